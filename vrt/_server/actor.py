"""One session's actor on the server: the protocol pumped, the session driven, across
connections.

The actor owns a session's :class:`~vrt._wire.server.ServerProtocol` and its in-process
:class:`~vrt.Session`: client messages become session actions (:meth:`SessionActor.receive`),
session events become messages (:func:`~vrt._server.frames.message_of`, in the engine's own
order), and app calls go to the client and wait for its ``tool.result``
(:meth:`SessionActor.send_app`, the engine's app host). The connection currently carrying the
session is its :class:`~vrt._server.link.Link`; without one (detached) the frames wait in the
protocol's replay buffer for a resume.
"""

from __future__ import annotations

import json
import logging
import math
from typing import TYPE_CHECKING, Any

import trio

from vrt._cluster.record import (
    State,
    TooLarge,
    encode_item,
    encode_state,
    limit_bytes,
    principal_hash,
    token_hash,
)
from vrt._cluster.relay import HANDOVER_CLOSE
from vrt._cluster.store import StoreError
from vrt._core.bounded import RecentSet
from vrt._core.events import TERMINAL_PHASES, ToolPreview, ToolStream, TurnEnded, TurnStarted
from vrt._core.previews import Previews
from vrt._core.results import ResultCode, ToolResult
from vrt._engine import telemetry
from vrt._engine.call import Call
from vrt._engine.history import Snapshot
from vrt._engine.session import Session
from vrt._errors import SessionClosed
from vrt._net.pumps import cancelled
from vrt._server.frames import messages_of
from vrt._server.link import Link, RateLimit, send_and_close
from vrt._wire import codec
from vrt._wire import messages as m
from vrt._wire.endpoint import FrameTooLarge
from vrt._wire.server import ServerProtocol
from vrt.models import ToolSpec, TurnInterrupted, UserInput

if TYPE_CHECKING:
    from vrt._net.accept import GuardedStream
    from vrt._server.hub import Hub

log = logging.getLogger("vrt.server")

