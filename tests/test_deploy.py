"""Serving in production, as an operator runs it: ``vrt serve --store`` processes, a real
``redis-server`` (alone, or a 3-master Redis Cluster), HAProxy in front (docs/deploy.md).
Every process is started and stopped by the test on loopback ports; each server's log
must hold no ERROR."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

import vrt
from tests import servers
from tests.conftest import Log, until
from tests.servers import RedisCluster, free_port, haproxy, redis_cli, redis_cluster, redis_server
from vrt._cluster.redis import RedisStore
from vrt._cluster.store import history_key, node_key, open_store, session_key
from vrt.testing import LoopbackProxy

pytestmark = pytest.mark.network

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


@asynccontextmanager
async def connected_store(url: str) -> AsyncIterator[RedisStore]:
    store = open_store(url)
    assert isinstance(store, RedisStore)
    await store.connect()
    try:
        yield store
    finally:
        await store.aclose()


@asynccontextmanager
async def vrt_serve(
    tmp_path: Path, name: str, *flags: str, target: str = "tests.deploy_agent:agent"
) -> AsyncIterator[tuple[trio.Process, str]]:
    """``vrt serve TARGET FLAGS`` (tests/servers.py), its log ``NAME.log`` in tmp_path."""
    async with servers.vrt_serve(tmp_path / f"{name}.log", target, *flags) as served:
        yield served


async def turn(client: vrt.Client, events: Log, text: str) -> vrt.TurnEnded:
    await client.send_text(text)
    ended: vrt.TurnEnded = await until(events, lambda e: isinstance(e, vrt.TurnEnded))
    return ended


def said(events: Log, turn_id: str) -> str:
    return "".join(
        e.text for e in events.events if isinstance(e, vrt.TextDelta) and e.turn_id == turn_id
    )


def worker_pids(parent: int) -> set[int]:
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(parent)], capture_output=True, text=True
    ).stdout
    return {int(pid) for pid in out.split()}


async def test_two_workers_survive_a_sigterm_of_the_one_running_the_session(
    tmp_path: Path, redis_url: str
) -> None:
    """``vrt serve --workers 2 --store``: the worker running the session is sent SIGTERM on
    its own; it drains (the session moves to the other worker), the client sees
    ``resumed``, never ``closed``; the parent starts the worker again, a planned restart
    logged at INFO (it was a WARNING); SIGTERM to the parent drains both and exits 0."""
    port = free_port()
    flags = ("--port", str(port), "--store", redis_url, "--workers", "2")
    async with (
        vrt_serve(tmp_path, "workers", *flags) as (parent, line),
        connected_store(redis_url) as store,
    ):
        assert f"ws://127.0.0.1:{port}/ (2 workers)" in line
        with trio.fail_after(10):
            while len(worker_pids(parent.pid)) < 2:  # noqa: ASYNC110 - other processes
                await trio.sleep(0.05)
        first = worker_pids(parent.pid)
        async with vrt.connect(f"ws://127.0.0.1:{port}/") as client:
            async with client.subscribe() as channel:
                events = Log(channel)
                ended = await turn(client, events, "hello")
                assert said(events, ended.turn_id) == "turn 1, 1 inputs seen, 0 interrupted"
                with trio.fail_after(5):  # the turn's end is saved just after it is sent
                    while (saved := await store.load(client.session_id or "")) is None:  # noqa: ASYNC110 - another process saves it
                        await trio.sleep(0.05)
                owner_pid = int(saved.owner.split(":")[1])
                assert owner_pid in first
                os.kill(owner_pid, signal.SIGTERM)
                await until(events, lambda e: isinstance(e, vrt.Resumed))
                ended = await turn(client, events, "still there?")
                assert said(events, ended.turn_id) == "turn 2, 2 inputs seen, 0 interrupted"
                assert not any(isinstance(e, vrt.Closed) for e in events.events)
        with trio.fail_after(15):  # the drained worker was started again
            while not (worker_pids(parent.pid) - first) or len(worker_pids(parent.pid)) < 2:  # noqa: ASYNC110
                await trio.sleep(0.1)
        log = tmp_path / "workers.log"
        index = saved.owner.split(":")[2]
        planned = (
            f"vrt.server: worker {index} ({saved.owner}) drained and exited: starting it again"
        )
        assert any(entry.endswith(planned) for entry in log_lines(log, "INFO")), log.read_text()
        assert log_lines(log, "WARNING") == []
        parent.send_signal(signal.SIGTERM)
        with trio.fail_after(20):
            await parent.wait()
        assert parent.returncode == 0


async def test_vrt_serve_with_a_store_drains_on_sigterm_and_exits_0(
    tmp_path: Path, redis_url: str
) -> None:
    port = free_port()
    async with vrt_serve(tmp_path, "one", "--port", str(port), "--store", redis_url) as (
        process,
        _,
    ):
        async with vrt.connect(f"ws://127.0.0.1:{port}/") as client:
            async with client.subscribe() as channel:
                events = Log(channel)
                await turn(client, events, "hello")
                process.send_signal(signal.SIGTERM)
                with trio.fail_after(10):
                    await process.wait()
        assert process.returncode == 0


async def test_after_a_flushall_a_drain_hands_the_whole_session_over(tmp_path: Path) -> None:
    """Issue 26, finding 1, as an operator met it: one node, two turns, ``redis-cli
    flushall``, two turns, SIGTERM. The client got ``closed`` (``shutdown``), after
    thousands of WARNINGs. Now the first save after the flush writes the whole session,
    the drain hands it over (the client reconnects, to resume elsewhere) and the store
    holds all of it; the log has no WARNING."""
    port = free_port()
    with servers.redis() as redis:
        async with vrt_serve(tmp_path, "one", "--port", str(port), "--store", redis.url) as (
            process,
            _,
        ):
            async with vrt.connect(f"ws://127.0.0.1:{port}/") as client:
                async with client.subscribe() as channel:
                    events = Log(channel)
                    for text in ("one", "two"):
                        await turn(client, events, text)
                    redis.cli("FLUSHALL")
                    for text in ("three", "four"):
                        ended = await turn(client, events, text)
                    assert said(events, ended.turn_id) == "turn 4, 4 inputs seen, 0 interrupted"
                    process.send_signal(signal.SIGTERM)
                    await until(events, lambda e: isinstance(e, vrt.Reconnecting))
                    with trio.fail_after(10):
                        await process.wait()
                    assert process.returncode == 0
                    async with connected_store(redis.url) as store:
                        saved = await store.load(client.session_id or "")
        assert not any(isinstance(e, vrt.Closed) for e in events.events)
        assert saved is not None and saved.owner == ""  # handed over
        assert len(saved.history) == 8  # four turns: each an input and an answer
    log = (tmp_path / "one.log").read_text()
    assert " WARNING " not in log, log[-3000:]


def test_without_a_store_workers_are_refused() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "vrt", "serve", "tests.deploy_agent:agent", "--workers", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and "needs --store" in result.stderr


# -- a Redis Cluster --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with redis_cluster() as found:
        yield found


async def test_two_nodes_on_a_redis_cluster_hand_a_session_over(
    tmp_path: Path, cluster: RedisCluster
) -> None:
    """Issue 26's Redis Cluster test: two ``vrt serve --store redis://ONE-NODE:PORT`` nodes
    on a 3-master cluster, each named so that its lease is on a shard the named node does
    not hold (neither started before: ``MOVED``). A client through a proxy (the balancer)
    on the first node; its turns are saved on its session's shard (they were refused
    before: ``CROSSSLOT``). The first node is drained (SIGTERM) while the proxy sends new
    connections to the second: the client resumes there, never closed, and its next turn
    sees the whole history."""
    seed = int(cluster.url.rsplit(":", 1)[1])
    names = [n for n in (f"node-{i}" for i in range(50)) if cluster.port_of(node_key(n)) != seed]
    ports = [free_port(), free_port()]
    flags = ("--store", cluster.url, "--drain-timeout", "10")
    async with (
        vrt_serve(tmp_path, "a", "--port", str(ports[0]), "--node", names[0], *flags) as (a, _),
        vrt_serve(tmp_path, "b", "--port", str(ports[1]), "--node", names[1], *flags),
        connected_store(cluster.url) as store,
        trio.open_nursery() as nursery,
    ):
        proxy = LoopbackProxy(ports[0])
        await nursery.start(proxy.run)
        async with (
            vrt.connect(f"ws://127.0.0.1:{proxy.port}/", tools=[note]) as client,
            client.subscribe() as channel,
        ):
            events = Log(channel)
            ended = await turn(client, events, "hello")
            assert said(events, ended.turn_id) == "turn 1, 1 inputs seen, 0 interrupted"
            ended = await turn(client, events, "app note this")  # an app call
            assert said(events, ended.turn_id) == "turn 2, 2 inputs seen, 0 interrupted"
            session = client.session_id or ""
            saved = await store.load(session)
            assert saved is not None and saved.owner == names[0]
            shard = cluster.port_of(session_key(session))
            assert redis_cli(shard, "EXISTS", session_key(session), history_key(session)) == "2"
            proxy.target_port = ports[1]  # the balancer takes the first node out
            a.send_signal(signal.SIGTERM)
            await until(events, lambda e: isinstance(e, vrt.Resumed))
            with trio.fail_after(10):
                await a.wait()
            assert a.returncode == 0
            ended = await turn(client, events, "still there?")
            assert said(events, ended.turn_id) == "turn 3, 3 inputs seen, 0 interrupted"
            saved = await store.load(session)
            assert saved is not None and saved.owner == names[1]
            assert not any(isinstance(e, vrt.Closed) for e in events.events)
            vrt.testing.assert_stream_valid(events.events)  # every call one terminal
        nursery.cancel_scope.cancel()


# -- workers start or the command fails (issue 26) ------------------------------------------------


async def run_vrt_serve(*args: str) -> subprocess.CompletedProcess[bytes]:
    """``vrt serve ARGS`` to its end (within 45 s), its output captured."""
    with trio.fail_after(45):
        return await trio.run_process(
            [sys.executable, "-m", "vrt", "serve", *args],
            cwd=ROOT,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )


def one_line(done: subprocess.CompletedProcess[bytes]) -> str:
    """The one line a ``vrt serve`` that could not start printed (exit status 2, no
    banner, nothing else on stderr)."""
    err = done.stderr.decode()
    assert done.returncode == 2 and done.stdout == b"", (done.returncode, done.stdout, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


async def test_workers_that_cannot_start_fail_the_command_in_one_line(redis_url: str) -> None:
    """A store that refuses, a bad ``MODULE:AGENT``, a busy port: ``vrt serve --workers 2``
    prints what one ``vrt serve`` prints, one line, before any banner, and exits 2 (it
    printed its banner, then restarted its workers every 1.5-3 s forever, and a refused
    port was reported as timed out)."""
    refused = f"redis://127.0.0.1:{free_port()}"
    workers = ("--workers", "2", "--port", "0")
    agent = "tests.deploy_agent:agent"
    results: dict[str, subprocess.CompletedProcess[bytes]] = {}

    async def run(name: str, *args: str) -> None:
        results[name] = await run_vrt_serve(*args)

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "refused", agent, *workers, "--store", refused)
            nursery.start_soon(
                run, "target", "tests.deploy_agent:nope", *workers, "--store", redis_url
            )
            nursery.start_soon(
                run, "busy", agent, "--workers", "2", "--store", redis_url, "--port", str(port)
            )
    store_line = f"cannot connect to the store at {refused[8:]}: connection refused"
    assert one_line(results["refused"]) == f"vrt serve: {store_line}"  # as one process says
    with pytest.raises(vrt.VrtError, match=f"^{store_line}$"):  # not "timed out"
        async with connected_store(refused):
            pass  # pragma: no cover
    assert one_line(results["target"]) == "vrt serve: 'tests.deploy_agent' has no attribute 'nope'"
    busy_line = f"vrt serve: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert one_line(results["busy"]) == busy_line


def log_lines(path: Path, level: str) -> list[str]:
    """The lines of a log at ``level``, from the level on."""
    marker = f" {level} "
    return [line.split(marker, 1)[1] for line in path.read_text().splitlines() if marker in line]


async def healthz(port: int) -> bytes:
    """The status line of ``GET /healthz`` on ``port`` (within 5 s)."""
    with trio.fail_after(5):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(b"GET /healthz HTTP/1.1\r\nhost: vrt\r\n\r\n")
            answer = b""
            while b"\r\n" not in answer:
                chunk = await stream.receive_some(1024)
                assert chunk, answer
                answer += chunk
            return answer.split(b"\r\n")[0]


async def test_a_crashed_worker_is_started_again_until_it_keeps_crashing(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``vrt serve --workers 2``, one deployment: the port is the parent's alone (another
    deployment on it, with or without ``--workers``, fails at once, where ``SO_REUSEPORT``
    let a second one join and split the clients); a worker killed with SIGKILL is started
    again (a WARNING that says how it died, an INFO once it is back; each line names its
    node) while the port keeps answering; then a worker that cannot start any more is
    started again after 0.5, 1 and 2 s, and at the fifth crash in a row the parent gives
    up: one line, the other worker drains, exit 1, the port is free."""
    crash = tmp_path / "crash"
    monkeypatch.setenv("VRT_TEST_CRASH", str(crash))
    port = free_port()
    log = tmp_path / "crashing.log"
    flags = ("--port", str(port), "--store", redis_url, "--workers", "2")
    async with servers.vrt_serve(log, "tests.crash_agent:agent", *flags) as (parent, line):
        assert f"ws://127.0.0.1:{port}/ (2 workers)" in line
        first = worker_pids(parent.pid)
        assert len(first) == 2  # both were ready before the banner
        results: dict[str, subprocess.CompletedProcess[bytes]] = {}

        async def run(name: str, *args: str) -> None:
            results[name] = await run_vrt_serve("tests.deploy_agent:agent", *args)

        answered: list[bytes] = []

        async def keep_asking(done: trio.Event) -> None:
            while not done.is_set():
                answered.append(await healthz(port))
                await trio.sleep(0.02)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "plain", "--port", str(port))
            nursery.start_soon(run, "workers", *flags)
            done = trio.Event()
            nursery.start_soon(keep_asking, done)
            killed = min(first)
            os.kill(killed, signal.SIGKILL)
            with trio.fail_after(30):
                while "is ready again" not in log.read_text():  # noqa: ASYNC110
                    await trio.sleep(0.05)
            done.set()
        busy_line = f"vrt serve: cannot listen on 127.0.0.1:{port}: Address already in use"
        assert one_line(results["plain"]) == busy_line
        assert one_line(results["workers"]) == busy_line
        assert len(answered) > 10 and set(answered) == {b"HTTP/1.1 200 "}, answered
        host = socket.gethostname()
        index = next(i for i in (0, 1) if f"{host}:{killed}:{i}" in log.read_text())
        back = worker_pids(parent.pid) - first
        assert len(back) == 1 and len(worker_pids(parent.pid)) == 2
        warned = f"[{host}:{parent.pid}] vrt.server: worker {index} ({host}:{killed}:{index}) was "
        assert any(
            w.startswith(warned + "killed by SIGKILL after ") for w in log_lines(log, "WARNING")
        )
        ready = f"worker {index} ({host}:{min(back)}:{index}) is ready again"
        assert f"[{host}:{parent.pid}] vrt.server: {ready}" in log_lines(log, "INFO")
        serving = [e for e in log_lines(log, "INFO") if " vrt.server: serving on " in e]
        assert len(serving) == 3, serving  # two, then the one started again
        for entry in serving:  # each worker's lines name it
            assert entry.startswith(f"[{entry.split(' as node ')[1]}] "), entry

        crash.touch()  # from now on, a worker cannot start
        os.kill(min(back), signal.SIGKILL)
        with trio.fail_after(60):
            await parent.wait()
    assert parent.returncode == 1
    text = log.read_text()
    gave_up = (
        f"vrt serve: worker {index} crashed 5 times in a row, giving up; the last time it "
        "could not start: the crash agent was told to crash"
    )
    assert text.splitlines().count(gave_up) == 1, text
    again = [w for w in log_lines(log, "WARNING") if ": starting it again in " in w]
    assert [w.rsplit(" in ", 1)[1] for w in again] == ["0.25 s", "0.5 s", "1 s", "2 s"], again
    cannot = f"vrt.server: worker {index} could not start: the crash agent was told to crash:"
    assert sum(cannot in w for w in again) == 2, again
    assert text.count(" vrt.server: drained") == 1  # the other worker drained
    for pid in first | back:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with socket.socket() as again:  # nobody listens on the port any more
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (as vrt serve does)
        again.bind(("127.0.0.1", port))
        again.listen()


