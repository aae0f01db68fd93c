"""The store's rules, on both stores: :class:`MemoryStore` and :class:`RedisStore` on a real
``redis-server`` (valkey-glide under Trio), alone and as a 3-master Redis Cluster. The same
test, the same answers."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.servers import RedisCluster, free_port, redis_cli, redis_cluster, redis_server
from vrt._cluster.redis import RedisStore, _keys
from vrt._cluster.store import (
    MemoryStore,
    Saved,
    Store,
    StoreError,
    StoreForgot,
    history_key,
    node_key,
    open_store,
    session_key,
)

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with redis_cluster() as found:
        yield found


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.network),
        pytest.param("cluster", marks=pytest.mark.network),
    ]
)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield MemoryStore()
        return
    if request.param == "cluster":
        url = request.getfixturevalue("cluster").url
    else:
        url = request.getfixturevalue("redis_url")
    the_store = open_store(url)
    assert isinstance(the_store, RedisStore)
    await the_store.connect()
    try:
        yield the_store
    finally:
        await the_store.aclose()


def sid() -> str:
    return f"s_{trio.current_time()}_{id(object())}"


async def test_a_node_lives_while_it_beats(store: Store) -> None:
    """A heartbeat also says whether the lease was still there: a node whose store forgot
    it (or whose lease ran out) learns it at its next heartbeat."""
    node = sid()
    assert await store.node_address(node) is None
    assert not await store.heartbeat(node, "127.0.0.1:1234", 0.3)  # the first
    assert await store.heartbeat(node, "127.0.0.1:1234", 0.3)
    assert await store.node_address(node) == "127.0.0.1:1234"
    await trio.sleep(0.5)
    assert await store.node_address(node) is None  # its lease ran out
    assert not await store.heartbeat(node, "127.0.0.1:1234", 5)
    await store.forget_node(node)
    assert await store.node_address(node) is None


async def test_the_census_counts_the_live_nodes_but_the_draining(store: Store) -> None:
    """What rebalancing shares out: each node's session count, live for its ttl, on the
    store's clock; a draining node (-1) is counted out, a silent one drops out."""
    a, b, c = sid(), sid(), sid()
    assert (await store.census(a, 3, 0.4))[a] == 3
    counts = await store.census(b, 5, 5)
    assert (counts[a], counts[b]) == (3, 5)
    counts = await store.census(c, -1, 5)
    assert c not in counts and counts[b] == 5
    await trio.sleep(0.6)
    counts = await store.census(b, 4, 5)
    assert a not in counts and counts[b] == 4
    assert c not in counts


async def test_owners_change_only_by_compare_and_set(store: Store) -> None:
    s = sid()
    assert await store.load(s) is None
    assert await store.save(s, "a", "a", b"one", 5)
    assert await store.load(s) == Saved(owner="a", state=b"one")
    assert not await store.save(s, "b", "b", b"two", 5)  # b does not own it
    assert await store.claim(s, "b", "c") is None  # the owner is not b
    assert await store.save(s, "a", "", b"parked", 5)  # a hands it over
    assert await store.claim(s, "", "b") == Saved(owner="b", state=b"parked")
    assert await store.claim(s, "", "c") is None  # taken already: only one node wins
    assert not await store.save(s, "a", "a", b"stale", 5)  # a can no longer write it
    await store.delete(s, "a")  # not a's to delete
    assert (await store.load(s)) == Saved(owner="b", state=b"parked")
    await store.delete(s, "b")
    assert await store.load(s) is None


