"""The store on Redis or Valkey (``redis://``, ``valkey://``): valkey-glide's async client,
which runs under Trio through anyio, imported when a server first connects. It is the
``trio-vrt[redis]`` extra: without it, :class:`RedisStore` raises :class:`StoreError`
naming what to install.

The rules are :mod:`vrt._cluster.store`'s; here each change is one Lua script, atomic on the
server and one round trip.

A Redis or Valkey Cluster works as it is: the URL names any one of its nodes, and
:meth:`RedisStore.connect` finds out (the node's ``INFO``) whether to use glide's cluster
client, which learns the other nodes and sends each key to its shard. A session's keys
share a hash tag (``vrt:{ID}:session``, ``vrt:{ID}:history``), so each script touches one
slot; a node's lease is a key of its own, on whichever shard its slot is.

valkey-glide's Rust core logs by itself, to stdout with ANSI colours or to files under
``./glide-logs`` (its ``Logger`` has no hook into Python's logging): :meth:`RedisStore.connect`
turns it off, unless the application configured ``glide.Logger`` first. What the client has
to say reaches vrt anyway, as the error of the call it failed, which vrt logs once.
"""

from __future__ import annotations

import logging
import math
import socket
from collections.abc import Iterable, Sequence
from typing import Any

import trio

from vrt._cluster.store import (
    TIMEOUT,
    Saved,
    StoreError,
    StoreForgot,
    census_key,
    history_key,
    node_key,
    session_key,
)

log = logging.getLogger("vrt.server")

MISSING = "the Redis/Valkey store client is not installed: pip install 'trio-vrt[redis]'"
"""What :class:`RedisStore` raises (a :class:`StoreError`) without valkey-glide."""

