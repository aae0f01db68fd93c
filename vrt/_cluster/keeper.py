"""One session's keeper: its saves at turn boundaries, its handover, its adoption.

A server with a store gives each session a :class:`Keeper`. The session's actor tells it of
each turn boundary (:meth:`Keeper.boundary`); the keeper's saver task writes the newest
boundary's state to the store, in order, and only what the store lacks of the history. Asked
to move (a drain, or the session's client resumed at another node), the keeper hands the
session over at its next boundary (:meth:`Keeper.move`, :meth:`Keeper.hand_over`): a last
save, owned by nobody, then the actor lets the session go (its client reconnects with
1012). Where the session may go next is the Movement machine's (``machines/movement.py``),
which the actor and the keeper drive through its compiled table; the keeper reaches its
session only through the narrow :class:`Host` interface, so this room never imports the
server.

A store that forgot the session (restarted without persistence, flushed, a key evicted,
a failover to a replica that lagged) refuses a save that sends only what it lacks
(:class:`~vrt._cluster.store.StoreForgot`): the keeper writes the whole session at once
instead, and counts from there. Its node tells it the same when a heartbeat or a touch
finds the store forgot (:meth:`Keeper.resave`): the last boundary written is written again,
whole. A save the store failed (an outage) is written again once the store answers, unless
a newer boundary replaced it; the node logs the outage once, not each save.

The other half is adoption: :func:`adopted_protocol` is the protocol state of a session a
node takes over from the store for its client's resume, and :func:`settle_lost_turn` ends
the turn a crashed node was running when it died.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

import trio

from vrt._cluster.node import Adopt, Parked
from vrt._cluster.record import State, TooLarge, encode_item, encode_state, limit_bytes
from vrt._cluster.store import StoreError, StoreForgot
from vrt._engine.history import Snapshot
from vrt._engine.session import Session
from vrt._wire import codec
from vrt._wire import messages as m
from vrt._wire.audio import AudioInfo
from vrt._wire.server import ServerProtocol
from vrt.models import TurnInterrupted, UserInput

if TYPE_CHECKING:
    from vrt._cluster.node import Node
    from vrt._core.tables import Machine, StrictMachine
    from vrt._net.options import Options

log = logging.getLogger("vrt.server")

HELD_FRAMES = 1000
"""Frames held while a handover's last save is under way (a rate-limited client sends at
most about a hundred a second; a save takes milliseconds)."""
FORGET_TIMEOUT = 2.0
"""Seconds a closed session's record has to be deleted (it expires anyway)."""
RETRY_FIRST = 0.5
"""Seconds after a failed save before it is tried again (then twice as long each time it
fails again, up to :data:`RETRY_MAX`), once the store answers (its node's heartbeat)."""
RETRY_MAX = 30.0


class Host(Protocol):
    """What a keeper needs of the session it keeps (the server's session actor)."""

    @property
    def session_id(self) -> str:
        """The session's id (its record's key, and what logs show)."""

    @property
    def in_session(self) -> bool:
        """Whether the session is live: open or detached (the Session machine's)."""

    def state(self, open_turn: str | None) -> State:
        """The session as it is now, its history apart (at a turn boundary)."""

    def history(self) -> tuple[int, Snapshot[Any]]:
        """The number of the history's first item, and an O(1) snapshot of the items."""

    def saved(self, received: int) -> None:
        """What the client sent up to seq ``received`` is in the store: it may be acked."""

    def let_go(self) -> None:
        """End the session here without ``closed``: it goes on at another node (1012)."""

    def stay(self, held: list[str | bytes]) -> None:
        """The handover failed: the session goes on here; read the frames held meanwhile."""


