"""``vrt.asgi``: vrt/1 as an ASGI application, served by hypercorn's Trio worker.

In process (``hypercorn.trio.serve`` on a free loopback port): a Starlette app with a route
of its own (``GET /hello``) and vrt mounted at ``/vrt``, its sessions opened by Starlette's
lifespan (``lifespan=vrt_app.lifespan``); and the app served alone, its lifespan run by
hypercorn. Then the real ``hypercorn --worker-class trio`` command in a subprocess, with the
Python client and vrt.js in Chromium (each a turn, a cut and a resume).
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import ConnectionClosed, wrap_client_stream

import vrt
import vrt.asgi
from tests.conftest import Log, every_record, until
from vrt._net.web import _file
from vrt.testing import LoopbackProxy

ROOT = Path(__file__).parent.parent
OBJ = {"type": "object"}
HOST = "127.0.0.1"


@vrt.server_tool(risk="low", parameters=OBJ)
async def lookup(args: Any, ctx: vrt.ToolContext) -> Any:
    return {"hits": 3}


@vrt.app_tool(name="show", parameters=OBJ)
async def show(args: Any, ctx: vrt.ToolContext) -> Any:
    return {"shown": args["id"]}


def make_agent() -> vrt.Agent:
    """Each turn: words, the server tool ``lookup``, the app tool ``show``; then words."""
    script: list[list[Any]] = []
    for turn in range(4):
        script += [
            [vrt.say("Looking. "), vrt.call("lookup", {"q": turn}, chunks=2),
             vrt.call("show", {"id": str(turn)})],
            [vrt.say("Done.")],
        ]  # fmt: skip
    return vrt.define_agent(
        model=vrt.ScriptedModel(script), tools=[lookup], client_tools="accept", max_steps=3
    )


agent = make_agent()


def starlette_app(vrt_app: vrt.asgi.App, *, lifespan: bool = True) -> Any:
    """A Starlette app with a route of its own and ``vrt_app`` mounted at ``/vrt``."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse("hello from starlette")

    return Starlette(
        routes=[Route("/hello", hello), Mount("/vrt", app=vrt_app)],
        lifespan=vrt_app.lifespan if lifespan else None,
    )


def served() -> Any:
    """What the hypercorn command serves (``tests.test_asgi:served()``): the Starlette app,
    with vrt's log lines on stderr, their level shown (an ERROR must not go unseen)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return starlette_app(vrt.asgi.app(agent))


@asynccontextmanager
async def hypercorn(app: Any, stop: trio.Event | None = None) -> AsyncIterator[int]:
    """``app`` served by ``hypercorn.trio.serve`` on a free loopback port (yielded); shut
    down on the way out, or when ``stop`` is set."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    config.bind = [f"{HOST}:0"]
    config.graceful_timeout = 0.5
    stop = trio.Event() if stop is None else stop
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            functools.partial(serve, app, config, shutdown_trigger=stop.wait)
        )
        yield int(binds[0].rsplit(":", 1)[1])
        stop.set()