# -- three nodes behind HAProxy --------------------------------------------------------------

CLIENTS = 200
NODE_FLAGS = (
    "--resume-window", "60",
    # Every connection comes from HAProxy's address: the per-peer limits (their defaults)
    # count the client HAProxy forwards (X-Forwarded-For, the shipped configuration).
    "--trusted-proxies", "127.0.0.1/32",
    "--drain-timeout", "10",
)  # fmt: skip
SOURCES = [f"127.0.{1 + i // 250}.{1 + i % 250}" for i in range(CLIENTS)]
"""The addresses the clients come from (every 127.x.y.z is loopback), as many clients'
would: each a peer of its own once HAProxy forwards it."""


@vrt.app_tool(parameters={"type": "object", "properties": {"text": {"type": "string"}}})
async def note(args: Any, ctx: vrt.ToolContext) -> dict[str, Any]:
    await trio.sleep(0.2)
    return {"noted": len(args.get("text", ""))}


@attrs.define
class Client:
    """What one client saw: every event, its resume gaps, the inputs it sent."""

    events: list[Any] = attrs.Factory(list)
    gaps: list[float] = attrs.Factory(list)
    inputs: int = 0
    interrupted: int = 0
    final: str = ""
    error: str | None = None
    done: bool = False


async def a_client(port: int, seed: int, stop: trio.Event, seen: Client) -> None:
    try:
        await _a_client(port, seed, stop, seen)
    except Exception as exc:  # reported with what it saw, not as one of 200 tracebacks
        seen.error = f"{exc!r}; last events: {seen.events[-8:]}"
    finally:
        seen.done = True


