"""The shared store: where a session's saved state waits for the process that goes on with it.

A port of the transport (DESIGN.md, "Serving in production"):
:class:`~vrt._cluster.redis.RedisStore` on valkey-glide for ``redis://`` and ``valkey://``
URLs (:mod:`vrt._cluster.redis`), and :class:`MemoryStore`, the same rules over a dict,
for one process and for tests on Trio's clock. Both hold two kinds of record:

- a **session**: its saved state and its history (opaque bytes: :mod:`vrt._cluster.record`
  writes and reads them; the history one record an item, appended and trimmed at its
  front, so a save costs what changed) and its **owner**, the node running it, or ``""``
  once handed over (parked). Every change of owner is a compare-and-set, so two nodes
  never both take a session, and a node that lost a session (its lease ran out and
  another node adopted it) can no longer overwrite it. A record expires ``ttl`` seconds
  after it was last saved or touched.
- a **node**: its relay address, kept while the node is alive by its heartbeat, and gone
  one lease after the node stopped (a crash), which is how another node knows it may
  adopt the node's sessions.

Every call has a deadline (``timeout``); a store that does not answer in time raises
:class:`StoreError`, as any error of the store does, and the caller decides.

A store may also forget: Redis restarted without persistence, flushed, a key evicted under
``maxmemory``, a failover to a replica that lagged. A save that finds less of the session
than the node wrote raises :class:`StoreForgot`, and the node saves the whole session
again at once; a heartbeat says whether the node's own lease was still there, which is how
a node learns, within a second, that the store forgot everything.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol
from urllib.parse import urlsplit

import attrs
import trio

from vrt._errors import VrtError

KEY_PREFIX = "vrt:"
"""Every key the store writes starts with this (``vrt:{ID}:session``, ``vrt:node:NAME``)."""
TIMEOUT = 2.0
"""Seconds a store call may take before it fails (:class:`StoreError`)."""


class StoreError(VrtError):
    """The store failed, or did not answer within its timeout."""


class StoreForgot(StoreError):
    """A save found less of the session in the store than the node wrote there (history
    items missing before the first one it sends): the store forgot it, wholly or in part.
    Nothing was written; the node saves the whole session again."""


@attrs.frozen(kw_only=True)
class Saved:
    """A session's record: who owns it (``""``: nobody, it was handed over), its state and
    its history's items."""

    owner: str
    state: bytes
    history: tuple[bytes, ...] = ()
    front: int = 0
    """The number of the history's first item (those before it were dropped)."""


class Store(Protocol):
    """What the server needs of a shared store (see the module's docstring)."""

    async def heartbeat(self, node: str, address: str, ttl: float) -> bool:
        """Say ``node`` is alive, reachable for relays at ``address``, for ``ttl`` seconds;
        whether its lease was still there (False at a node's first heartbeat, or once the
        store forgot it: expired, flushed, restarted)."""

    async def node_address(self, node: str) -> str | None:
        """The relay address of ``node`` while it is alive; None once its lease ran out."""

    async def forget_node(self, node: str) -> None:
        """``node`` stops (drained): its lease ends now."""

    async def save(
        self,
        session_id: str,
        node: str,
        owner: str,
        state: bytes,
        ttl: float,
        *,
        front: int = 0,
        first: int = 0,
        items: Sequence[bytes] = (),
    ) -> bool:
        """Write the session's ``state`` and ``owner`` (``node`` itself, or ``""`` to hand it
        over), if ``node`` owns it or nobody has it yet; False (nothing written) if another
        node took it. With them, the history: its items are numbered from the start of the
        conversation; those before ``front`` are dropped, and of ``items`` (numbered from
        ``first``) those the store lacks are appended. Writing the same save twice (a
        timeout that hid a success) changes nothing the second time. :class:`StoreForgot`
        (nothing written) if the store holds fewer items than ``first`` needs: it forgot
        some (or the whole record); a save with ``first == front`` and every item never
        raises it."""

    async def census(self, node: str, sessions: int, ttl: float) -> dict[str, int]:
        """Count ``sessions`` for ``node`` for ``ttl`` seconds (-1: it is draining, no
        place for sessions to go), and return every live node's count but the draining
        ones', this one's included: what rebalancing shares out."""

    async def restore(
        self, session_id: str, state: bytes, ttl: float, *, front: int, items: Sequence[bytes]
    ) -> bool:
        """Write a handed-over session's last save again, owned by nobody, if the store
        has no record of it (it forgot: its node kept the save, see ``Node.park``); False
        if it has one. The record is a restored one: the first save of a node that runs
        the session (it took the session over before the store forgot) may overwrite it."""

    async def load(self, session_id: str) -> Saved | None:
        """The session's record, or None (never saved, deleted or expired)."""

    async def claim(self, session_id: str, expected: str, node: str) -> Saved | None:
        """Make ``node`` the owner if the owner is still ``expected`` (``""`` for a session
        handed over, or a node found dead); the record then, else None."""

    async def delete(self, session_id: str, node: str) -> None:
        """Delete the session's record if ``node`` owns it (the session closed for good)."""

    async def touch(self, session_ids: Iterable[str], ttl: float) -> set[str]:
        """Keep these sessions' records ``ttl`` seconds more (a node's live sessions); the
        ids of those the store no longer has whole (it forgot them, or part of them:
        expired, evicted, flushed; on Redis an empty history, which is no key, looks the
        same: the caller knows whether it has one)."""

    async def aclose(self) -> None:
        """Close the connection to the store."""


