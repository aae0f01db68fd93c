"""The shared store: where a session's saved state waits for the process that goes on with it.

A port of the transport (DESIGN.md, "Serving in production"): :class:`RedisStore` on
valkey-glide for ``redis://`` and ``valkey://`` URLs, and :class:`MemoryStore`, the same
rules over a dict, for one process and for tests on Trio's clock. Both hold two kinds of
record:

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
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Protocol
from urllib.parse import urlsplit

import attrs
import trio

from vrt._errors import VrtError

KEY_PREFIX = "vrt:"
"""Every key the store writes starts with this (``vrt:session:ID``, ``vrt:node:NAME``)."""
TIMEOUT = 2.0
"""Seconds a store call may take before it fails (:class:`StoreError`)."""


class StoreError(VrtError):
    """The store failed, or did not answer within its timeout."""


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

    async def heartbeat(self, node: str, address: str, ttl: float) -> None:
        """Say ``node`` is alive, reachable for relays at ``address``, for ``ttl`` seconds."""

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
        timeout that hid a success) changes nothing the second time."""

    async def load(self, session_id: str) -> Saved | None:
        """The session's record, or None (never saved, deleted or expired)."""

    async def claim(self, session_id: str, expected: str, node: str) -> Saved | None:
        """Make ``node`` the owner if the owner is still ``expected`` (``""`` for a session
        handed over, or a node found dead); the record then, else None."""

    async def delete(self, session_id: str, node: str) -> None:
        """Delete the session's record if ``node`` owns it (the session closed for good)."""

    async def touch(self, session_ids: Iterable[str], ttl: float) -> None:
        """Keep these sessions' records ``ttl`` seconds more (a node's live sessions)."""

    async def aclose(self) -> None:
        """Close the connection to the store."""


def open_store(url: str, *, timeout: float = TIMEOUT) -> Store:
    """The store a ``--store`` URL names: ``redis://HOST:PORT[/DB]``, ``valkey://...``
    (valkey-glide; connected by :meth:`RedisStore.connect`), or ``memory://`` (this
    process only). ValueError for anything else."""
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
    return RedisStore(
        host=parts.hostname,
        port=port,
        database=int(db) if db else 0,
        tls=parts.scheme in ("rediss", "valkeys"),
        username=parts.username,
        password=parts.password,
        timeout=timeout,
    )


def _session_key(session_id: str) -> str:
    return f"{KEY_PREFIX}session:{session_id}"


def _node_key(node: str) -> str:
    return f"{KEY_PREFIX}node:{node}"


# -- in memory -----------------------------------------------------------------------------------


class MemoryStore:
    """The store's rules over dicts, on Trio's clock: one process (several servers in it
    share one), and tests with ``autojump_clock``."""

    def __init__(self) -> None:
        self._sessions: dict[str, tuple[Saved, float]] = {}
        """Each session's record and when it expires (its history a tuple in the record)."""
        self._nodes: dict[str, tuple[str, float]] = {}
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

    async def heartbeat(self, node: str, address: str, ttl: float) -> None:
        await trio.lowlevel.checkpoint()
        self._nodes[node] = (address, trio.current_time() + ttl)

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
            return False
        history, at = (current.history, current.front) if current is not None else ((), front)
        end = at + len(history)
        if front > at:  # the oldest items dropped
            history, at = history[front - at :], front
            end = max(end, front)
        if first > end:
            raise StoreError(f"history items missing before {first}")
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
        return claimed

    async def delete(self, session_id: str, node: str) -> None:
        await trio.lowlevel.checkpoint()
        current = self._session(session_id)
        if current is not None and current.owner == node:
            del self._sessions[session_id]

    async def touch(self, session_ids: Iterable[str], ttl: float) -> None:
        await trio.lowlevel.checkpoint()
        until = trio.current_time() + ttl
        for session_id in session_ids:
            if self._session(session_id) is not None:
                self._sessions[session_id] = (self._sessions[session_id][0], until)

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


# -- Redis / Valkey ------------------------------------------------------------------------------