async def _a_client(port: int, seed: int, stop: trio.Event, seen: Client) -> None:
    rng = random.Random(seed)
    async with (
        vrt.connect(f"ws://127.0.0.1:{port}/", tools=[note], resume_timeout=60) as client,
        client.subscribe() as channel,
    ):
        lost_at: float | None = None

        async def watch() -> None:
            nonlocal lost_at
            async for event in channel:
                seen.events.append(event)
                if isinstance(event, vrt.Reconnecting):
                    lost_at = trio.current_time()
                elif isinstance(event, vrt.Resumed) and lost_at is not None:
                    seen.gaps.append(trio.current_time() - lost_at)
                    lost_at = None

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            while not stop.is_set():
                kind = rng.choices(["plain", "app", "slow"], [6, 3, 1])[0]
                text = {"plain": "hello", "app": "app note this", "slow": "slow please"}[kind]
                ended = await _turn(client, seen, text)
                if ended.reason == "interrupted":
                    seen.interrupted += 1
                await trio.sleep(rng.uniform(0.5, 2.5))
            ended = await _turn(client, seen, "last")  # its whole history, seen by the model
            seen.final = "".join(
                e.text
                for e in seen.events
                if isinstance(e, vrt.TextDelta) and e.turn_id == ended.turn_id
            )
            nursery.cancel_scope.cancel()