async def test_the_history_is_appended_and_trimmed_item_by_item(store: Store) -> None:
    """A save writes what changed: items added at the end, the oldest dropped from the
    front; a load or a claim gets them all, in order. The same save written twice (a
    timeout that hid a success) changes nothing; a save that would leave a hole fails."""
    s = sid()
    assert await store.save(s, "a", "a", b"v1", 5, items=[b"i0", b"i1", b"i2"])
    assert await store.save(s, "a", "a", b"v2", 5, front=2, first=3, items=[b"i3"])
    assert await store.load(s) == Saved(owner="a", state=b"v2", history=(b"i2", b"i3"), front=2)
    assert await store.save(s, "a", "a", b"v2", 5, front=2, first=3, items=[b"i3"])  # again
    assert await store.save(s, "a", "a", b"v2", 5, front=2, first=2, items=[b"i2", b"i3"])
    assert await store.load(s) == Saved(owner="a", state=b"v2", history=(b"i2", b"i3"), front=2)
    many = [bytes([n]) for n in range(256)] * 5
    assert await store.save(s, "a", "", b"v3", 5, front=2, first=4, items=many)
    claimed = await store.claim(s, "", "b")
    assert claimed is not None and claimed.history[:2] == (b"i2", b"i3")
    assert len(claimed.history) == 2 + 1280 and claimed.history[-1] == b"\xff"
    assert claimed.front == 2
    assert not await store.save(s, "a", "a", b"v4", 5, front=100)  # not a's: nothing trimmed
    assert len((await store.load(s) or claimed).history) == 1282
    # b drops everything stored and more: the history starts again at its new front
    assert await store.save(s, "b", "b", b"v5", 5, front=2000, first=2000, items=[b"x"])
    assert await store.load(s) == Saved(owner="b", state=b"v5", history=(b"x",), front=2000)
    with pytest.raises(StoreForgot):
        await store.save(s, "b", "b", b"v6", 5, front=2000, first=2005, items=[b"y"])
    assert await store.load(s) == Saved(owner="b", state=b"v5", history=(b"x",), front=2000)


async def test_a_store_that_forgot_a_session_says_so_and_takes_it_whole(store: Store) -> None:
    """Gone (expired, flushed, evicted): a save of what the node believes the store
    lacks is refused with :class:`StoreForgot`, nothing written; the whole session then
    is an ordinary save."""
    s = sid()
    assert await store.save(s, "a", "a", b"v1", 0.2, items=[b"i0", b"i1"])
    await trio.sleep(0.3)  # its record expired
    with pytest.raises(StoreForgot):
        await store.save(s, "a", "a", b"v2", 5, first=2, items=[b"i2"])
    assert await store.load(s) is None
    assert await store.save(s, "a", "a", b"v2", 5, items=[b"i0", b"i1", b"i2"])
    assert await store.load(s) == Saved(owner="a", state=b"v2", history=(b"i0", b"i1", b"i2"))


async def test_a_touch_names_the_records_the_store_no_longer_has(store: Store) -> None:
    kept, gone = sid(), sid() + "x"
    assert await store.save(kept, "a", "a", b"state", 5, items=[b"i0"])
    assert await store.save(gone, "a", "a", b"state", 0.2, items=[b"i0"])
    await trio.sleep(0.3)
    assert await store.touch([kept, gone], 5) == {gone}


@pytest.mark.network
@pytest.mark.parametrize("key", [0, 1], ids=["hash evicted", "history evicted"])
async def test_one_key_of_a_session_evicted_is_a_forgotten_session(
    redis_url: str, key: int
) -> None:
    """On Redis a session is two keys (its hash, its history list): either evicted alone
    (``maxmemory``) makes the next save that counts on it :class:`StoreForgot`."""
    store = open_store(redis_url)
    assert isinstance(store, RedisStore)
    await store.connect()
    try:
        s = sid()
        assert await store.save(s, "a", "a", b"v1", 5, items=[b"i0", b"i1"])
        await store._call("delete", [_keys(s)[key]])
        with pytest.raises(StoreForgot):
            await store.save(s, "a", "a", b"v2", 5, first=2, items=[b"i2"])
        assert await store.save(s, "a", "a", b"v2", 5, items=[b"i0", b"i1", b"i2"])
        assert await store.load(s) == Saved(owner="a", state=b"v2", history=(b"i0", b"i1", b"i2"))
    finally:
        await store.aclose()


async def test_records_expire_unless_touched(store: Store) -> None:
    kept, dropped = sid(), sid() + "x"
    for s in (kept, dropped):
        assert await store.save(s, "a", "a", b"state", 0.4)
    await trio.sleep(0.25)
    await store.touch([kept], 5)
    await trio.sleep(0.3)
    assert await store.load(kept) is not None
    assert await store.load(dropped) is None


async def test_concurrent_claims_have_one_winner(store: Store) -> None:
    s = sid()
    assert await store.save(s, "a", "", b"parked", 5)
    winners: list[Any] = []

    async def claim(node: str) -> None:
        if await store.claim(s, "", node) is not None:
            winners.append(node)

    async with trio.open_nursery() as nursery:
        for i in range(20):
            nursery.start_soon(claim, f"n{i}")
    assert len(winners) == 1


async def test_big_states_round_trip(store: Store) -> None:
    s = sid()
    state = bytes(range(256)) * 8192  # 2 MiB, every byte value
    assert await store.save(s, "a", "a", state, 5)
    found = await store.load(s)
    assert found is not None and found.state == state


