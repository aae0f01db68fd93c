"""A store that forgets, or stops answering, on a real ``redis-server`` (tests/servers.py):
two ``vrt.serve`` nodes in this process, each with its own connection to the store, the
client through a :class:`LoopbackProxy` that the test moves as a load balancer would
(tests/test_handover.py's pattern).

Covered: each way a store forgets (FLUSHALL, a restart without persistence, the session's
hash or its history list evicted) followed by a drain: nothing lost, the whole history
moves; an idle session the store forgot is saved again before any boundary (the node's
heartbeat finds its lease gone, its touch the record), so a crash after it loses nothing;
a partition from the store (tests/store_link.py) longer than the records' life: one
WARNING when it starts and one when it ends, ``GET /healthz`` 503 meanwhile, nothing
lost; a drain while Redis is stopped (SIGSTOP): the sessions are let go unsaved and
adopted elsewhere from their last save once it answers.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio

import vrt
from tests import servers
from tests.conftest import Log, until
from tests.servers import Redis
from tests.test_handover import Recording, ended, make_agent, move, texts, via
from vrt._cluster import node as node_module
from vrt._cluster.redis import RedisStore, _keys
from vrt._cluster.store import node_key
from vrt._server import hub as hub_module

pytestmark = [pytest.mark.network, pytest.mark.usefixtures("no_errors")]

STORE_TIMEOUT = 0.5
"""Seconds a store call waits here (2 s in production): an outage is noticed sooner."""


@attrs.define
class Node:
    server: vrt.Server
    scope: trio.CancelScope
    model: Recording
    done: trio.Event


@asynccontextmanager
async def nodes(redis: Redis | int, **options: Any) -> AsyncIterator[list[Node]]:
    """Two servers, ``n0`` and ``n1``, on ``redis`` (or a port that leads to it), each
    with its own connection."""
    port = redis if isinstance(redis, int) else redis.port
    stores = [RedisStore(host="127.0.0.1", port=port, timeout=STORE_TIMEOUT) for _ in "ab"]
    started: list[Node] = []
    async with trio.open_nursery() as nursery:
        for i, store in enumerate(stores):
            model, scope, done = Recording(), trio.CancelScope(), trio.Event()

            async def run(
                scope: trio.CancelScope = scope,
                done: trio.Event = done,
                model: Recording = model,
                store: RedisStore = store,
                i: int = i,
                *,
                task_status: trio.TaskStatus[vrt.Server],
            ) -> None:
                try:
                    with scope:
                        await vrt.serve(
                            make_agent(model),
                            "127.0.0.1",
                            0,
                            store=store,
                            node=f"n{i}",
                            task_status=task_status,
                            **options,
                        )
                finally:
                    done.set()

            server = await nursery.start(run)
            started.append(Node(server=server, scope=scope, model=model, done=done))
        yield started
        nursery.cancel_scope.cancel()
    for store in stores:
        await store.aclose()


async def turn(client: vrt.Client, events: Log, text: str) -> vrt.TurnEnded:
    await client.send_text(text)
    done: vrt.TurnEnded = await until(events, ended)
    return done


def inputs(model: Recording) -> list[str]:
    """The user inputs of the last request the model got (its whole history)."""
    return [h.text for h in model.requests[-1].history if isinstance(h, vrt.models.UserInput)]


async def healthz(server: vrt.Server) -> str:
    """``GET /healthz``: its status line's code and its body, as ``"503 store unreachable"``."""
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    async with stream:
        await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        with trio.fail_after(5):
            while chunk := await stream.receive_some(4096):
                data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return f"{head.split()[1].decode()} {body.decode().strip()}"


async def until_healthz(server: vrt.Server, expected: str) -> None:
    with trio.fail_after(5):
        while await healthz(server) != expected:  # noqa: ASYNC110 - another party's state
            await trio.sleep(0.05)