async def exchange(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request written by hand: the status, the headers and the body of the reply
    (read to the end of the connection, or ``content-length``)."""
    with trio.fail_after(5):
        async with await trio.open_tcp_stream(HOST, port) as stream:
            await stream.send_all(request)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = await stream.receive_some(65536)
                assert chunk, data
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            headers = {k.lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])}
            length = int(headers.get("content-length", "0"))
            while len(body) < length:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break
                body += chunk
            return status, headers, body


async def get(port: int, path: str) -> tuple[int, dict[str, str], bytes]:
    return await exchange(
        port, f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nConnection: close\r\n\r\n".encode()
    )


async def upgrade(
    port: int, path: str = "/vrt/", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """A WebSocket upgrade request written by hand: how it is answered."""
    key = base64.b64encode(os.urandom(16)).decode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    return await exchange(
        port,
        f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        f"{extra}\r\n".encode(),
    )


@asynccontextmanager
async def raw(
    port: int, path: str = "/vrt/", headers: list[tuple[bytes, bytes]] | None = None
) -> AsyncIterator[Any]:
    """A raw trio-websocket connection (the test owns its TCP stream and closes it)."""
    async with trio.open_nursery() as nursery:
        stream = await trio.open_tcp_stream(HOST, port)
        try:
            ws = await wrap_client_stream(nursery, stream, HOST, path, extra_headers=headers)
            try:
                yield ws
            finally:
                with trio.move_on_after(1) as scope:
                    scope.shield = True
                    await ws.aclose()
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()
            # Last: a checkpoint after it would raise Cancelled in place of the body's error.
            nursery.cancel_scope.cancel()


@pytest.fixture
def no_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Nothing logged at ERROR or above, by vrt, hypercorn or Starlette."""
    caplog.set_level(logging.INFO)
    yield
    errors = [r.getMessage() for r in every_record(caplog) if r.levelno >= logging.ERROR]
    assert not errors, errors


async def one_turn(url: str, text: str = "go") -> list[Any]:
    """A session through ``url`` with the Python client: one turn's events."""
    async with vrt.connect(url, tools=[show]) as client, client.subscribe() as channel:
        events = Log(channel)
        await client.send_text(text)
        ended = await until(events, lambda e: isinstance(e, vrt.TurnEnded))
        assert ended.reason == "finished"
    assert client.closed == vrt.Closed(reason="client")
    return events.events


def settled(events: list[Any]) -> list[tuple[str, str, bool | None]]:
    return [
        (e.name, e.kind, e.ok)
        for e in events
        if isinstance(e, vrt.ToolStream) and e.phase == vrt.Phase.SETTLED
    ]


async def test_a_turn_and_the_files_through_a_starlette_mount(no_errors: None) -> None:
    async with hypercorn(starlette_app(vrt.asgi.app(agent))) as port:
        assert (await get(port, "/hello"))[::2] == (200, b"hello from starlette")
        events = await one_turn(f"ws://{HOST}:{port}/vrt/")
        assert settled(events) == [("lookup", "server", True), ("show", "app", True)]
        text = "".join(e.text for e in events if isinstance(e, vrt.TextDelta))
        assert text == "Looking. Done."
        status, headers, body = await get(port, "/vrt/vrt.js")
        found = _file("vrt.js")
        assert found is not None
        assert (status, body, headers["etag"]) == (200, found[0], found[1])
        assert headers["content-type"] == "text/javascript; charset=utf-8"
        assert (await get(port, "/vrt/healthz"))[::2] == (200, b"ok\n")
        assert (await get(port, "/vrt/metrics"))[0] == 404  # metrics=False
        assert (await get(port, "/vrt/nothing"))[0] == 404
        assert (await get(port, "/elsewhere"))[0] == 404  # Starlette's own 404


async def test_served_alone_hypercorn_runs_its_lifespan(no_errors: None) -> None:
    """The app served by itself: hypercorn's lifespan opens its sessions; at shutdown an
    open session is told ``closed`` ``shutdown``, as ``vrt.serve``'s are when cancelled."""
    stop = trio.Event()
    async with hypercorn(vrt.asgi.app(agent, metrics=True), stop) as port:
        async with (
            vrt.connect(f"ws://{HOST}:{port}/", tools=[show]) as client,
            client.subscribe() as channel,
        ):
            events = Log(channel)
            await client.send_text("go")
            await until(events, lambda e: isinstance(e, vrt.TurnEnded))
            status, headers, body = await get(port, "/metrics")
            assert status == 200 and headers["content-type"].startswith("text/plain")
            assert b"# TYPE " in body  # Prometheus text format
            assert (await get(port, "/healthz"))[::2] == (200, b"ok\n")
            stop.set()
            closed = await until(events, lambda e: isinstance(e, vrt.Closed))
    assert closed == vrt.Closed(reason="shutdown")


async def test_the_frames_are_those_of_vrt_serve() -> None:
    """The same exchange, byte for byte (ids aside), through both fronts."""
    hello = {
        "type": "hello", "seq": 1, "protocol": "vrt/1", "capabilities": ["tool-stream-v1"],
        "tools": [{"name": "show", "description": "", "parameters": OBJ}],
    }  # fmt: skip

    async def frames(port: int, path: str) -> list[str]:
        got: list[str] = []
        async with raw(port, path) as ws:
            await ws.send_message(json.dumps(hello))
            got.append(await ws.get_message())
            await ws.send_message('{"type":"input","seq":2,"text":"go"}')
            while '"turn.ended"' not in got[-1]:
                with trio.fail_after(5):
                    frame = await ws.get_message()
                if '"type":"ack"' in frame:
                    continue
                got.append(frame)
                if '"tool.call"' in frame:
                    call = json.loads(frame)
                    await ws.send_message(
                        json.dumps(
                            {
                                "type": "tool.result",
                                "seq": 3,
                                "callId": call["callId"],
                                "epoch": call["epoch"],
                                "result": {"ok": True, "output": 1},
                            }
                        )
                    )
        welcome = json.loads(got[0])
        return [
            f.replace(welcome["sessionId"], "SESSION").replace(welcome["resumeToken"], "TOKEN")
            for f in got
        ]

    async with trio.open_nursery() as nursery:
        server = await nursery.start(functools.partial(vrt.serve, make_agent(), HOST, 0))
        served = await frames(server.port, "/")
        nursery.cancel_scope.cancel()
    async with hypercorn(vrt.asgi.app(make_agent())) as port:
        assert await frames(port, "/") == served
    assert len(served) > 10 and '"closed"' not in "".join(served)


async def test_authenticate_and_the_origin_allow_list(no_errors: None) -> None:
    remotes: list[tuple[str, str]] = []

    async def by_bearer(request: vrt.HandshakeRequest) -> str | None:
        remotes.append((request.path, request.remote))
        token = request.header("Authorization")
        if token == "Bearer wrong":
            raise vrt.Refuse(403, "that token is revoked")
        return {"Bearer alice": "alice"}.get(token or "")

    vrt_app = vrt.asgi.app(agent, authenticate=by_bearer, allowed_origins=["https://app.example"])
    async with hypercorn(starlette_app(vrt_app)) as port:
        status, _, body = await upgrade(port, "/vrt/?room=7")
        assert (status, body) == (401, b"unauthorized")
        assert remotes[0][0] == "/vrt/?room=7"
        host, client_port = remotes[0][1].rsplit(":", 1)
        assert host == HOST and int(client_port) > 0
        wrong = {"authorization": "Bearer wrong"}
        assert (await upgrade(port, headers=wrong))[::2] == (403, b"that token is revoked")
        evil = {"authorization": "Bearer alice", "origin": "https://evil.example"}
        assert (await upgrade(port, headers=evil))[::2] == (403, b"origin not allowed")
        with pytest.raises(vrt.RemoteProtocolError) as refused:
            async with vrt.connect(f"ws://{HOST}:{port}/vrt/"):
                pass  # pragma: no cover
        assert refused.value.code == "HTTP_401"
        headers = [("authorization", "Bearer alice"), ("origin", "https://app.example")]
        async with vrt.connect(f"ws://{HOST}:{port}/vrt/", headers=headers) as client:
            assert client.session_id is not None


async def test_frame_limits_close_1009(no_errors: None) -> None:
    """Before the hello, a frame over 64 KiB; after it, one over ``max_message_size``:
    both close the connection with 1009, as vrt.serve does."""
    async with hypercorn(starlette_app(vrt.asgi.app(agent, max_message_size=200_000))) as port:
        async with raw(port) as ws:
            await ws.send_message("x" * (64 * 1024 + 1))
            with pytest.raises(ConnectionClosed) as closed:
                with trio.fail_after(5):
                    await ws.get_message()
            assert closed.value.reason.code == 1009
        async with raw(port) as ws:
            hello = {"type": "hello", "seq": 1, "protocol": "vrt/1", "capabilities": []}
            await ws.send_message(json.dumps(hello))
            assert json.loads(await ws.get_message())["type"] == "welcome"
            await ws.send_message("x" * 100_000)  # over the hello limit, within the session's
            assert await error_code(ws) == "BAD_JSON"  # read, answered, and still open
            await ws.send_message("y" * 200_001)
            with pytest.raises(ConnectionClosed) as closed:
                await error_code(ws)
            assert closed.value.reason.code == 1009
            assert closed.value.reason.reason == "Exceeded maximum message size: 200000 bytes"


async def test_sessions_per_peer_by_address_or_principal(no_errors: None) -> None:
    """``max_sessions_per_peer`` counts by the client's address without a principal, by
    principal with one: a second session that would go over it is refused (error
    RATE_LIMITED, closed rejected) once the first has started a turn."""
    hello = json.dumps({"type": "hello", "seq": 1, "protocol": "vrt/1", "capabilities": []})

    async def second_session(port: int, path: str) -> list[str]:
        async with raw(port, path) as ws:
            await ws.send_message(hello)
            with trio.fail_after(5):
                return [json.loads(await ws.get_message())["type"] for _ in range(2)]

    async def by_query(request: vrt.HandshakeRequest) -> str:
        return request.path.rsplit("=", 1)[1]  # /vrt/?who=NAME: the principal NAME

    for authenticate, first, other in ((None, "/vrt/", "/vrt/"),
                                       (by_query, "/vrt/?who=a", "/vrt/?who=b")):  # fmt: skip
        vrt_app = vrt.asgi.app(agent, max_sessions_per_peer=1, authenticate=authenticate)
        async with hypercorn(starlette_app(vrt_app)) as port:
            url = f"ws://{HOST}:{port}{first}"
            async with vrt.connect(url, tools=[show]) as client, client.subscribe() as channel:
                await client.send_text("go")
                await until(Log(channel), lambda e: isinstance(e, vrt.TurnEnded))
                assert await second_session(port, first) == ["error", "closed"]
                if authenticate is not None:  # another principal, the same address
                    assert (await second_session(port, other))[0] == "welcome"


async def test_sessions_per_peer_by_the_address_a_trusted_proxy_forwards(
    no_errors: None,
) -> None:
    """Behind a proxy every connection has the proxy's address: with the proxy in
    ``trusted_proxies`` the sessions count by the client its ``X-Forwarded-For`` names
    (the rightmost address that is not a trusted proxy); without, by the proxy's."""
    hello = json.dumps({"type": "hello", "seq": 1, "protocol": "vrt/1", "capabilities": []})

    def forwarded(chain: str) -> list[tuple[bytes, bytes]]:
        return [(b"x-forwarded-for", chain.encode())]

    async def session_of(port: int, chain: str) -> list[str]:
        async with raw(port, headers=forwarded(chain)) as ws:
            await ws.send_message(hello)
            with trio.fail_after(5):
                first = json.loads(await ws.get_message())["type"]
                if first == "welcome":
                    return [first]
                return [first, json.loads(await ws.get_message())["type"]]

    for trusted, other in ((["127.0.0.1/32"], ["welcome"]), (None, ["error", "closed"])):
        vrt_app = vrt.asgi.app(agent, max_sessions_per_peer=1, trusted_proxies=trusted)
        async with hypercorn(starlette_app(vrt_app)) as port:
            url = f"ws://{HOST}:{port}/vrt/"
            headers = [("x-forwarded-for", "198.51.100.7, 203.0.113.1")]
            async with (
                vrt.connect(url, tools=[show], headers=headers) as client,
                client.subscribe() as channel,
            ):
                await client.send_text("go")
                await until(Log(channel), lambda e: isinstance(e, vrt.TurnEnded))
                # the client wrote 198.51.100.7 itself: 203.0.113.1 is who it is
                assert await session_of(port, "9.9.9.9, 203.0.113.1") == ["error", "closed"]
                assert await session_of(port, "198.51.100.7, 203.0.113.2") == other


async def error_code(ws: Any) -> str:
    """The code of the next ``error`` frame (acks skipped)."""
    with trio.fail_after(5):
        while True:
            frame = json.loads(await ws.get_message())
            if frame["type"] == "error":
                return str(frame["code"])
            assert frame["type"] == "ack", frame


async def test_the_connection_adapter_in_memory() -> None:
    """AsgiConnection: frames in, ConnectionClosed at the disconnect, one close; a send
    the server fails (hypercorn 0.18 lets trio's BusyResourceError out when the peer's
    close and a send meet on the socket) is the connection's end, not an error."""
    inbound, receive = trio.open_memory_channel[dict[str, Any]](10)
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(dict(message))

    ws = vrt.asgi.AsgiConnection(receive.receive, send, 1024)
    await inbound.send({"type": "websocket.receive", "text": "one"})
    await inbound.send({"type": "websocket.receive", "bytes": b"two"})
    await inbound.send({"type": "websocket.disconnect", "code": 1001})
    assert [await ws.get_message(), await ws.get_message()] == ["one", b"two"]
    with pytest.raises(ConnectionClosed) as closed:
        await ws.get_message()
    assert closed.value.reason.code == 1001 and ws.closed is not None
    with pytest.raises(ConnectionClosed):
        await ws.send_message("late")
    await ws.aclose()
    assert sent == []  # the peer is gone: nothing sent, no close either

    async def busy(message: dict[str, Any]) -> None:
        sent.append(dict(message))
        raise trio.BusyResourceError("another task is currently sending data")

    ws = vrt.asgi.AsgiConnection(receive.receive, busy, 1024)
    with pytest.raises(ConnectionClosed):
        await ws.send_message("hello")
    await ws.aclose(1000)  # over already: nothing more
    ws = vrt.asgi.AsgiConnection(receive.receive, busy, 1024)
    await ws.aclose(1000)
    await ws.aclose(1000)
    assert [m["type"] for m in sent] == ["websocket.send", "websocket.close"]


async def test_the_app_called_in_memory() -> None:
    """The app called by hand, as any ASGI 3 server would: its lifespan (started once,
    a second start fails), a refusal without the ``websocket.http.response`` extension (a
    close before the accept: the server answers 403), a path below ``root_path`` whether
    or not the server left ``root_path`` in ``path``."""

    async def nobody(request: vrt.HandshakeRequest) -> None:
        return None

    vrt_app = vrt.asgi.app(agent, authenticate=nobody)
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(dict(message))

    def receiving(*messages: dict[str, Any]) -> Any:
        inbound, outbound = trio.open_memory_channel[dict[str, Any]](len(messages))
        for message in messages:
            inbound.send_nowait(message)
        return outbound.receive

    async with trio.open_nursery() as nursery:
        to_app, lifespan_receive = trio.open_memory_channel[dict[str, Any]](2)
        lifespan_send, from_app = trio.open_memory_channel[dict[str, Any]](2)
        to_app.send_nowait({"type": "lifespan.startup"})
        nursery.start_soon(
            vrt_app, {"type": "lifespan"}, lifespan_receive.receive, lifespan_send.send
        )
        with trio.fail_after(5):
            assert await from_app.receive() == {"type": "lifespan.startup.complete"}
        again = receiving({"type": "lifespan.startup"})
        await vrt_app({"type": "lifespan"}, again, send)
        assert sent.pop()["type"] == "lifespan.startup.failed"

        scope = {"type": "websocket", "path": "/vrt/", "root_path": "/vrt", "headers": [],
                 "client": ("10.0.0.1", 5000)}  # fmt: skip
        await vrt_app(scope, receiving({"type": "websocket.connect"}), send)
        assert sent == [{"type": "websocket.close", "code": 1008}]
        sent.clear()
        for path in ("/vrt/healthz", "/healthz"):  # root_path kept in path, or not
            scope = {"type": "http", "method": "GET", "path": path, "root_path": "/vrt",
                     "headers": []}  # fmt: skip
            await vrt_app(scope, receiving(), send)
            assert (sent[0]["status"], sent[1]["body"]) == (200, b"ok\n"), path
            sent.clear()
        await to_app.send({"type": "lifespan.shutdown"})
        with trio.fail_after(5):
            assert await from_app.receive() == {"type": "lifespan.shutdown.complete"}


def test_import_vrt_does_not_load_it() -> None:
    """``vrt.asgi`` is imported by who uses it (nor does it load hypercorn or Starlette)."""
    check = (
        "import sys, vrt; assert 'vrt.asgi' not in sys.modules; import vrt.asgi; "
        "assert not {'hypercorn', 'starlette'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", check], check=True, cwd=ROOT, timeout=60)


