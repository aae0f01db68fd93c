"""Hostile peers and bad networks, over loopback: each finding of the hardening issue (the
probes in ../shared/probes/hostile) as a bounded regression test.

Client: vrt.connect against servers that close, stall, dribble or answer nonsense; resume
through a proxy that misbehaves and recovers; a frame over its limit; cancellation.
Server: handshakes that never finish, a flood of connections under a low fd limit, blind
acks, zombie connections after an overflow, unfinished frames, preview amplification,
session floods, absurd epochs, the input-then-close race. No peer may make the server log
an ERROR: every test here checks it (``no_errors``).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import json
import os
import resource
import subprocess
import sys
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

import vrt
from tests.servers import vrt_serve
from tests.test_wire_errors import chat_agent, connected, serving, session
from vrt._cluster.store import MemoryStore
from vrt._server import pace as _pace
from vrt.testing import LoopbackProxy

pytestmark = [pytest.mark.network, pytest.mark.usefixtures("no_errors")]

HOST = "127.0.0.1"
ROOT = Path(__file__).parent.parent


# -- raw peers -----------------------------------------------------------------------------------

UPGRADE = (
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


def ws_frame(payload: bytes, *, declared: int | None = None, opcode: int = 1) -> bytes:
    """A client text frame (zero mask: valid, and no cost to mask megabytes); ``declared``
    announces more payload than is given (an unfinished frame)."""
    n = len(payload) if declared is None else declared
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([0x80 | 127]) + n.to_bytes(8, "big")
    return head + b"\0\0\0\0" + payload


def message(type_: str, seq: int, **fields: Any) -> bytes:
    return ws_frame(json.dumps({"type": type_, "seq": seq, **fields}).encode())


HELLO = message("hello", 1, protocol="vrt/1", capabilities=["tool-stream-v1"], tools=[])


async def raw_upgraded(port: int, *, local: str | None = None) -> trio.SocketStream:
    """A TCP connection past its WebSocket upgrade (the 101 read, nothing else)."""
    stream = await trio.open_tcp_stream(HOST, port, local_address=local)
    await stream.send_all(UPGRADE)
    data = b""
    with trio.fail_after(2):
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(65536)
            assert chunk, f"closed during the upgrade: {data!r}"
            data += chunk
    assert data.startswith(b"HTTP/1.1 101"), data
    return stream


async def closed_by_server(stream: trio.SocketStream, within: float) -> float:
    """Read (and drop) until the server closes or resets ``stream``; the seconds it took."""
    start = trio.current_time()
    with trio.fail_after(within):
        try:
            while await stream.receive_some(1 << 16):
                pass
        except trio.BrokenResourceError:
            pass  # reset: the server dropped it at once
    return trio.current_time() - start


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def until(condition: Callable[[], bool], *, within: float) -> None:
    """Poll ``condition`` (something no event tells: the process's descriptors)."""
    with trio.fail_after(within):
        while not condition():  # noqa: ASYNC110 - nothing to wait on but the kernel
            await trio.sleep(0.01)


# -- the client against broken servers -----------------------------------------------------------


Handler = Callable[[trio.SocketStream], Awaitable[None]]


def _accept_key(request: bytes) -> str:
    key = next(
        line.split(b":", 1)[1].strip()
        for line in request.split(b"\r\n")
        if line.lower().startswith(b"sec-websocket-key")
    )
    digest = hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest()
    return base64.b64encode(digest).decode()


async def _request(stream: trio.SocketStream) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return data
        data += chunk
    return data


def _switching(request: bytes) -> bytes:
    return (
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Accept: {_accept_key(request)}\r\n\r\n"
    ).encode()


async def close_at_once(stream: trio.SocketStream) -> None:
    await stream.aclose()


async def never_answer(stream: trio.SocketStream) -> None:
    await _request(stream)
    await trio.sleep_forever()


async def switch_then_silence(stream: trio.SocketStream) -> None:
    await stream.send_all(_switching(await _request(stream)))
    await trio.sleep_forever()


async def switch_then_close(stream: trio.SocketStream) -> None:
    await stream.send_all(_switching(await _request(stream)))
    await stream.aclose()


async def garbage(stream: trio.SocketStream) -> None:
    await _request(stream)
    await stream.send_all(b"\x00\xffgarbage\r\n\r\n" * 10)
    await trio.sleep_forever()


async def a_web_page(stream: trio.SocketStream) -> None:
    await _request(stream)
    page = b"<html><body>" + b"Welcome to our site! " * 50 + b"</body></html>"
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n"
    await stream.send_all(head % len(page) + page)
    await trio.sleep_forever()


async def status_line_a_byte_a_second(stream: trio.SocketStream) -> None:
    await _request(stream)
    for byte in b"HTTP/1.1 101 Switching Protocols\r\n":
        await stream.send_all(bytes([byte]))
        await trio.sleep(1)


async def switch_then_broken_welcome(stream: trio.SocketStream) -> None:
    await stream.send_all(_switching(await _request(stream)))
    payload = b'{"type":"welcome"'
    await stream.send_all(bytes([0x81, len(payload)]) + payload)
    await trio.sleep_forever()


@asynccontextmanager
async def fake_server(
    handler: Callable[[trio.SocketStream], Awaitable[None]],
) -> AsyncIterator[int]:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0, host=HOST))
        yield listeners[0].socket.getsockname()[1]
        nursery.cancel_scope.cancel()


