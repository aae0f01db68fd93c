"""A realtime model's driver: its model session, held for a session's life, and the turns
its responses make.

A session whose agent has a realtime model (:class:`vrt.models.OpenAIRealtime`,
:class:`vrt.models.GeminiLive`) owns one :class:`Upstream`, a task in the session's nursery
that holds the model's WebSocket through its :class:`~.realtime_link.Link` (the socket, the
send and receive pumps, the reconnects: :mod:`.realtime_link`). Its Upstream machine
(:mod:`machines.upstream`) decides what may be sent: a request for a response only when
none is active, requested or being cancelled; a cancel only while a response is active.

How responses become turns. A response the model starts on its own (its voice detector
heard the user) opens a turn (:meth:`Session.open_model_turn`), interrupting the open one
first. A turn's first step is that response's events; a text turn (``start_turn``) sends
the text and asks for a response. When a step ends with calls, the turn waits for them as
with any model; its next step sends their results and asks for the next response. At the
end of a turn, the results of calls not yet answered go upstream without a request (an
interrupted turn's too: every call the model completed gets exactly one answer).

Barge-in. The model's speech-start interrupts the open turn as ``session.interrupt()`` does
(the model cancels its own response); the app's interrupt cancels the active response and
truncates the assistant's audio to what was heard (:mod:`.realtime_voice` keeps the
account). Events of a response no longer wanted (late ones, a call delivered twice) are
dropped with a DEBUG line; a call id runs at most once per session.

A lost connection fails the step that waits on it (:class:`~vrt.ModelError`); the Link
reconnects with backoff and the Upstream seeds the new model session with the session's
history.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import trio

from vrt._core.bounded import RecentSet
from vrt._core.events import AudioDelta, Transcript
from vrt._core.results import CallRecord, ResultCode, ToolResult
from vrt._core.tables import SETTLING, TURN, UPSTREAM
from vrt._engine.realtime_link import Fatal, Link
from vrt._engine.realtime_voice import Voice
from vrt._errors import InvalidTransition, ModelError
from vrt.models import CallDelta, CallEnd, CallStart, ModelEvent, ModelRequest, UserInput
from vrt.models._realtime import (
    AudioOut,
    CallsCancelled,
    Message,
    Ready,
    RealtimeEvent,
    RealtimeModel,
    RealtimeProtocol,
    RealtimeSeed,
    ResponseDone,
    ResponseOutput,
    ResponseStarted,
    Settled,
    SpeechStarted,
    Spoken,
    TranscriptOut,
    UpstreamError,
    UserTranscript,
)

if TYPE_CHECKING:
    from vrt._engine.session import Session
    from vrt._engine.turn import Turn

log = logging.getLogger("vrt")

FEED_SIZE = 4096
"""Events of a response waiting for its turn's step to take them (then the model waits)."""
_ENDED = TURN.finals
"""The Turn machine's final states: a turn that takes nothing more."""
ITEMS_KEPT = 1_000
"""Audio items and open calls of one response the driver tracks (a model server that
opens more gets the rest untracked: audio still plays, calls are dropped)."""
IDS_KEPT = 10_000
"""Call and response ids remembered to drop duplicates and late events."""


class _End:
    """The response ended (its turn's step ends)."""


class _Failed:
    def __init__(self, message: str) -> None:
        self.message = message


_END = _End()
FeedItem = ModelEvent | Spoken | _End | _Failed


