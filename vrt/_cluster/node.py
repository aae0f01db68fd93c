"""This process as one node of many sharing a store (``vrt.serve(store=...)``).

The node keeps its lease in the store (a heartbeat: the node's relay address, refreshed
every second, gone one :data:`LEASE` after the node stopped), keeps its live sessions'
records from expiring, and answers the question a resume asks when its session is not
here: :meth:`Node.locate` reads the session's record and says where it is. Handed over
(nobody owns it): adopt it here. Owned by a live node: relay the connection there. Owned
by a node whose lease ran out (it crashed): adopt it here from its last saved boundary.
Every change of owner is the store's compare-and-set, so two nodes never both adopt one.

The node is also where the store's health is known once for all its sessions: every store
call that fails or answers says so (:meth:`Node.store_failed`, :meth:`Node.store_answered`),
one WARNING marks when the store starts to fail and one when it answers again, and
``GET /healthz`` says ``503 store unreachable`` meanwhile. A heartbeat that finds the
node's own lease gone means the store forgot (restarted without persistence, flushed,
failed over, or an outage outlasted the lease): every session here is saved again, whole.

Nodes share the sessions out among themselves (:meth:`Node.rebalance`): each counts its
sessions in the store's census every few seconds, and one that holds more than its share
(the live nodes' sessions over the live nodes, with a margin) hands idle sessions over, a
few at a time; their clients reconnect through the load balancer, which sends each where
it sends it, so the spread evens out over a few rounds (a worker restarted empty, a node
added behind the balancer).
"""

from __future__ import annotations

import logging
import math
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import trio

from vrt._cluster.record import (
    State,
    checks,
    encode_item,
    principal_hash,
    restore,
    token_matches,
)
from vrt._cluster.store import Store, StoreError
from vrt._cluster.trust import Trust
from vrt._wire import messages as m
from vrt._wire.server import replayable

log = logging.getLogger("vrt.server")

Resave = Callable[[bool], bool]
"""A keeper's ``resave(everything)``: the store forgot its session (``everything``: the
whole store) or some of it; True if it saves it again."""

LEASE = 5.0
"""Seconds a node's lease lasts without a heartbeat: how long after a crash its sessions
can be adopted elsewhere."""
HEARTBEAT = 1.0
"""Seconds between two heartbeats."""
LOCATE_TIMEOUT = LEASE + 3.0
"""Seconds a resume may wait for a dead owner's lease to run out."""
FORGOT_GRACE = LEASE + 2 * HEARTBEAT
"""Seconds after the store forgot (restarted without persistence, flushed, or an outage
outlasted the leases), or answered again after an outage, during which a resume of a
session it does not hold, or of one whose node has no lease, is told to try again, not
refused nor adopted as after a crash: its node may not have saved it again, or renewed
its lease, yet."""
REBALANCE_EVERY = 2.0
"""Seconds between two rounds of rebalancing (a census each)."""
REBALANCE_MARGIN = 0.1
"""A node holds at most its share and this much more (and one session) before it hands
sessions over."""
REBALANCE_MOVES = 10
"""Idle sessions a node hands over in one round, at most: a worker restarted empty fills
at about 5 sessions a second from each node above its share."""

Mover = Callable[[], bool]
"""A keeper's ``hand_over_idle``: hand the session over now if it is between turns;
whether it will."""


PARKED_FOR = 2 * LEASE
"""Seconds a node keeps the last save of a session it handed over: should the store forget
it meanwhile (restarted, flushed), before another node claims it, the node writes it
again (nobody else has it)."""


@attrs.define
class Parked:
    """The last save of a session this node handed over, kept PARKED_FOR seconds."""

    state: bytes
    front: int
    history: Sequence[Any]
    ttl: float
    until: float = 0.0


class NotYet(StoreError):
    """The store forgot what it held moments ago and has no record of the session: its
    node may save it again in a moment, so the client should try again (not a refusal)."""


@attrs.frozen
class Adopt:
    """Adopt the session here: the store says this node owns it now."""

    state: State
    token: str
    crashed: bool
    """From a node that crashed (the turn it ran, if any, is lost), not a handover."""


@attrs.frozen
class Here:
    """This node runs the session, or is adopting it for another connection right now."""