CONNECT_TIMEOUT = 1.0


@pytest.mark.parametrize(
    ("handler", "code"),
    [
        (close_at_once, "CLOSED"),
        (never_answer, "TIMEOUT"),
        (switch_then_silence, "TIMEOUT"),
        (switch_then_close, "CLOSED"),
        (garbage, "HANDSHAKE"),
        (a_web_page, "HTTP_200"),
        (status_line_a_byte_a_second, "TIMEOUT"),
        (switch_then_broken_welcome, "TIMEOUT"),
    ],
)
async def test_connect_to_a_broken_server_fails_within_its_timeout(
    handler: Handler, code: str
) -> None:
    """Probe a11: each of these hung vrt.connect (45-100 s and counting), or leaked h11's
    LocalProtocolError, or put the page's HTML in the message."""
    async with fake_server(handler) as port:
        start = trio.current_time()
        with trio.fail_after(CONNECT_TIMEOUT + 3), pytest.raises(vrt.RemoteProtocolError) as info:
            async with vrt.connect(f"ws://{HOST}:{port}/", connect_timeout=CONNECT_TIMEOUT):
                pass
        elapsed = trio.current_time() - start
    assert info.value.code == code, info.value
    assert elapsed < CONNECT_TIMEOUT + 1, elapsed
    assert "<" not in str(info.value) and len(str(info.value)) < 200, info.value