def test_bad_options_raise() -> None:
    for option in ("host", "port", "max_pending_connections", "max_pending_per_peer",
                   "sockets", "relay_host"):  # fmt: skip
        with pytest.raises(TypeError):
            vrt.asgi.app(agent, **{option: 1})
    with pytest.raises(ValueError, match="store"):
        vrt.asgi.app(agent, store="redis://127.0.0.1:6379")
    with pytest.raises(ValueError, match="max_message_size"):
        vrt.asgi.app(agent, max_message_size=10)
    with pytest.raises(ValueError, match="handshake_timeout"):
        vrt.asgi.app(agent, handshake_timeout=0)


async def test_an_app_not_started_refuses_clearly(caplog: pytest.LogCaptureFixture) -> None:
    """Mounted without Starlette's lifespan: 503 to an upgrade and to a request, one
    WARNING that says what to do, no hang and no traceback."""
    caplog.set_level(logging.INFO)
    async with hypercorn(starlette_app(vrt.asgi.app(agent), lifespan=False)) as port:
        assert (await upgrade(port))[::2] == (503, b"not started\n")
        assert (await get(port, "/vrt/healthz"))[::2] == (503, b"not started\n")
        assert (await get(port, "/hello"))[0] == 200
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "lifespan=vrt_app.lifespan" in warnings[0], warnings
    assert "Traceback" not in caplog.text


