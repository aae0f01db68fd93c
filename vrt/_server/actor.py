"""One session's actor on the server: the protocol pumped, the session driven, across
connections.

The actor owns a session's :class:`~vrt._wire.server.ServerProtocol` and its in-process
:class:`~vrt.Session`: client messages become session actions (:meth:`SessionActor.receive`),
session events become messages (:func:`~vrt._server.frames.message_of`, in the engine's own
order), and app calls go to the client and wait for its ``tool.result``
(:class:`~vrt._server.appcalls.AppCalls`, the engine's app host). The connection currently
carrying the session is its :class:`~vrt._server.link.Link`; without one (detached) the frames
wait in the protocol's replay buffer for a resume.

Where the session runs, and whether a turn may start, is its Movement machine's
(``machines/movement.py``): the actor starts turns only while it is owned here (``idle`` to
``busy`` and back); with a store, the session's :class:`~vrt._cluster.keeper.Keeper` saves it
at its turn boundaries and hands it over, through the actor's narrow side of it (the
``Host`` methods below: :meth:`SessionActor.state`, :meth:`~SessionActor.history`,
:meth:`~SessionActor.saved`, :meth:`~SessionActor.let_go`, :meth:`~SessionActor.stay`).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import trio

from vrt._cluster.keeper import Keeper, settle_lost_turn
from vrt._cluster.node import Adopt
from vrt._cluster.record import State, state_of
from vrt._cluster.relay import HANDOVER_CLOSE
from vrt._core.events import (
    TERMINAL_PHASES,
    AudioDelta,
    ToolPreview,
    ToolStream,
    TurnEnded,
    TurnStarted,
)
from vrt._core.previews import Previews
from vrt._core.tables import MOVEMENT
from vrt._engine import telemetry
from vrt._engine.history import Snapshot
from vrt._engine.session import Session
from vrt._net.pumps import cancelled
from vrt._server.appcalls import AppCalls
from vrt._server.frames import messages_of
from vrt._server.link import Link, send_and_close
from vrt._server.pace import Pace
from vrt._server.ratelimit import RateLimit
from vrt._server.turns import Turns
from vrt._server.voice import Voice
from vrt._wire import messages as m
from vrt._wire.audio import AudioIn
from vrt._wire.endpoint import FrameTooLarge
from vrt._wire.server import ServerProtocol
from vrt.models import ToolSpec

if TYPE_CHECKING:
    from vrt._net.accept import GuardedStream
    from vrt._server.hub import Hub

log = logging.getLogger("vrt.server")

LET_GO = frozenset({"handed_over", "taken_over", "abandoned"})
"""The Movement states of a session let go here to go on elsewhere: no ``closed``, its
record kept (handed over; taken by another node; abandoned by a drain, unsaved)."""


class SessionActor:
    """One session's actor: the protocol pumped, the session driven, across connections."""

    def __init__(
        self,
        hub: Hub,
        proto: ServerProtocol,
        hello: m.Hello,
        principal: Any,
        peer: Any,
        *,
        adopted: Adopt | None = None,
    ) -> None:
        self.hub = hub
        self.restored = adopted.state if adopted is not None else None
        """The saved state this session goes on from (adopted from another node), if any."""
        self.peer = peer
        """Whom ``max_sessions_per_peer`` counts this session for."""
        self.agent = hub.agent
        self.options = hub.options
        self.proto = proto
        self.hello = hello
        self.principal = principal
        self.link: Link | None = None
        self.session: Session | None = None
        self.rate = RateLimit(self.options.max_messages_per_second, trio.current_time())
        self.movement = MOVEMENT.new()
        """Where the session runs and whether a turn may start (the Movement machine)."""
        if adopted is None:
            self.movement.send("open")
        else:
            self.movement.send("adopt_lost" if adopted.crashed else "adopt")
        node = hub.node
        self.keeper = (
            Keeper(node, self, self.movement, self.options, restored=self.restored)
            if node is not None
            else None
        )
        """Saves the session to the store, hands it over (None without a store)."""
        self.app_calls = AppCalls(proto, self.flush)
        self._nursery: trio.Nursery | None = None
        """The actor's: the session's turns run here, and cancelling it ends the session."""
        self.turns = Turns(self.movement, self.keeper)
        """The turns the client asks for, one at a time while the session is here."""
        self.pace = Pace(self)
        """Holds the model while the client is far behind."""
        audio = proto.audio
        self.voice = Voice(self, audio, self.options.audio_speed_limit) if audio else None
        """The session's audio both ways, when ``audio-v1`` was negotiated."""
        # Made when someone waits on them (idle sessions are many: each object counts).
        self._attached: trio.Event | None = None
        self._detached: trio.Event | None = None
        self._previews = Previews()
        self._wire_previews = True
        """Whether ``tool.preview`` frames go out (not with ``local-preview-v1``)."""
        self._piece = self.options.max_message_size // 16
        """Characters of model text or argument fragment per frame, at most (a character
        may take 12 bytes escaped: an emoji is written as two \\u escapes)."""

    @property
    def log_id(self) -> str:
        return self.proto.session_id

    @property
    def turned(self) -> bool:
        """Whether the client ever asked for a turn (an ``input``)."""
        return self.turns.turned

    def flush(self) -> None:
        """Hand every frame the protocol queued to the current connection, in order.

        Without a connection they are dropped here: every numbered one is in the replay
        buffer for the resume. A replay buffer or a connection backlog over its bound
        closes the session (``overflow``).
        """
        proto = self.proto
        frames = proto.take_outbox()
        link = self.link
        if link is not None:
            for frame in frames:
                link.send(frame)
            if link.backlog > self.options.replay_limit_bytes and proto.in_session:
                self.overflow(f"{link.backlog} bytes the client has not read")
                return
        if proto.overflowed and proto.in_session:
            self.overflow("the replay buffer is full", stuck=False)

    def overflow(self, why: str, *, stuck: bool = True) -> None:
        """Close the session (``overflow``). A connection stuck behind frames the client
        does not read is dropped at once (its socket holds what it did not read); one that
        still drains (``stuck=False`` and little backlog) takes ``closed`` like any other
        close."""
        log.info("session %s closed (overflow): %s", self.log_id, why)
        telemetry.refused("overflow")
        link = self.link
        if link is not None and (stuck or link.backlog > self.options.high_water_bytes):
            self.link = None
            link.abort()
        self.end("overflow")

    # -- the session's life (in the hub's nursery) ----------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the session until it closes or expires: one task and one nursery, which its
        turns share (the fewer per session, the more sessions fit: bench/load.py)."""
        keeper = self.keeper
        started = False
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                session = self._open_session(nursery)
                if keeper is not None:
                    await nursery.start(keeper.run)
                    if self.proto.ack_limit is None:  # adopted: its saved received seq
                        self.proto.ack_limit = self.proto.received_seq if self.restored else 0
                try:
                    task_status.started()
                    started = True
                    await self._expiry()
                finally:
                    if self.movement.state in LET_GO:
                        session.hand_over(taken=self.movement.state != "handed_over")
                    else:
                        session.close("client")  # cancels the nursery: the turns end with it
        except Exception:  # a bug: the peer learns only that it happened
            log.exception("session %s failed", self.log_id)
            if self.proto.in_session:
                self.proto.error(m.INTERNAL, "internal server error")
                self.proto.close("server")
        finally:
            if not started:
                # Closed while its keeper started (a newer session of its peer needed its
                # place, :meth:`Hub._make_room`): the hub's start returns all the same.
                task_status.started()
            self.hub.closed(self)
            if self.proto.in_session:  # cancelled: the server shuts down
                self.proto.close("shutdown")
            handed_over = self.movement.state in LET_GO
            if not self.movement.final:
                self.movement.send("close")
            if handed_over:
                log.info("session %s %s", self.log_id, self.movement.state.replace("_", " "))
            else:
                log.info("session %s ended (%s)", self.log_id, self.proto.closed_reason)
            self.flush()
            self._drop_link()
            if keeper is not None:
                shutdown = self.proto.closed_reason == "shutdown"
                await keeper.forget(delete=not handed_over and not shutdown)

    def _open_session(self, nursery: trio.Nursery) -> Session:
        specs = [
            ToolSpec(name=t.name, description=t.description, parameters=t.parameters)
            for t in self.hello.tools
        ]
        session = Session(
            self.agent,
            self.proto.session_id,
            app_tools=specs,
            app_host=self.app_calls,
            principal=self.principal,
            capture_content=self.options.capture_content,
        )
        if session.ignored_app_tools:
            log.warning(
                "session %s: the client hosts app tools (%s) that the agent does not offer "
                "to the model: pass client_tools='accept' to define_agent to offer them",
                self.log_id,
                ", ".join(sorted(session.ignored_app_tools)[:5]),
            )
        restored = self.restored
        if restored is not None:
            session.restore(
                restored.history,
                epoch=restored.epoch,
                turns=restored.turns,
                model_state=restored.model,
                history_offset=restored.history_offset,
            )
            self.turns.turned = restored.turned
        session.run_in(nursery)
        self.turns.run_in(session, nursery)
        session.pace = self.pace.wait
        session.max_open_calls = self.options.max_open_calls
        session.max_queued_app_calls = self.options.max_queued_app_calls
        # Every frame that carries them must fit the client's limit (vrt.connect's default
        # max_message_size is the server's): arguments are sent escaped, up to about 6x.
        session.max_argument_bytes = self.options.max_message_size // 8
        session.max_progress_bytes = self.options.max_message_size // 2
        session.max_history_bytes = self.options.max_history_bytes
        # Frames in the engine's own order; the legacy previews only for a client that
        # does not make them itself (local-preview-v1).
        self._wire_previews = not m.local_previews(self.proto.capabilities)
        session.listen(self._on_event, previews=self._wire_previews)
        self.session = session
        return session

    async def _expiry(self) -> None:
        """Until the session closes: whenever it is detached, close it (``expired``) if no
        connection resumes it within the resume window; and close it (``expired``) if no
        turn was asked for within ``first_turn_timeout`` of its start."""
        proto = self.proto
        idle_until = trio.current_time() + self.options.first_turn_timeout
        while proto.state != "closed":
            if proto.state == "detached":
                self._attached = trio.Event()
                window = trio.current_time() + self.options.resume_window
                with trio.move_on_at(window if self.turns.turned else min(window, idle_until)):
                    await self._attached.wait()
                    continue
                log.info("session %s expired", self.log_id)
                proto.expire()
                return
            self._detached = trio.Event()
            with trio.move_on_at(math.inf if self.turns.turned else idle_until):
                await self._detached.wait()
                continue
            if not self.turns.turned:
                log.info("session %s closed: no turn within first_turn_timeout", self.log_id)
                self.end("expired")
                return

    def end(self, reason: str) -> None:
        """Close the session for good with ``reason`` (``closed`` goes out last)."""
        self.proto.close(reason)
        self.flush()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    # -- connections (each in the task that accepted it) ----------------------------------------

    def resume(self, hello: m.Hello) -> None:
        """A new connection resumes the session: the newest wins, the old one is closed."""
        session = self.session
        log.info("session %s resumed", self.log_id)
        telemetry.RESUMES.add(1)
        self.proto.resume(hello, session.epoch if session is not None else 0)
        self._drop_link()
        _set(self._attached)
        self.pace.look_again()

    async def carry(self, ws: Any, stream: GuardedStream | None = None) -> None:
        """Carry the session on ``ws`` (over ``stream``, if it has a TCP stream of its own)
        until it ends or a newer connection takes over."""
        link = Link(ws, self, stream)
        self.link = link
        self.flush()  # welcome (and the replay, on a resume)
        if self.proto.ack_due:
            self.hub.acks.due(self._send_ack)  # the hello; on a resume, everything again
        try:
            await link.run()
        finally:
            # Cancelled from outside: the server is shutting down (trio-websocket may
            # already have closed the socket under the reader, so this, not the exception).
            shutdown = cancelled()
            frames = link.pending()
            if self.link is link:
                self.link = None
                proto = self.proto
                if shutdown and proto.in_session:
                    proto.close("shutdown")  # said on this connection, before it closes
                    frames += proto.take_outbox()
                elif proto.state == "open":  # the connection died under the session
                    log.info("session %s detached", self.log_id)
                    proto.drop()
                    if self.options.resume_window == 0:
                        proto.expire()
                        if self._nursery is not None:
                            self._nursery.cancel_scope.cancel()
                    else:
                        _set(self._detached)
            await send_and_close(ws, frames)

    def _drop_link(self) -> None:
        """Stop using the current connection: its writer sends what it has, then closes."""
        link, self.link = self.link, None
        if link is not None:
            link.finish()

    def receive(self, frame: str | bytes) -> None:
        """One frame from the connection carrying the session (past the rate limit).

        While the session is being handed over, frames are held, not read (see
        :attr:`Keeper.holding <vrt._cluster.keeper.Keeper.holding>`); read if the handover
        fails."""
        keeper = self.keeper
        if keeper is not None and keeper.holding:
            keeper.hold(frame)
            return
        proto = self.proto
        session = self.session
        assert session is not None
        acked = proto.acked_by_peer
        for message in proto.receive(frame):
            self._act(session, message)
        if proto.frame_messages > 1:  # a batch: each message counts against the rate
            self.rate.charge(proto.frame_messages - 1)
        self.flush()
        if proto.ack_due:
            self.hub.acks.due(self._send_ack)
        if proto.acked_by_peer != acked:
            self.pace.acked()
        if proto.state == "closed":  # the client's ``close``
            self.end("client")

    def rate_limited(self) -> None:
        """The first frame over the message rate (of an episode): the client is told."""
        telemetry.refused("rate")
        self.proto.error(
            m.RATE_LIMITED,
            f"over {self.rate.rate:g} messages a second: they are read more slowly "
            "until the rate falls",
        )
        self.flush()

    def over_rate(self) -> None:
        """Over the message rate for too long: the session is closed (``server``)."""
        log.info("session %s closed: over its message rate for too long", self.log_id)
        self.end("server")

    def _send_ack(self) -> None:
        if self.proto.send_ack():  # nothing once closed: the timer may call late
            self.flush()

    # -- session events to frames (a session listener) -----------------------------------------

    def _on_event(self, event: Any) -> None:
        """A session event to frames, synchronously (a session listener)."""
        proto = self.proto
        if not proto.in_session:
            return
        kind = type(event)
        voice = self.voice
        if kind is AudioDelta:
            if voice is not None:
                voice.delta(event)
            return  # (without audio-v1 the client gets none, as before)
        if voice is not None:
            if kind is TurnStarted:
                voice.turn_started(event)
            elif kind is TurnEnded:
                voice.turn_ended(event)  # its audio.end goes first
        if isinstance(event, ToolStream):
            if self._wire_previews:
                self._previews.stream(event)
        elif isinstance(event, ToolPreview) and not self._previews.wanted(event):
            return
        tool_stream = m.TOOL_STREAM_V1 in proto.capabilities
        for cls, fields in messages_of(
            event, tool_stream=tool_stream, audio=voice is not None, piece=self._piece
        ):
            try:
                proto.send(cls, **fields)
            except FrameTooLarge as exc:  # the engine's limits should make this unreachable
                log.warning("session %s: %s is over max_message_size: not sent", self.log_id, exc)
        if isinstance(event, ToolStream) and event.kind == "app":
            if event.phase in TERMINAL_PHASES:
                self.app_calls.ended(event.call_id)  # tool.abort, if it had no result
        self.flush()
        if self.keeper is not None and type(event) in (TurnStarted, TurnEnded):
            self.keeper.boundary(event.turn_id if type(event) is TurnStarted else None)

    # -- the keeper's side (vrt._cluster.keeper.Host) --------------------------------------------

    @property
    def session_id(self) -> str:
        return self.proto.session_id

    @property
    def in_session(self) -> bool:
        return self.proto.in_session

    def state(self, open_turn: str | None) -> State:
        """The session as it is now, for the store (at a turn boundary)."""
        assert self.session is not None
        return state_of(
            self.proto,
            self.session,
            principal=self.principal,
            tools=self.hello.tools,
            open_turn=open_turn,
            turned=self.turns.turned,
            inputs=self.turns.waiting,
        )

    def history(self) -> tuple[int, Snapshot[Any]]:
        session = self.session
        assert session is not None
        return session.history_offset, Snapshot(session.history)

    def saved(self, received: int) -> None:
        """What is saved is safe: the client may forget it (see ``Endpoint.ack_limit``)."""
        proto = self.proto
        proto.ack_limit = max(proto.ack_limit or 0, received)
        if proto.ack_due:
            self.hub.acks.due(self._send_ack)

    def let_go(self) -> None:
        """End the session here without ``closed``: the connection closes with 1012."""
        self.proto.hand_over()
        link, self.link = self.link, None
        if link is not None:
            link.finish(code=HANDOVER_CLOSE)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def stay(self, held: list[str | bytes]) -> None:
        """The handover failed: read what came meanwhile, and go on here."""
        for frame in held:
            self.receive(frame)
        self.turns.start()

    # -- adopted from the store ------------------------------------------------------------------

    def take_over(self, hello: m.Hello) -> None:
        """Adopted and resumed by ``hello`` (Movement ``resume``): settle the turn the node
        it came from lost, if any, then start the turns of the inputs that moved with it."""
        restored = self.restored
        assert restored is not None
        session = self.session
        assert session is not None
        lost = self.movement.state == "recovering"
        self.movement.send("resume")
        if lost or hello.open or restored.open_turn is not None:
            settle_lost_turn(self.proto, session, restored.open_turn, hello)
            if self.keeper is not None:
                self.keeper.boundary(None)  # (sent by carry(), after the welcome and the replay)
        self.turns.extend(restored.inputs)

    # -- acting on client messages --------------------------------------------------------------

    def _act(self, session: Session, message: Any) -> None:
        proto = self.proto
        if type(message) is AudioIn:
            if not session.final:  # audio that came after the session closed: dropped
                session.send_audio(message.pcm)
        elif isinstance(message, m.Input):
            self.turns.input(message.text)
        elif isinstance(message, m.Interrupt):
            voice = self.voice
            if voice is None:
                self.turns.interrupt(message.epoch)  # (heardMs means nothing without audio)
            else:
                self.turns.interrupt(message.epoch, heard_ms=voice.heard(message.heard_ms))
                voice.interrupted()
        elif isinstance(message, m.ToolResultMessage):
            self.app_calls.result(message, session.epoch)
        elif isinstance(message, m.ConfirmReply):
            if proto.lost(message.call_id):
                return  # a call of the turn a crashed node ran: already ended, quietly
            if not session.answer_confirmation(message.call_id, message.approved, message.reason):
                proto.error(
                    m.UNKNOWN_CALL,
                    f"no open confirmation for call {message.call_id!r}",
                    message.seq,
                )


def _set(event: trio.Event | None) -> None:
    if event is not None:
        event.set()