# Each change is one script: atomic on the server, one round trip. KEYS[1] is the
# session's hash (owner, state), KEYS[2] its history (a list, an item each). A save
# answers 1 (written), 0 (another node owns it) or -1 (the store lacks history items
# before the first one sent: it forgot them, or the whole record; nothing written).
_SAVE = """
local found = redis.call('HMGET', KEYS[1], 'owner', 'front', 'restored')
local front, first = tonumber(ARGV[5]), tonumber(ARGV[6])
if found[1] and found[1] ~= ARGV[1] then
  if found[1] ~= '' or not found[3] then return 0 end
  if first > front then return -1 end  -- a restored parked save: only a whole one replaces it
  found = {false, false}
end
if not found[1] then redis.call('DEL', KEYS[2]) end
local at = tonumber(found[2] or ARGV[5])
local stored = redis.call('LLEN', KEYS[2])
local stop = at + stored
if front > at and stop < front then stop = front end
if first > stop then return -1 end
if front > at then
  redis.call('LTRIM', KEYS[2], front - at, -1)
  at = front
end
for i = 7 + stop - first, #ARGV, 500 do
  redis.call('RPUSH', KEYS[2], unpack(ARGV, i, math.min(i + 499, #ARGV)))
end
redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'state', ARGV[3], 'front', at)
redis.call('HDEL', KEYS[1], 'restored')
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
redis.call('HDEL', KEYS[1], 'restored')
return {ARGV[2], found[2], redis.call('LRANGE', KEYS[2], 0, -1), found[3] or '0'}
"""
_DELETE = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then redis.call('DEL', KEYS[1], KEYS[2]) end
return 1
"""
# A parked save written again (the store forgot it), only where there is no record.
_RESTORE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'owner', '', 'state', ARGV[1], 'front', ARGV[3], 'restored', '1')
for i = 4, #ARGV, 500 do
  redis.call('RPUSH', KEYS[2], unpack(ARGV, i, math.min(i + 499, #ARGV)))
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
"""
# KEYS[1] the census (a hash: node -> "UNTIL_MS COUNT"), on the server's clock: a node's
# count is its own, live until UNTIL; the dead are dropped by whoever counts next.
_CENSUS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], (now + tonumber(ARGV[3])) .. ' ' .. ARGV[2])
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local untl, count = string.match(all[i + 1], '^(%d+) (-?%d+)$')
  if not untl or tonumber(untl) <= now then
    redis.call('HDEL', KEYS[1], all[i])
  elseif tonumber(count) >= 0 then
    out[#out + 1] = all[i]
    out[#out + 1] = count
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return out
"""


class RedisStore:
    """The store on Redis or Valkey, through valkey-glide's async client (which runs under
    Trio through anyio). One multiplexed connection per process (per shard of a cluster);
    it reconnects by itself.
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
        try:
            import glide  # noqa: F401 - the extra: here, so that a missing one fails at once
        except ImportError:
            raise StoreError(MISSING) from None
        self.host = host
        self.port = port
        self.database = database
        self.tls = tls
        self._username = username
        self._password = password
        self.timeout = timeout
        self._client: Any = None
        self._scripts: dict[str, Any] = {}
        self.cluster: bool | None = None
        """Whether the store is a Redis or Valkey Cluster (None until connected)."""

    def __repr__(self) -> str:  # never the password
        return f"<RedisStore {self.host}:{self.port}/{self.database}>"

    async def connect(self) -> None:
        """Connect (within the timeout), or raise :class:`StoreError`. A cluster is found
        here, whichever of its nodes the URL names; see :meth:`_open`."""
        # A refusal comes back within a round trip; glide says "timed out", seconds later.
        refused = await _refused(self.host, self.port, seconds=min(self.timeout, 1.0))
        if refused is not None:
            raise StoreError(f"cannot connect to the store at {self.host}:{self.port}: {refused}")
        with trio.move_on_after(self.timeout + 1.0) as scope:
            try:
                self._client = await self._open()
            except StoreError:
                raise
            except Exception as exc:
                raise StoreError(
                    f"cannot connect to the store at {self.host}:{self.port}: {_short(exc)}"
                ) from None
        if scope.cancelled_caught:
            raise StoreError(f"the store at {self.host}:{self.port} did not answer in time")
        if self.cluster:
            log.info("the store at %s:%s is a cluster", self.host, self.port)

    async def _open(self) -> Any:
        """A client for the store: glide's standalone client, or its cluster client for a
        Redis or Valkey Cluster, as ``redis-cli -c`` users expect.

        Which one is asked of the node itself (``INFO cluster``: ``cluster_enabled:1``)
        on a first, standalone connection, in database 0 (a cluster refuses to switch).
        A single server in database 0 keeps that connection; otherwise it is closed and
        the right client opened. Trying the cluster client first instead would cost a
        single server, the common case, a failed topology refresh: seconds and warnings
        at every start. A standalone client wants a primary at its address; a cluster's
        replica is asked read-only instead (a lone replica or a Sentinel cannot hold
        sessions: glide's "No primary" error stands). Read-only is not the first try: it
        would wait seconds for an address that refuses connections.
        """
        try:
            from glide import (
                AdvancedGlideClientConfiguration,
                AdvancedGlideClusterClientConfiguration,
                ClosingError,
                GlideClient,
                GlideClientConfiguration,
                GlideClusterClient,
                GlideClusterClientConfiguration,
                InfoSection,
                NodeAddress,
                ServerCredentials,
            )
        except ImportError:  # pragma: no cover - checked when the store was made
            raise StoreError(MISSING) from None
        _quiet_glide()
        credentials = (
            ServerCredentials(password=self._password, username=self._username)
            if self._password is not None
            else None
        )
        ms = int(self.timeout * 1000)
        common: dict[str, Any] = {
            "use_tls": self.tls,
            "credentials": credentials,
            "request_timeout": ms,
            "client_name": "trio-vrt",
            # glide connects with a blocking call (the event loop waits): no longer than this
            "advanced_config": AdvancedGlideClientConfiguration(connection_timeout=ms),
        }
        seed = [NodeAddress(self.host, self.port)]
        no_primary: Exception | None = None
        try:
            probe = await GlideClient.create(GlideClientConfiguration(seed, **common))
        except ClosingError as exc:
            if "No primary" not in str(exc):
                raise
            no_primary = exc
            config = GlideClientConfiguration(seed, read_only=True, **common)
            probe = await GlideClient.create(config)
        try:
            self.cluster = b"cluster_enabled:1" in bytes(await probe.info([InfoSection.CLUSTER]))
        except BaseException:
            await _close(probe, self.timeout)
            raise
        if not self.cluster and no_primary is None and not self.database:
            return probe
        await _close(probe, self.timeout)
        if not self.cluster:
            if no_primary is not None:
                raise no_primary
            config = GlideClientConfiguration(seed, database_id=self.database, **common)
            return await GlideClient.create(config)
        common["advanced_config"] = AdvancedGlideClusterClientConfiguration(connection_timeout=ms)
        config = GlideClusterClientConfiguration(seed, database_id=self.database or None, **common)
        try:
            return await GlideClusterClient.create(config)
        except Exception as exc:
            if not self.database:
                raise
            raise StoreError(
                f"cannot connect to the cluster at {self.host}:{self.port} in database "
                f"{self.database} (a Redis Cluster has only database 0): {_short(exc)}"
            ) from None

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

    async def heartbeat(self, node: str, address: str, ttl: float) -> bool:
        from glide import ExpirySet, ExpiryType

        had = await self._call(  # SET ... GET: the lease as it was
            "set", node_key(node), address, None, ExpirySet(ExpiryType.MILLSEC, _ms(ttl)), True
        )
        return had is not None

    async def node_address(self, node: str) -> str | None:
        found = await self._call("get", node_key(node))
        return None if found is None else bytes(found).decode()

    async def census(self, node: str, sessions: int, ttl: float) -> dict[str, int]:
        found = await self._script(_CENSUS, [census_key()], [node, str(sessions), str(_ms(ttl))])
        pairs = [bytes(x).decode() for x in found or ()]
        return {pairs[i]: int(pairs[i + 1]) for i in range(0, len(pairs) - 1, 2)}

    async def forget_node(self, node: str) -> None:
        await self._call("delete", [node_key(node)])

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
        if done == -1:
            raise StoreForgot(f"history items missing before {first}")
        return bool(done)

    async def load(self, session_id: str) -> Saved | None:
        if not _tagged(session_id):
            return None
        return _saved(await self._script(_LOAD, _keys(session_id), []))

    async def restore(
        self, session_id: str, state: bytes, ttl: float, *, front: int, items: Sequence[bytes]
    ) -> bool:
        done = await self._script(
            _RESTORE, _keys(session_id), [state, str(_ms(ttl)), str(front), *items]
        )
        return bool(done)

    async def claim(self, session_id: str, expected: str, node: str) -> Saved | None:
        if not _tagged(session_id):
            return None
        return _saved(await self._script(_CLAIM, _keys(session_id), [expected, node]))

    async def delete(self, session_id: str, node: str) -> None:
        await self._script(_DELETE, _keys(session_id), [node])

    async def touch(self, session_ids: Iterable[str], ttl: float) -> set[str]:
        from glide import Batch, ClusterBatch

        ids = list(session_ids)
        ms = _ms(ttl)
        gone: set[str] = set()
        for start in range(0, len(ids), 250):  # one round trip per 250 sessions
            # Not atomic: in a cluster, glide sends each key to its own shard.
            batch = ClusterBatch(is_atomic=False) if self.cluster else Batch(is_atomic=False)
            chunk = ids[start : start + 250]
            for session_id in chunk:
                for key in _keys(session_id):
                    batch.pexpire(key, ms)
            done = await self._call("exec", batch, False) or ()
            # PEXPIRE answers False for a key that is not there: the session's hash or its
            # history list gone (an empty history is no key either: its keeper knows)
            pairs = zip(chunk, done[::2], done[1::2], strict=False)
            gone.update(s for s, record, history in pairs if not (record and history))
        return gone

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await _close(client, self.timeout)


async def _close(client: Any, seconds: float) -> None:
    """Close a glide client, even in a cancelled scope, giving it ``seconds`` at most."""
    with trio.move_on_after(seconds) as scope:
        scope.shield = True
        try:
            await client.close()
        except Exception:  # closing: nothing left to tell anyone
            pass


def _quiet_glide() -> None:
    """Turn valkey-glide's own log off (stdout with ANSI colours, or files), unless the
    application configured it before (``glide.Logger.init`` keeps a configured logger)."""
    from glide import Logger, LogLevel

    Logger.init(LogLevel.OFF)


def _keys(session_id: str) -> list[str]:
    """A session's two keys: its hash (``vrt:{ID}:session``), its history list
    (``vrt:{ID}:history``). One script uses both: the hash tag ``{ID}`` puts them on one
    slot, one shard of a cluster."""
    return [session_key(session_id), history_key(session_id)]


def _tagged(session_id: str) -> bool:
    """Whether the id makes a hash tag: not empty, not starting with ``}`` (the tag would
    be empty, each key then on a slot of its own). The server's ids (``s_`` and hex)
    always do; a client's resume with one that does not finds nothing, as in memory."""
    return not session_id.startswith("}") and session_id != ""


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


async def _refused(host: str, port: int, *, seconds: float) -> str | None:
    """Why a TCP connection to ``host:port`` fails at once (``connection refused``: nothing
    listens there; an unknown host), or None if it connects, or not within ``seconds``."""
    with trio.move_on_after(seconds):
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            causes = exc.__cause__ if isinstance(exc.__cause__, BaseExceptionGroup) else None
            failed = list(causes.exceptions) if causes is not None else [exc]
            if all(isinstance(each, ConnectionRefusedError) for each in failed):
                return "connection refused"
            return exc.strerror if isinstance(exc, socket.gaierror) else None
        await stream.aclose()
    return None