async def test_connect_refused_by_tcp_is_an_oserror_at_once() -> None:
    listener = trio.socket.socket()
    await listener.bind((HOST, 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there now
    with trio.fail_after(1), pytest.raises(OSError, match="onnect"):
        async with vrt.connect(f"ws://{HOST}:{port}/"):
            pass


@vrt.app_tool(description="Echo", parameters={"type": "object"})
async def echo(args: Any, ctx: Any) -> Any:
    return args


def _two_turns() -> vrt.Agent:
    return vrt.define_agent(
        model=vrt.ScriptedModel([[vrt.say("one")], [vrt.say("two")]]), client_tools="accept"
    )


@pytest.mark.parametrize("mode", ["close", "stall", "502", "503", "504"])
async def test_a_resume_gets_through_a_proxy_that_misbehaves_then_recovers(mode: str) -> None:
    """Probe a12: after the cut, a proxy that accepted-and-closed (or stalled) new
    connections for 5 s left the client Reconnecting with one attempt, neither Resumed nor
    Closed 40 s later. Each failed or stalled attempt is one attempt of the backoff now.
    A proxy's 502 or 504 while the node behind it restarts (seen from HAProxy during a
    rolling restart) is tried again like a draining server's 503, not taken as a refusal."""
    async with serving(_two_turns()) as server, trio.open_nursery() as nursery:
        proxy = LoopbackProxy(server.port)
        port = await nursery.start(proxy.run)
        url = f"ws://{HOST}:{port}/"
        async with vrt.connect(url, connect_timeout=0.5) as client:
            async with client.subscribe() as events:
                await client.send_text("first")
                async for event in events:
                    if isinstance(event, vrt.TurnEnded):
                        break
                proxy.misbehave = mode
                proxy.cut()
                nursery.start_soon(_heal_after, proxy, 2.0)
                seen = []
                with trio.fail_after(10):
                    async for event in events:
                        seen.append(type(event).__name__)
                        if isinstance(event, vrt.Resumed):
                            break
                    await client.send_text("second")
                    async for event in events:
                        if isinstance(event, vrt.TurnEnded):
                            assert event.reason == "finished"
                            break
        assert seen[0] == "Reconnecting" and seen[-1] == "Resumed", seen
        assert proxy.connections > 3  # several attempts during the bad 2 s
        nursery.cancel_scope.cancel()


async def _heal_after(proxy: LoopbackProxy, seconds: float) -> None:
    await trio.sleep(seconds)
    proxy.heal()


async def test_a_frame_over_the_clients_limit_ends_the_session_without_resuming() -> None:
    """Probe a22: a server frame over the client's limit closed 1009; the client resumed,
    got the same frame replayed, 1009 again: 257 reconnect cycles in 30 s."""
    big = {"blob": "x" * (1536 * 1024)}  # its arguments-complete frame is over 1 MiB
    agent = vrt.define_agent(model=vrt.ScriptedModel([[vrt.call("echo", big)]]))
    async with serving(agent, max_message_size=16 << 20, replay_limit_bytes=64 << 20) as server:
        async with vrt.connect(server.url, max_message_size=1 << 20) as client:
            async with client.subscribe() as events:
                await client.send_text("go")
                with trio.fail_after(5):
                    seen = [type(event).__name__ async for event in events]
        assert client.closed == vrt.Closed(reason="too_large")
    assert "Reconnecting" not in seen and seen[-1] == "Closed", seen


async def test_the_client_sends_no_frame_over_its_limit() -> None:
    """The server would close 1009 and the resume would replay it: the client refuses to
    send one (ValueError), and an app tool's oversize output is answered FAILED."""

    @vrt.app_tool(description="Big", parameters={"type": "object"})
    async def big(args: Any, ctx: Any) -> Any:
        return "y" * (2 << 20)

    agent = vrt.define_agent(
        model=vrt.ScriptedModel([[vrt.call("big", {})], []]), client_tools="accept"
    )
    async with serving(agent) as server, vrt.connect(server.url, tools=[big]) as client:
        with pytest.raises(ValueError, match="max_message_size"):
            await client.send_text("z" * (2 << 20))
        async with client.subscribe() as events:
            await client.send_text("go")
            with trio.fail_after(5):
                async for event in events:
                    if isinstance(event, vrt.ToolStream) and event.phase == "settled":
                        settled = event
                    if isinstance(event, vrt.TurnEnded):
                        break
        assert client.closed is None
    assert settled.ok is False and settled.code == "FAILED"


@vrt.server_tool(risk="low", description="Slow", parameters={"type": "object"})
async def forever(args: Any, ctx: vrt.ToolContext) -> Any:
    await trio.sleep_forever()


async def test_cancelling_connect_mid_turn_returns_within_a_second() -> None:
    """Probe a18: cancelling a vrt.connect block returned 10 s after the cancel mid-turn."""
    agent = vrt.define_agent(
        model=vrt.ScriptedModel([[vrt.say("working"), vrt.call("forever", {})]]), tools=[forever]
    )
    async with serving(agent) as server:
        with trio.CancelScope() as scope:
            async with vrt.connect(server.url) as client, client.subscribe() as events:
                await client.send_text("go")
                async for event in events:
                    if isinstance(event, vrt.ToolStream):
                        break
                scope.cancel()
                cancelled_at = trio.current_time()
                await trio.sleep_forever()
        assert trio.current_time() - cancelled_at < 1.0


async def test_cancelling_a_pending_connect_returns_within_a_second() -> None:
    """Probe a18: ... and 5 s after the cancel while the connection was pending."""
    async with fake_server(switch_then_silence) as port:
        cancelled_at = trio.current_time() + 0.3
        with trio.move_on_at(cancelled_at) as pending:
            async with vrt.connect(f"ws://{HOST}:{port}/"):
                pass
        returned_at = trio.current_time()
    assert pending.cancelled_caught
    assert returned_at - cancelled_at < 1.0


# -- the server: handshakes, floods, file descriptors ------------------------------------------


async def test_a_connection_that_never_upgrades_is_dropped_at_the_handshake_timeout() -> None:
    """Probes a01 and a03: idle TCP connections and a slowloris upgrade were held 60 s
    (trio-websocket's own timeout: handshake_timeout did not cover the HTTP phase)."""
    async with serving(chat_agent(), handshake_timeout=0.5) as server:
        idle = await trio.open_tcp_stream(HOST, server.port)
        slow = await trio.open_tcp_stream(HOST, server.port)

        async def dribble() -> None:
            for byte in UPGRADE:
                await slow.send_all(bytes([byte]))
                await trio.sleep(0.05)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(dribble)
            assert await closed_by_server(idle, within=2) < 1.0
            assert await closed_by_server(slow, within=2) < 1.0
            nursery.cancel_scope.cancel()
        for stream in (idle, slow):
            await stream.aclose()


async def test_a_peer_that_leaves_mid_handshake_is_forgotten_at_once() -> None:
    """Probe a02: 2,000 connect-and-close left 2,000 sockets in CLOSE-WAIT for ~60 s."""
    async with serving(chat_agent()) as server:
        await trio.sleep(0.05)
        before = open_fds()
        for _ in range(200):
            stream = await trio.open_tcp_stream(HOST, server.port)
            await stream.send_all(UPGRADE[:20])
            await stream.aclose()
        await until(lambda: open_fds() <= before, within=2)
        async with session(server) as peer:
            await peer.run_turn()


async def test_a_full_pool_lets_the_newcomer_in_and_closes_the_longest_waiting() -> None:
    """At the cap a new connection used to be closed at once: 256 slow handshakes locked
    everyone out (probe a01 at 2b9f98f). Now the newcomer gets in and the connection that
    has waited longest makes room, from the newcomer's address when it is at its share."""
    options = {"max_pending_connections": 5, "max_pending_per_peer": 2, "handshake_timeout": 2}
    async with serving(chat_agent(), **options) as server:
        a = [await trio.open_tcp_stream(HOST, server.port, local_address="127.0.0.2")]
        await trio.sleep(0.05)
        a.append(await trio.open_tcp_stream(HOST, server.port, local_address="127.0.0.2"))
        others = []
        for i in range(3):
            others.append(
                await trio.open_tcp_stream(HOST, server.port, local_address=f"127.0.0.{3 + i}")
            )
        await trio.sleep(0.1)
        # a third from 127.0.0.2: over its share, so the first from 127.0.0.2 goes
        a.append(await trio.open_tcp_stream(HOST, server.port, local_address="127.0.0.2"))
        assert await closed_by_server(a[0], within=1) < 0.5
        # a sixth in all: over the pool, so the oldest of all (now a[1]) goes
        newest = await trio.open_tcp_stream(HOST, server.port, local_address="127.0.0.9")
        assert await closed_by_server(a[1], within=1) < 0.5
        for stream in [a[2], *others, newest]:  # the rest are kept until their deadline
            with pytest.raises(trio.TooSlowError):
                await closed_by_server(stream, within=0.2)
        async with session(server) as peer:  # and a real client gets in meanwhile
            await peer.run_turn()
        for stream in [*a, *others, newest]:
            await stream.aclose()


LOCKOUT_TURN = 5.0
"""Seconds a real client may take to connect and finish a turn through an attack (a
lockout, before the fixes, was about 60 s; a turn takes 0.1 s alone, and up to 2.5 s while
the flood, the server and another test process share two cores)."""


@asynccontextmanager
async def serve_process(tmp_path: Path, *flags: str) -> AsyncIterator[int]:
    """``vrt serve tests.serve_agent:agent`` in its own process (the attack runs in this
    one, as it would on another machine): its port. Its log must hold no ERROR and no
    traceback (tests/servers.py)."""
    flags = ("--port", "0", *flags)
    async with vrt_serve(tmp_path / "server.log", "tests.serve_agent:agent", *flags) as (_, line):
        yield int(line.rsplit(":", 1)[1].strip(" /\n"))


async def real_turn(port: int) -> float:
    """A real ``vrt.connect`` runs a turn (a server tool, then text) to its end; the
    seconds from the connect to ``turn.ended``, which must be under LOCKOUT_TURN."""
    start = trio.current_time()
    with trio.fail_after(LOCKOUT_TURN):
        async with vrt.connect(f"ws://{HOST}:{port}/") as client, client.subscribe() as events:
            await client.send_text("ping?")
            async for event in events:
                if isinstance(event, vrt.TurnEnded):
                    assert event.reason == "finished"
                    break
    return trio.current_time() - start


async def stalled(port: int, local: str, counts: dict[str, int], *, trickle: bool) -> None:
    """One attacking connection: the upgrade request without its last byte, sent at once
    (``trickle`` False) or a byte a second; it counts itself opened, then closed when the
    server closes or resets it."""
    try:
        stream = await trio.open_tcp_stream(HOST, port, local_address=local)
    except OSError:
        # Reset before this task saw its connect complete: evicted at once (the server
        # accepted it, and closed it as later ones came).
        counts["opened"] += 1
        counts["closed"] += 1
        return
    counts["opened"] += 1
    async with stream, trio.open_nursery() as nursery:

        async def watch() -> None:
            try:
                while await stream.receive_some(4096):
                    pass
            except trio.BrokenResourceError:
                pass
            counts["closed"] += 1
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            if trickle:
                for byte in UPGRADE[:-1]:
                    await stream.send_all(bytes([byte]))
                    await trio.sleep(1)
            else:
                await stream.send_all(UPGRADE[:-1])
        await trio.sleep_forever()  # until the watcher sees the server close it


async def attack(
    port: int, addresses: list[str], n: int, *, trickle: bool
) -> tuple[list[float], dict[str, int]]:
    """``n`` stalled connections from ``addresses`` in turn; a real turn at 1, 3 and 5 s
    into the attack (after its last connection opened). The turns' seconds and the
    attackers' counts."""
    counts = {"opened": 0, "closed": 0}
    turns: list[float] = []
    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(
                functools.partial(
                    stalled, port, addresses[i % len(addresses)], counts, trickle=trickle
                )
            )
            if i % 100 == 99:
                await trio.sleep(0.02)
        with trio.fail_after(10):
            while counts["opened"] < n:  # noqa: ASYNC110 - counts only
                await trio.sleep(0.05)
        start = trio.current_time()
        for at in (1, 3, 5):
            await trio.sleep_until(start + at)
            turns.append(await real_turn(port))
        nursery.cancel_scope.cancel()
    return turns, counts


async def test_300_stalled_handshakes_from_one_address_lock_nobody_out(tmp_path: Path) -> None:
    """One address takes at most max_pending_per_peer (64) of the pool: the rest of its
    300 are closed as they come, and a real client gets in throughout, from that same
    address too."""
    async with serve_process(tmp_path) as port:
        turns, counts = await attack(port, ["127.0.0.2"], 300, trickle=False)
        assert counts["opened"] == 300 and counts["closed"] >= 300 - 64, counts
        assert max(turns) < LOCKOUT_TURN, turns
        turns, counts = await attack(port, ["127.0.0.1"], 300, trickle=False)
        assert counts["closed"] >= 300 - 64, counts
        assert max(turns) < LOCKOUT_TURN, turns


async def test_1000_trickling_handshakes_from_many_addresses_lock_nobody_out(
    tmp_path: Path,
) -> None:
    """Probe a01 from 50 addresses: the pool (256) stays full of slow connections, yet
    each newcomer, a real client's included, gets in; the longest waiting make room."""
    addresses = [f"127.0.0.{i}" for i in range(2, 52)]
    async with serve_process(tmp_path) as port:
        turns, counts = await attack(port, addresses, 1000, trickle=True)
    assert counts["opened"] == 1000 and counts["closed"] >= 1000 - 256, counts
    assert max(turns) < LOCKOUT_TURN, turns


async def test_a_connect_and_close_flood_locks_nobody_out_while_it_runs(tmp_path: Path) -> None:
    """Probe a02 while it runs: connections opened and closed as fast as one task can;
    real clients get in during it."""
    flooded = 0

    async def flood() -> None:
        nonlocal flooded
        while True:
            with contextlib.suppress(OSError):
                stream = await trio.open_tcp_stream(HOST, port)
                await stream.aclose()
                flooded += 1

    async with serve_process(tmp_path) as port:
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(flood)
            await trio.sleep(0.5)
            turns = [await real_turn(port) for _ in range(5)]
            nursery.cancel_scope.cancel()
    assert flooded > 500, flooded
    assert max(turns) < LOCKOUT_TURN, turns


FLOOD_SERVER = """
import logging, resource, sys, trio, vrt
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
agent = vrt.define_agent(model=vrt.ScriptedModel([[vrt.say("hi")]] * 100))
async def main():
    async with trio.open_nursery() as nursery:
        server = await nursery.start(vrt.serve, agent, "127.0.0.1", 0)
        print(server.port, flush=True)
        await trio.sleep(60)
trio.run(main)
"""


async def test_a_connect_and_close_flood_under_a_low_fd_limit_locks_nobody_out() -> None:
    """Probe a02b: with an fd limit of 1,024, 1,100 connect-and-close locked every
    legitimate client out for ~60 s and wrote ~1,170 warning lines with tracebacks."""
    with subprocess.Popen(  # noqa: ASYNC220 - its pipes are read from a thread
        [sys.executable, "-c", FLOOD_SERVER],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    ) as proc:
        try:
            assert proc.stdout is not None
            port = int(await trio.to_thread.run_sync(proc.stdout.readline))
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            assert soft >= 1200  # the flood itself needs the descriptors on this side
            for _ in range(1100):
                with trio.fail_after(5):
                    stream = await trio.open_tcp_stream(HOST, port)
                await stream.aclose()
            flood_over = time.monotonic()
            with trio.fail_after(2):
                async with vrt.connect(f"ws://{HOST}:{port}/") as client:
                    async with client.subscribe() as events:
                        await client.send_text("hello")
                        async for event in events:
                            if isinstance(event, vrt.TurnEnded):
                                break
            assert time.monotonic() - flood_over < 2
        finally:
            proc.terminate()
            _, stderr = proc.communicate(timeout=10)
    assert "Traceback" not in stderr, stderr[-2000:]
    warnings = [line for line in stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    assert len(warnings) <= 5, warnings


# -- the server: memory a hostile session can hold ---------------------------------------------


class Long:
    """A model that streams a long answer, 1 KiB a delta, as fast as it may."""

    async def stream(self, request: vrt.ModelRequest) -> AsyncIterator[Any]:
        for _ in range(50_000):
            yield vrt.models.Text(text="z" * 1024)


async def test_a_blind_acking_client_holds_a_few_megabytes_and_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Probe a07 blindack: a client that acks every seq without reading kept the model
    going while frames piled up in the connection's unbounded queue: +209 MB a session,
    never closed. Now the backlog counts in bytes: the model is held at 40 % of
    replay_limit_bytes, the blind acks do not count as progress, and the session closes
    (overflow) with its socket reset."""
    monkeypatch.setattr(_pace, "STALL_TIMEOUT", 1.0)
    agent = vrt.define_agent(model=Long())
    async with serving(agent) as server:
        stream = await raw_upgraded(server.port)
        tracemalloc.start()
        try:
            base, _ = tracemalloc.get_traced_memory()
            await stream.send_all(HELLO + message("input", 2, text="long"))
            closed = False
            with trio.move_on_after(4):
                for k in range(1, 400):
                    try:
                        await stream.send_all(
                            ws_frame(json.dumps({"type": "ack", "seq": 50 * k}).encode())
                        )
                    except trio.BrokenResourceError:
                        closed = True
                        break
                    await trio.sleep(0.02)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert closed, "the blind acker was never dropped"
        await stream.aclose()
    assert peak - base < 8 << 20, f"{(peak - base) / 2**20:.1f} MiB"


async def test_an_overflowed_connection_is_reset_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Probes a07 and a23: after an overflow close the blocked writer kept the TCP
    connection, its fd and ~5 MB of queued frames for as long as the peer kept the socket
    (40 zombies past max_sessions 20, RSS 44 -> 240 MB)."""
    monkeypatch.setattr(_pace, "STALL_TIMEOUT", 0.5)
    agent = vrt.define_agent(model=Long())
    async with serving(agent, max_sessions=2) as server:
        before = open_fds()
        zombies = []
        for _ in range(2):
            stream = await raw_upgraded(server.port)
            await stream.send_all(HELLO + message("input", 2, text="long"))
            zombies.append(stream)  # never read again
        # both overflow, and their server sockets are gone
        await until(lambda: open_fds() <= before + len(zombies), within=5)
        async with session(server) as peer:  # their places under max_sessions are free
            await peer.send("close")
            await peer.expect_disconnect()
        for stream in zombies:
            await stream.aclose()


async def test_an_unfinished_frame_holds_at_most_the_frame_limit() -> None:
    """Probe a16: an unfinished 4 MiB frame held 4 MB a connection before hello (11 s) and
    a session after it (indefinitely): the WebSocket layer's limit was 4x max_message_size.
    Before hello a frame may be 64 KiB; after it, max_message_size: past that the
    connection is closed (1009) at once. Ten connections each send 900 KiB of a frame that
    never ends (under the old 4x limit of 1 MiB, over the new 256 KiB)."""
    head = b'{"type":"input","seq":2,"text":"'
    unfinished = ws_frame(head + b"a" * (900 << 10), declared=4 << 20)
    async with serving(chat_agent(), max_message_size=256 * 1024) as server:
        streams = []
        tracemalloc.start()
        try:
            base, _ = tracemalloc.get_traced_memory()
            for hello in (False, True) * 5:
                stream = await raw_upgraded(server.port)
                streams.append(stream)
                try:
                    await stream.send_all((HELLO if hello else b"") + unfinished)
                except trio.BrokenResourceError:
                    pass  # closed before it was all sent
            await trio.sleep(0.2)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        for stream in streams:
            assert await closed_by_server(stream, within=1) < 1
            await stream.aclose()
        await fresh_works(server)
    assert peak - base < 4 << 20, f"{(peak - base) / 2**20:.1f} MiB"


async def fresh_works(server: vrt.Server) -> None:
    async with session(server) as peer:
        await peer.run_turn()


async def fresh_works_elsewhere(server: vrt.Server) -> None:
    """A new session from another address (127.0.0.2) runs a turn."""
    stream = await raw_upgraded(server.port, local="127.0.0.2")
    async with stream:
        await stream.send_all(HELLO + message("input", 2, text="hi"))
        data = b""
        with trio.fail_after(2):
            while b"turn.ended" not in data:
                data += await stream.receive_some(1 << 16)


def _args_call(size: int, chunks: int) -> vrt.Agent:
    arguments = {"text": "p" * size}
    return vrt.define_agent(
        model=vrt.ScriptedModel([[vrt.call("echo", arguments, chunks=chunks)], []]),
        client_tools="accept",
    )


async def test_legacy_previews_are_linear_in_the_arguments() -> None:
    """Probe a21: 64 KiB of arguments in 1,000 deltas made 2,031 frames and 33.7 MB on the
    wire (every tool.preview carried all the text so far)."""
    async with (
        serving(_args_call(65536, 1000)) as server,
        session(
            server, tools=[{"name": "echo", "description": "", "parameters": {"type": "object"}}]
        ) as peer,
    ):
        await peer.send("input", text="go")
        preview_bytes = 0
        with trio.fail_after(10):
            while True:
                frame = await peer.next_frame()
                if frame["type"] == "tool.preview":
                    preview_bytes += len(json.dumps(frame))
                if frame["type"] == "tool.call":
                    break
    assert preview_bytes < 8 * 65536, preview_bytes


async def test_sessions_per_peer_and_sessions_that_never_start_a_turn() -> None:
    """Probe a08: 1,000 anonymous hellos in 2.8 s filled max_sessions; the slots stayed
    taken 30 s after the attacker left; no per-peer cap. Then, with the per-peer cap (at
    2b9f98f), a real client from the attacker's address was refused for as long as the
    attacker's turnless sessions lived. Now a session that never started a turn makes room
    for a newcomer at a limit, as a slow handshake does; one that did is never closed for
    it."""
    async with serving(chat_agent(), max_sessions_per_peer=3, first_turn_timeout=0.5) as server:
        flood = []
        for _ in range(3):
            stream = await raw_upgraded(server.port)
            await stream.send_all(HELLO)
            flood.append(stream)
        async with connected(server) as newcomer:  # the fourth from the same address
            await newcomer.hello()  # welcomed: the oldest turnless session made room
            assert await closed_by_server(flood[0], within=1) < 0.5
            await newcomer.run_turn()
            await newcomer.send("close")  # (else, detached, it would hold its place)
            await newcomer.until(lambda f: f["type"] == "closed")
        async with session(server) as a, session(server) as b, session(server) as c:
            for peer in (a, b, c):
                await peer.run_turn()
            async with connected(server) as extra:  # three that spoke: no room
                await extra.send(
                    "hello", protocol="vrt/1", capabilities=["tool-stream-v1"], tools=[]
                )
                error = await extra.next_frame()
                assert error["type"] == "error" and error["code"] == "RATE_LIMITED", error
            for peer in (a, b, c):
                await peer.send("close")
                await peer.until(lambda f: f["type"] == "closed")
        # another address is another peer
        other = await raw_upgraded(server.port, local="127.0.0.2")
        await other.send_all(HELLO)
        # none of them starts a turn: all closed (expired) after first_turn_timeout
        for stream in [*flood[1:], other]:
            assert await closed_by_server(stream, within=3) < 2.5
        for stream in [*flood, other]:
            await stream.aclose()
        await fresh_works(server)


async def test_hellos_at_once_over_the_per_peer_limit_log_no_error() -> None:
    """Found rerunning issue 26's finding 7: with a store, a session closed to make room
    for a newer one of its peer while its keeper was starting made the server log ERROR
    "connection failed" (the actor's task ended before it said it had started)."""
    store = MemoryStore()
    async with serving(chat_agent(), store=store, node="n0", max_sessions_per_peer=1) as server:

        async def hello() -> None:
            stream = await raw_upgraded(server.port)
            async with stream:
                await stream.send_all(HELLO)
                with contextlib.suppress(trio.TooSlowError):
                    await closed_by_server(stream, within=0.5)

        async with trio.open_nursery() as nursery:
            for _ in range(30):
                nursery.start_soon(hello)
        await fresh_works(server)


async def test_inputs_then_close_log_no_error() -> None:
    """Probe a19: input then close logged ERROR "session failed" with a SessionClosed
    traceback (6 in 20)."""
    agent = vrt.define_agent(model=vrt.ScriptedModel([[vrt.say("hi"), vrt.pause(1)]] * 200))
    async with serving(agent) as server:
        for _ in range(20):
            stream = await raw_upgraded(server.port)
            inputs = b"".join(message("input", 2 + i, text="slow") for i in range(5))
            await stream.send_all(HELLO + inputs + message("close", 7))
            await closed_by_server(stream, within=2)
            await stream.aclose()


@pytest.mark.parametrize("epoch", [2**53 + 1, int("9" * 4300)], ids=["2**53+1", "4300 nines"])
async def test_an_absurd_epoch_is_a_bad_message(epoch: int) -> None:
    """Probe a20: an interrupt with epoch 10**4300 - 1, then a barge-in, made the epoch
    unencodable: INTERNAL, closed(server) and a traceback."""
    async with serving(chat_agent()) as server, session(server) as peer:
        seq = peer.next_seq()
        await peer.send_raw(f'{{"type":"interrupt","seq":{seq},"epoch":{epoch}}}')
        error = await peer.expect_error("BAD_MESSAGE", seq)
        assert len(error["message"]) <= 300
        await peer.works()


async def test_an_ack_of_what_was_never_sent_is_a_protocol_error() -> None:
    async with serving(chat_agent()) as server, session(server) as peer:
        await peer.send_raw(json.dumps({"type": "ack", "seq": 999}))
        error = await peer.expect_error("BAD_MESSAGE", None)
        assert "above" in error["message"]
        await peer.works()


async def test_a_peer_cannot_crash_the_server_through_the_websocket_layer() -> None:
    """Found rerunning probe a16: hellos refused at the per-peer cap, each followed by an
    oversize frame, drove wsproto into refusing trio-websocket's own 1009 close; the error
    escaped its reader task and took the whole server down."""
    async with serving(chat_agent(), max_sessions_per_peer=2) as server:
        streams = []
        for _ in range(8):
            stream = await raw_upgraded(server.port)
            streams.append(stream)
            try:
                await stream.send_all(HELLO + ws_frame(b"a" * (200 << 10), declared=4 << 20))
            except trio.BrokenResourceError:
                pass
        for stream in streams[:-2]:  # each made room for the next (no turn), and closed
            await closed_by_server(stream, within=3)
        await fresh_works_elsewhere(server)  # the server is up (this address is at its cap)
        for stream in streams:
            await stream.aclose()


# -- found by the review of this work ----------------------------------------------------------


async def test_a_resume_token_with_a_lone_surrogate_is_refused_quietly() -> None:
    """hmac.compare_digest(token.encode(), ...) raised UnicodeEncodeError on "\\ud800":
    'connection failed', an ERROR with a traceback."""
    async with serving(chat_agent()) as server, connected(server) as peer:
        await peer.send_raw(
            '{"type":"hello","seq":1,"protocol":"vrt/1","capabilities":[],"tools":[],'
            '"resume":{"sessionId":"s_1","token":"\\ud800","lastSeq":0}}'
        )
        await peer.expect_rejected("RESUME_FAILED")


def _wide_tools(count: int, size: int) -> list[vrt.AppTool]:
    async def run(args: Any, ctx: Any) -> Any:
        return None

    return [
        vrt.AppTool(name=f"t{i}", description="d" * size, parameters={"type": "object"}, run=run)
        for i in range(count)
    ]


async def test_a_client_with_a_big_hello_can_still_resume() -> None:
    """The resume hello carried the tools again: a first hello near 64 KiB made a resume
    hello over the server's pre-hello limit (1009), and RemoteProtocolError TOO_LARGE
    escaped vrt.connect mid-session."""
    tools = _wide_tools(8, 7800)  # a hello of about 63 KiB
    async with serving(_two_turns()) as server, trio.open_nursery() as nursery:
        proxy = LoopbackProxy(server.port)
        port = await nursery.start(proxy.run)
        async with vrt.connect(f"ws://{HOST}:{port}/", tools=tools) as client:
            async with client.subscribe() as events:
                proxy.cut()
                with trio.fail_after(5):
                    async for event in events:
                        if isinstance(event, vrt.Resumed):
                            break
                await client.send_text("after")
                with trio.fail_after(5):
                    async for event in events:
                        if isinstance(event, vrt.TurnEnded):
                            break
        nursery.cancel_scope.cancel()


async def test_a_server_that_drops_every_resume_is_given_up_on() -> None:
    """Each resumed welcome reset the resume deadline and the backoff: a proxy dropping
    every connection right after the resume kept the client reconnecting forever."""
    async with serving(_two_turns()) as server, trio.open_nursery() as nursery:
        proxy = LoopbackProxy(server.port)
        port = await nursery.start(proxy.run)

        async def drop_each_connection() -> None:
            proxy.cut()
            seen = proxy.connections
            while True:
                await trio.sleep(0.01)
                if proxy.connections != seen:
                    seen = proxy.connections
                    await trio.sleep(0.1)  # long enough for the welcome and the replay
                    proxy.cut()

        url = f"ws://{HOST}:{port}/"
        async with vrt.connect(url, resume_timeout=1.0) as client, client.subscribe() as events:
            nursery.start_soon(drop_each_connection)
            with trio.fail_after(6):
                kinds = [type(event).__name__ async for event in events]
        assert kinds[-1] == "Closed" and client.closed == vrt.Closed(reason="lost"), kinds
        assert kinds.count("Resumed") >= 2, kinds  # it did resume, and was dropped again
        nursery.cancel_scope.cancel()


async def welcome_then_deaf(stream: trio.SocketStream) -> None:
    """Welcomes, then reads and ignores everything: no ``closed``, no close reply."""
    request = await _request(stream)
    await stream.send_all(_switching(request))
    welcome = {
        "type": "welcome",
        "seq": 1,
        "sessionId": "s_1",
        "resumeToken": "t",
        "epoch": 0,
        "capabilities": [],
        "resumed": False,
        "lastSeq": 1,
    }
    payload = json.dumps(welcome).encode()
    await stream.send_all(bytes([0x81, len(payload)]) + payload)
    while await stream.receive_some(65536):
        pass


async def test_a_deadline_cuts_short_leaving_connect() -> None:
    """Leaving the block waited up to 5 s for ``closed``, shielded: an app's deadline
    that fired meanwhile was ignored (left at 1.5 s, deadline 2 s, back at 6.5 s)."""
    async with fake_server(welcome_then_deaf) as port:
        deadline = trio.current_time() + 0.5
        with trio.move_on_at(deadline):
            async with vrt.connect(f"ws://{HOST}:{port}/"):
                await trio.sleep(0.2)  # leave normally, before the deadline
        assert trio.current_time() - deadline < 0.6


async def garbage_at_once(stream: trio.SocketStream) -> None:
    await stream.send_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")  # not TLS
    await trio.sleep(5)


async def test_a_tls_failure_is_a_tls_error_at_once() -> None:
    """A TLS failure (a refused certificate, a peer that does not speak TLS) was
    swallowed in trio-websocket's reader: TIMEOUT after connect_timeout."""
    async with fake_server(garbage_at_once) as port:
        start = trio.current_time()
        with pytest.raises(vrt.RemoteProtocolError) as info:
            async with vrt.connect(f"wss://{HOST}:{port}/", connect_timeout=5):
                pass
    assert info.value.code == "TLS", info.value
    assert trio.current_time() - start < 1


async def test_a_client_epoch_leaves_room_for_the_servers_own_interrupts() -> None:
    """An interrupt with epoch 2**53 passed the schema; the next barge-in sent 2**53 + 1,
    which the server's own schema (and vrt.connect) refuse. Client epochs stop at 2**52."""
    async with serving(chat_agent()) as server, session(server) as peer:
        seq = await peer.send("interrupt", epoch=2**52 + 1)
        await peer.expect_error("BAD_MESSAGE", seq)
        await peer.send("interrupt", epoch=2**52)
        turn = await peer.run_turn()  # every frame is checked against its schema
        assert turn[0]["epoch"] == 2**52


async def test_the_pending_cap_warns_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    """A peer alternating over-the-cap connections and freeing a slot got a WARNING and
    an INFO line a cycle (300 of each in 2 s)."""
    async with serving(chat_agent(), max_pending_connections=2) as server:
        for _ in range(30):
            held = [await trio.open_tcp_stream(HOST, server.port) for _ in range(2)]
            await trio.sleep(0.02)
            try:
                extra = await trio.open_tcp_stream(HOST, server.port)
            except OSError:
                pass
            else:
                await extra.aclose()
            for stream in held:
                await stream.aclose()
            await trio.sleep(0.02)
    lines = [r.getMessage() for r in caplog.records if "max_pending_connections" in r.getMessage()]
    assert len(lines) == 1, lines