# Each change is one script: atomic on the server, one round trip. KEYS[1] is the
# session's hash (owner, state), KEYS[2] its history (a list, an item each).
_SAVE = """
local found = redis.call('HMGET', KEYS[1], 'owner', 'front')
if found[1] and found[1] ~= ARGV[1] then return 0 end
if not found[1] then redis.call('DEL', KEYS[2]) end
local front, first = tonumber(ARGV[5]), tonumber(ARGV[6])
local at = tonumber(found[2] or ARGV[5])
local stored = redis.call('LLEN', KEYS[2])
local stop = at + stored
if front > at and stop < front then stop = front end
if first > stop then return redis.error_reply('history items missing before ' .. first) end
if front > at then
  redis.call('LTRIM', KEYS[2], front - at, -1)
  at = front
end
for i = 7 + stop - first, #ARGV, 500 do
  redis.call('RPUSH', KEYS[2], unpack(ARGV, i, math.min(i + 499, #ARGV)))
end
redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'state', ARGV[3], 'front', at)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
"""
_LOAD = """
local found = redis.call('HMGET', KEYS[1], 'owner', 'state', 'front')
if not found[2] then return false end
return {found[1] or '', found[2], redis.call('LRANGE', KEYS[2], 0, -1), found[3] or '0'}
"""
_CLAIM = """
local found = redis.call('HMGET', KEYS[1], 'owner', 'state', 'front')
if not found[2] or (found[1] or '') ~= ARGV[1] then return false end
redis.call('HSET', KEYS[1], 'owner', ARGV[2])
return {ARGV[2], found[2], redis.call('LRANGE', KEYS[2], 0, -1), found[3] or '0'}
"""
_DELETE = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then redis.call('DEL', KEYS[1], KEYS[2]) end
return 1
"""


class RedisStore:
    """The store on Redis or Valkey, through valkey-glide's async client (which runs under
    Trio through anyio). One multiplexed connection per process; it reconnects by itself.
    """

    def __init__(
        self,
        *,
        host: str,
        port: int,
        database: int = 0,
        tls: bool = False,
        username: str | None = None,
        password: str | None = None,
        timeout: float = TIMEOUT,
    ) -> None:
        self.host = host
        self.port = port
        self.database = database
        self.tls = tls
        self._username = username
        self._password = password
        self.timeout = timeout
        self._client: Any = None
        self._scripts: dict[str, Any] = {}

    def __repr__(self) -> str:  # never the password
        return f"<RedisStore {self.host}:{self.port}/{self.database}>"

    async def connect(self) -> None:
        """Connect (within the timeout), or raise :class:`StoreError`."""
        try:
            from glide import (
                GlideClient,
                GlideClientConfiguration,
                NodeAddress,
                ServerCredentials,
            )
        except ImportError:  # pragma: no cover - a dependency of trio-vrt
            raise StoreError("valkey-glide is not installed") from None
        credentials = (
            ServerCredentials(password=self._password, username=self._username)
            if self._password is not None
            else None
        )
        config = GlideClientConfiguration(
            [NodeAddress(self.host, self.port)],
            use_tls=self.tls,
            credentials=credentials,
            database_id=self.database,
            request_timeout=int(self.timeout * 1000),
            client_name="trio-vrt",
        )
        with trio.move_on_after(self.timeout + 1.0) as scope:
            try:
                self._client = await GlideClient.create(config)
            except Exception as exc:
                raise StoreError(
                    f"cannot connect to the store at {self.host}:{self.port}: {_short(exc)}"
                ) from None
        if scope.cancelled_caught:
            raise StoreError(f"the store at {self.host}:{self.port} did not answer in time")

    async def _call(self, name: str, *args: Any) -> Any:
        if self._client is None:
            raise StoreError("the store is not connected")
        with trio.move_on_after(self.timeout + 0.5) as scope:
            try:
                return await getattr(self._client, name)(*args)
            except Exception as exc:
                raise StoreError(f"the store failed ({name}): {_short(exc)}") from None
        assert scope.cancelled_caught
        raise StoreError(f"the store did not answer within {self.timeout:g} s ({name})")

    async def _script(self, code: str, keys: list[str], args: list[Any]) -> Any:
        from glide import Script

        script = self._scripts.get(code)
        if script is None:
            script = self._scripts[code] = Script(code)  # type: ignore[no-untyped-call]
        if self._client is None:
            raise StoreError("the store is not connected")
        with trio.move_on_after(self.timeout + 0.5) as scope:
            try:
                return await self._client.invoke_script(script, keys=keys, args=args)
            except Exception as exc:
                raise StoreError(f"the store failed (a script): {_short(exc)}") from None
        assert scope.cancelled_caught
        raise StoreError(f"the store did not answer within {self.timeout:g} s")

    async def heartbeat(self, node: str, address: str, ttl: float) -> None:
        from glide import ExpirySet, ExpiryType

        await self._call(
            "set", _node_key(node), address, None, ExpirySet(ExpiryType.MILLSEC, _ms(ttl))
        )

    async def node_address(self, node: str) -> str | None:
        found = await self._call("get", _node_key(node))
        return None if found is None else bytes(found).decode()

    async def forget_node(self, node: str) -> None:
        await self._call("delete", [_node_key(node)])

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
        done = await self._script(
            _SAVE,
            _keys(session_id),
            [node, owner, state, str(_ms(ttl)), str(front), str(first), *items],
        )
        return bool(done)

    async def load(self, session_id: str) -> Saved | None:
        return _saved(await self._script(_LOAD, _keys(session_id), []))

    async def claim(self, session_id: str, expected: str, node: str) -> Saved | None:
        return _saved(await self._script(_CLAIM, _keys(session_id), [expected, node]))

    async def delete(self, session_id: str, node: str) -> None:
        await self._script(_DELETE, _keys(session_id), [node])

    async def touch(self, session_ids: Iterable[str], ttl: float) -> None:
        from glide import Batch

        ids = list(session_ids)
        ms = _ms(ttl)
        for start in range(0, len(ids), 250):  # one round trip per 250 sessions
            batch = Batch(is_atomic=False)
            for session_id in ids[start : start + 250]:
                for key in _keys(session_id):
                    batch.pexpire(key, ms)
            await self._call("exec", batch, False)

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with trio.move_on_after(self.timeout) as scope:
                scope.shield = True
                try:
                    await client.close()
                except Exception:  # closing: nothing left to tell anyone
                    pass


def _keys(session_id: str) -> list[str]:
    """A session's two keys: its hash (``vrt:session:ID``), its history list
    (``vrt:history:ID``). One script uses both: a single Redis or Valkey node, or a
    cluster's one shard (no hash tags yet)."""
    return [_session_key(session_id), f"{KEY_PREFIX}history:{session_id}"]


def _saved(found: Any) -> Saved | None:
    """A load or claim script's answer as a record."""
    if not found:
        return None
    owner, state, history, front = found
    return Saved(
        owner=bytes(owner).decode(),
        state=bytes(state),
        history=tuple(bytes(item) for item in history),
        front=int(front),
    )


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