# -- the hypercorn command, the Python client's resume, vrt.js in Chromium ----------------------


@contextmanager
def hypercorn_command(target: str = "tests.test_asgi:served()") -> Iterator[int]:
    """``hypercorn --worker-class trio TARGET`` on a free loopback port (yielded); its log
    must hold no ERROR and no traceback when it is stopped (SIGINT)."""
    import socket

    with socket.socket() as probe:
        probe.bind((HOST, 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hypercorn",
            "--worker-class",
            "trio",
            "--bind",
            f"{HOST}:{port}",
            "--graceful-timeout",
            "1",
            target,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert process.stdout is not None
        while True:
            line = process.stdout.readline().decode()
            assert line, "hypercorn exited"
            if "Running on" in line:
                break
        yield port
    finally:
        process.send_signal(signal.SIGINT)
        try:
            out, _ = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            out, _ = process.communicate()
        problems = [x for x in out.decode().splitlines() if "ERROR" in x or "Traceback" in x]
        assert not problems, problems


@pytest.mark.network
def test_the_hypercorn_command_python_client_and_vrt_js() -> None:
    """The real ``hypercorn --worker-class trio`` serving the Starlette app: the Python
    client and vrt.js in Chromium each run a turn, and each has its connection cut (by a
    proxy that drops it) and resumes, all through ``/vrt/``."""
    with hypercorn_command() as port:
        assert trio.run(get, port, "/hello")[2] == b"hello from starlette"
        trio.run(resume_through_a_cut, port)
        browser_turns(f"http://{HOST}:{port}/vrt/", port)


async def resume_through_a_cut(port: int) -> None:
    async with trio.open_nursery() as nursery:
        proxy = LoopbackProxy(port)
        await nursery.start(proxy.run)
        url = f"ws://{HOST}:{proxy.port}/vrt/"
        async with vrt.connect(url, tools=[show]) as client, client.subscribe() as channel:
            events = Log(channel)
            await client.send_text("one")
            first = await until(events, lambda e: isinstance(e, vrt.TurnEnded))
            session = client.session_id
            assert proxy.cut() == 1
            await until(events, lambda e: isinstance(e, vrt.Reconnecting))
            await until(events, lambda e: isinstance(e, vrt.Resumed))
            await client.send_text("two")
            second = await until(events, lambda e: isinstance(e, vrt.TurnEnded))
            assert client.session_id == session
            assert (first.turn_id, second.turn_id) == ("t_1", "t_2")
            assert second.reason == "finished"
        assert settled(events.events) == [("lookup", "server", True), ("show", "app", True)] * 2
        assert client.closed == vrt.Closed(reason="client")
        assert proxy.connections == 2
        nursery.cancel_scope.cancel()


BROWSER_TURN = """async (url) => {
  const { connect } = await import("/vrt/vrt.js");
  const settled = [];
  const client = await connect(url, {
    tools: [{name: "show", description: "", parameters: {type: "object"},
             run: async (args) => ({shown: args.id})}],
  });
  client.addEventListener("tool.stream", (e) => {
    if (e.detail.phase === "settled") settled.push([e.detail.name, e.detail.kind, e.detail.ok]);
  });
  const ended = new Promise((r) => client.addEventListener("turn.ended", r, {once: true}));
  await client.sendText("go");
  const reason = (await ended).detail.reason;
  await client.close();
  return {settled, reason, closed: client.closed};
}"""

BROWSER_START = """async (url) => {
  const { connect } = await import("/vrt/vrt.js");
  const state = (window.vrtTest = {settled: [], lifecycle: [], ran: 0});
  // A fixed wait here raced the cut on a loaded machine (the turn could end first)
  state.cut = new Promise((r) => (state.wasCut = r));
  let running;
  const runningNow = new Promise((r) => (running = r));
  const client = await connect(url, {
    resume: {backoff: 50},
    tools: [{name: "show", description: "", parameters: {type: "object"},
             run: async (args) => {
               state.ran += 1;
               running();
               await state.cut;  // answered only once the page has lost the connection
               return {shown: args.id};
             }}],
  });
  client.addEventListener("tool.stream", (e) => {
    if (e.detail.phase === "settled") {
      state.settled.push([e.detail.name, e.detail.kind, e.detail.ok]);
    }
  });
  for (const type of ["reconnecting", "resumed", "closed"]) {
    client.addEventListener(type, () => state.lifecycle.push(type));
  }
  client.addEventListener("reconnecting", () => state.wasCut(), {once: true});
  state.ended = new Promise((r) => client.addEventListener("turn.ended", r, {once: true}));
  state.client = client;
  await client.sendText("go");
  await runningNow;  // the app tool runs: the test cuts the connection now
}"""

BROWSER_FINISH = """async () => {
  const state = window.vrtTest;
  const reason = (await state.ended).detail.reason;
  await state.client.close();
  return {settled: state.settled, lifecycle: state.lifecycle, ran: state.ran, reason};
}"""


def browser_turns(base: str, port: int) -> None:
    """vrt.js in Chromium: a turn; then a turn whose connection is cut while its app tool
    runs (tests/web_proxy.py in front of ``port``), resumed with nothing lost or run twice."""
    from playwright.sync_api import sync_playwright

    from tests.test_browser import CHROMIUM, run_js

    assert CHROMIUM is not None, "Debian's chromium is needed (.ci/run installs it)"
    proxy = subprocess.Popen(
        [sys.executable, "tests/web_proxy.py", str(port)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert proxy.stdin is not None and proxy.stdout is not None
        through = f"ws://{HOST}:{int(proxy.stdout.readline())}/vrt/"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_page()
                console: list[str] = []
                page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
                page.goto(base + "machines.js")
                turn = run_js(page, BROWSER_TURN, base.replace("http://", "ws://"))
                run_js(page, BROWSER_START, through)
                proxy.stdin.write(b"cut\n")
                proxy.stdin.flush()
                assert proxy.stdout.readline().decode().strip() == "cut 1"
                resumed = run_js(page, BROWSER_FINISH, None)
            finally:
                browser.close()
    finally:
        proxy.kill()
        proxy.communicate()
    both = [["lookup", "server", True], ["show", "app", True]]
    assert turn == {"settled": both, "reason": "finished", "closed": "client"}, turn
    assert resumed == {
        "settled": both,
        "lifecycle": ["reconnecting", "resumed", "closed"],
        "ran": 1,  # the app tool ran once, across the cut
        "reason": "finished",
    }, resumed
    assert not console, console