class Keeper:
    """Saves one session at its turn boundaries, hands it over, and lets it go."""

    def __init__(
        self,
        node: Node,
        host: Host,
        movement: Machine | StrictMachine,
        options: Options,
        *,
        restored: State | None = None,
    ) -> None:
        self.node = node
        self.host = host
        self.movement = movement
        """The session's Movement machine (its actor drives the turn events)."""
        self._limit = limit_bytes(options.replay_limit_bytes)
        self._stored = 0
        """The number of the history item after the last one the store holds."""
        if restored is not None:
            self._stored = restored.history_offset + len(restored.history)
        self._adopted = restored is not None
        self._forgotten = False
        """The store forgot the session: the next write sends all of it."""
        self._unsaved: _Unsaved | None = None
        """The newest boundary's save, not yet written (older ones are superseded)."""
        self._last: _Unsaved | None = None
        """The last boundary written (what :meth:`resave` writes again)."""
        self._wanted = trio.Event()
        self._lock = trio.Lock()
        """Saves, and a handover's last one, are written one at a time, in order."""
        self._held: list[str | bytes] = []
        self._nursery: trio.Nursery | None = None

    # -- the actor's side -----------------------------------------------------------------------

    @property
    def holding(self) -> bool:
        """Whether the client's frames are held unread (a handover's last save is under
        way: the saved state does not count them, so the client sends them again to the
        next process). :meth:`hold` takes them."""
        return self.movement.state == "handing_over"

    def hold(self, frame: str | bytes) -> None:
        """Keep a frame read while handing over (read if the handover fails)."""
        if len(self._held) < HELD_FRAMES:
            self._held.append(frame)

    def boundary(self, open_turn: str | None) -> None:
        """A turn started (``open_turn``) or ended (None): save the session as it is now,
        by the saver task (the newest boundary only, when several wait)."""
        if not self.host.in_session or not self.movement.can("save"):
            return
        unsaved = self._snapshot(open_turn)
        if unsaved is not None:
            self._unsaved = unsaved
            self._wanted.set()

    def move(self) -> None:
        """Move the session to another node (a drain, or its client's resume reached
        another node): now if it is between turns, else at the end of its turn (Movement
        ``moving``: its actor's ``rest`` starts the handover then)."""
        if self.movement.can("move"):
            self.movement.send("move")
        elif self.movement.can("hand_over") and self._nursery is not None:
            self._nursery.start_soon(self.hand_over)

    def hand_over_idle(self) -> bool:
        """Rebalancing asks (its node holds more than its share): hand the session over
        now if it is between turns here; whether it will."""
        if not (self.host.in_session and self.movement.can("hand_over")) or not self._nursery:
            return False
        self._nursery.start_soon(self.hand_over)
        return True

    def resave(self, everything: bool = True) -> bool:
        """The store forgot this session (its node found out: a heartbeat found the lease
        gone, ``everything``; or a touch a key of the record): write the last boundary
        written again, whole, now (or the newer one waiting), by the saver task. True if
        it will; False if it is not live, or (not ``everything``) its history is empty,
        which in Redis is no key at all, and nothing is missing."""
        if not self.host.in_session:
            return False
        last = self._last
        if not everything and last is not None and not len(last.history):
            return False
        self._forgotten = True
        if self._unsaved is None and last is None and self.movement.state == "idle":
            self.boundary(None)  # adopted, and no boundary since: between turns now
        self._wanted.set()
        return True

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The keeper's task, in the session's nursery until the session ends there: the
        saver, which writes each boundary's state to the store, and a handover asked for
        between turns (:meth:`move`)."""
        if self._adopted:  # its record is in the store, this node's
            self._kept()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await self._saver()

    async def _saver(self) -> None:
        delay = RETRY_FIRST
        while True:
            await self._wanted.wait()
            self._wanted = trio.Event()
            failed = False
            async with self._lock:
                unsaved, self._unsaved = self._unsaved, None
                if unsaved is None and self._forgotten:
                    unsaved = self._last  # resave(): the last boundary, whole
                if unsaved is None or not self.movement.can("save"):
                    continue
                self.movement.send("save")
                try:
                    kept = await self._write(unsaved, self.node.name)
                except StoreError as exc:
                    self.node.store_failed(exc)
                    log.debug("session %s: not saved: %s", self.host.session_id, exc)
                    if self._unsaved is None:  # (a newer boundary replaces it)
                        self._unsaved = unsaved
                    failed = True
            if failed:
                # Again once the store answers (the node's heartbeat says so), no sooner
                # than the delay: an outage costs one failed save per session, not one
                # per boundary, and a save the store refuses alone is not tried in a loop.
                await trio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
                await self.node.answering.wait()
                self._wanted.set()
                continue
            delay = RETRY_FIRST
            self.node.store_answered()
            if not kept:
                self._taken()
                continue
            self.host.saved(unsaved.received)

    async def hand_over(self) -> bool:
        """Hand the session over now, if it is between turns (Movement ``hand_over``):
        see :meth:`leave`. False if it is not (in a turn, closed, moving or handed over
        already), or the handover failed: the session goes on here."""
        if not (self.host.in_session and self.movement.can("hand_over")):
            return False
        self.movement.send("hand_over")
        return await self.leave()

    async def leave(self) -> bool:
        """The session is ``handing_over`` (:meth:`hand_over`, or its actor's ``rest``
        at the end of a turn while ``moving``): save it for another node and let it go
        here: its connection is closed with 1012 (the client resumes elsewhere), no
        ``closed``. False if the store failed: the session stays here (``stay``), and
        reads the frames it held meanwhile (a drain tries again)."""
        self._held = []
        async with self._lock:  # after a save being written, if one is
            if self.movement.state != "handing_over":
                return False  # taken by that save, or closed meanwhile: nothing to write
            unsaved = self._snapshot(None)
            kept: bool | None = None
            if unsaved is not None:
                self._unsaved = None
                try:
                    kept = await self._write(unsaved, "")
                except StoreError as exc:
                    self.node.store_failed(exc)  # (the node logs an outage once)
                    log.debug("session %s: cannot hand over: %s", self.host.session_id, exc)
                    if self._unsaved is None:  # saved here (owned) once the store answers
                        self._unsaved = unsaved
                        self._wanted.set()
                else:
                    self.node.store_answered()
            held, self._held = self._held, []
        if self.movement.state != "handing_over":
            return False  # closed meanwhile (the server stops): nothing to let go
        if kept is None:  # the session stays: read what came meanwhile
            self.movement.send("stay")
            self.host.stay(held)
            return False
        if not kept:
            self._taken()
            return True
        self.movement.send("let_go")
        assert unsaved is not None  # (written: kept)
        self.node.park(
            self.host.session_id,
            Parked(unsaved.state, unsaved.history_offset, unsaved.history, self.node.record_ttl),
        )
        self.host.let_go()
        return True

    def abandon(self) -> bool:
        """A drain is over and the session is still here: its handover could not be
        written (the store fails) or its turn would not end. Let it go unsaved (Movement
        ``abandon``), its connection closed with 1012 and no ``closed``, its record left
        as it is: its client resumes at another node, which adopts it from its last saved
        boundary once this node's lease runs out, as after a crash; the client replays
        what it sent since (acked only once saved). False if it is not owned here now, or
        has nothing in the store (never saved: it cannot go on elsewhere, and closes
        here)."""
        if not (self.host.in_session and self.movement.can("abandon")):
            return False
        if self._last is None and not self._adopted:
            return False
        self.movement.send("abandon")
        self.host.let_go()
        return True

    async def forget(self, *, delete: bool) -> None:
        """The session left this node; with ``delete`` (closed for good) its record goes
        too (bounded, shielded: it expires anyway)."""
        self.node.forget(self.host.session_id)
        if not delete:
            return
        with trio.move_on_after(FORGET_TIMEOUT) as scope:
            scope.shield = True
            try:
                await self.node.store.delete(self.host.session_id, self.node.name)
            except StoreError as exc:
                log.info(
                    "session %s: record not deleted (%s): it expires", self.host.session_id, exc
                )

    # -- inside ---------------------------------------------------------------------------------

    def _taken(self) -> None:
        """Another node adopted this session (this one's lease ran out, the store said so
        at a save): let it go, and send the client there (1012)."""
        if not (self.movement.can("taken") and self.host.in_session):
            return
        log.warning("session %s: another node took it over: let go here", self.host.session_id)
        self.movement.send("taken")
        self.host.let_go()

    def _snapshot(self, open_turn: str | None) -> _Unsaved | None:
        """The session at this boundary, to be written: its state now, and its history as
        it is now (the items are encoded when written, only those the store lacks)."""
        state = self.host.state(open_turn)
        try:
            data = encode_state(state, self._limit)
        except TooLarge as exc:
            log.warning("session %s: not saved (%s): it cannot move", self.host.session_id, exc)
            return None
        offset, history = self.host.history()
        return _Unsaved(data, state.received_seq, offset, history)

    async def _write(self, unsaved: _Unsaved, owner: str) -> bool:
        """Write ``unsaved`` (under the lock): its state, and of its history what the
        store lacks (the front it dropped since, the items it added), or all of it if the
        store forgot the session (:class:`StoreForgot`: at once, in the same call). False
        if another node owns the session now; :class:`StoreError` if the store failed
        (then the next save writes what this one would have: the store skips the items it
        has, so a save that timed out but was written does no harm)."""
        whole, self._forgotten = self._forgotten, False
        try:
            try:
                kept = await self._save(unsaved, owner, whole=whole)
            except StoreForgot as exc:
                log.info(
                    "session %s: the store forgot it (%s): saved again, whole",
                    self.host.session_id,
                    exc,
                )
                whole = True
                kept = await self._save(unsaved, owner, whole=True)
        except BaseException:
            self._forgotten = self._forgotten or whole
            raise
        if kept:
            self._stored = unsaved.history_offset + len(unsaved.history)
            self._last = unsaved
            if owner:
                self._kept()
        return kept

    async def _save(self, unsaved: _Unsaved, owner: str, *, whole: bool) -> bool:
        offset, history = unsaved.history_offset, unsaved.history
        first = offset if whole else max(self._stored, offset)
        return await self.node.store.save(
            self.host.session_id,
            self.node.name,
            owner,
            unsaved.state,
            self.node.record_ttl,
            front=offset,
            first=first,
            items=[encode_item(item) for item in history[first - offset :]],
        )

    def _kept(self) -> None:
        """The store holds this session, owned by this node: its node keeps the record
        from expiring (a touch every half window), and tells :meth:`resave` if it finds
        the store forgot it."""
        session_id = self.host.session_id
        self.node.sessions.add(session_id)
        self.node.resavers[session_id] = self.resave
        self.node.movers[session_id] = self.hand_over_idle


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


def settle_lost_turn(
    proto: ServerProtocol, session: Session, open_turn: str | None, hello: m.Hello
) -> None:
    """Adopted and resumed by ``hello``: end what the client holds open of the turn the
    node the session came from was running (``open_turn`` as saved, and what ``hello``
    reports open; ``handover-v1``). Each call the client reports open gets ``cancelled``,
    the turn ``turn.ended`` ``interrupted`` with the epoch raised, and the history marks
    the turn interrupted, as an interrupt would have. What the saved replay already ends
    the client gets from it, not twice; a result the client replays for a lost call is
    dropped quietly."""
    assert hello.resume is not None
    turns: dict[str, None] = {}
    if open_turn is not None:
        turns[open_turn] = None
    epoch = session.epoch
    ended_calls, ended_turns = proto.ended_since(hello.resume.last_seq)
    for entry in hello.open:
        if entry.turn_id not in ended_turns:
            turns[entry.turn_id] = None
        if entry.call_id is None or entry.call_id in ended_calls:
            continue
        proto.lose_call(entry.call_id)
        proto.send(
            m.ToolStreamMessage,
            call_id=entry.call_id,
            turn_id=entry.turn_id,
            epoch=epoch,
            name=entry.name or "",
            kind="app" if entry.kind == "app" else "server",
            phase="cancelled",
        )
    if not turns:
        return
    session.interrupt(epoch + 1)
    known = {i.turn_id for i in session.history if isinstance(i, UserInput)}
    for turn_id in turns:
        if turn_id in known:  # a turn whose input this process has: marked
            session.record(TurnInterrupted(turn_id=turn_id))
        proto.send(m.TurnEndedMessage, turn_id=turn_id, epoch=session.epoch, reason="interrupted")
    session.skip_turns(turns)
    log.info(
        "session %s: adopted after its node was lost: %d calls and %d turns ended interrupted",
        proto.session_id,
        sum(1 for e in hello.open if e.call_id is not None),
        len(turns),
    )


def adopted_protocol(
    found: Adopt,
    hello: m.Hello,
    server_tools: Any,
    options: Options,
    *,
    audio: AudioInfo | None = None,
) -> ServerProtocol | None:
    """The protocol state of the session ``found`` in the store, for its client's resume
    ``hello`` (detached until the actor resumes it); None if the client's lastSeq does not
    fit what was saved. ``audio``: the rates ``audio-v1`` offers here (None: not offered)."""
    assert hello.resume is not None
    state = found.state
    proto = ServerProtocol(
        session_id=state.session_id,
        resume_token=found.token,
        server_tools=server_tools,
        capabilities=options.capabilities,
        max_message_size=options.max_message_size,
        replay_limit=options.replay_limit,
        replay_limit_bytes=options.replay_limit_bytes,
        audio=audio,
    )
    proto.max_frame = options.max_message_size
    # After a crash the client may have seen messages past the save: number above them.
    sent = max(state.sent_seq, hello.resume.last_seq) if found.crashed else state.sent_seq
    proto.adopt(
        capabilities=state.capabilities,
        tools=tuple(codec.from_plain(t, m.ToolDecl) for t in state.tools),
        sent_seq=sent,
        received_seq=state.received_seq,
        acked_by_peer=state.acked_by_peer,
        replay=state.replay,
    )
    if not proto.can_resume(hello.resume.last_seq):
        log.info("session %s: the client's lastSeq does not fit its saved state", state.session_id)
        return None
    return proto