class Upstream:
    """One session's connection to its realtime model (see the module's docstring)."""

    def __init__(self, session: Session, model: RealtimeModel) -> None:
        self.session = session
        self.model = model
        self.machine = UPSTREAM.new()
        self.link = Link(self, model, session.session_id)
        """The connection (its socket, its queues, its reconnect loop)."""
        self._changed = trio.Event()  # set (and replaced) whenever the machine moves
        self._active: str | None = None  # the response the machine holds open
        self._feed: trio.MemorySendChannel[FeedItem] | None = None  # its step's, if bound
        self._feed_turn: Turn | None = None
        self._awaiting: tuple[Turn, trio.MemorySendChannel[FeedItem]] | None = None
        self._opened: dict[Turn, trio.MemoryReceiveChannel[FeedItem]] = {}
        self._over: RecentSet[str] = RecentSet(IDS_KEPT)  # responses ended or unwanted
        self._call_ids: RecentSet[str] = RecentSet(IDS_KEPT)  # calls seen this session
        self._live_calls: dict[str, str] = {}  # calls of the active response: their names
        self._completed: dict[str, tuple[str, Turn | None]] = {}
        """Calls the model completed and nobody answered yet: their names, and the turn
        they were fed to (None: no turn took them)."""
        self._known: set[str] = set()  # calls the connected model session knows
        self._asked: RecentSet[str] = RecentSet(IDS_KEPT)  # turns whose input went upstream
        self._cancelled: RecentSet[str] = RecentSet(IDS_KEPT)  # Gemini: ids it cancelled
        self._held: list[CallRecord] = []  # Gemini: answers waiting for Settled
        self._settling = SETTLING.new()  # Gemini: it heard the user; cancellations may follow
        self._voice = Voice(ITEMS_KEPT)  # the model's audio items, to truncate on an interrupt
        self._user_said: str | None = None
        self._broken: Turn | None = None  # a turn whose connection was lost mid-step

    @property
    def state(self) -> str:
        """The Upstream machine's state."""
        return self.machine.state

    @property
    def protocol(self) -> RealtimeProtocol | None:
        """The API's protocol object of the current connection (None before the first)."""
        return self.link.protocol

    @property
    def failure(self) -> str | None:
        """Why the last attempt to connect failed (short, no secret), or None."""
        return self.link.failure

    @property
    def connections(self) -> int:
        """How many times the model session was set up (1 + reconnects)."""
        return self.link.connections

    @property
    def audio_dropped(self) -> int:
        """Bytes of the user's audio dropped because the buffer was full."""
        return self.link.audio_dropped

    @property
    def _unsettled(self) -> bool:
        """The model may still cancel calls of the turn it cut: their answers wait."""
        return self._settling.state == "unsettled"

    def _move(self, event: str) -> bool:
        """Send ``event`` to the machine; False if it does not allow it here."""
        try:
            self.machine.send(event)
        except InvalidTransition:
            return False
        self._changed.set()
        self._changed = trio.Event()
        return True

    def _send(self, messages: Iterable[Message]) -> None:
        self.link.send(messages)

    def send_audio(self, pcm: bytes) -> None:
        """Queue the user's voice for the model: sync, never blocks; the buffer keeps the
        newest :data:`~vrt._engine.realtime_link.AUDIO_BUFFER_SECONDS` (the oldest is
        dropped and counted)."""
        self.link.send_audio(pcm)

    # -- the connection (the Link asks, the machine decides) --------------------------------------

    async def run(self) -> None:
        """Hold the connection for the session's life (cancelled with it), reconnecting
        with backoff when it is lost (:meth:`Link.run <.realtime_link.Link.run>`)."""
        try:
            await self.link.run()
        finally:
            self._move("close")
            self._settling.send("close")

    def audio_may_go(self) -> bool:
        """The user's audio waits while the model session is set up."""
        return self.state != "connecting"

    def setup(self, protocol: RealtimeProtocol) -> Iterable[Message]:
        """A new connection's first messages: the model session, with no history yet."""
        return protocol.setup(self._seed(()))

    def retrying(self) -> None:
        """The backoff is over: the next attempt to connect begins."""
        self._move("reconnect")

    def _seed(self, history: Sequence[Any]) -> RealtimeSeed:
        session = self.session
        return RealtimeSeed(
            instructions=session.agent.instructions, tools=session.specs, history=history
        )

    async def received(self, events: Sequence[RealtimeEvent], protocol: RealtimeProtocol) -> bool:
        """Act on the events of one message from the model; True if they made the model
        session ready."""
        ready = False
        for event in events:
            if isinstance(event, Ready):
                ready = self._on_ready(protocol) or ready
            else:
                await self._on(event, protocol)
        return ready

    def _on_ready(self, protocol: RealtimeProtocol) -> bool:
        if not self._move("ready"):
            return False  # a second session.updated: nothing new
        history = list(self.session.history)
        turn = self.session.turn
        if turn is not None and turn.turn_id not in self._asked:  # its step 1 sends it
            cut = [i for i, item in enumerate(history) if isinstance(item, UserInput)
                   and item.turn_id == turn.turn_id]  # fmt: skip
            history = history[: cut[0]] if cut else history
        self._known = {item.call_id for item in history if isinstance(item, CallRecord)}
        self._send(protocol.seed(self._seed(history)))
        return True

    def lost(self) -> None:
        """The connection is gone (the Link emptied its queues): fail the step waiting on
        it; what the model knew is seeded again from the history on the next connection."""
        self._move("drop")
        self._active = None
        self._live_calls.clear()
        self._completed.clear()
        self._held.clear()
        self._voice = Voice(ITEMS_KEPT)  # its items were the lost model session's
        self._cancelled = RecentSet(IDS_KEPT)
        self._settling.send("settle")  # the next model session starts settled
        self._over = RecentSet(IDS_KEPT)  # a new connection's ids may repeat (Gemini's)
        message = f"the connection to the model was lost ({self.failure})"
        if self._feed is not None:
            self._fail_feed(self._feed, message)
        elif self._awaiting is None and self.session.turn is not None:
            self._broken = self.session.turn  # between two steps: it fails at its next
        if self._awaiting is not None:
            self._fail_feed(self._awaiting[1], message)
            self._awaiting = None
        self._feed = self._feed_turn = None

    @staticmethod
    def _fail_feed(feed: trio.MemorySendChannel[FeedItem], message: str) -> None:
        try:
            feed.send_nowait(_Failed(message))
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            feed.close()

    # -- what the model says ----------------------------------------------------------------------

    async def _on(self, event: RealtimeEvent, protocol: RealtimeProtocol) -> None:
        if isinstance(event, ResponseStarted):
            self._on_started(event.response_id, protocol)
        elif isinstance(event, ResponseOutput | TranscriptOut | AudioOut):
            rid = event.response_id
            if rid != self._active and not self._implicit_start(rid, protocol):
                log.debug("session %s: an event of response %s dropped (not the current one)",
                          self.session.session_id, rid)  # fmt: skip
                return
            if isinstance(event, AudioOut):
                self._on_audio(event)
            elif isinstance(event, TranscriptOut):
                await self._feed_item(Spoken(text=event.text))
            else:
                item = self._filter_call(event.event)
                if item is not None:
                    await self._feed_item(item)
        elif isinstance(event, ResponseDone):
            self._on_done(event, protocol)
        elif isinstance(event, SpeechStarted):
            self._on_speech(protocol)
        elif isinstance(event, UserTranscript):
            turn = self.session.turn
            self._user_said = event.text
            if self.session.watched:
                self.session.emit(
                    Transcript(turn_id=turn.turn_id if turn else "", role="user", text=event.text)
                )
        elif isinstance(event, CallsCancelled):
            for call_id in event.call_ids:
                self._cancelled.add(call_id)
                self._completed.pop(call_id, None)
        elif isinstance(event, Settled):
            self._settling.send("settle")
            held, self._held = self._held, []
            self._answer([r for r in held if r.call_id not in self._cancelled], respond=False)
        elif isinstance(event, UpstreamError):
            log.warning("session %s: the realtime model says: %s%s", self.session.session_id,
                        event.message, f" ({event.code})" if event.code else "")  # fmt: skip
            if event.fatal:
                raise Fatal(event.message)

    def _on_started(self, rid: str, protocol: RealtimeProtocol) -> None:
        if rid in self._over:
            return
        state = self.state
        if state == "unwanted":
            self._move("started")  # cancelling: it is cancelled as soon as it exists
            self._over.add(rid)
            self._active = rid
            self._send(protocol.cancel())
            return
        if not self._move("started"):
            log.debug("session %s: response %s started in state %s: dropped",
                      self.session.session_id, rid, state)  # fmt: skip
            self._over.add(rid)
            return
        self._active = rid
        self._live_calls.clear()
        self._voice.new_response()
        if state == "requested" and self._awaiting is not None:
            self._feed_turn, self._feed = self._awaiting
            self._awaiting = None
            return
        # The model's own response (its voice detector heard the user): a new turn.
        send, receive = trio.open_memory_channel[FeedItem](FEED_SIZE)
        text, self._user_said = self._user_said or "", None
        turn = self.session.open_model_turn(text)
        self._asked.add(turn.turn_id)
        self._opened[turn] = receive
        self._feed, self._feed_turn = send, turn

    def _implicit_start(self, rid: str, protocol: RealtimeProtocol) -> bool:
        """An event of a response never announced (a real server's quirk: no
        ``response.created``): taken as its start when one is awaited."""
        if rid in self._over or self._active is not None:
            return False
        if not self.machine.can("started"):
            return False
        self._on_started(rid, protocol)
        # active now, responding or being cancelled (it was unwanted): its events go on to
        # count its calls (answered INTERRUPTED if completed); nothing of it reaches a turn
        return self._active == rid

    def _filter_call(self, event: ModelEvent) -> ModelEvent | None:
        """Drop a call delivered twice, and fragments of calls not live in this response."""
        if isinstance(event, CallStart):
            if event.call_id in self._call_ids:
                log.debug("session %s: call %s delivered again: dropped",
                          self.session.session_id, event.call_id)  # fmt: skip
                return None
            if len(self._live_calls) >= ITEMS_KEPT:  # a response that never ends its calls
                log.debug("session %s: call %s dropped (too many calls open in a response)",
                          self.session.session_id, event.call_id)  # fmt: skip
                return None
            self._call_ids.add(event.call_id)
            self._live_calls[event.call_id] = event.name
        elif isinstance(event, CallDelta | CallEnd):
            if event.call_id not in self._live_calls:
                log.debug("session %s: an event of call %s dropped (not live)",
                          self.session.session_id, event.call_id)  # fmt: skip
                return None
            if isinstance(event, CallEnd):
                name = self._live_calls.pop(event.call_id)
                self._known.add(event.call_id)
                if self._feed is None:  # no turn takes it (it ended, or was cut first)
                    self._orphans([_interrupted(event.call_id, name, event.arguments)])
                    return None
                self._completed[event.call_id] = (name, self._feed_turn)
        return event

    async def _feed_item(self, item: FeedItem) -> None:
        feed = self._feed
        if feed is None:
            return  # the step stopped taking them (an interrupt): dropped
        try:
            await feed.send(item)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            turn = self._feed_turn
            self._feed = None
            if not isinstance(item, CallEnd):
                return
            entry = self._completed.get(item.call_id)
            if entry is not None and turn is not None and turn.state in _ENDED:
                del self._completed[item.call_id]  # its turn ended before it came
                self._orphans([_interrupted(item.call_id, entry[0], item.arguments)])

    def _on_audio(self, event: AudioOut) -> None:
        turn = self._feed_turn
        if turn is None or self._feed is None:
            return
        rate = self.model.output_rate
        self._voice.sent(turn, event.item_id, len(event.pcm) / 2 / rate * 1000)
        if self.session.watched:
            self.session.emit(AudioDelta(turn_id=turn.turn_id, pcm=event.pcm, sample_rate=rate))

    def _on_done(self, event: ResponseDone, protocol: RealtimeProtocol) -> None:
        rid = event.response_id
        if rid != self._active:
            if rid in self._over:
                return
            if self.state == "unwanted":  # it ended before we saw it start: nothing to cancel
                self._move("done")
                self._over.add(rid)
                return
            if not self._implicit_start(rid, protocol):
                return
        self._over.add(rid)
        self._active = None
        self._move("done")
        feed, self._feed, self._feed_turn = self._feed, None, None
        if feed is None:
            return
        item: FeedItem = _END
        if event.status == "failed":
            item = _Failed(f"the model's response failed: {event.message or 'no reason given'}")
        try:
            feed.send_nowait(item)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        feed.close()

    def _on_speech(self, protocol: RealtimeProtocol) -> None:
        """The model heard the user start speaking: barge-in from the model."""
        state = self.state
        turn = self.session.turn
        if protocol.answers_wait_for_settled:
            self._settling.send("heard")  # the ids it cancels, if any, come before it settles
            self._cancelled = RecentSet(IDS_KEPT)
        if turn is not None and turn.state not in _ENDED:
            self._truncate(None, protocol)
            turn.interrupt(by_model=True)
        if state == "requested" and not protocol.cancels:
            self._move("forget")
        else:
            self._move("speech")
        self._drop_awaiting()
        self._stop_feed()

    # -- what the turns ask -----------------------------------------------------------------------

    async def step(self, turn: Turn, request: ModelRequest) -> AsyncIterator[FeedItem]:
        """One step of ``turn``: the events of one response, up to its end."""
        receive = self._opened.pop(turn, None)
        if receive is None:
            if self._broken is turn:
                self._broken = None
                raise ModelError("the connection to the model was lost")
            receive = await self._request(turn, request)
        timeout = self.model.timeout
        async with receive:
            while True:
                with trio.move_on_after(timeout) as waited:
                    try:
                        item = await receive.receive()
                    except trio.EndOfChannel:
                        return  # an interrupt stopped the feed (the turn's scope is cancelled)
                if waited.cancelled_caught:
                    self._abandon_request(turn)
                    raise ModelError(f"the model sent nothing for {timeout:g} s")
                if isinstance(item, _End):
                    return
                if isinstance(item, _Failed):
                    raise ModelError(item.message)
                yield item

    async def _request(
        self, turn: Turn, request: ModelRequest
    ) -> trio.MemoryReceiveChannel[FeedItem]:
        """Send the text or the previous step's results and ask for the next response."""
        with trio.move_on_after(self.model.timeout):
            while self.state != "idle":
                await self._changed.wait()
        await trio.lowlevel.checkpoint_if_cancelled()  # an interrupt while it waited wins
        state = self.state
        if not self._move("create"):  # the machine says whether a request may go now
            why = self.failure or f"the model's connection is {state}"
            raise ModelError(f"the model is not ready: {why}")
        protocol = self.protocol
        assert protocol is not None
        if request.step == 1:
            self._send(protocol.user_text(turn.text))
            self._asked.add(turn.turn_id)
        else:
            records = [
                item
                for item in request.history
                if isinstance(item, CallRecord) and item.call_id in self._completed
            ]
            self._answer(records, respond=True)
        send, receive = trio.open_memory_channel[FeedItem](FEED_SIZE)
        self._awaiting = (turn, send)
        return receive

    def _answer(self, records: Sequence[CallRecord], *, respond: bool) -> None:
        """One answer per record upstream (records the model session does not know, after a
        reconnect, as seeded history), then, if ``respond``, a request for a response."""
        protocol = self.protocol
        if protocol is None or self.state in ("connecting", "lost", "closed"):
            return
        for record in records:
            self._completed.pop(record.call_id, None)
        known = [r for r in records if r.call_id in self._known]
        unknown = [r for r in records if r.call_id not in self._known]
        if unknown:
            self._send(protocol.seed(self._seed(unknown)))
        if known:
            self._send(protocol.answers(known, respond=False))
        if respond:
            self._send(protocol.respond())

    def turn_ended(self, turn: Turn, records: Sequence[CallRecord], status: str) -> None:
        """``turn`` ended: its calls the model completed and nobody answered get their
        answers now, with no request for a response (Gemini, after an interrupt: once it
        says which it cancelled)."""
        self._opened.pop(turn, None)
        self._abandon_request(turn)
        if self._broken is turn:
            self._broken = None
        pending = [r for r in records if r.call_id in self._completed]
        taken = {r.call_id for r in records}
        cut = [  # completed, fed to this turn, never taken by it (it was cut first)
            _interrupted(call_id, name, None)
            for call_id, (name, fed) in self._completed.items()
            if fed is turn and call_id not in taken
        ]
        for record in cut:
            self._completed.pop(record.call_id, None)
        if cut:
            self._orphans(cut)
        if not pending:
            return
        if status == "interrupted" and self._unsettled:  # Gemini heard the user
            for record in pending:
                self._completed.pop(record.call_id, None)
            self._held.extend(pending)
            return
        self._answer([r for r in pending if r.call_id not in self._cancelled], respond=False)

    def _abandon_request(self, turn: Turn) -> None:
        """``turn`` stopped waiting for the response it asked for (its step timed out, or
        it ended): the request is forgotten, so the next one may go; a response that comes
        after all starts from ``idle``, as one of the model's own (a new turn), rather than
        feeding a turn that is gone or being cancelled as unwanted."""
        if self._awaiting is None or self._awaiting[0] is not turn:
            return
        self._drop_awaiting()
        if self.state in ("requested", "unwanted"):
            self._move("forget")

    def _orphans(self, records: list[CallRecord]) -> None:
        """Calls the model completed that no turn will answer: INTERRUPTED, now (Gemini,
        after it heard the user: once it settles, less the ids it cancelled)."""
        if self._unsettled:
            self._held.extend(records)
        else:
            self._answer([r for r in records if r.call_id not in self._cancelled], respond=False)

    def interrupted(self, heard_ms: int | None) -> None:
        """The app interrupted the turn: cancel the active response, or make a requested one
        unwanted; truncate the assistant's audio to what the user heard."""
        protocol = self.protocol
        if protocol is None:
            return
        state = self.state
        self._truncate(heard_ms, protocol)
        if state == "responding":
            self._move("interrupt")
            self._send(protocol.cancel())
        elif state == "requested" and not protocol.cancels:
            self._move("forget")
        else:
            self._move("interrupt")
        self._drop_awaiting()
        self._stop_feed()

    def _truncate(self, heard_ms: int | None, protocol: RealtimeProtocol) -> None:
        """Truncate the audio item holding the point the user heard to (``heard_ms`` into
        the turn's audio; None: all that was sent), never past what was sent of it: the
        active response's, or with ``heard_ms`` the last response's of the open turn (one
        that ended on a call: its voice still plays while the call runs, and the model
        must not keep what the user never heard)."""
        cut = self._voice.cut(heard_ms, active=self._active is not None, turn=self.session.turn)
        if cut is not None:
            self._send(protocol.truncate(*cut))

    def _stop_feed(self) -> None:
        """The open turn is interrupted: the rest of its response is dropped."""
        if self._feed is not None:
            self._feed.close()
        self._feed = self._feed_turn = None

    def _drop_awaiting(self) -> None:
        if self._awaiting is not None:
            self._awaiting[1].close()
            self._awaiting = None


def _interrupted(call_id: str, name: str, arguments: Any) -> CallRecord:
    """The answer of a call the model completed after its turn stopped taking calls."""
    return CallRecord(
        call_id=call_id,
        name=name,
        kind="server",
        arguments=arguments if arguments is not None else {},
        result=ToolResult(
            ok=False,
            code=ResultCode.INTERRUPTED,
            message="the user interrupted the turn before the call ran",
        ),
    )