STALL_TIMEOUT = 30.0
"""A connected client held at the high water mark this long without acking is closed."""
HELD_FRAMES = 1000
"""Frames held while a handover's last save is under way (a rate-limited client sends at
most about a hundred a second; a save takes milliseconds)."""


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
        restored: State | None = None,
    ) -> None:
        self.hub = hub
        self.restored = restored
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
        self.rate = RateLimit(self.options.max_messages_per_second)
        self._nursery: trio.Nursery | None = None
        """The actor's: the session's turns run here, and cancelling it ends the session."""
        self._inputs: list[tuple[str, int]] = []
        """Inputs whose turns have not started, with the interrupt count when each came."""
        self._starting = False
        self._turned = False
        """A turn was asked for (an ``input``): the first-turn limit no longer applies."""
        # Made when someone waits on them (idle sessions are many: each object counts).
        self._acked: trio.Event | None = None
        self._attached: trio.Event | None = None
        self._detached: trio.Event | None = None
        self.pending: dict[str, _Pending] = {}
        self._interrupts = 0
        # For the error a late tool.result gets (STALE_EPOCH, DUPLICATE_RESULT): the
        # newest calls only, so a long session does not grow by every call.
        self.issued: RecentSet[str] = RecentSet(1000)
        self.answered: RecentSet[str] = RecentSet(1000)
        self.lost_calls: RecentSet[str] = RecentSet(1000)
        """Calls of a turn lost with a crashed node, ended at the adoption."""
        self._previews = Previews()
        self._wire_previews = True
        """Whether ``tool.preview`` frames go out (not with ``local-preview-v1``)."""
        self._piece = self.options.max_message_size // 16
        """Characters of model text or argument fragment per frame, at most (a character
        may take 12 bytes escaped: an emoji is written as two \\u escapes)."""
        # With a store: the state saved at the last turn boundary, not yet written, and
        # the lock that keeps saves (and the handover's last one) in order.
        self._unsaved: _Unsaved | None = None
        self._stored = 0
        """The number of the history item after the last one the store holds."""
        if restored is not None:
            self._stored = restored.history_offset + len(restored.history)
        self._save_wanted: trio.Event | None = None
        self._save_lock = trio.Lock()
        self._held: list[str | bytes] | None = None
        """Frames read while a handover's last save is under way (see :meth:`receive`)."""
        self.move_at_boundary = False
        """Hand the session over at its next turn boundary (a drain, or a connection
        relayed from another node: the session goes where its client is)."""
        self.handed_over = False

    @property
    def log_id(self) -> str:
        return self.proto.session_id

    @property
    def turned(self) -> bool:
        """Whether the client ever asked for a turn (an ``input``)."""
        return self._turned

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
                self._overflow(f"{link.backlog} bytes the client has not read")
                return
        if proto.overflowed and proto.in_session:
            self._overflow("the replay buffer is full", stuck=False)

    def _overflow(self, why: str, *, stuck: bool = True) -> None:
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

    def written(self) -> None:
        """The writer sent a frame: a model held for the backlog may go on."""
        if self._acked is not None and self._draining():
            _set(self._acked)

    def _draining(self) -> bool:
        """Whether the current connection's backlog is under the high water mark: a client
        that acks what it never read (its socket full) is not making progress."""
        link = self.link
        return link is None or link.backlog <= self.options.high_water_bytes

    # -- the session's life (in the hub's nursery) ----------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the session until it closes or expires: one task and one nursery, which its
        turns share (the fewer per session, the more sessions fit: bench/load.py)."""
        node = self.hub.node
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                session = self._open_session(nursery)
                if node is not None:
                    self._save_wanted = trio.Event()
                    nursery.start_soon(self._saver)
                    if self.proto.ack_limit is None:  # adopted: its saved received seq
                        self.proto.ack_limit = self.proto.received_seq if self.restored else 0
                try:
                    task_status.started()
                    await self._expiry()
                finally:
                    if self.handed_over:
                        session.hand_over()
                    else:
                        session.close("client")  # cancels the nursery: the turns end with it
        except Exception:  # a bug: the peer learns only that it happened
            log.exception("session %s failed", self.log_id)
            if self.proto.in_session:
                self.proto.error(m.INTERNAL, "internal server error")
                self.proto.close("server")
        finally:
            self.hub.closed(self)
            if self.proto.in_session:  # cancelled: the server shuts down
                self.proto.close("shutdown")
            if self.handed_over:
                log.info("session %s handed over", self.log_id)
            else:
                log.info("session %s ended (%s)", self.log_id, self.proto.closed_reason)
            self.flush()
            self._drop_link()
            if node is not None:
                node.forget(self.proto.session_id)
                if not self.handed_over and self.proto.closed_reason != "shutdown":
                    await self._forget_in_store()

    def _open_session(self, nursery: trio.Nursery) -> Session:
        specs = [
            ToolSpec(name=t.name, description=t.description, parameters=t.parameters)
            for t in self.hello.tools
        ]
        session = Session(
            self.agent,
            self.proto.session_id,
            app_tools=specs,
            app_host=self,
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
            self._turned = restored.turned
        session.run_in(nursery)
        session.pace = self._pace
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
                with trio.move_on_at(window if self._turned else min(window, idle_until)):
                    await self._attached.wait()
                    continue
                log.info("session %s expired", self.log_id)
                proto.expire()
                return
            self._detached = trio.Event()
            with trio.move_on_at(math.inf if self._turned else idle_until):
                await self._detached.wait()
                continue
            if not self._turned:
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
        _set(self._acked)  # the pace check looks again

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

        While the session is being handed over, frames are held, not read: the saved
        state does not count them, so the client sends them again to the next process
        (its resume replays what that process's ``welcome`` says it lacks). Read if the
        handover fails."""
        if self._held is not None:
            if len(self._held) < HELD_FRAMES:
                self._held.append(frame)
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
        if proto.acked_by_peer != acked and self._draining():
            _set(self._acked)  # acks wake a held model only while the writer makes headway
        if proto.state == "closed":  # the client's ``close``
            self.end("client")

    async def _pace(self) -> None:
        """Hold the model while the client is far behind (or detached): unacked messages
        over the high water mark, or unacked or unwritten bytes over 40 % of
        ``replay_limit_bytes``.

        A connected client that makes no progress for STALL_TIMEOUT seconds while held (no
        ack, or acks while the frames pile up unread: it acks blindly) has stopped
        reading: the session closes with ``overflow`` (it could never catch up within the
        buffer). A detached one is waited
        for until the resume window ends.
        """
        proto = self.proto
        while self._behind() and proto.state != "closed":
            self._acked = trio.Event()
            if proto.state == "detached":
                await self._acked.wait()
                continue
            with trio.move_on_after(STALL_TIMEOUT):
                await self._acked.wait()
                continue
            self._overflow(f"no progress for {STALL_TIMEOUT:g} s while held")
            await trio.lowlevel.checkpoint()

    def _behind(self) -> bool:
        proto = self.proto
        options = self.options
        link = self.link
        return (
            proto.sent_seq - proto.acked_by_peer > options.high_water
            or proto.replay_bytes > options.high_water_bytes
            or (link is not None and link.backlog > options.high_water_bytes)
        )

    def _send_ack(self) -> None:
        if self.proto.send_ack():  # nothing once closed: the timer may call late
            self.flush()

    # -- session events to frames (a session listener) -----------------------------------------

    def _on_event(self, event: Any) -> None:
        """A session event to frames, synchronously (a session listener)."""
        proto = self.proto
        if not proto.in_session:
            return
        if isinstance(event, ToolStream):
            if self._wire_previews:
                self._previews.stream(event)
        elif isinstance(event, ToolPreview) and not self._previews.wanted(event):
            return
        tool_stream = m.TOOL_STREAM_V1 in proto.capabilities
        for cls, fields in messages_of(event, tool_stream=tool_stream, piece=self._piece):
            try:
                proto.send(cls, **fields)
            except FrameTooLarge as exc:  # the engine's limits should make this unreachable
                log.warning("session %s: %s is over max_message_size: not sent", self.log_id, exc)
        if isinstance(event, ToolStream) and event.kind == "app":
            if event.phase in TERMINAL_PHASES and self.pending.pop(event.call_id, None) is not None:
                # Ended without the app's result (interrupt or timeout): the app sees the
                # terminal phase first, then tool.abort, so the tool learns why it stops.
                proto.send(m.ToolAbort, call_id=event.call_id)
        self.flush()
        if self._save_wanted is not None and type(event) in (TurnStarted, TurnEnded):
            self._boundary(event.turn_id if type(event) is TurnStarted else None)

    # -- the store (handover-v1) -------------------------------------------------------------------

    def state(self, open_turn: str | None) -> State:
        """The session as it is now, for the store (at a turn boundary)."""
        proto = self.proto
        session = self.session
        assert session is not None
        return State(
            session_id=proto.session_id,
            token_hash=token_hash(proto.resume_token),
            principal_hash=principal_hash(self.principal),
            capabilities=proto.capabilities,
            tools=tuple(codec.to_plain(t) for t in self.hello.tools),
            epoch=session.epoch,
            turns=session.turns,
            open_turn=open_turn,
            turned=self._turned,
            history=(),  # saved item by item (see _Unsaved)
            history_offset=session.history_offset,
            sent_seq=proto.sent_seq,
            received_seq=proto.received_seq,
            acked_by_peer=proto.acked_by_peer,
            replay=tuple(proto.replay),
            inputs=tuple(text for text, _ in self._inputs),
            model=session.model_state(),
        )

    def _snapshot(self, open_turn: str | None) -> _Unsaved | None:
        """The session at this boundary, to be written: its state now, and its history as
        it is now (the items are encoded when written, only those the store lacks)."""
        session = self.session
        assert session is not None
        try:
            data = encode_state(self.state(open_turn), limit_bytes(self.options.replay_limit_bytes))
        except TooLarge as exc:
            log.warning("session %s: not saved (%s): it cannot move", self.log_id, exc)
            return None
        return _Unsaved(
            data, self.proto.received_seq, session.history_offset, Snapshot(session.history)
        )

    def _boundary(self, open_turn: str | None) -> None:
        """A turn started or ended: save the session (by the saver task, in order); at the
        end of a turn, hand it over if asked to."""
        if not self.proto.in_session or self.handed_over:
            return
        unsaved = self._snapshot(open_turn)
        if unsaved is not None:
            self._unsaved = unsaved
            assert self._save_wanted is not None
            self._save_wanted.set()
        if open_turn is None and self.move_at_boundary and self._nursery is not None:
            self._nursery.start_soon(self.hand_over)

    async def _write(self, unsaved: _Unsaved, owner: str) -> bool:
        """Write ``unsaved`` (under the save lock): its state, and of its history what the
        store lacks (the front it dropped since, the items it added). False if another
        node owns the session now; :class:`StoreError` if the store failed (then the next
        save writes what this one would have: the store skips the items it has, so a
        save that timed out but was written does no harm)."""
        node = self.hub.node
        assert node is not None
        offset, history = unsaved.history_offset, unsaved.history
        first = max(self._stored, offset)
        kept = await node.store.save(
            self.proto.session_id,
            node.name,
            owner,
            unsaved.state,
            node.record_ttl,
            front=offset,
            first=first,
            items=[encode_item(item) for item in history[first - offset :]],
        )
        if kept:
            self._stored = offset + len(history)
        return kept

    async def _saver(self) -> None:
        """Write each boundary's state to the store, the newest only when several wait."""
        node = self.hub.node
        assert node is not None
        while True:
            assert self._save_wanted is not None
            await self._save_wanted.wait()
            self._save_wanted = trio.Event()
            async with self._save_lock:
                unsaved, self._unsaved = self._unsaved, None
                if unsaved is None or self.handed_over:
                    continue
                try:
                    kept = await self._write(unsaved, node.name)
                except StoreError as exc:
                    log.warning("session %s: not saved: %s", self.log_id, exc)
                    continue
            if not kept:
                self._taken()
                continue
            # What is saved is safe: the client may forget it (see Endpoint.ack_limit).
            proto = self.proto
            proto.ack_limit = max(proto.ack_limit or 0, unsaved.received)
            if proto.ack_due:
                self.hub.acks.due(self._send_ack)

    def _taken(self) -> None:
        """Another node adopted this session (this one's lease ran out, the store said so
        at a save): let it go, and send the client there (1012)."""
        if self.handed_over or not self.proto.in_session:
            return
        log.warning("session %s: another node took it over: let go here", self.log_id)
        self._let_go()

    @property
    def idle(self) -> bool:
        """Between turns: no turn open, none being started (inputs may wait: they move
        with the session, in its saved state)."""
        session = self.session
        return session is not None and session.turn is None and not self._starting

    async def hand_over(self) -> bool:
        """Save the session for another node and let it go here, now (it must be between
        turns): its connection is closed with 1012 (the client resumes elsewhere), no
        ``closed``. False if it cannot (no store, a turn open, the store failed): the
        session goes on here."""
        node = self.hub.node
        if node is None or self.handed_over or not self.proto.in_session or not self.idle:
            return False
        async with self._save_lock:
            if self.handed_over:  # another hand_over (a drain's retry) did it meanwhile
                return False
            unsaved = self._snapshot(None)
            if unsaved is None or not self.idle:
                return False
            self._unsaved = None
            self._held = []
            kept: bool | None
            try:
                kept = await self._write(unsaved, "")
            except StoreError as exc:
                log.warning("session %s: cannot hand over: %s", self.log_id, exc)
                kept = None
            held, self._held = self._held, None
        if kept is None:  # the session stays: read what came meanwhile
            for frame in held:
                self.receive(frame)
            self.move_at_boundary = False
            self._start_turns()
            return False
        if not kept:
            self._taken()
            return True
        self._let_go()
        return True

    def _let_go(self) -> None:
        """End the session here without ``closed``: the connection closes with 1012."""
        self.handed_over = True
        self.proto.hand_over()
        link, self.link = self.link, None
        if link is not None:
            link.finish(code=HANDOVER_CLOSE)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def _forget_in_store(self) -> None:
        """The session closed for good: its record goes (bounded, shielded)."""
        node = self.hub.node
        assert node is not None
        with trio.move_on_after(2.0) as scope:
            scope.shield = True
            try:
                await node.store.delete(self.proto.session_id, node.name)
            except StoreError as exc:
                log.info("session %s: record not deleted (%s): it expires", self.log_id, exc)

    def settle_lost_turn(self, hello: m.Hello) -> None:
        """Adopted from a node that crashed: end what the client holds open of the turn
        that node was running (``handover-v1``). Each call the client reports open gets
        ``cancelled``, the turn ``turn.ended`` ``interrupted`` with the epoch raised, and
        the history marks the turn interrupted, as an interrupt would have."""
        restored = self.restored
        session = self.session
        assert restored is not None
        assert session is not None
        proto = self.proto
        turns: dict[str, None] = {}
        if restored.open_turn is not None:
            turns[restored.open_turn] = None
        epoch = session.epoch
        # What the saved replay already ends, the client gets from it: not ended twice.
        assert hello.resume is not None
        ended_calls, ended_turns = _ended_in(proto.replay, hello.resume.last_seq)
        for entry in hello.open:
            if entry.turn_id not in ended_turns:
                turns[entry.turn_id] = None
            if entry.call_id is None or entry.call_id in ended_calls:
                continue
            self.lost_calls.add(entry.call_id)  # a result replayed for it is dropped quietly
            proto.send(
                m.ToolStreamMessage,
                call_id=entry.call_id,
                turn_id=entry.turn_id,
                epoch=epoch,
                name=entry.name or "",
                kind="app" if entry.kind == "app" else "server",
                phase="cancelled",
            )
        if turns:
            session.interrupt(epoch + 1)
            known = {i.turn_id for i in session.history if isinstance(i, UserInput)}
            for turn_id in turns:
                if turn_id in known:  # a turn whose input this process has: marked
                    session.record(TurnInterrupted(turn_id=turn_id))
                proto.send(
                    m.TurnEndedMessage, turn_id=turn_id, epoch=session.epoch, reason="interrupted"
                )
            session.skip_turns(turns)
            log.info(
                "session %s: adopted after its node was lost: %d calls and %d turns ended "
                "interrupted",
                self.log_id,
                sum(1 for e in hello.open if e.call_id is not None),
                len(turns),
            )
        self._boundary(None)  # (sent by carry(), after the welcome and the replay)

    def go_on(self) -> None:
        """Adopted and resumed: start the turns of the inputs that moved with the session."""
        restored = self.restored
        if restored is not None and restored.inputs:
            self._inputs.extend((text, self._interrupts) for text in restored.inputs)
            self._turned = True
            self._start_turns()

    # -- acting on client messages --------------------------------------------------------------

    def _act(self, session: Session, message: Any) -> None:
        proto = self.proto
        if isinstance(message, m.Input):
            self._turned = True
            session.interrupt()  # barge-in: at once, before the new turn is queued
            self._inputs.append((message.text, self._interrupts))
            self._start_turns()
        elif isinstance(message, m.Interrupt):
            self._interrupts += 1
            session.interrupt(max(message.epoch, session.epoch + 1))
        elif isinstance(message, m.ToolResultMessage):
            self._result(message)
        elif isinstance(message, m.ConfirmReply):
            if message.call_id in self.lost_calls:
                return  # a call of the turn a crashed node ran: already ended, quietly
            if not session.answer_confirmation(message.call_id, message.approved, message.reason):
                proto.error(
                    m.UNKNOWN_CALL,
                    f"no open confirmation for call {message.call_id!r}",
                    message.seq,
                )

    def _start_turns(self) -> None:
        """Start the waiting inputs' turns, unless the session is about to move (they go
        with it, in its saved state)."""
        if not self._starting and not self.move_at_boundary and self._inputs:
            self._starting = True
            assert self._nursery is not None
            assert self.session is not None
            self._nursery.start_soon(self._turns, self.session)

    async def _turns(self, session: Session) -> None:
        """Start the waiting inputs' turns one at a time, in arrival order (``start_turn``
        may wait for a barge-in's turn to end): a task only while inputs wait."""
        try:
            while self._inputs and not self.move_at_boundary:
                text, generation = self._inputs.pop(0)
                turn = await session.start_turn(text)
                if generation != self._interrupts:
                    turn.interrupt()  # the user interrupted after sending it
        except SessionClosed:
            self._inputs.clear()  # closed while they waited (the client's close): no turns
        finally:
            self._starting = False

    def _result(self, message: m.ToolResultMessage) -> None:
        call_id = message.call_id
        pending = self.pending.get(call_id)
        if pending is None or pending.result is not None:
            session = self.session
            if call_id in self.lost_calls:
                return  # a call of the turn a crashed node ran: already ended, quietly
            if call_id in self.answered:
                code, text = m.DUPLICATE_RESULT, f"call {call_id!r} already has its result"
            elif call_id in self.issued and session is not None and message.epoch < session.epoch:
                code, text = (
                    m.STALE_EPOCH,
                    f"call {call_id!r} was interrupted (epoch {session.epoch})",
                )
            else:
                code, text = m.UNKNOWN_CALL, f"no open app call {call_id!r}"
            self.proto.error(code, text, message.seq)
            return
        if message.epoch != pending.epoch:
            self.proto.error(
                m.STALE_EPOCH,
                f"call {call_id!r} runs in epoch {pending.epoch}, not {message.epoch}",
                message.seq,
            )
            return
        wire = message.result
        result = pending.result = (
            ToolResult.success(wire.output)
            if wire.ok
            else ToolResult.failure(ResultCode(wire.code or "FAILED"), wire.message)
        )
        del self.pending[call_id]  # answered: its terminal phase sends no tool.abort
        self.answered.add(call_id)
        pending.done.set()
        # Settled here, in the reader's task: ``settled`` leaves with this frame's other
        # answers, not a scheduler pass later from the call's task (which just ends).
        pending.call.answered(result)

    # -- the app host (vrt._engine.call.AppHost) ------------------------------------------------

    @property
    def eager(self) -> bool:
        """With ``batch-v1``: an app call's ``tool.call`` is queued with its
        ``arguments-complete``, so they leave in one frame. Without it the order of the
        frames stays what it always was."""
        return self.proto.batching

    def send_app(self, call: Call) -> _Pending | ToolResult:
        """Send an app call's ``tool.call`` now; what waits for its ``tool.result``."""
        call_id = call.call_id
        pending = _Pending(call)
        self.pending[call_id] = pending
        self.issued.add(call_id)
        try:
            self.proto.send(
                m.ToolCallMessage,
                call_id=call_id,
                turn_id=call.turn.turn_id,
                epoch=call.turn.epoch,
                name=call.name,
                arguments=call.arguments,
            )
        except FrameTooLarge:  # a Rewrite hook's arguments: the engine bounds the model's
            del self.pending[call_id]
            message = "the call's arguments are over what the client takes (max_message_size)"
            return ToolResult.failure(ResultCode.FAILED, message)
        self.flush()
        return pending


