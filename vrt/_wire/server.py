"""The server's side of vrt/1, sans-IO: handshake, capability negotiation, frame checks.

:meth:`ServerProtocol.receive` takes one frame and returns the messages the session must
act on; every protocol error (bad JSON, unknown type, schema, oversize, input before hello)
is answered here, in :attr:`outbox`, and never reaches the session. Once ``audio-v1`` is
negotiated (offered only with the rates of the agent's realtime model), a binary frame that
keeps the audio rules (:mod:`vrt._wire.audio`) is the user's voice,
:class:`~vrt._wire.audio.AudioIn`.

It also keeps the books of the app calls it sends (:meth:`ServerProtocol.send_call`): which
``tool.result`` is awaited, in which epoch, and what became of the others, so that a late,
stale, duplicate or unknown result gets its error here (:meth:`ServerProtocol.take_result`)
and the session only ever sees the one result of an awaited call.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from vrt._core.bounded import RecentSet
from vrt._core.events import TERMINAL_PHASES
from vrt._core.schema import check_parameters
from vrt._core.tables import SESSION
from vrt._errors import DefinitionError
from vrt._wire import codec
from vrt._wire import messages as m
from vrt._wire.audio import AudioIn, AudioInfo, refusal
from vrt._wire.endpoint import REPLAY_LIMIT, REPLAY_LIMIT_BYTES, Endpoint

MAX_MESSAGE_SIZE = 1 << 20
MAX_APP_TOOLS = 128
"""App tools one hello may declare (checking each schema costs ~0.25 ms of the loop)."""
REMEMBERED_CALLS = 1000
"""App calls whose fate the books keep (answered, sent, lost), newest first: enough for the
error a late ``tool.result`` gets; a session that runs for days does not grow by each call."""


def replayable(
    last_seq: int, sent_seq: int, acked_by_peer: int, replay: Collection[tuple[int, str]]
) -> bool:
    """Whether a client that processed up to ``last_seq`` can be replayed the rest by a
    side that sent up to ``sent_seq``, was acked up to ``acked_by_peer`` and keeps
    ``replay`` (its unacked messages, oldest first)."""
    if last_seq > sent_seq:
        return False  # the client claims messages never sent
    first_kept = next(iter(replay))[0] if replay else sent_seq + 1
    return last_seq >= first_kept - 1 and last_seq >= acked_by_peer


class ServerProtocol(Endpoint):
    """One connection's protocol state on the server."""

    def __init__(
        self,
        *,
        session_id: str,
        resume_token: str,
        server_tools: Collection[str],
        capabilities: Collection[str] = m.CAPABILITIES,
        max_message_size: int = MAX_MESSAGE_SIZE,
        replay_limit: int = REPLAY_LIMIT,
        replay_limit_bytes: int = REPLAY_LIMIT_BYTES,
        admit: Callable[[], bool] | None = None,
        audio: AudioInfo | None = None,
    ) -> None:
        super().__init__(replay_limit=replay_limit, replay_limit_bytes=replay_limit_bytes)
        self.offered_audio = audio
        """The rates of the agent's realtime model: ``audio-v1`` is offered only with them."""
        self.admit = admit
        """Asked before a new session is accepted; False refuses it (``RATE_LIMITED``)."""
        self.session_id = session_id
        self.resume_token = resume_token
        self.server_tools = frozenset(server_tools)
        self.supported = tuple(c for c in capabilities if c != m.AUDIO_V1 or audio is not None)
        self.max_message_size = max_message_size
        self.machine = SESSION.new()
        """The Session machine: ``handshaking`` until hello is accepted, ``open``,
        ``detached`` while no connection carries the session, ``closed``."""
        self.capabilities: tuple[str, ...] = ()
        self.frame_messages = 1
        """How many messages the last frame :meth:`receive` took carried (a batch's size:
        what a rate limit counts)."""
        self.closed_reason: str | None = None
        """Why the session closed (the ``closed`` reason), once it has."""
        self.app_tools: tuple[m.ToolDecl, ...] = ()
        # The books of app calls (see take_result).
        self._awaited: dict[str, int] = {}
        """App calls sent whose ``tool.result`` is awaited, with their epoch."""
        self._sent: RecentSet[str] = RecentSet(REMEMBERED_CALLS)
        self._answered: RecentSet[str] = RecentSet(REMEMBERED_CALLS)
        self._lost: RecentSet[str] = RecentSet(REMEMBERED_CALLS)

    @property
    def state(self) -> str:
        """The Session machine's state (``handshaking``, ``open``, ``detached``, ``closed``)."""
        return self.machine.state

    @property
    def in_session(self) -> bool:
        """The session exists: accepted and not closed (``open`` or ``detached``)."""
        return self.state in ("open", "detached")

    @property
    def audio(self) -> AudioInfo | None:
        """The session's audio, when ``audio-v1`` was negotiated (else None)."""
        return self.offered_audio if m.AUDIO_V1 in self.capabilities else None

    def receive(self, frame: str | bytes) -> list[Any]:
        """Process one frame; return the client messages the session must act on.

        A ``hello`` with ``resume`` is returned as is, not answered: which session it
        resumes is the server's to decide (:meth:`resume` on that session's protocol, or
        :meth:`refuse`).
        """
        if self.state in ("closed", "detached"):
            return []
        in_session = self.state == "open"
        self.frame_messages = 1
        if not isinstance(frame, str) and in_session and m.AUDIO_V1 in self.capabilities:
            return self._audio(frame)
        if len(frame) > self.max_message_size // 4:  # a character is at most 4 bytes
            # surrogatepass: a lone surrogate (possible in memory, never on a socket) counts
            # 3 bytes instead of raising
            size = len(frame.encode("utf-8", "surrogatepass") if isinstance(frame, str) else frame)
            if size > self.max_message_size:
                self.error(
                    m.TOO_LARGE,
                    f"frame of {size} bytes is over the limit of {self.max_message_size}",
                    numbered=in_session,
                )
                return []
        try:
            data = codec.parse(frame)
        except codec.DecodeError as exc:
            self.error(exc.code, exc.message, exc.ref, numbered=in_session)
            return []
        if type(data) is list and in_session and self.batching:
            return self._batch(data)
        return self._message(data, in_session)

    def _audio(self, frame: bytes) -> list[Any]:
        """``audio-v1``: a binary frame is the user's voice. One against the rules is
        answered (no ``ref``: it has no seq) and the session goes on."""
        info = self.offered_audio
        assert info is not None
        problem = refusal(len(frame), info.input_rate)
        if problem is not None:
            self.error(*problem)
            return []
        return [AudioIn(pcm=bytes(frame))]

    def _batch(self, items: list[Any]) -> list[Any]:
        """``batch-v1``: each message in order, as if it had come alone."""
        if not items:
            self.error(m.BAD_MESSAGE, "a batch must hold at least one message")
            return []
        if len(items) > m.BATCH_MESSAGES:
            self.error(
                m.BAD_MESSAGE,
                f"a batch holds at most {m.BATCH_MESSAGES} messages: the {len(items)} of this "
                f"one were not read",
                codec.ref_of(items[0]),  # PROTOCOL.md: the ref of the batch's first message
            )
            return []
        self.frame_messages = len(items)
        out: list[Any] = []
        for item in items:
            out.extend(self._message(item, in_session=True, batched=True))
            if self.state != "open":
                break  # closed (the client's close) or dropped: the rest is not read
        return out

    def _message(self, data: Any, in_session: bool, *, batched: bool = False) -> list[Any]:
        """One parsed message (a frame's, or one of a batch)."""
        try:
            if not isinstance(data, dict):
                what = "a batch's message" if batched else "a frame"
                raise codec.DecodeError(m.BAD_MESSAGE, f"{what} must be a JSON object")
            message = codec.structure(data, m.CLIENT_TYPES)
        except codec.DecodeError as exc:
            if in_session and exc.ref is not None and not self.accept(exc.ref):
                return []  # a replay we already answered
            self.error(exc.code, exc.message, exc.ref, numbered=in_session)
            if not in_session and exc.type == m.Hello.TYPE:
                self.close("rejected")  # an invalid hello
            return []
        if isinstance(message, m.Ack):
            if not self.peer_acked(message.seq):
                self.error(
                    m.BAD_MESSAGE,
                    f"ack {message.seq} is above the last message sent ({self.sent_seq})",
                    numbered=in_session,
                )
            return []
        if not in_session:
            if isinstance(message, m.Hello):
                return self._hello(message)
            self.error(m.BAD_STATE, f"{message.TYPE} before hello", message.seq, numbered=False)
            return []
        if not self.accept(message.seq):
            return []
        if isinstance(message, m.Hello):
            self.error(m.BAD_STATE, "hello after the handshake", message.seq)
            return []
        if isinstance(message, m.Close):
            self.close("client")
        return [message]

    def send_ack(self) -> bool:
        """Queue an ack if one is due, inside a session only: ``closed`` is the last frame
        (the server's shared ack timer may call this just after the session closed)."""
        return self.in_session and super().send_ack()

    def close(self, reason: str) -> None:
        """Send ``closed`` (final) and stop processing frames."""
        if self.machine.final:
            return
        in_session = self.in_session
        self.machine.send("close")
        self.closed_reason = reason
        if in_session:
            self.send(m.ClosedMessage, reason=reason)
        else:
            self.send_unnumbered(m.ClosedMessage, reason=reason)

    def refuse(self, code: str, text: str, ref: int | None = None) -> None:
        """Refuse the hello: ``error`` then ``closed`` (``rejected``), both outside the
        session's numbering."""
        self.error(code, text, ref, numbered=False)
        self.close("rejected")

    def drop(self) -> None:
        """The connection is gone: the session is ``detached`` and waits for a resume.

        Whatever is queued for the old connection is dropped: every numbered message is
        in the replay buffer.
        """
        self.machine.send("drop")
        self.outbox.clear()

    def hand_over(self) -> None:
        """The session moves to another process (``handover-v1``): final here, nothing
        more is sent (no ``closed``: it goes on elsewhere)."""
        self.machine.send("hand_over")
        self.outbox.clear()

    def adopt(
        self,
        *,
        capabilities: tuple[str, ...],
        tools: tuple[m.ToolDecl, ...],
        sent_seq: int,
        received_seq: int,
        acked_by_peer: int,
        replay: tuple[tuple[int, str], ...],
    ) -> None:
        """Go on with a session saved by another process (``detached`` until its client
        resumes): its capabilities (those this server still supports), app tools, seq
        numbering and unacked messages."""
        self.machine.send("adopt")
        self.capabilities = tuple(c for c in capabilities if c in self.supported)
        self.batching = m.BATCH_V1 in self.capabilities
        self.app_tools = tools
        self.sent_seq, self.received_seq, self.acked_by_peer = sent_seq, received_seq, acked_by_peer
        self.replay.extend(replay)
        self.replay_bytes = sum(len(frame) for _, frame in replay)

    def expire(self) -> None:
        """The resume window ran out while detached: closed, nothing sent."""
        self.machine.send("expire")
        self.closed_reason = "expired"
        self.outbox.clear()

    def can_resume(self, last_seq: int) -> bool:
        """Whether a client that processed up to ``last_seq`` can be replayed the rest."""
        if not self.in_session or self.overflowed:
            return False
        return replayable(last_seq, self.sent_seq, self.acked_by_peer, self.replay)

    def resume(self, hello: m.Hello, epoch: int) -> None:
        """Reattach a new connection (check :meth:`can_resume` first).

        Queues ``welcome`` (``resumed``, seq 0: it belongs to this connection, so it is
        never replayed) and then every message after the client's ``lastSeq``, in order.
        A session still ``open`` (the old connection not yet noticed dead) is taken over:
        the newest connection wins.
        """
        assert hello.resume is not None
        if self.state == "open":
            self.drop()
        self.machine.send("resume")
        self.outbox.clear()
        last_seq = hello.resume.last_seq
        self.peer_acked(last_seq)
        self.send_unnumbered(
            m.Welcome,
            session_id=self.session_id,
            resume_token=self.resume_token,
            epoch=epoch,
            capabilities=self.capabilities,
            resumed=True,
            last_seq=self.received_seq,
            audio=self._audio_spec(),
        )
        self.outbox.extend(frame for seq, frame in self.replay if seq > last_seq)
        self.ack_state_reset()

    # -- the books of app calls ------------------------------------------------------------------

    def send_call(
        self, call_id: str, turn_id: str, epoch: int, name: str, arguments: dict[str, Any]
    ) -> None:
        """Send an app call's ``tool.call`` and await its ``tool.result``
        (:class:`~vrt._wire.endpoint.FrameTooLarge` if its frame is over the client's
        limit: then nothing is sent nor awaited)."""
        self.send(
            m.ToolCallMessage,
            call_id=call_id,
            turn_id=turn_id,
            epoch=epoch,
            name=name,
            arguments=arguments,
        )
        self._awaited[call_id] = epoch
        self._sent.add(call_id)

    def end_call(self, call_id: str) -> None:
        """An app call ended on the server without the app's result (interrupted, timed
        out): if its result was awaited, ``tool.abort`` tells the app why its tool stops,
        after the call's terminal phase; a result that comes later is refused."""
        if self._awaited.pop(call_id, None) is not None:
            self.send(m.ToolAbort, call_id=call_id)

    def lose_call(self, call_id: str) -> None:
        """A call that ended with a process that died (``handover-v1``): what the client
        sends for it later (its result, its confirmation) is dropped quietly."""
        self._lost.add(call_id)

    def lost(self, call_id: str) -> bool:
        """Whether ``call_id`` ended with a process that died (see :meth:`lose_call`)."""
        return call_id in self._lost

    def take_result(self, result: m.ToolResultMessage, epoch: int) -> bool:
        """Whether ``result`` is the one awaited for its call (then it is no longer
        awaited: the call has its result). Otherwise its error is queued (nothing for a
        call lost with a dead process): ``DUPLICATE_RESULT`` for a call answered already,
        ``STALE_EPOCH`` for one sent in another epoch or interrupted since (the session is
        in ``epoch``), ``UNKNOWN_CALL`` for any other."""
        call_id = result.call_id
        awaited = self._awaited.get(call_id)
        if awaited is not None and awaited == result.epoch:
            del self._awaited[call_id]
            self._answered.add(call_id)
            return True
        if awaited is not None:
            code = m.STALE_EPOCH
            text = f"call {call_id!r} runs in epoch {awaited}, not {result.epoch}"
        elif call_id in self._lost:
            return False  # a call of the turn a crashed node ran: already ended, quietly
        elif call_id in self._answered:
            code, text = m.DUPLICATE_RESULT, f"call {call_id!r} already has its result"
        elif call_id in self._sent and result.epoch < epoch:
            code, text = m.STALE_EPOCH, f"call {call_id!r} was interrupted (epoch {epoch})"
        else:
            code, text = m.UNKNOWN_CALL, f"no open app call {call_id!r}"
        self.error(code, text, result.seq)
        return False

    def ended_since(self, last_seq: int) -> tuple[set[str], set[str]]:
        """The calls (a terminal ``tool.stream``) and turns (``turn.ended``) that the
        messages of the replay buffer numbered above ``last_seq`` end: what a client that
        processed up to ``last_seq`` learns from the replay."""
        calls: set[str] = set()
        turns: set[str] = set()
        for seq, frame in self.replay:
            if seq <= last_seq:
                continue
            message = codec.parse(frame)  # our own frames: valid JSON objects
            kind = message.get("type")
            if kind == m.TurnEndedMessage.TYPE:
                turns.add(message["turnId"])
            elif kind == m.ToolStreamMessage.TYPE and message.get("phase") in TERMINAL_PHASES:
                calls.add(message["callId"])
        return calls, turns

    def _hello(self, hello: m.Hello) -> list[Any]:
        problem = self._refusal(hello)
        if problem is not None:
            code, text = problem
            self.refuse(code, text, hello.seq)
            return []
        if hello.resume is not None:
            return [hello]
        if self.admit is not None and not self.admit():
            self.refuse(
                m.RATE_LIMITED, "the server is at its limit of sessions; try later", hello.seq
            )
            return []
        self.machine.send("accept")
        self.capabilities = tuple(c for c in self.supported if c in hello.capabilities)
        self.batching = m.BATCH_V1 in self.capabilities
        self.app_tools = hello.tools
        self.send(
            m.Welcome,
            session_id=self.session_id,
            resume_token=self.resume_token,
            epoch=0,
            capabilities=self.capabilities,
            resumed=False,
            last_seq=hello.seq,
            audio=self._audio_spec(),
        )
        self.accept(hello.seq)  # after welcome: an ack it triggers must not come first
        return [hello]

    def _audio_spec(self) -> m.AudioSpec | None:
        """``welcome.audio``: the rates, when ``audio-v1`` is negotiated."""
        info = self.audio
        return info.spec() if info is not None else None

    def _refusal(self, hello: m.Hello) -> tuple[str, str] | None:
        if hello.protocol != m.PROTOCOL:
            return (
                m.UNSUPPORTED_PROTOCOL,
                f"protocol {hello.protocol!r} is not supported; use {m.PROTOCOL!r}",
            )
        if len(hello.open) > m.OPEN_LIMIT:
            return m.BAD_MESSAGE, f"{len(hello.open)} open calls; at most {m.OPEN_LIMIT}"
        if hello.resume is not None:
            return None  # the tools are the session's own, declared when it began
        if len(hello.tools) > MAX_APP_TOOLS:
            return (
                m.BAD_MESSAGE,
                f"{len(hello.tools)} app tools; at most {MAX_APP_TOOLS} are accepted",
            )
        names: set[str] = set()
        for tool in hello.tools:
            if tool.name in self.server_tools:
                return m.TOOL_CONFLICT, f"app tool {tool.name!r} clashes with a server tool"
            if tool.name in names:
                return m.TOOL_CONFLICT, f"two app tools are named {tool.name!r}"
            names.add(tool.name)
            try:
                check_parameters(tool.parameters, f"app tool {tool.name!r}")
            except DefinitionError as exc:
                return m.BAD_MESSAGE, str(exc)
            except RecursionError:
                return m.BAD_MESSAGE, f"app tool {tool.name!r}: parameters is nested too deeply"
        return None