async def test_an_id_the_server_never_makes_finds_nothing(store: Store) -> None:
    """A client's resume may name any session id; one that would leave a cluster's hash
    tag empty (each key then on a slot of its own) finds nothing, as an unknown one does."""
    for s in ("", "}", "}x{y}"):
        assert await store.load(s) is None
        assert await store.claim(s, "", "a") is None


@pytest.mark.network
async def test_a_store_that_does_not_answer_is_a_store_error() -> None:
    with trio.socket.socket() as silent:  # listens, never answers
        await silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        port = silent.getsockname()[1]
        store = RedisStore(host="127.0.0.1", port=port, timeout=0.5)
        with trio.fail_after(5), pytest.raises(StoreError):
            await store.connect()
    store = RedisStore(host="127.0.0.1", port=free_port(), timeout=0.5)
    with trio.fail_after(5), pytest.raises(StoreError, match="cannot connect"):
        await store.connect()


@pytest.mark.network
async def test_any_node_of_a_cluster_is_a_store_that_keeps_each_session_on_one_shard(
    cluster: RedisCluster, redis_url: str
) -> None:
    """``--store redis://ANY-NODE:PORT`` of a Redis Cluster: the cluster is found at
    connect, from whichever node is named, a replica too. A node's lease is kept whatever
    shard its name's slot is on; a session's two keys are on one shard (its scripts touch
    one slot); sessions spread over every shard and are touched across them in one call.
    A single server is not taken for a cluster."""
    stores = [open_store(f"redis://127.0.0.1:{port}") for port in (*cluster.slots, cluster.replica)]
    alone = open_store(redis_url)
    try:
        for each in (*stores, alone):
            assert isinstance(each, RedisStore)
            await each.connect()
        assert [each.cluster for each in stores if isinstance(each, RedisStore)] == [True] * 4
        assert isinstance(alone, RedisStore) and alone.cluster is False
        store = stores[-1]  # through the replica: glide finds the masters
        names = {cluster.port_of(node_key(f"n{i}")): f"n{i}" for i in range(40)}
        assert len(names) == 3  # a lease on every shard, the seed's and the others
        for name in names.values():
            await store.heartbeat(name, f"{name}:1", 5)
            assert await store.node_address(name) == f"{name}:1"
            await store.forget_node(name)
            assert await store.node_address(name) is None
        shards: dict[str, int] = {}  # sessions, four on each shard
        while len(shards) < 12:
            s = sid()
            port = cluster.port_of(session_key(s))
            if list(shards.values()).count(port) < 4:
                shards[s] = port
        ids = list(shards)
        for s in ids:
            assert await store.save(s, "a", "a", b"state", 60, items=[b"i0", b"i1"])
            assert redis_cli(shards[s], "EXISTS", session_key(s), history_key(s)) == "2"
            assert await store.load(s) == Saved(owner="a", state=b"state", history=(b"i0", b"i1"))
        await store.touch(ids, 0.3)  # one call, three shards: every key's expiry is set
        await trio.sleep(0.5)
        for s in ids:
            assert await store.load(s) is None
            assert redis_cli(shards[s], "EXISTS", session_key(s), history_key(s)) == "0"
    finally:
        for each in (*stores, alone):
            await each.aclose()


