"""The client's side of vrt/1, sans-IO: handshake, the epoch gate, the call views and the
serial app-tool queue.

Every call the server streams has a CallView machine here, so the app never sees two
terminal phases for one call: :meth:`ClientProtocol.interrupt` cancels every open view at
once, locally, and the server's own ``cancelled`` for the same call is then refused by the
machine and dropped. Every ``tool.call`` has an AppCall machine: the epoch gate answers a
stale one INTERRUPTED at once; current ones queue and :meth:`next_app_call` hands them out
one at a time, in arrival order, only after the previous one has its result. With
``audio-v1`` the same epoch gates the model's voice (:class:`~vrt._wire.audio.Gate`): a
binary frame reaches the app only inside its turn's ``audio.start``/``audio.end`` span and
only while that turn's epoch is the client's, so the audio of an interrupted turn still on
the wire is dropped the moment :meth:`ClientProtocol.interrupt` raises the epoch.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Sequence
from typing import Any

import attrs

from vrt._core.bounded import RecentSet
from vrt._core.events import (
    AudioDelta,
    Closed,
    Phase,
    TextSoFar,
    ToolPreview,
    ToolStream,
    Transcript,
    TurnEnded,
    TurnStarted,
)
from vrt._core.events import TextDelta as TextDeltaEvent
from vrt._core.previews import Previews
from vrt._core.results import ResultCode, ToolResult
from vrt._core.tables import APP_CALL, CALL_VIEW, CONNECTION, Machine, StrictMachine
from vrt._errors import InvalidTransition
from vrt._wire import codec
from vrt._wire import messages as m
from vrt._wire.audio import AudioInfo, Gate, refusal
from vrt._wire.endpoint import Endpoint, FrameTooLarge

_VIEW_EVENT = {
    Phase.ARGUMENTS_DELTA: "delta",
    Phase.ARGUMENTS_COMPLETE: "complete",
    Phase.PROGRESS: "progress",
    Phase.SETTLED: "settle",
    Phase.CANCELLED: "cancel",
    Phase.FAILED: "fail",
}


@attrs.frozen(kw_only=True)
class AppCallTicket:
    """An app call the runner should run now."""

    call_id: str
    turn_id: str
    epoch: int
    name: str
    arguments: Any


@attrs.frozen(kw_only=True)
class AbortApp:
    """The running app call must stop (server ``tool.abort`` or a local interrupt)."""

    call_id: str
    reason: str
    """The app tool's ``ctx.signal.reason``: ``interrupted``, ``timeout``, ``aborted`` (the
    server gave up on the call) or ``closed``."""


@attrs.frozen(kw_only=True)
class Welcomed:
    """The handshake finished (``resumed``: a resume did)."""

    session_id: str
    capabilities: tuple[str, ...]
    resumed: bool = False


ANSWERS_KEPT = 100
"""App-call results kept to answer a repeated ``tool.call`` without running it again.

A replayed frame is dropped by its seq before this is looked at; the store answers a
``tool.call`` sent again under a new seq, which comes soon after the first or not at all.
Each result is kept whole, so the bound is what a long session's client holds (1,000 took
~1 kB a turn for 500 turns in bench/load.py's soak)."""


class _View:
    """A call as the app sees it: its CallView machine, its first event (the template of a
    local ``cancelled``), and with local previews the arguments' text so far."""

    __slots__ = ("chars", "first", "fragments", "machine", "text")

    def __init__(self, first: ToolStream) -> None:
        self.machine: Machine | StrictMachine = CALL_VIEW.new()
        self.first = first
        self.fragments: list[str] = []
        self.chars = 0
        self.text: str | None = None  # the whole text, once complete

    def preview(self, event: ToolStream) -> ToolPreview:
        """The legacy preview that follows ``event`` (``local-preview-v1``): what the
        server's engine would have sent (the text so far, read lazily; once complete, the
        text of the fragments, or of the arguments when none came)."""
        if event.phase is Phase.ARGUMENTS_DELTA and event.delta:
            if self.chars < PREVIEW_KEPT:  # a server that never completes: bounded here
                self.fragments.append(event.delta)
                self.chars += len(event.delta)
        elif event.phase is Phase.ARGUMENTS_COMPLETE and self.text is None:
            self.text = (
                "".join(self.fragments) if self.fragments else _arguments_text(event.arguments)
            )
            self.fragments = []
        text = self.text
        return ToolPreview(
            call_id=event.call_id,
            turn_id=event.turn_id,
            name=event.name,
            arguments=text
            if text is not None
            else TextSoFar(self.fragments, len(self.fragments), self.chars),
            complete=text is not None,
        )


