"""The in-process session: the agent's conversation, its turns and its event subscribers."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import secrets
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import trio

from vrt._core.bounded import RecentSet
from vrt._core.events import Closed, ConfirmRequest, Event, ToolPreview, TurnStarted, pcm16
from vrt._core.results import CallRecord, TurnResult
from vrt._core.tables import SESSION
from vrt._engine.agent import Agent, RegisteredApp
from vrt._engine.call import AppHost, Call
from vrt._engine.groups import single_unwrapped
from vrt._engine.history import Snapshot
from vrt._engine.realtime import Upstream
from vrt._engine.subscription import Subscription
from vrt._engine.telemetry import capture_from_environment
from vrt._engine.tools import schema_validator
from vrt._engine.turn import Turn
from vrt._errors import SessionClosed
from vrt.models import AgentText, HistoryItem, ModelRequest, ToolSpec, UserInput
from vrt.models._realtime import is_realtime

log = logging.getLogger("vrt")

CALL_IDS_KEPT = 10_000
"""Call ids a session remembers to refuse a model's reuse of one (the newest)."""


class Session:
    """One conversation with an agent. Build it with :func:`open_session`."""

    def __init__(
        self,
        agent: Agent,
        session_id: str,
        *,
        app_tools: Iterable[ToolSpec] = (),
        app_host: AppHost | None = None,
        principal: Any = None,
        capture_content: bool | None = None,
    ) -> None:
        self.agent = agent
        self.capture_content = (
            capture_from_environment() if capture_content is None else bool(capture_content)
        )
        """Whether traces carry content (the user's text, arguments, outputs, messages):
        off unless asked for, or ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``."""
        self.principal = principal
        """Who the session's client is (``vrt.serve``'s ``authenticate``); ``ctx.principal``."""
        self.session_id = session_id
        self.app_host = app_host
        self.app_tools: dict[str, RegisteredApp] = {}
        self.ignored_app_tools = frozenset(
            () if agent.client_tools == "accept" else (spec.name for spec in app_tools)
        )
        """App tools the client hosts that the agent does not offer (``client_tools``
        is ``"ignore"``): named in the failure of a call to one."""
        if agent.client_tools == "accept":
            self.app_tools = {
                spec.name: RegisteredApp(spec=spec, check_schema=schema_validator(spec.parameters))
                for spec in app_tools
            }
        self.registry = agent.registry
        """The server tools of the current model step (those of live sources change only
        between steps: :meth:`request`)."""
        self._versions = agent.versions()
        self.specs: tuple[ToolSpec, ...] = agent.specs + tuple(
            app.spec for app in self.app_tools.values()
        )
        """Exactly what the model is offered: server tools, then the client's app tools."""
        self.pace: Callable[[], Awaitable[None]] | None = None
        """Awaited before each model event: a transport's flow control (``vrt.serve``)."""
        self.max_open_calls: int | None = None
        """Calls of a turn without a result; a call over it FAILED at once (``vrt.serve``)."""
        self.max_queued_app_calls: int | None = None
        """App calls waiting for the app; one over it FAILED (``vrt.serve``)."""
        self.max_argument_bytes: int | None = None
        """A call whose arguments grow over this many UTF-8 bytes fails (``vrt.serve``:
        every frame that carries them must fit the client's limit)."""
        self.max_progress_bytes: int | None = None
        """``ctx.emit`` refuses progress over this many bytes of JSON (``vrt.serve``)."""
        self.app_line: deque[Call] = deque()
        """App calls without a result, in call order: only the first is sent to the client."""
        self._confirmations: dict[str, trio.Event] = {}
        self._answers: dict[str, tuple[bool, str | None]] = {}
        self.epoch = 0
        """Raised by one on every interrupt; every turn and call carries the epoch it ran in."""
        self.history: list[HistoryItem] = []
        self.max_history_bytes: int | None = None
        """Past this size of history (texts, arguments and results, roughly in bytes of
        JSON), the oldest whole turns are dropped from what the model is sent next
        (``vrt.serve``: a session's memory stays bounded, whatever its client sends)."""
        self._sizes: list[int] = []  # each history item's size, while there is a limit
        self._history_size = 0
        self.history_offset = 0
        """How many items the history has dropped from its front since the conversation
        began (``history[0]`` is item number ``history_offset``): what a store that keeps
        the history item by item trims."""
        self.subscribers: list[trio.MemorySendChannel[Event]] = []
        self.listeners: list[Callable[[Event], None]] = []
        # Those of them that take the legacy ToolPreview events (by default, all).
        self._preview_subscribers: list[trio.MemorySendChannel[Event]] = []
        self._preview_listeners: list[Callable[[Event], None]] = []
        self.watched = False
        """Whether anyone receives events (the engine builds none otherwise)."""
        self.previews_watched = False
        """Whether anyone takes :class:`~vrt.ToolPreview` events (none built otherwise)."""
        self._nursery: trio.Nursery | None = None  # the turns' nursery, see host()
        self._machine = SESSION.new()
        self._machine.send("accept")
        self._turn: Turn | None = None
        self._turns = 0
        self._call_ids: RecentSet[str] = RecentSet(CALL_IDS_KEPT)
        self._lock = trio.Lock()
        self.upstream: Upstream | None = (
            Upstream(self, agent.model) if is_realtime(agent.model) else None
        )
        """A realtime model's connection, held for the session's life (None for a model
        stepped request by request)."""
        self.model_turn_opened: Callable[[Turn], None] | None = None
        """Called when a realtime model opens a turn of its own (``vrt.serve``: the session
        is busy until it ends)."""

    @property
    def state(self) -> str:
        """The Session machine's state (``open`` or ``closed`` in process)."""
        return self._machine.state

    @property
    def final(self) -> bool:
        """Whether the session is over here (closed, or handed over to another process)."""
        return self._machine.final

    @property
    def turn(self) -> Turn | None:
        """The open turn, if any."""
        return self._turn

    @asynccontextmanager
    async def subscribe(self, *, previews: bool = True) -> AsyncIterator[Subscription[Event]]:
        """Receive every event from now on, in order, until the session closes.

        The channel is unbounded so that emitting never blocks the engine; a subscriber
        that stops reading holds memory until it leaves the ``async with``. The last event
        is :class:`~vrt.Closed`, after which the iteration ends. Receiving is a cancel
        point; it yields to the scheduler at least every 64 events (see
        :class:`~vrt.Subscription`). Raises :class:`~vrt.SessionClosed` on a closed session.

        ``previews=False``: without the legacy :class:`~vrt.ToolPreview` events (an app
        that follows :class:`~vrt.ToolStream` needs none; when nobody takes them, the
        engine builds none).
        """
        if self._machine.final:
            raise SessionClosed("the session is closed")
        send, receive = trio.open_memory_channel[Event](math.inf)
        self.subscribers.append(send)
        if previews:
            self._preview_subscribers.append(send)
        self._rewatch()
        try:
            async with receive:
                yield Subscription(receive)
        finally:
            self._drop_subscriber(send)
            send.close()

    def listen(
        self, listener: Callable[[Event], None], *, previews: bool = True
    ) -> Callable[[], None]:
        """Call ``listener(event)`` synchronously for every event, in engine order; returns
        a function that stops it. ``previews=False``: without :class:`~vrt.ToolPreview`.

        For transports (``vrt.serve`` turns events into frames this way, so a call's
        ``tool.stream`` frames always precede its ``tool.call``). A listener must not block
        or raise.
        """
        self.listeners.append(listener)
        if previews:
            self._preview_listeners.append(listener)
        self._rewatch()

        def stop() -> None:
            for listeners in (self.listeners, self._preview_listeners):
                if listener in listeners:
                    listeners.remove(listener)
            self._rewatch()

        return stop

    def _rewatch(self) -> None:
        self.watched = bool(self.subscribers or self.listeners)
        self.previews_watched = bool(self._preview_subscribers or self._preview_listeners)

    def _drop_subscriber(self, channel: trio.MemorySendChannel[Event]) -> None:
        for channels in (self.subscribers, self._preview_subscribers):
            if channel in channels:
                channels.remove(channel)
        self._rewatch()

    def emit(self, event: Event) -> None:
        """Deliver ``event`` to every listener and subscriber, synchronously."""
        for listener in self.listeners:
            listener(event)
        self._deliver(self.subscribers, event)

    def emit_preview(self, event: ToolPreview) -> None:
        """Deliver a legacy preview to those that take them (:attr:`previews_watched`)."""
        for listener in self._preview_listeners:
            listener(event)
        self._deliver(self._preview_subscribers, event)

    def _deliver(self, channels: list[trio.MemorySendChannel[Event]], event: Event) -> None:
        gone = None
        for channel in channels:
            try:
                channel.send_nowait(event)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                gone = [*(gone or ()), channel]  # the subscriber closed its end
        if gone:
            for channel in gone:
                self._drop_subscriber(channel)

    async def start_turn(self, text: str) -> Turn:
        """Start a turn for the user's ``text`` and return it (await ``turn.wait()``).

        If a turn is open it is interrupted first (barge-in) and this waits for it to
        end, so the history stays in order. Cancelling this call before the new turn
        started leaves the old turn interrupted and starts nothing.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, not {type(text).__name__}")
        async with self._lock:
            if self._machine.state != "open":
                raise SessionClosed("the session is closed")
            while (previous := self._turn) is not None:  # a realtime model may open one
                previous.interrupt()
                with contextlib.suppress(SessionClosed):
                    await previous.wait()
                if self._machine.state != "open":
                    raise SessionClosed("the session is closed")
            self._turns += 1
            turn = Turn(self, f"t_{self._turns}", self.epoch, text)
            self._turn = turn
            self.record(UserInput(turn_id=turn.turn_id, text=text))
            if self.watched:
                self.emit(TurnStarted(turn_id=turn.turn_id, epoch=turn.epoch))
            assert self._nursery is not None
            self._nursery.start_soon(turn.run)
            return turn

    def open_model_turn(self, text: str) -> Turn:
        """A realtime model started a response of its own (it heard the user): open its
        turn now, interrupting the open one (the model already stopped it: nothing is sent
        upstream). ``text`` is what the user said, as far as the model transcribed it.
        The new turn records its input once the interrupted one has ended."""
        previous = self._turn
        if previous is not None:
            previous.interrupt(by_model=True)
        self._turns += 1
        turn = Turn(self, f"t_{self._turns}", self.epoch, text, after=previous)
        self._turn = turn
        if self.watched:
            self.emit(TurnStarted(turn_id=turn.turn_id, epoch=turn.epoch))
        assert self._nursery is not None
        self._nursery.start_soon(turn.run)
        if self.model_turn_opened is not None:
            self.model_turn_opened(turn)
        return turn

    def send_audio(self, pcm: bytes) -> None:
        """Feed the user's voice to a realtime model: PCM16 little-endian mono at the
        model's ``input_rate``. Sync and never blocks: the buffer holds the newest 5 s, the
        oldest is dropped (and counted) when the connection cannot keep up.

        Raises ``TypeError`` for anything but bytes, ``ValueError`` for an odd length (not
        PCM16), ``RuntimeError`` if the agent's model is not a realtime one, and
        :class:`~vrt.SessionClosed` once the session is closed.
        """
        pcm = pcm16(pcm)
        if self.final:
            raise SessionClosed("the session is closed")
        if self.upstream is None:
            raise RuntimeError("this agent's model is not a realtime model: it takes no audio")
        if pcm:
            self.upstream.send_audio(pcm)

    def interrupt(self, epoch: int | None = None, *, heard_ms: int | None = None) -> None:
        """Interrupt the open turn, if any (sync, idempotent): see :meth:`Turn.interrupt`.

        ``epoch`` (the client's new epoch, over the wire) is adopted even with no open turn.
        ``heard_ms``: how much of the turn's audio the user heard (a realtime model is told
        to forget the rest).
        """
        if self._turn is not None:
            self._turn.interrupt(epoch, heard_ms=heard_ms)
        if epoch is not None:
            self.epoch = max(self.epoch, epoch)

    def close(self, reason: str = "client") -> None:
        """End the session for good: open turns are cancelled without terminal events
        (the reference says so), subscribers get :class:`~vrt.Closed` and their iteration
        ends. Idempotent."""
        if self._machine.final:
            return
        self._machine.send("close")
        self._turn = None
        self._end_here(Closed(reason=reason))

    def hand_over(self, *, taken: bool = False) -> None:
        """This process lets the session go, between turns, to go on elsewhere (a server
        with a store): its nursery is cancelled and its subscribers' iterations end, with
        no :class:`~vrt.Closed` (it is not over). ``taken``: another process took it over
        (this one's lease ran out), maybe in a turn, which is dropped here without
        terminal events, as a close drops it (that process settles it). Idempotent once
        final."""
        if self._machine.final:
            return
        if self._turn is not None and not taken:
            raise RuntimeError("a session is handed over between turns only")
        self._machine.send("hand_over")
        self._turn = None
        self._end_here(None)

    def _end_here(self, last: Closed | None) -> None:
        """The session is final here: its turns cancelled, the model told (it drops what
        it kept for the session, e.g. ScriptedModel's cursor), ``last`` emitted, and every
        subscriber's iteration ended."""
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        forget = getattr(self.agent.model, "forget", None)
        if callable(forget):
            forget(self.session_id)
        if last is not None:
            self.emit(last)
        for channel in self.subscribers:
            channel.close()
        self.subscribers.clear()
        self.listeners.clear()
        self._preview_subscribers.clear()
        self._preview_listeners.clear()
        self._rewatch()

    @property
    def turns(self) -> int:
        """How many turns the session started."""
        return self._turns

    def restore(
        self,
        history: Iterable[HistoryItem],
        *,
        epoch: int,
        turns: int,
        model_state: Any = None,
        history_offset: int = 0,
    ) -> None:
        """Go on from a saved session (another process ran it): its history (whose first
        item is number ``history_offset``), epoch and turn count, and what the model kept
        for it (``restore_session``, if the model has it). Before the first turn only."""
        if self._turns or self.history:
            raise RuntimeError("a session is restored before its first turn only")
        self.history_offset = history_offset
        self.record(*history)
        for item in self.history:
            if isinstance(item, CallRecord):
                self._call_ids.add(item.call_id)
        self.epoch = epoch
        self._turns = turns
        restore = getattr(self.agent.model, "restore_session", None)
        if model_state is not None and callable(restore):
            restore(self.session_id, model_state)

    def skip_turns(self, turn_ids: Iterable[str]) -> None:
        """Number the next turns after these (turns a crashed process started, which this
        one never saw: their ids are not given again)."""
        for turn_id in turn_ids:
            head, _, number = turn_id.partition("_")
            if head == "t" and number.isdigit():
                self._turns = max(self._turns, int(number))

    def model_state(self) -> Any:
        """What the model keeps for this session (``session_state``), JSON, or None."""
        state = getattr(self.agent.model, "session_state", None)
        return state(self.session_id) if callable(state) else None

    async def host(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the nursery the session's turns run in, until :meth:`close` cancels it.

        A nursery of its own, so that closing the session cancels its turns but never the
        code of whoever opened it.
        """
        async with trio.open_nursery() as nursery:
            self.run_in(nursery)
            task_status.started()
            await trio.sleep_forever()

    def run_in(self, nursery: trio.Nursery) -> None:
        """Run the session's turns in ``nursery``, which :meth:`close` cancels.

        :meth:`host` gives it a nursery of its own; ``vrt.serve`` gives it its session
        actor's, which ends with the session anyway (a task and a nursery less a session).
        """
        self._nursery = nursery
        if self.upstream is not None:
            nursery.start_soon(self.upstream.run)

    # -- for turns --------------------------------------------------------------------------------

    def record(self, *items: HistoryItem) -> None:
        """Append ``items`` to the history, then keep it under :attr:`max_history_bytes`.

        The history is append-only for the snapshots already handed out: dropping turns
        makes a new list (the old one lives on in those snapshots), about once per quarter
        of the limit added.
        """
        self.history.extend(items)
        limit = self.max_history_bytes
        if limit is None:
            return
        for item in items:
            size = _size(item)
            self._sizes.append(size)
            self._history_size += size
        if self._history_size > limit:
            self._drop_oldest_turns(limit * 3 // 4)

    def _drop_oldest_turns(self, target: int) -> None:
        """Drop whole turns, oldest first, until the history is ``target`` or less; never
        the turn in progress (the last input's), so every call keeps its result."""
        history, sizes = self.history, self._sizes
        starts = [i for i, item in enumerate(history) if isinstance(item, UserInput)]
        cut, total = 0, self._history_size
        for start in starts[1:]:
            if total <= target:
                break
            total -= sum(sizes[cut:start])
            cut = start
        if cut:
            log.info("session %s: the oldest %d history items dropped", self.session_id, cut)
            self.history, self._sizes, self._history_size = history[cut:], sizes[cut:], total
            self.history_offset += cut

    def request(self, turn: Turn, step: int) -> ModelRequest:
        """The model request for one step of ``turn``: between two steps is where the
        tools of a live source (an MCP server whose list changed) are taken up."""
        if self.agent.sources:
            self._tools_now()
        return ModelRequest(
            instructions=self.agent.instructions,
            tools=self.specs,
            history=Snapshot(self.history),
            session_id=self.session_id,
            turn_id=turn.turn_id,
            step=step,
        )

    def _tools_now(self) -> None:
        versions = self.agent.versions()
        if versions == self._versions:
            return
        self._versions = versions
        registry, specs = self.agent.tools_now()
        clash = [name for name in registry if name in self.app_tools]
        for name in clash:  # the client's app tool came first: it keeps its name
            log.warning("session %s: server tool %r clashes with an app tool: left out",
                        self.session_id, name)  # fmt: skip
            del registry[name]
        self.registry = registry
        self.specs = tuple(spec for spec in specs if spec.name in registry) + tuple(
            app.spec for app in self.app_tools.values()
        )

    async def confirm(self, call_id: str, request: ConfirmRequest) -> tuple[bool, str | None]:
        """Emit ``request`` and wait for its answer: ``(approved, reason)``.

        Cancelled with the call's turn; an answer arriving after that is ignored.
        """
        done = trio.Event()
        self._confirmations[call_id] = done
        try:
            self.emit(request)
            await done.wait()
            return self._answers.pop(call_id)
        finally:
            self._confirmations.pop(call_id, None)
            self._answers.pop(call_id, None)

    def answer_confirmation(self, call_id: str, approved: bool, reason: str | None) -> bool:
        """Answer the open confirmation of ``call_id``; False if none is open."""
        done = self._confirmations.get(call_id)
        if done is None or done.is_set():
            return False
        self._answers[call_id] = (approved, reason)
        done.set()
        return True

    def seen_call_id(self, call_id: str) -> bool:
        """Record ``call_id``; True if the session had already seen it."""
        if call_id in self._call_ids:
            return True
        self._call_ids.add(call_id)
        return False

    def turn_ended(self, turn: Turn, result: TurnResult) -> None:
        if self._turn is turn:
            self._turn = None
        if self.upstream is not None:
            self.upstream.turn_ended(turn, result.calls, result.status)

    def __repr__(self) -> str:
        return f"<Session {self.session_id} {self._machine.state}>"


@asynccontextmanager
async def open_session(
    agent: Agent,
    *,
    session_id: str | None = None,
    app_tools: Iterable[ToolSpec] = (),
    app_host: AppHost | None = None,
    principal: Any = None,
    capture_content: bool | None = None,
) -> AsyncIterator[Session]:
    """Open an in-process session with ``agent`` (no network).

    The session owns a nursery for its turns. Leaving the block closes the session: a turn
    still open is cancelled, its open calls get no terminal event, ``turn.wait()`` raises
    :class:`~vrt.SessionClosed`, and subscribers receive :class:`~vrt.Closed`. If the body
    is cancelled, the same happens.

    ``session_id``, ``app_tools``, ``app_host`` and ``principal`` are for transports
    (``vrt.serve``): the client's app tools, offered to the model when the agent accepts
    client tools, where their calls run, and who the client is (tools see it as
    ``ctx.principal``).

    Traces (OpenTelemetry, once the application configures its SDK) carry no content
    unless ``capture_content`` is True (None: as the environment variable
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`` says).
    """
    with single_unwrapped():
        async with trio.open_nursery() as nursery:
            session = Session(
                agent,
                session_id or f"s_{secrets.token_hex(8)}",
                app_tools=app_tools,
                app_host=app_host,
                principal=principal,
                capture_content=capture_content,
            )
            await nursery.start(session.host)
            try:
                yield session
            finally:
                session.close("client")


def _size(item: HistoryItem) -> int:
    """About how many bytes of JSON ``item`` makes in a model request."""
    if isinstance(item, UserInput | AgentText):
        return len(item.text) + 64
    if isinstance(item, CallRecord):
        result = item.result
        return (
            len(json.dumps(item.arguments, default=repr))
            + len(json.dumps(result.output, default=repr))
            + len(result.message or "")
            + 128
        )
    return 256  # a TurnInterrupted note
