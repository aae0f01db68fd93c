"""Serving in production, as an operator runs it: ``vrt serve --store`` processes, a real
``redis-server``, HAProxy in front (docs/deploy.md). Every process is started and
stopped by the test on loopback ports; each server's log must hold no ERROR."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

import vrt
from tests.conftest import Log, until
from tests.servers import free_port, redis_server
from vrt._net.store import RedisStore, open_store

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
    """``vrt serve TARGET FLAGS`` in a process of its own, its stderr in a log: the process
    and its first line. Stopped with SIGINT (killed if it does not stop) on the way out;
    its log must hold no ERROR or traceback."""
    log = tmp_path / f"{name}.log"
    with log.open("wb") as err:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "vrt", "serve", target, *flags],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=err,
        )
        try:
            assert process.stdout is not None
            line = b""
            with trio.fail_after(30):
                while not line.endswith(b"\n"):
                    chunk = await process.stdout.receive_some(1)
                    assert chunk, log.read_text()[-2000:]
                    line += chunk
            yield process, line.decode()
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGINT)
                with trio.move_on_after(15):
                    await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
    text = log.read_text()
    assert " ERROR " not in text and "Traceback" not in text, text[-4000:]


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
    ``resumed``, never ``closed``; the parent starts the worker again; SIGTERM to the
    parent drains both and exits 0."""
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
                saved = await store.load(client.session_id or "")
                assert saved is not None
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


def test_without_a_store_workers_are_refused() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "vrt", "serve", "tests.deploy_agent:agent", "--workers", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and "needs --store" in result.stderr