class _Unsaved:
    """A boundary's save, not yet written: the state's bytes, the client seq they hold,
    and the history then (its first item's number, and an O(1) snapshot of the items)."""

    __slots__ = ("history", "history_offset", "received", "state")

    def __init__(
        self, state: bytes, received: int, history_offset: int, history: Snapshot[Any]
    ) -> None:
        self.state = state
        self.received = received
        self.history_offset = history_offset
        self.history = history


class _Pending:
    """An app call waiting for the client's ``tool.result`` (the engine's ``AppWait``).

    Without a result (cancelled: timeout or interrupt) it stays in the actor's ``pending``
    until the call's terminal phase, which sends tool.abort after it (``_on_event``); with
    one, :meth:`SessionActor._result` has removed it already."""

    __slots__ = ("call", "done", "epoch", "result")

    def __init__(self, call: Call) -> None:
        self.call = call
        self.epoch = call.turn.epoch
        self.done = trio.Event()
        self.result: ToolResult | None = None

    async def wait(self) -> ToolResult:
        """The client's result (see :meth:`SessionActor._result`)."""
        await self.done.wait()
        assert self.result is not None
        return self.result


def _ended_in(replay: Any, after: int) -> tuple[set[str], set[str]]:
    """The calls (a terminal ``tool.stream``) and turns (``turn.ended``) that the replay
    buffer's messages numbered above ``after`` end."""
    calls: set[str] = set()
    turns: set[str] = set()
    for seq, frame in replay:
        if seq <= after or ('"turn.ended"' not in frame and '"tool.stream"' not in frame):
            continue
        message = json.loads(frame)
        if message.get("type") == "turn.ended":
            turns.add(message["turnId"])
        elif message.get("type") == "tool.stream" and message.get("phase") in TERMINAL_PHASES:
            calls.add(message["callId"])
    return calls, turns


def _set(event: trio.Event | None) -> None:
    if event is not None:
        event.set()