def open_store(url: str, *, timeout: float = TIMEOUT) -> Store:
    """The store a ``--store`` URL names: ``redis://HOST:PORT[/DB]``, ``valkey://...``
    (valkey-glide, the ``trio-vrt[redis]`` extra; connected by ``RedisStore.connect``), or
    ``memory://`` (this process only). ValueError for anything else; :class:`StoreError`
    naming the extra to install if valkey-glide is not there."""
    parts = urlsplit(url)
    if parts.scheme == "memory":
        return MemoryStore()
    if parts.scheme not in ("redis", "valkey", "rediss", "valkeys"):
        raise ValueError(
            f"store must be a redis://, valkey:// or memory:// URL, not {url.split(':', 1)[0]!r}"
        )
    if not parts.hostname:
        raise ValueError("the store URL has no host (redis://HOST:PORT)")
    try:
        port = parts.port or 6379
    except ValueError:
        raise ValueError("the store URL's port is not a number") from None
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise ValueError(f"the store URL's database must be a number, not {db!r}")
    from vrt._cluster.redis import RedisStore  # here: that module imports this one

    return RedisStore(
        host=parts.hostname,
        port=port,
        database=int(db) if db else 0,
        tls=parts.scheme in ("rediss", "valkeys"),
        username=parts.username,
        password=parts.password,
        timeout=timeout,
    )


def session_key(session_id: str) -> str:
    """A session's record's key: ``vrt:{ID}:session``. The braces are a hash tag: in a
    Redis or Valkey Cluster a session's keys (this one and :func:`history_key`) are on
    one slot, so the one script that changes both runs on one shard."""
    return f"{KEY_PREFIX}{{{session_id}}}:session"


def history_key(session_id: str) -> str:
    """A session's history's key: ``vrt:{ID}:history``, on its record's slot."""
    return f"{KEY_PREFIX}{{{session_id}}}:history"


def census_key() -> str:
    """The nodes' session counts (one hash: one slot in a cluster)."""
    return f"{KEY_PREFIX}census"


def node_key(node: str) -> str:
    """A node's lease's key."""
    return f"{KEY_PREFIX}node:{node}"


# -- in memory -----------------------------------------------------------------------------------