async def saved(redis: Redis, session: str, *, items: int) -> None:
    """Wait until the store holds ``items`` history items of ``session`` (a turn's end is
    saved after the client saw it)."""
    with trio.fail_after(5):
        while redis.cli("LLEN", _keys(session)[1]) != str(items):  # noqa: ASYNC110 - the store's
            await trio.sleep(0.02)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("vrt") and r.levelno >= logging.WARNING
    ]


FORGET: dict[str, Callable[[Redis, str], object]] = {
    "flushall": lambda redis, _: redis.cli("FLUSHALL"),
    "restart": lambda redis, _: redis.restart(),
    "hash evicted": lambda redis, session: redis.cli("DEL", _keys(session)[0]),
    "history evicted": lambda redis, session: redis.cli("DEL", _keys(session)[1]),
}
"""Each way a store forgets a session, as the test makes it happen."""


@pytest.mark.parametrize("way", list(FORGET))
async def test_a_store_that_forgot_gets_the_whole_session_and_a_drain_loses_nothing(
    way: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 26, finding 1: after the store forgot, every save failed (items missing)
    and the drain closed the session (``shutdown``). Now the first save that finds the
    store lacking writes the whole session, and the drain moves all of it."""
    with servers.redis() as redis:
        async with nodes(redis) as [a, b], via(a) as proxy:
            async with vrt.connect(f"ws://127.0.0.1:{proxy.port}/") as client:
                async with client.subscribe() as channel:
                    events = Log(channel)
                    for text in ("one", "two"):
                        await turn(client, events, text)
                    FORGET[way](redis, client.session_id or "")
                    for text in ("three", "four"):
                        await turn(client, events, text)
                    move(proxy, b, cut=False)
                    a.server.drain()
                    with trio.fail_after(5):
                        await until(events, lambda e: isinstance(e, vrt.Resumed))
                        await a.done.wait()
                    last = await turn(client, events, "five")
    assert texts(events.events, last.turn_id) == "seen 5 inputs, 0 interrupted"
    assert inputs(b.model) == ["one", "two", "three", "four", "five"]  # the whole history
    assert not any(isinstance(e, vrt.Closed) for e in events.events)
    vrt.testing.assert_stream_valid(events.events)
    assert not [w for w in warnings(caplog) if w.startswith("session")]  # none per save


@pytest.mark.parametrize("way", ["flushall", "hash evicted", "history evicted"])
async def test_an_idle_session_the_store_forgot_is_saved_again_before_a_crash(
    way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No boundary comes after the store forgot: the node finds out by itself (its
    heartbeat finds its lease gone; its touch, every half resume window, the record) and
    saves the session again, whole; a crash of the node then loses nothing."""
    monkeypatch.setattr(node_module, "HEARTBEAT", 0.2)  # (1 s in production)
    with servers.redis() as redis:
        async with nodes(redis, resume_window=2.0) as [a, b], via(a) as proxy:
            async with vrt.connect(f"ws://127.0.0.1:{proxy.port}/") as client:
                async with client.subscribe() as channel:
                    events = Log(channel)
                    for text in ("one", "two"):
                        await turn(client, events, text)
                    session = client.session_id or ""
                    FORGET[way](redis, session)
                    with trio.fail_after(4):  # saved again, with no turn meanwhile
                        while redis.cli("EXISTS", *_keys(session)) != "2":  # noqa: ASYNC110
                            await trio.sleep(0.1)
                    move(proxy, b)
                    a.scope.cancel()  # a crash
                    await a.done.wait()
                    redis.cli("DEL", node_key("n0"))  # its lease over (5 s, otherwise)
                    await until(events, lambda e: isinstance(e, vrt.Resumed))
                    last = await turn(client, events, "three")
    assert texts(events.events, last.turn_id) == "seen 3 inputs, 0 interrupted"
    assert inputs(b.model) == ["one", "two", "three"]
    assert not any(isinstance(e, vrt.Closed) for e in events.events)


async def test_an_outage_longer_than_the_records_life_is_one_warning_and_loses_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The nodes lose the store (a network partition: their connections cut, new ones
    never answered) for longer than the records live (1.5 resume windows, a lease and a
    second: here 1.5 s). The sessions go on, their saves fail, ``GET /healthz`` says
    ``503 store unreachable`` and one WARNING says it started. When the store is back (the
    records expired meanwhile): one WARNING says so, every session is saved again,
    whole, and a drain then moves all of it."""
    monkeypatch.setattr(node_module, "LEASE", 0.2)
    monkeypatch.setattr(node_module, "HEARTBEAT", 0.1)
    with servers.redis() as redis, servers.store_link(redis.port) as link:
        async with nodes(link.port, resume_window=0.2) as [a, b], via(a) as proxy:
            async with vrt.connect(f"ws://127.0.0.1:{proxy.port}/") as client:
                async with client.subscribe() as channel:
                    events = Log(channel)
                    await turn(client, events, "one")
                    await saved(redis, client.session_id or "", items=2)
                    assert await healthz(a.server) == "200 ok"
                    link.cut()
                    for text in ("two", "three"):  # the session goes on; no save
                        await turn(client, events, text)
                    await until_healthz(a.server, "503 store unreachable")
                    await trio.sleep(1.6)  # past the records' life
                    assert redis.cli("KEYS", "vrt:*:session") == ""  # expired
                    link.mend()
                    await until_healthz(a.server, "200 ok")
                    move(proxy, b, cut=False)
                    a.server.drain()
                    await until(events, lambda e: isinstance(e, vrt.Resumed))
                    last = await turn(client, events, "four")
    assert texts(events.events, last.turn_id) == "seen 4 inputs, 0 interrupted"
    assert inputs(b.model) == ["one", "two", "three", "four"]
    assert not any(isinstance(e, vrt.Closed) for e in events.events)
    said = [w for w in warnings(caplog) if w.startswith("node n0")]
    assert len([w for w in said if "the store fails" in w]) == 1, said
    assert len([w for w in said if "the store answers again" in w]) == 1, said
    assert not [w for w in warnings(caplog) if w.startswith("session")]


async def test_a_drain_during_an_outage_lets_sessions_go_unsaved_and_they_go_on_elsewhere(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGTERM while the store does not answer: the handover cannot be written; at the
    drain's end the session is let go unsaved (1012, no ``closed``) and its record left as
    its last save had it. The client tries to resume until the store answers again; then
    the other node adopts it from that save, and the client replays what it sent since
    (acked only once saved)."""
    monkeypatch.setattr(node_module, "LEASE", 0.5)
    monkeypatch.setattr(hub_module, "DRAIN_GRACE", 0.3)
    with servers.redis() as redis:
        async with nodes(redis, drain_timeout=0.3) as [a, b], via(a) as proxy:
            async with vrt.connect(f"ws://127.0.0.1:{proxy.port}/") as client:
                async with client.subscribe() as channel:
                    events = Log(channel)
                    await turn(client, events, "one")
                    await saved(redis, client.session_id or "", items=2)
                    redis.pause()
                    await turn(client, events, "two")  # ran; its saves wait in the store
                    move(proxy, b, cut=False)
                    a.server.drain()
                    await until(events, lambda e: isinstance(e, vrt.Reconnecting))
                    with trio.fail_after(5):
                        await a.done.wait()
                    await trio.sleep(0.5)  # the outage goes on: resumes at b fail (1011)
                    redis.resume()
                    await until(events, lambda e: isinstance(e, vrt.Resumed))
                    last = await turn(client, events, "three")
    assert texts(events.events, last.turn_id) == "seen 3 inputs, 0 interrupted"
    assert inputs(b.model) == ["one", "two", "three"]
    assert not any(isinstance(e, vrt.Closed) for e in events.events)
    vrt.testing.assert_stream_valid(events.events)
    assert any("let go unsaved" in w for w in warnings(caplog))
