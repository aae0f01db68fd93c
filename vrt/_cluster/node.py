"""This process as one node of many sharing a store (``vrt.serve(store=...)``).

The node keeps its lease in the store (a heartbeat: the node's relay address, refreshed
every second, gone one :data:`LEASE` after the node stopped), keeps its live sessions'
records from expiring, and answers the question a resume asks when its session is not
here: :meth:`Node.locate` reads the session's record and says where it is. Handed over
(nobody owns it): adopt it here. Owned by a live node: relay the connection there. Owned
by a node whose lease ran out (it crashed): adopt it here from its last saved boundary.
Every change of owner is the store's compare-and-set, so two nodes never both adopt one.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

import attrs
import trio

from vrt._cluster.record import State, checks, principal_hash, restore, token_matches
from vrt._cluster.store import Store, StoreError
from vrt._cluster.trust import Trust
from vrt._wire import messages as m

log = logging.getLogger("vrt.server")

LEASE = 5.0
"""Seconds a node's lease lasts without a heartbeat: how long after a crash its sessions
can be adopted elsewhere."""
HEARTBEAT = 1.0
"""Seconds between two heartbeats."""
LOCATE_TIMEOUT = LEASE + 3.0
"""Seconds a resume may wait for a dead owner's lease to run out."""


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
        lease: float = LEASE,
        trust: Trust | None = None,
    ) -> None:
        self.store = store
        self.name = name
        self.lease = lease
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
        answer fails the server's start: :class:`StoreError`)."""
        await self.store.heartbeat(self.name, self.address, self.lease)
        task_status.started()
        touch_every = max(1.0, self.resume_window / 2)
        next_touch = trio.current_time() + touch_every
        warned = False
        while not self._stopped:
            await trio.sleep(HEARTBEAT)
            if self._stopped:
                break
            try:
                await self.store.heartbeat(self.name, self.address, self.lease)
                if trio.current_time() >= next_touch:
                    next_touch = trio.current_time() + touch_every
                    await self.store.touch(list(self.sessions), self.record_ttl)
                if warned:
                    log.warning("node %s: the store answers again", self.name)
                    warned = False
            except StoreError as exc:
                if not warned:
                    log.warning(
                        "node %s: the store failed (%s): other nodes will adopt this "
                        "node's sessions once its lease of %g s runs out",
                        self.name,
                        exc,
                        self.lease,
                    )
                    warned = True

    async def stop(self) -> None:
        """The node is done (drained): its lease ends now, so nobody waits for it."""
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

    async def wait_for_lease(self, owner: str) -> None:
        """Wait (up to a lease and a little) for ``owner``'s lease to run out: it did not
        take a relayed connection, so it is gone or going."""
        with trio.move_on_after(self.lease + 1.0):
            while await self.store.node_address(owner) is not None:  # noqa: ASYNC110 - the store's
                await trio.sleep(min(0.25, self.lease / 4))

    def forget(self, session_id: str) -> None:
        """The session left this node (closed for good, or handed over)."""
        self.sessions.discard(session_id)


def default_name(worker: int | None = None) -> str:
    """A node's name when none is given: ``host:pid``, and ``:worker`` for a worker of
    ``vrt serve --workers`` (unique while the process lives)."""
    name = f"{socket.gethostname()}:{os.getpid()}"
    return name if worker is None else f"{name}:{worker}"