def _arguments_text(arguments: Any) -> str:
    """The JSON text of arguments that came whole (the engine's ``json.dumps``); raw text
    that did not parse stays as it is."""
    if isinstance(arguments, str):
        try:
            json.loads(arguments)
        except ValueError:
            return arguments
    return json.dumps(arguments)


PREVIEW_KEPT = 1 << 20
"""Characters of a call's arguments a local preview keeps (the server sends at most an
eighth of its max_message_size)."""


class _AppCall:
    __slots__ = ("machine", "message")

    def __init__(self, message: m.ToolCallMessage) -> None:
        self.message = message
        self.machine: Machine | StrictMachine = APP_CALL.new()


MESSAGE_KEPT = 1000
"""Characters of an app tool's failure message sent to the server (the rest is cut)."""


class ClientProtocol(Endpoint):
    """One client's protocol state."""

    def __init__(
        self, tools: Sequence[m.ToolDecl] = (), capabilities: Sequence[str] = m.CAPABILITIES
    ) -> None:
        super().__init__()
        self.connection = CONNECTION.new()
        self.tools = tuple(tools)
        self.offered = tuple(capabilities)
        self.capabilities: tuple[str, ...] = ()
        self.session_id: str | None = None
        self.resume_token: str | None = None
        self.epoch = 0
        self.turn_id: str | None = None
        self.turn_epoch = 0
        """The epoch of the last turn started (:attr:`turn_id`)."""
        self.audio: AudioInfo | None = None
        """The session's audio, once ``audio-v1`` is negotiated."""
        self.gate = Gate()
        """Which of the server's audio frames the app gets (``audio-v1``)."""
        self.views: dict[str, _View] = {}
        self.local_previews = False
        """``local-preview-v1`` (with ``tool-stream-v1``) was negotiated: previews are made
        here, from ``tool.stream``."""
        self._previews = Previews()
        # calls begun by a turn the user already interrupted (the newest: a bound)
        self._ignored: RecentSet[str] = RecentSet(1000)
        self.app_calls: dict[str, _AppCall] = {}
        self.queue: deque[str] = deque()
        self.running: str | None = None
        self.answers: dict[str, m.WireResult] = {}  # call id -> result sent, oldest first
        self.open_turn: str | None = None
        """The turn the app saw start and not end (``handover-v1`` reports it on resume)."""
        self._ended: RecentSet[str] = RecentSet(100)
        """Turns whose ``turn.ended`` the app saw: a second one (a server that adopted the
        session after a crash may end a turn again) is dropped."""

    # -- the app's actions ------------------------------------------------------------------------

    def hello(self) -> None:
        """Queue the ``hello`` that opens the session."""
        self.send(m.Hello, protocol=m.PROTOCOL, capabilities=self.offered, tools=self.tools)

    def lost(self) -> None:
        """The connection is gone: ``reconnecting``. Queued frames are dropped; every
        numbered one is kept for replay."""
        self.connection.send("lost")
        self.outbox.clear()

    def resume_hello(self) -> None:
        """Queue the ``hello`` that resumes the session on a new connection.

        It is outside the session's numbering (seq 0): it belongs to this connection.
        """
        assert self.session_id is not None
        assert self.resume_token is not None
        self.outbox.clear()
        self.send_unnumbered(
            m.Hello,
            protocol=m.PROTOCOL,
            capabilities=self.offered,
            tools=(),  # the session's tools were declared when it began: a small hello
            resume=m.ResumeRequest(
                session_id=self.session_id, token=self.resume_token, last_seq=self.received_seq
            ),
            open=self.held_open() if m.HANDOVER_V1 in self.capabilities else (),
        )

    def held_open(self) -> tuple[m.OpenCall, ...]:
        """What the app holds open (``handover-v1``): each call without a terminal phase,
        and the open turn if none of them is of it, so that a server that adopts the
        session from an earlier save can end them."""
        held = [
            m.OpenCall(
                turn_id=view.first.turn_id,
                call_id=call_id,
                name=view.first.name,
                kind=view.first.kind,
            )
            for call_id, view in self.views.items()
        ][: m.OPEN_LIMIT - 1]
        turn = self.open_turn
        if turn is not None and all(entry.turn_id != turn for entry in held):
            held.append(m.OpenCall(turn_id=turn))
        return tuple(held)

    def send_input(self, text: str) -> None:
        """Queue user input (a new turn; the server interrupts an open one first)."""
        self.send(m.Input, text=text)

    def interrupt(self, heard_ms: int | None = None) -> list[Any]:
        """The user interrupted: raise the epoch, cancel every open call locally at once.

        Returns the ``cancelled`` events (one per open call) and, if an app tool is
        running, an :class:`AbortApp` for it; queued app calls are dropped. Then queues the
        ``interrupt`` message for the server, with ``heardMs`` when ``heard_ms`` is given
        and ``audio-v1`` was negotiated (a server without it would refuse the field, and
        the interrupt with it). From now on the interrupted turn's audio is dropped (the
        epoch gate).
        """
        self.epoch += 1
        out: list[Any] = []
        for call_id, view in list(self.views.items()):
            view.machine.send("cancel")
            del self.views[call_id]
            self._previews.forget(call_id)
            self._ignored.add(call_id)
            # No preview follows (with local previews too): the legacy wire's own preview
            # of this moment never reaches the app, the call being ignored from here on.
            out.append(attrs.evolve(view.first, phase=Phase.CANCELLED))
        out.extend(self.abort_all("interrupted"))
        heard = heard_ms if self.audio is not None else None
        self.send(m.Interrupt, epoch=self.epoch, heard_ms=heard)
        return out

    def next_app_call(self) -> AppCallTicket | None:
        """The next queued app call, now running; None if one runs or none waits."""
        if self.running is not None or not self.queue:
            return None
        call_id = self.queue.popleft()
        call = self.app_calls[call_id]
        call.machine.send("begin")
        self.running = call_id
        msg = call.message
        return AppCallTicket(
            call_id=call_id,
            turn_id=msg.turn_id,
            epoch=msg.epoch,
            name=msg.name,
            arguments=msg.arguments,
        )

    def answer(self, call_id: str, result: ToolResult) -> bool:
        """The running app call has its result: send it, unless the call was aborted."""
        call = self.app_calls.pop(call_id, None)
        if self.running == call_id:
            self.running = None
        if call is None or call.machine.final:
            return False  # aborted (interrupt or tool.abort): the server already settled it
        call.machine.send("answer")
        self._result(call.message, result)
        return True

    def confirm_reply(self, call_id: str, approved: bool, reason: str | None = None) -> None:
        """Answer a ``confirm.request``."""
        self.send(m.ConfirmReply, call_id=call_id, approved=approved, reason=reason)

    def close(self) -> None:
        """End the session for good."""
        self.send(m.Close)

    # -- the server's messages --------------------------------------------------------------------

    def receive(self, frame: str | bytes) -> list[Any]:
        """Process one frame; return what the app and the runner must see."""
        if not isinstance(frame, str) and self.audio is not None:
            return self._audio(frame)
        try:
            data = codec.parse(frame)
        except codec.DecodeError as exc:
            return [_broken(exc)]
        if type(data) is list and self.batching:
            if not data:
                return [
                    m.Error(seq=0, code=m.BAD_MESSAGE, message="from the server: an empty batch")
                ]
            out: list[Any] = []
            for item in data:
                shown = self._message(item, "a batch's message")
                out.extend(shown)
                if shown and type(shown[-1]) is Closed:
                    break  # ``closed`` is the last word: nothing after it is read
            return out
        return self._message(data, "a frame")

    def _audio(self, frame: bytes) -> list[Any]:
        """``audio-v1``: a binary frame is the model's voice, for the app if the gate lets
        it through (its turn's span is open and its epoch is the client's)."""
        assert self.audio is not None
        rate = self.audio.output_rate
        problem = refusal(len(frame), rate)
        if problem is not None:
            return [m.Error(seq=0, code=problem[0], message=f"from the server: {problem[1]}")]
        turn_id = self.gate.admits(self.epoch)
        if turn_id is None:
            if not self.gate.open:
                text = "from the server: an audio frame outside an audio.start/audio.end span"
                return [m.Error(seq=0, code=m.BAD_MESSAGE, message=text)]
            return []  # it crossed an interrupt: the user must not hear it
        return [AudioDelta(turn_id=turn_id, pcm=bytes(frame), sample_rate=rate)]

    def _message(self, data: Any, what: str) -> list[Any]:
        try:
            if not isinstance(data, dict):
                raise codec.DecodeError(m.BAD_MESSAGE, f"{what} must be a JSON object")
            message = codec.structure(data, m.SERVER_TYPES)
            if self.audio is None and isinstance(message, _AUDIO_MESSAGES):
                # audio-v1 not negotiated: these are not messages of this session's protocol
                shown = message.TYPE
                raise codec.DecodeError(m.UNKNOWN_TYPE, f"unknown message type {shown!r}")
        except codec.DecodeError as exc:
            return [_broken(exc)]
        if isinstance(message, m.Ack):
            if not self.peer_acked(message.seq):
                text = f"from the server: ack {message.seq} is above our last seq {self.sent_seq}"
                return [m.Error(seq=0, code=m.BAD_MESSAGE, message=text)]
            return []
        if message.seq != 0 and not self.accept(message.seq):
            return []
        handler = getattr(self, "_on_" + message.TYPE.replace(".", "_"))
        out: list[Any] = handler(message)
        return out

    def _on_welcome(self, msg: m.Welcome) -> list[Any]:
        if self.connection.state == "reconnecting" and msg.resumed:
            if msg.session_id != self.session_id:
                return [m.Error(seq=0, code=m.BAD_STATE, message="from the server: resumed "
                                "another session")]  # fmt: skip
            self.connection.send("resumed")
            self.epoch = max(self.epoch, msg.epoch)
            if msg.audio is not None and self.audio is not None:
                self.audio = AudioInfo.of(msg.audio)
            # Every message of ours after the server's lastSeq again, in order.
            self.peer_acked(msg.last_seq)
            self.outbox.extend(frame for seq, frame in self.replay if seq > msg.last_seq)
            self.ack_state_reset()
            return [
                Welcomed(session_id=msg.session_id, capabilities=self.capabilities, resumed=True)
            ]
        if self.connection.state != "connecting" or msg.resumed:
            return [m.Error(seq=0, code=m.BAD_STATE, message="from the server: a second welcome")]
        self.connection.send("welcome")
        self.session_id, self.resume_token = msg.session_id, msg.resume_token
        # The intersection, as the protocol says: a server that grants what was never
        # offered (a broken one) does not switch on what this client did not ask for.
        offered = self.offered
        caps = tuple(c for c in msg.capabilities if c in offered)
        broken: list[Any] = []
        if m.AUDIO_V1 in caps:
            if msg.audio is None:  # a broken server: no rates, no audio
                caps = tuple(c for c in caps if c != m.AUDIO_V1)
                text = "from the server: audio-v1 without the audio rates"
                broken.append(m.Error(seq=0, code=m.BAD_MESSAGE, message=text))
            else:
                self.audio = AudioInfo.of(msg.audio)
        self.capabilities, self.epoch = caps, max(self.epoch, msg.epoch)
        self.batching = m.BATCH_V1 in caps
        self.local_previews = m.local_previews(caps)
        return [*broken, Welcomed(session_id=msg.session_id, capabilities=caps)]

    def _on_turn_started(self, msg: m.TurnStartedMessage) -> list[Any]:
        self.epoch = max(self.epoch, msg.epoch)
        self.turn_id, self.turn_epoch = msg.turn_id, msg.epoch
        self.open_turn = msg.turn_id
        return [TurnStarted(turn_id=msg.turn_id, epoch=msg.epoch)]

    def _on_turn_ended(self, msg: m.TurnEndedMessage) -> list[Any]:
        self.epoch = max(self.epoch, msg.epoch)
        if msg.turn_id in self._ended:
            return []  # ended already (an adopting server ends what it cannot know ended)
        self._ended.add(msg.turn_id)
        if self.open_turn == msg.turn_id:
            self.open_turn = None
        self.gate.end(msg.turn_id)  # (a turn a server adopted after a crash may not say)
        return [TurnEnded(turn_id=msg.turn_id, epoch=msg.epoch, reason=msg.reason)]

    def _on_text_delta(self, msg: m.TextDeltaMessage) -> list[Any]:
        return [TextDeltaEvent(turn_id=msg.turn_id, text=msg.text)]

    def _on_audio_start(self, msg: m.AudioStart) -> list[Any]:
        self.gate.start(msg.turn_id, msg.epoch)
        return []

    def _on_audio_end(self, msg: m.AudioEnd) -> list[Any]:
        self.gate.end(msg.turn_id)
        return []

    def _on_transcript(self, msg: m.TranscriptMessage) -> list[Any]:
        if msg.role == "agent" and msg.turn_id == self.turn_id and self.turn_epoch < self.epoch:
            return []  # the words of audio the epoch gate drops: the user never heard them
        return [Transcript(turn_id=msg.turn_id, role=msg.role, text=msg.text)]

    def _on_tool_stream(self, msg: m.ToolStreamMessage) -> list[Any]:
        call_id = msg.call_id
        if call_id in self._ignored:
            return []
        phase = Phase(msg.phase)
        event = ToolStream(
            call_id=call_id,
            turn_id=msg.turn_id,
            epoch=msg.epoch,
            name=msg.name,
            kind="app" if msg.kind == "app" else "server",
            phase=phase,
            delta=msg.delta,
            arguments=msg.arguments,
            progress=msg.progress,
            ok=msg.ok,
            code=None if msg.code is None else ResultCode(msg.code),
            message=msg.message,
        )
        if phase is Phase.START:
            if call_id in self.views or msg.epoch < self.epoch:
                self._ignored.add(call_id)  # a call of a turn the user already interrupted
                return []
            view = self.views[call_id] = _View(event)
            return self._shown(view, event)
        found = self.views.get(call_id)
        if found is None:
            return []  # already final here (cancelled locally): the late phase is dropped
        view = found
        try:
            view.machine.send(_VIEW_EVENT[phase])
        except InvalidTransition:
            return [
                m.Error(
                    seq=0,
                    code=m.BAD_MESSAGE,
                    message=f"from the server: {phase} while call {call_id} is "
                    f"{view.machine.state}",
                )
            ]
        shown = self._shown(view, event)
        if not view.machine.final:
            return shown
        del self.views[call_id]
        # The app saw this call end: a queued tool.call for it must never run (tool.abort
        # may still be on its way, after the running call's result).
        reason = (
            "interrupted"
            if phase is Phase.CANCELLED
            else "timeout"
            if event.code is ResultCode.TIMEOUT
            else "aborted"
        )
        return [*shown, *self._abort(call_id, reason)]

    def _shown(self, view: _View, event: ToolStream) -> list[Any]:
        """``event``, and with local previews the preview that follows it when the server
        would have sent one (the same :class:`Previews` choice as its own)."""
        if not self.local_previews:
            return [event]
        self._previews.stream(event)
        preview = view.preview(event)
        return [event, preview] if self._previews.wanted(preview) else [event]

    def _on_tool_preview(self, msg: m.ToolPreviewMessage) -> list[Any]:
        if msg.call_id in self._ignored or self.local_previews:
            return []  # with local previews, made here: a server's own would be shown twice
        return [
            ToolPreview(
                call_id=msg.call_id,
                turn_id=msg.turn_id,
                name=msg.name,
                arguments=msg.arguments,
                complete=msg.complete,
            )
        ]

    def _on_tool_call(self, msg: m.ToolCallMessage) -> list[Any]:
        if msg.call_id in self.app_calls:
            return []  # the same call again (a replay): it runs once
        answer = self.answers.get(msg.call_id)
        if answer is not None:  # it ran already: its stored result again, never a rerun
            self.send(m.ToolResultMessage, call_id=msg.call_id, epoch=msg.epoch, result=answer)
            return []
        call = _AppCall(msg)
        if msg.epoch != self.epoch:  # the epoch gate
            call.machine.send("stale")
            self._result(
                msg, ToolResult.failure(ResultCode.INTERRUPTED, "the call's turn was interrupted")
            )
            return []
        call.machine.send("admit")
        self.app_calls[msg.call_id] = call
        self.queue.append(msg.call_id)
        return []

    def _on_tool_abort(self, msg: m.ToolAbort) -> list[Any]:
        return self._abort(msg.call_id, "aborted")

    def _abort(self, call_id: str, reason: str) -> list[Any]:
        """Abort one app call: a queued one is dropped, a running one must stop."""
        call = self.app_calls.get(call_id)
        if call is None or call.machine.final:
            return []
        call.machine.send("abort")
        if self.running == call_id:
            return [AbortApp(call_id=call_id, reason=reason)]
        self.queue.remove(call_id)
        del self.app_calls[call_id]
        return []

    def abort_all(self, reason: str) -> list[Any]:
        """The session ended: drop every queued app call and stop the running one."""
        while self.queue:
            self.app_calls.pop(self.queue.popleft()).machine.send("abort")
        if self.running is None:
            return []
        return self._abort(self.running, reason)

    def _on_confirm_request(self, msg: m.ConfirmRequestMessage) -> list[Any]:
        if msg.call_id in self._ignored:
            return []
        return [msg]

    def _on_error(self, msg: m.Error) -> list[Any]:
        return [msg]

    def _on_closed(self, msg: m.ClosedMessage) -> list[Any]:
        if not self.connection.final:
            self.connection.send("close")
        return [*self.abort_all("closed"), Closed(reason=msg.reason)]

    def _result(self, msg: m.ToolCallMessage, result: ToolResult) -> None:
        wire = m.WireResult(
            ok=result.ok,
            output=result.output if result.ok else None,
            code=None if result.code is None else str(result.code),
            message=None if result.message is None else result.message[:MESSAGE_KEPT],
        )
        try:
            self.send(m.ToolResultMessage, call_id=msg.call_id, epoch=msg.epoch, result=wire)
        except FrameTooLarge:  # an output the server would refuse: a result it takes
            wire = m.WireResult(
                ok=False,
                code=str(ResultCode.FAILED),
                message=f"the app tool's output is over the frame limit ({self.max_frame} bytes)",
            )
            self.send(m.ToolResultMessage, call_id=msg.call_id, epoch=msg.epoch, result=wire)
        answers = self.answers
        answers[msg.call_id] = wire
        if len(answers) > ANSWERS_KEPT:
            del answers[next(iter(answers))]


_AUDIO_MESSAGES = (m.AudioStart, m.AudioEnd, m.TranscriptMessage)
"""The messages of ``audio-v1``: unknown types in a session without it (as vrt.js says)."""


def _broken(exc: codec.DecodeError) -> m.Error:
    """A frame from a broken server: nothing to answer it with; surfaced, then dropped."""
    return m.Error(seq=0, code=exc.code, message=f"from the server: {exc.message}")