@attrs.frozen
class RelayTo:
    """Relay the connection to the session's live owner."""

    owner: str
    address: str


class Node:
    """This process's place among the nodes that share ``store``."""

    def __init__(
        self,
        store: Store,
        name: str,
        *,
        resume_window: float,
        lease: float | None = None,
        trust: Trust | None = None,
    ) -> None:
        self.store = store
        self.name = name
        self.lease = LEASE if lease is None else lease
        self.trust = trust or Trust()
        """This node's relay key: the proofs it makes and checks (:mod:`.trust`)."""
        self.address = ""
        """Where and how other nodes relay resumes to it, once serving: the text of an
        :class:`~vrt._cluster.trust.Endpoint` (its lease holds it)."""
        self.resume_window = resume_window
        self.sessions: set[str] = set()
        """The sessions this node owns (their records are kept from expiring)."""
        self.draining = False
        self.adopting: dict[str, trio.Event] = {}
        """Sessions being adopted here now (a second resume of one waits for it)."""
        self.relayed: set[Any] = set()
        """Client connections this node relays to another (closed with 1012 by a drain)."""
        self.movers: dict[str, Mover] = {}
        """Each session saved here, its keeper's ``hand_over_idle`` (rebalancing)."""
        self.parked: dict[str, Parked] = {}
        """The sessions this node handed over lately, their last saves (see PARKED_FOR)."""
        self.resavers: dict[str, Resave] = {}
        """Each session saved here, its keeper's ``resave``: the store forgot, save it
        whole again."""
        self.store_ok = True
        """Whether the store answered this node's last call (``GET /healthz`` says ``503
        store unreachable`` while it does not)."""
        self.answering = trio.Event()
        """Set while the store answers; a new one, unset, from its first failure on (what
        a save that failed waits for before it tries again)."""
        self.answering.set()
        self._failing_since = 0.0
        self._forgot_at = -math.inf
        """When the store was last found to have forgotten this node's lease."""
        self._moved = 0
        """Sessions the last round of rebalancing handed over: the census may not count
        them anywhere yet (the nodes they went to count every few seconds too)."""
        self._stopped = False

    @property
    def record_ttl(self) -> float:
        """How long a session's record outlives its last save or touch: the resume
        window, plus the time between two touches and a lease, so a client whose node
        crashed still gets its whole window."""
        return self.resume_window * 1.5 + self.lease + 1.0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Heartbeat and keep this node's sessions alive in the store until cancelled or
        :meth:`stop`; the first heartbeat is done before ``started`` (a store that does not
        answer fails the server's start: :class:`StoreError`). A heartbeat that finds the
        lease gone has every session saved again, whole (the store forgot)."""
        await self.store.heartbeat(self.name, self.address, self.lease)
        task_status.started()
        touch_every = max(1.0, self.resume_window / 2)
        next_touch = trio.current_time() + touch_every
        next_census = trio.current_time() + REBALANCE_EVERY
        while not self._stopped:
            await trio.sleep(HEARTBEAT)
            if self._stopped:
                break
            gone: set[str] = set()
            try:
                had = await self.store.heartbeat(self.name, self.address, self.lease)
                if not had:
                    self._forgot_at = trio.current_time()  # (a resume looking now asks)
                if trio.current_time() >= next_touch:
                    next_touch = trio.current_time() + touch_every
                    gone = await self.store.touch(list(self.sessions), self.record_ttl)
            except StoreError as exc:
                self.store_failed(exc)
                continue
            self.store_answered()
            if self._stopped:
                break
            if not had:
                self._forgot(self.resavers, everything=True)
                await self._unpark()
            elif gone:
                self._forgot({s: f for s, f in self.resavers.items() if s in gone})
            if trio.current_time() >= next_census:
                next_census = trio.current_time() + REBALANCE_EVERY
                try:
                    await self.rebalance()
                except StoreError as exc:
                    self.store_failed(exc)

    def park(self, session_id: str, parked: Parked) -> None:
        """``session_id`` was handed over with ``parked`` as its last save: kept here for
        PARKED_FOR seconds (the oldest parked ones that ran out leave now)."""
        now = trio.current_time()
        for old in [key for key, kept in self.parked.items() if kept.until <= now]:
            del self.parked[old]
        parked.until = now + PARKED_FOR
        self.parked[session_id] = parked

    async def _unpark(self) -> None:
        """The store forgot: write the parked saves again, owned by nobody, where it has no
        record (another node that took the session over meanwhile may have saved it
        again already; if not, its first save overwrites the restored one)."""
        now = trio.current_time()
        parked, self.parked = self.parked, {}
        written = 0
        for session_id, kept in parked.items():
            if kept.until <= now:
                continue
            items = [encode_item(item) for item in kept.history]
            try:
                written += await self.store.restore(
                    session_id, kept.state, kept.ttl, front=kept.front, items=items
                )
            except StoreError as exc:
                log.info("session %s: its handover not written again: %s", session_id, exc)
        if written:
            log.info("node %s: %d sessions handed over lately written again", self.name, written)

    async def rebalance(self) -> int:
        """One round of sharing out (see the module): count this node's sessions in the
        store's census and, above its share, hand some idle ones over (at most
        REBALANCE_MOVES). How many it hands over. A draining node counts itself out."""
        mine = len(self.sessions)
        counts = await self.store.census(
            self.name, -1 if self.draining else mine, REBALANCE_EVERY * 3
        )
        in_flight, self._moved = self._moved, 0
        if self.draining or len(counts) < 2:
            return 0
        # Those handed over last round count as somewhere else (they may be counted
        # twice: then the share is too high, and fewer go this round; never too many).
        total = sum(counts.values()) + in_flight
        share = math.ceil(total / len(counts) * (1 + REBALANCE_MARGIN))
        surplus = min(mine - share, REBALANCE_MOVES)
        moved = 0
        for mover in list(self.movers.values()):
            if moved >= surplus:
                break
            moved += mover()
        self._moved = moved
        if moved:
            log.info(
                "node %s: %d of the %d sessions of %d nodes (share %d): handing %d over",
                self.name,
                mine,
                total,
                len(counts),
                share,
                moved,
            )
        return moved

    def _forgot(self, resavers: dict[str, Resave], *, everything: bool = False) -> None:
        """The store forgot: this node's lease (``everything``: restarted without
        persistence, flushed, failed over, or out of reach for longer than the lease), or
        a key of the records ``resavers`` are for (expired or evicted; a missing history
        list may also be an empty one, which Redis does not keep: each keeper knows).
        Those sessions are saved again, whole; another node that adopted one meanwhile
        keeps it (that save is refused, and the session is let go here)."""
        count = sum(resave(everything) for resave in list(resavers.values()))
        if count:
            log.warning(
                "node %s: the store %s: saving %d sessions again, whole",
                self.name,
                "had lost this node's lease (restarted without persistence, flushed, failed "
                "over, or out of reach for longer than the lease)"
                if everything
                else "had lost some sessions' records (expired or evicted)",
                count,
            )

    def store_failed(self, exc: StoreError) -> None:
        """A store call failed (``exc``): the first since the store last answered logs the
        one WARNING of the outage, and ``GET /healthz`` says 503 until it answers again."""
        if not self.store_ok:
            log.debug("node %s: the store failed again: %s", self.name, exc)
            return
        self.store_ok = False
        self.answering = trio.Event()
        self._failing_since = trio.current_time()
        log.warning(
            "node %s: the store fails (%s): sessions are not saved until it answers, "
            "GET /healthz says 503 store unreachable; other nodes may adopt this node's "
            "sessions once its lease of %g s runs out",
            self.name,
            exc,
            self.lease,
        )

    def store_answered(self) -> None:
        """A store call succeeded: after a failure, the one line that says it is over, and
        the saves that waited for it go now."""
        if self.store_ok:
            return
        self.store_ok = True
        self._forgot_at = trio.current_time()  # an outage: leases may have run out meanwhile
        self.answering.set()
        log.warning(
            "node %s: the store answers again (after %.1f s): saving again",
            self.name,
            trio.current_time() - self._failing_since,
        )

    async def stop(self) -> None:
        """The node is done (drained): its lease ends now, so nobody waits for it (bounded
        by the store's timeout; a lease the store did not end runs out by itself)."""
        self._stopped = True
        try:
            await self.store.forget_node(self.name)
        except StoreError as exc:
            log.info("node %s: could not end its lease (%s): it runs out by itself", self.name, exc)

    async def locate(self, hello: m.Hello, principal: Any) -> Adopt | RelayTo | Here | None:
        """Where the session ``hello`` resumes is: adopt it, relay to its owner, here
        already (another connection's adoption took it meanwhile), or None (unknown,
        expired, another token or principal: one answer for all)."""
        assert hello.resume is not None
        resume = hello.resume
        session_id = resume.session_id
        deadline = trio.current_time() + LOCATE_TIMEOUT
        checked = False
        while trio.current_time() < deadline:
            saved = await self.store.load(session_id)
            if saved is None:
                if await self._forgot_recently():
                    raise NotYet("the store forgot what it held a moment ago: try again")
                return None
            if not checked:
                try:
                    token, principal_of = checks(saved.state)
                except ValueError as exc:
                    log.warning("session %s: its saved state is unreadable: %s", session_id, exc)
                    return None
                if not token_matches(resume.token, token) or (
                    principal_hash(principal) != principal_of
                ):
                    return None
                checked = True
            owner = saved.owner
            if owner == self.name and session_id in self.sessions:
                return Here()
            if owner and owner != self.name:
                address = await self.store.node_address(owner)
                if address is not None:
                    return RelayTo(owner=owner, address=address)
            crashed = owner != ""
            if crashed and owner != self.name and await self._forgot_recently():
                # No lease of its owner: dead, or its lease lost with the store's memory or
                # run out in an outage, the owner alive and about to renew it.
                raise NotYet("the session's node has no lease in the store yet: try again")
            try:
                found = restore(saved.state, saved.history)
            except ValueError as exc:
                log.warning("session %s: its saved state is unreadable: %s", session_id, exc)
                return None
            sent = max(found.sent_seq, resume.last_seq) if crashed else found.sent_seq
            if not replayable(resume.last_seq, sent, found.acked_by_peer, found.replay):
                if await self._forgot_recently():
                    # A save written again from a parked copy, older than the session
                    # that another node runs: that node saves it anew in a moment.
                    raise NotYet("the store has an older save than the client: try again")
                log.info("session %s: the client's lastSeq does not fit its saved state",
                         session_id)  # fmt: skip
                return None
            claimed = await self.store.claim(session_id, owner, self.name)
            if claimed is None:
                continue  # it changed meanwhile: look again
            try:
                state = restore(claimed.state, claimed.history)
            except ValueError as exc:
                log.warning("session %s: its saved state is unreadable: %s", session_id, exc)
                return None
            self.sessions.add(session_id)
            return Adopt(state=state, token=resume.token, crashed=owner != "")
        return None

    async def _forgot_recently(self) -> bool:
        """Whether the store forgot this node's lease within FORGOT_GRACE, or has just
        now (this node's heartbeat has not seen it yet), or answers again after an outage
        since then: a session it does not hold may be saved again by its node any moment,
        and a node without a lease may be alive, about to renew it."""
        if trio.current_time() - self._forgot_at < FORGOT_GRACE:
            return True
        if await self.store.node_address(self.name) is None:
            self._forgot_at = trio.current_time()
            return True
        # The heartbeat may have found the lease gone (and put it back) meanwhile.
        return trio.current_time() - self._forgot_at < FORGOT_GRACE

    async def wait_for_lease(self, owner: str) -> None:
        """Wait (up to a lease and a little) for ``owner``'s lease to run out: it did not
        take a relayed connection, so it is gone or going."""
        with trio.move_on_after(self.lease + 1.0):
            while await self.store.node_address(owner) is not None:  # noqa: ASYNC110 - the store's
                await trio.sleep(min(0.25, self.lease / 4))

    def forget(self, session_id: str) -> None:
        """The session left this node (closed for good, or handed over)."""
        self.sessions.discard(session_id)
        self.resavers.pop(session_id, None)
        self.movers.pop(session_id, None)


def default_name(worker: int | None = None) -> str:
    """A node's name when none is given: ``host:pid``, and ``:worker`` for a worker of
    ``vrt serve --workers`` (unique while the process lives)."""
    name = f"{socket.gethostname()}:{os.getpid()}"
    return name if worker is None else f"{name}:{worker}"