@pytest.mark.network
async def test_a_database_number_is_kept_and_a_cluster_has_only_database_0(
    redis_url: str, cluster: RedisCluster
) -> None:
    store = open_store(f"{redis_url}/3")
    assert isinstance(store, RedisStore)
    await store.connect()
    try:
        s = sid()
        assert await store.save(s, "a", "a", b"state", 5)
        port = int(redis_url.rsplit(":", 1)[1])
        assert redis_cli(port, "-n", "3", "EXISTS", session_key(s)) == "1"
        assert redis_cli(port, "-n", "0", "EXISTS", session_key(s)) == "0"
    finally:
        await store.aclose()
    in_cluster = open_store(f"{cluster.url}/3")
    assert isinstance(in_cluster, RedisStore)
    with trio.fail_after(5), pytest.raises(StoreError, match="only database 0"):
        await in_cluster.connect()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://x", "redis://, valkey:// or memory://"),
        ("redis://", "no host"),
        ("redis://h:port", "port is not a number"),
        ("redis://h:1/x", "database must be a number"),
    ],
)
def test_bad_store_urls(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        open_store(url)


def test_a_store_url_never_shows_its_password() -> None:
    store = open_store("redis://user:s3cret@127.0.0.1:6380/2")
    assert isinstance(store, RedisStore)
    assert (store.port, store.database, store.tls) == (6380, 2, False)
    assert "s3cret" not in repr(store)
    secure = open_store("rediss://h")
    assert isinstance(secure, RedisStore) and secure.tls


# -- the store client is an extra ------------------------------------------------------------

WITHOUT_GLIDE = """
import importlib.abc, sys

class Blocked(importlib.abc.MetaPathFinder):
    # valkey-glide not installed: what the `trio-vrt[redis]` extra brings is missing
    def find_spec(self, name, path=None, target=None):
        if name == "glide" or name.startswith(("glide.", "glide_shared")):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Blocked())
"""

WITHOUT_GLIDE_CHECKS = """
import functools, sys
import trio
import vrt
from vrt._cluster.store import MemoryStore, StoreError

agent = vrt.define_agent(model=vrt.ScriptedModel([[vrt.say("hi")]]))

async def main():
    async with trio.open_nursery() as nursery:
        for store in (None, MemoryStore()):  # no store, or one in this process
            await nursery.start(functools.partial(vrt.serve, agent, "127.0.0.1", 0, store=store))
        nursery.cancel_scope.cancel()
    try:
        await vrt.serve(agent, "127.0.0.1", 0, store="redis://127.0.0.1:1")
    except StoreError as exc:
        print(exc)

trio.run(main)
assert not [m for m in sys.modules if m.startswith("glide")], "glide was imported"
from vrt._cli import main as cli
sys.exit(cli(["serve", "tests.deploy_agent:agent", "--store", "redis://127.0.0.1:1"]))
"""


def test_without_the_redis_extra_only_a_store_needs_it() -> None:
    """valkey-glide is the ``trio-vrt[redis]`` extra: ``import vrt`` and ``vrt.serve``
    without a Redis store never import it, and with one the error names what to install;
    ``vrt serve --store`` prints that one line and exits 2 (here glide is blocked by a
    meta path finder, as if it were not installed)."""
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_GLIDE + WITHOUT_GLIDE_CHECKS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    missing = "the Redis/Valkey store client is not installed: pip install 'trio-vrt[redis]'"
    assert result.stdout == missing + "\n", result.stderr[-2000:]
    assert (result.returncode, result.stderr) == (2, f"vrt serve: {missing}\n")


@pytest.mark.network
async def test_valkey_glides_own_log_stays_out_of_ours(capfd: pytest.CaptureFixture[str]) -> None:
    """glide's Rust core logs by itself, to file descriptor 1 with ANSI colours (a
    connection that fails, a request that times out), and has no hook into Python's
    logging: vrt turns it off when it connects, and says what went wrong once, as a
    :class:`StoreError` its caller logs."""
    store = RedisStore(host="127.0.0.1", port=free_port(), timeout=0.3)
    with pytest.raises(StoreError, match="cannot connect"):
        await store.connect()
    await trio.sleep(0.2)  # glide writes its log from a thread of its own
    out, err = capfd.readouterr()
    assert "\x1b[" not in out + err and "glide" not in out + err, out + err


async def test_a_parked_save_written_again_yields_to_the_node_that_runs_the_session(
    store: Store,
) -> None:
    """``restore`` writes a handed-over session's last save again only where the store has
    no record, owned by nobody; the node that took the session over before the store
    forgot overwrites it with its first whole save (an incremental one is told the store
    forgot), while any other record still refuses a node that does not own it."""
    s = sid()
    assert await store.restore(s, b"parked", 5, front=0, items=[b"1", b"2"])
    assert not await store.restore(s, b"again", 5, front=0, items=[])
    assert await store.load(s) == Saved(owner="", state=b"parked", history=(b"1", b"2"))
    with pytest.raises(StoreForgot):
        await store.save(s, "x", "x", b"newer", 5, front=0, first=3, items=[b"4"])
    assert await store.save(s, "x", "x", b"newer", 5, items=[b"1", b"2", b"3", b"4"])
    assert await store.load(s) == Saved(owner="x", state=b"newer", history=(b"1", b"2", b"3", b"4"))
    assert await store.save(s, "x", "", b"handed", 5, front=0, first=4, items=[])
    assert not await store.save(s, "y", "y", b"zombie", 5, items=[b"1"])  # a genuine handover
    t = sid()
    assert await store.restore(t, b"parked", 5, front=0, items=[])
    assert await store.claim(t, "", "z") is not None  # claimed: no longer a restored one
    assert not await store.save(t, "x", "x", b"late", 5, items=[])