class MemoryStore:
    """The store's rules over dicts, on Trio's clock: one process (several servers in it
    share one), and tests with ``autojump_clock``."""

    def __init__(self) -> None:
        self._sessions: dict[str, tuple[Saved, float]] = {}
        """Each session's record and when it expires (its history a tuple in the record)."""
        self._nodes: dict[str, tuple[str, float]] = {}
        self._census: dict[str, tuple[int, float]] = {}
        self._restored: set[str] = set()
        """Sessions whose record a node wrote again from a parked save (``restore``)."""
        self.saves = 0
        """How many saves were written (for tests)."""

    def _session(self, session_id: str) -> Saved | None:
        found = self._sessions.get(session_id)
        if found is None:
            return None
        if found[1] <= trio.current_time():
            del self._sessions[session_id]
            return None
        return found[0]

    async def heartbeat(self, node: str, address: str, ttl: float) -> bool:
        await trio.lowlevel.checkpoint()
        had = await self.node_address(node) is not None
        self._nodes[node] = (address, trio.current_time() + ttl)
        return had

    async def node_address(self, node: str) -> str | None:
        await trio.lowlevel.checkpoint()
        found = self._nodes.get(node)
        if found is None or found[1] <= trio.current_time():
            self._nodes.pop(node, None)
            return None
        return found[0]

    async def forget_node(self, node: str) -> None:
        await trio.lowlevel.checkpoint()
        self._nodes.pop(node, None)

    async def census(self, node: str, sessions: int, ttl: float) -> dict[str, int]:
        await trio.lowlevel.checkpoint()
        now = trio.current_time()
        self._census[node] = (sessions, now + ttl)
        for name, (_, until) in list(self._census.items()):
            if until <= now:
                del self._census[name]
        return {name: count for name, (count, _) in self._census.items() if count >= 0}

    async def save(
        self,
        session_id: str,
        node: str,
        owner: str,
        state: bytes,
        ttl: float,
        *,
        front: int = 0,
        first: int = 0,
        items: Sequence[bytes] = (),
    ) -> bool:
        await trio.lowlevel.checkpoint()
        current = self._session(session_id)
        if current is not None and current.owner != node:
            if current.owner or session_id not in self._restored:
                return False
            if first > front:  # a restored parked save: only a whole one replaces it
                raise StoreForgot(f"history items missing before {first}")
            current = None
        self._restored.discard(session_id)
        history, at = (current.history, current.front) if current is not None else ((), front)
        end = at + len(history)
        if front > at:  # the oldest items dropped
            history, at = history[front - at :], front
            end = max(end, front)
        if first > end:
            raise StoreForgot(f"history items missing before {first}")
        history += tuple(items[end - first :])
        saved = Saved(owner=owner, state=state, history=history, front=at)
        self._sessions[session_id] = (saved, trio.current_time() + ttl)
        self.saves += 1
        return True

    async def load(self, session_id: str) -> Saved | None:
        await trio.lowlevel.checkpoint()
        return self._session(session_id)

    async def claim(self, session_id: str, expected: str, node: str) -> Saved | None:
        await trio.lowlevel.checkpoint()
        current = self._session(session_id)
        if current is None or current.owner != expected:
            return None
        claimed = attrs.evolve(current, owner=node)
        self._sessions[session_id] = (claimed, self._sessions[session_id][1])
        self._restored.discard(session_id)
        return claimed

    async def restore(
        self, session_id: str, state: bytes, ttl: float, *, front: int, items: Sequence[bytes]
    ) -> bool:
        await trio.lowlevel.checkpoint()
        if self._session(session_id) is not None:
            return False
        saved = Saved(owner="", state=state, history=tuple(items), front=front)
        self._sessions[session_id] = (saved, trio.current_time() + ttl)
        self._restored.add(session_id)
        return True

    async def delete(self, session_id: str, node: str) -> None:
        await trio.lowlevel.checkpoint()
        current = self._session(session_id)
        if current is not None and current.owner == node:
            del self._sessions[session_id]

    async def touch(self, session_ids: Iterable[str], ttl: float) -> set[str]:
        await trio.lowlevel.checkpoint()
        until = trio.current_time() + ttl
        gone: set[str] = set()
        for session_id in session_ids:
            if self._session(session_id) is not None:
                self._sessions[session_id] = (self._sessions[session_id][0], until)
            else:
                gone.add(session_id)
        return gone

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()

    def flush(self) -> None:
        """Forget every record and lease, as a Redis restarted without persistence does
        (``FLUSHALL``): for tests."""
        self._sessions.clear()
        self._nodes.clear()
        self._restored.clear()
