"""A turn: one user input, the model steps it leads to, and every call in them.

Each turn owns a nursery inside its own cancel scope; every call's task lives in that
nursery. Interrupting the turn (sync, idempotent) first moves the Turn machine to
``interrupting`` and every open call to ``cancelled`` (one stream event each, all before
any task runs again), then cancels the scope. The turn ends ``interrupted`` only after the
nursery has exited, i.e. every task has unwound.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any, cast

import trio

from vrt._core.events import TextDelta, Transcript, TurnEnded
from vrt._core.results import CallRecord, TurnResult, TurnStatus
from vrt._core.tables import TURN
from vrt._engine.call import Call, _describe
from vrt._engine.current import current_session
from vrt._engine.telemetry import TurnSpans
from vrt._errors import InvalidTransition, ModelError, SessionClosed
from vrt.models import (
    AgentText,
    CallDelta,
    CallEnd,
    CallStart,
    HistoryItem,
    Model,
    Text,
    TurnInterrupted,
    Usage,
    UserInput,
)
from vrt.models._realtime import Spoken

if TYPE_CHECKING:
    from vrt._engine.session import Session

log = logging.getLogger("vrt")

STOPPED = "the model stopped before completing the arguments"


class Turn:
    """A running turn. Await :meth:`wait` for its :class:`~vrt.TurnResult`."""

    def __init__(
        self, session: Session, turn_id: str, epoch: int, text: str, *, after: Turn | None = None
    ) -> None:
        self.session = session
        self.text = text
        """The user's input: what they typed, or what a realtime model heard them say."""
        self._after = after  # a realtime model's own turn: the interrupted one ends first
        self.turn_id = turn_id
        self.epoch = epoch
        self.spans = TurnSpans(
            session.agent,
            session.session_id,
            turn_id,
            epoch,
            text,
            capture=session.capture_content,
        )
        """The turn's OpenTelemetry spans (:mod:`vrt._engine.telemetry`)."""
        self._machine = TURN.new()
        self._scope = trio.CancelScope()
        self._calls: list[Call] = []  # every call of the turn, in call order
        self._open: dict[str, Call] = {}  # calls not yet final
        self._refused: set[str] = set()  # calls failed over a session limit: deltas dropped
        self._idle: trio.Event | None = None
        self._text: list[str] = []
        self._records: list[CallRecord] = []  # results already fed back, in call order
        self._ended = trio.Event()
        self._result: TurnResult | None = None

    @property
    def state(self) -> str:
        """The Turn machine's state (``generating``, ``awaiting``, ..., ``interrupted``)."""
        return self._machine.state

    def interrupt(
        self, epoch: int | None = None, *, heard_ms: int | None = None, by_model: bool = False
    ) -> None:
        """Interrupt the turn: sync and idempotent.

        Every open call moves to ``cancelled`` with an INTERRUPTED result at once, the
        session's epoch goes up by one (or to ``epoch``, the client's new one), and the
        turn's scope is cancelled. The turn ends ``interrupted`` once its tasks have
        unwound. Does nothing if the turn is already ending or ended.

        With a realtime model, the model is told (its response cancelled, its audio
        truncated to ``heard_ms``), unless the interrupt is the model's own (``by_model``:
        it heard the user and stopped itself).
        """
        try:
            self._machine.send("interrupt")
        except InvalidTransition:
            return  # already interrupting or final: the machine says there is nothing to do
        self.session.epoch = epoch if epoch is not None else self.session.epoch + 1
        upstream = self.session.upstream
        if upstream is not None and not by_model:
            upstream.interrupted(heard_ms)
        for call in list(self._open.values()):
            call.interrupt()
        self.spans.end("interrupted")  # at the interrupt, not once the tasks have unwound
        self._scope.cancel()

    async def wait(self) -> TurnResult:
        """Wait for the turn to end and return its result.

        Cancelling the wait does not affect the turn. Raises :class:`~vrt.SessionClosed`
        if the session closed before the turn ended. A close that lands after the Turn
        machine already reached its end (or began unwinding an interrupt) but before the
        turn's task published it does not undo that end: Trio delivers the cancellation at
        the task's next checkpoint, so the result is returned, consistent with every call's
        result, and no ``TurnEnded`` follows the session's ``Closed``.
        """
        await self._ended.wait()
        if self._result is None:
            raise SessionClosed(f"the session closed before turn {self.turn_id} ended")
        return self._result

    # -- called by calls --------------------------------------------------------------------------

    def call_ended(self, call: Call) -> None:
        del self._open[call.call_id]
        if not self._open and self._idle is not None:
            self._idle.set()

    # -- the turn's task --------------------------------------------------------------------------

    async def run(self) -> None:
        """The turn loop; on session close it is cancelled and the turn never ends."""
        message: str | None = None
        current_session.set(self.session)  # call tasks inherit it (confirmation)
        try:
            with self._scope:
                if self._after is not None:  # a realtime model's turn: after the one it cut
                    with contextlib.suppress(SessionClosed):
                        await self._after.wait()
                    self._after = None
                    self.session.record(UserInput(turn_id=self.turn_id, text=self.text))
                try:
                    async with trio.open_nursery() as nursery:
                        message = await self._loop(nursery)
                except BaseExceptionGroup as group:
                    if not (self._scope.cancel_called or self.session.state == "closed"):
                        raise
                    cancelled, rest = group.split(trio.Cancelled)
                    if rest is not None:  # cleanup errors of cancelled calls: results are set
                        log.warning(
                            "turn %s: errors while unwinding an interrupt: %r", self.turn_id, rest
                        )
                    if cancelled is not None:
                        raise cancelled from None  # this scope (or the session's) catches it
        except Exception as exc:  # an engine bug, not a tool's or the model's error
            log.exception("turn %s failed", self.turn_id)
            message = f"internal error: {_describe(exc)}"
            for call in list(self._open.values()):
                call.interrupt("the turn failed")
            with contextlib.suppress(InvalidTransition):
                self._machine.send("error")
        except BaseException:
            for call in self._open.values():
                call.trace.cut()
            self.spans.cut()
            self._ended.set()  # session closed: wait() raises SessionClosed
            self._calls, self._open = [], {}  # the calls never get results; hold nothing
            raise
        if self._machine.state == "interrupting":
            self._machine.send("unwound")
        self._finish(message)

    async def _loop(self, nursery: trio.Nursery) -> str | None:
        """Run model steps until one makes no call; return a failure message, if any."""
        step = 0
        while True:
            step += 1
            first = len(self._calls)
            await trio.lowlevel.checkpoint_if_cancelled()  # no model request after an interrupt
            try:
                await self._stream_step(step, nursery)
            except Exception as exc:
                log.warning("model failed in turn %s: %s", self.turn_id, _describe(exc))
                failure = f"model failed: {_describe(exc)}"
                self._abandon(failure)
                await self._calls_final()
                await self._advance("error")
                return failure
            self._abandon(STOPPED)
            if len(self._calls) == first:
                await self._advance("finish")
                return None
            await self._advance("step_done")
            await self._calls_final()
            self._flush_step()
            if step >= self.session.agent.max_steps:
                await self._advance("finish")
                return None
            await self._advance("next_step")

    async def _advance(self, event: str) -> None:
        """Move the Turn machine, unless an interrupt got in first.

        An interrupt cancels the scope, but a wait that was already woken (the last call
        ended) or a stream that ended without a checkpoint would carry on: checking the
        scope here makes the interrupt win, so no step starts after it.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        self._machine.send(event)

    async def _stream_step(self, step: int, nursery: trio.Nursery) -> None:
        session = self.session
        request = session.request(self, step)
        spans = self.spans
        spans.step_started(step)
        token = spans.current()
        try:
            upstream = session.upstream
            stream = (
                cast(Model, session.agent.model).stream(request)
                if upstream is None
                else upstream.step(self, request)
            )
            await self._step_events(stream, nursery)
        except Exception as exc:
            spans.step_ended(exc)
            raise
        finally:
            spans.restore(token)
        spans.step_ended()

    async def _step_events(self, stream: Any, nursery: trio.Nursery) -> None:
        session = self.session
        calls = self._open
        closing: Any = (
            contextlib.aclosing(stream)
            if hasattr(stream, "aclose")
            else contextlib.nullcontext(stream)
        )
        pace = session.pace
        first = True
        async with closing:
            async for event in stream:
                if first:
                    first = False
                    self.spans.first_event()
                if pace is not None:  # the transport is behind: wait for the peer
                    await pace()
                # an interrupt may land while the model's await had already completed; the
                # model can then yield buffered events without a checkpoint: drop them
                await trio.lowlevel.checkpoint_if_cancelled()
                if isinstance(event, CallDelta):
                    call = calls.get(event.call_id)
                    if call is None:
                        if event.call_id in self._refused:
                            continue
                        raise ModelError(f"delta for unknown call {event.call_id!r}")
                    if not isinstance(event.delta, str):
                        raise ModelError(f"delta for call {event.call_id!r} is not a str")
                    if not call.delta(event.delta):
                        self._refused.add(call.call_id)  # too large: failed, the rest dropped
                elif isinstance(event, CallStart):
                    if session.seen_call_id(event.call_id):
                        raise ModelError(f"call id {event.call_id!r} was already used")
                    call = Call(self, event.call_id, event.name)
                    self._calls.append(call)
                    calls[call.call_id] = call
                    limit = session.max_open_calls
                    if limit is not None and len(calls) > limit:
                        self._refused.add(call.call_id)  # its deltas and end are dropped
                        call.abandon(f"too many open calls in this turn (limit {limit})")
                elif isinstance(event, CallEnd):
                    call = calls.get(event.call_id)
                    if call is None:
                        if event.call_id in self._refused:
                            continue
                        raise ModelError(f"end of unknown call {event.call_id!r}")
                    if call.complete(event.arguments):
                        call.issue(nursery)
                elif isinstance(event, Text):
                    self._text.append(event.text)
                    if session.watched:
                        session.emit(TextDelta(turn_id=self.turn_id, text=event.text))
                elif isinstance(event, Spoken):  # a realtime model's voice, as text
                    self._text.append(event.text)
                    if session.watched:
                        session.emit(
                            Transcript(turn_id=self.turn_id, role="agent", text=event.text)
                        )
                elif isinstance(event, Usage):
                    self.spans.usage(event.input_tokens, event.output_tokens)
                else:
                    raise ModelError(f"the model streamed {event!r}, not a vrt.models event")

    def _abandon(self, message: str) -> None:
        """Fail every call whose arguments never completed."""
        for call in list(self._open.values()):
            if call.text is None:
                call.abandon(message)

    async def _calls_final(self) -> None:
        if self._open:
            self._idle = trio.Event()
            await self._idle.wait()
            self._idle = None

    def _flush_step(self) -> None:
        """Feed the text and results so far into the history, in call order."""
        items: list[HistoryItem] = []
        if self._text:
            items.append(AgentText(turn_id=self.turn_id, text="".join(self._text)))
            self._text = []
        fresh = [call.record() for call in self._calls[len(self._records) :]]
        self._records.extend(fresh)
        items.extend(fresh)
        if items:
            self.session.record(*items)

    def _finish(self, message: str | None) -> None:
        status: TurnStatus = self._machine.state  # type: ignore[assignment]
        for call in list(self._open.values()):  # unreachable unless the engine has a bug
            log.error(
                "turn %s ended with call %s still %s",
                self.turn_id,
                call.call_id,
                call.machine.state,
            )
            call.interrupt("the turn ended before the call had a result")
        self._flush_step()
        if status == "interrupted":
            self.session.record(TurnInterrupted(turn_id=self.turn_id))
        self._result = TurnResult(
            turn_id=self.turn_id,
            status=status,
            calls=tuple(self._records),
            message=message,
        )
        self._calls = []
        self._records = []
        self.spans.end(status, message)
        self.session.turn_ended(self, self._result)
        if self.session.watched:
            self.session.emit(
                TurnEnded(turn_id=self.turn_id, epoch=self.session.epoch, reason=status)
            )
        self._ended.set()

    def __repr__(self) -> str:
        return f"<Turn {self.turn_id} {self._machine.state}>"