async def _turn(client: vrt.Client, seen: Client, text: str) -> vrt.TurnEnded:
    start = len(seen.events)
    await client.send_text(text)
    seen.inputs += 1
    with trio.fail_after(60):
        while True:
            for event in seen.events[start:]:
                if isinstance(event, vrt.TurnEnded):
                    return event
            start = len(seen.events)
            await trio.sleep(0.02)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


async def test_three_nodes_behind_haproxy_lose_nothing(tmp_path: Path) -> None:
    """Issue 19's acceptance test, and issue 26's. 200 clients through a proxy that cuts
    connections at random, to HAProxy (roundrobin, no stickiness, /healthz checks), to
    three ``vrt serve --store`` nodes; each node in turn is sent SIGTERM (it drains) and
    started again; then the store fails: paused 10 s (SIGSTOP: it answers nothing), then
    restarted without persistence (it forgot everything); then one node is killed
    (SIGKILL) and started again. No session is closed, every call has one terminal on the
    app's side, and each client's last turn sees its whole history."""
    ports = [free_port() for _ in range(3)]
    report: dict[str, Any] = {}
    async with contextlib.AsyncExitStack() as stack:
        store = stack.enter_context(servers.redis())
        redis_url = store.url
        nodes: list[trio.Process] = []

        async def start(i: int, generation: int) -> trio.Process:
            process, _ = await stack.enter_async_context(
                vrt_serve(
                    tmp_path,
                    f"node{i}-{generation}",
                    "--port",
                    str(ports[i]),
                    "--store",
                    redis_url,
                    *NODE_FLAGS,
                )
            )
            return process

        for i in range(3):
            nodes.append(await start(i, 0))
        balancer = stack.enter_context(haproxy(ports))
        proxy = LoopbackProxy(balancer, sources=SOURCES)
        stop = trio.Event()
        clients = [Client() for _ in range(CLIENTS)]
        cuts = 0
        async with trio.open_nursery() as outer, trio.open_nursery() as nursery:
            await outer.start(proxy.run)
            for i, seen in enumerate(clients):
                nursery.start_soon(a_client, proxy.port, i, stop, seen)
                if i % 20 == 19:
                    await trio.sleep(0.1)
            await trio.sleep(2)

            async def cutter() -> None:
                nonlocal cuts
                while not stop.is_set():
                    await trio.sleep(0.5)
                    cuts += proxy.cut(3)

            nursery.start_soon(cutter)
            restarts = 0
            for i in range(3):  # a rolling restart: drain, then start again
                nodes[i].send_signal(signal.SIGTERM)
                with trio.fail_after(30):
                    await nodes[i].wait()
                assert nodes[i].returncode == 0, f"node {i} exited {nodes[i].returncode}"
                nodes[i] = await start(i, 1)
                restarts += 1
                await trio.sleep(1)
            store.pause()  # an outage: the nodes' calls time out, their leases run out
            await trio.sleep(10)
            store.resume()
            await trio.sleep(2)
            store.restart()  # it forgot everything: each node saves its sessions again, whole
            await trio.sleep(3)
            killed_at = trio.current_time()
            nodes[1].kill()  # a crash
            await nodes[1].wait()
            nodes[1] = await start(1, 2)
            await trio.sleep(8)  # past the dead node's lease: its sessions adopted
            stop.set()
            with trio.fail_after(90):  # every client's last turn, then the proxy
                while any(not seen.done for seen in clients):  # noqa: ASYNC110 - 200 tasks
                    await trio.sleep(0.1)
            outer.cancel_scope.cancel()
        report.update(cuts=cuts, restarts=restarts, killed_at=killed_at)
    # -- what the apps saw
    failed = [(i, seen.error) for i, seen in enumerate(clients) if seen.error]
    assert not failed, failed[:3]
    gaps = [gap for seen in clients for gap in seen.gaps]
    closed = [e for seen in clients for e in seen.events if isinstance(e, vrt.Closed)]
    assert not closed, closed[:5]
    terminals: dict[str, int] = {}
    for seen in clients:
        for event in seen.events:
            if isinstance(event, vrt.ToolStream):
                terminals.setdefault(event.call_id, 0)
                if event.phase in (vrt.Phase.SETTLED, vrt.Phase.CANCELLED, vrt.Phase.FAILED):
                    terminals[event.call_id] += 1
    bad = {call: n for call, n in terminals.items() if n != 1}
    assert not bad, list(bad.items())[:10]
    cancelled = sum(
        1
        for seen in clients
        for e in seen.events
        if isinstance(e, vrt.ToolStream) and e.phase == vrt.Phase.CANCELLED
    )
    wrong = [
        (i, seen.final, seen.inputs, seen.interrupted)
        for i, seen in enumerate(clients)
        if seen.final != f"{seen.final.split(',')[0]}, {seen.inputs} inputs seen, "
        f"{seen.interrupted} interrupted"
    ]
    assert not wrong, wrong[:10]
    for seen in clients:
        vrt.testing.assert_stream_valid(seen.events)
    print(
        f"\n{CLIENTS} sessions, {sum(s.inputs for s in clients)} turns, {report['cuts']} cuts, "
        f"{report['restarts']} restarts and 1 SIGKILL; {len(gaps)} resumes, gap p50 "
        f"{pct(gaps, 0.5) * 1000:.0f} ms p99 {pct(gaps, 0.99) * 1000:.0f} ms max "
        f"{max(gaps, default=0) * 1000:.0f} ms; {len(terminals)} calls, {cancelled} cancelled "
        f"(the crash), {sum(s.interrupted for s in clients)} turns interrupted"
    )
