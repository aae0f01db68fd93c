"""Clients behind a proxy the server trusts (``trusted_proxies``, :mod:`vrt._net.proxied`):
the per-peer limits count the client the proxy names, from ``X-Forwarded-For`` or a PROXY
protocol v2 header, and nobody else's word is taken.

The parsers as tables of bytes and headers; then real sockets: sessions and pending
handshakes counted by the forwarded client, a PROXY header before TLS, the hostile
headers a peer may send (cut short, too long, another version: dropped, never an ERROR),
and real HAProxy with ``send-proxy-v2`` in front of a node with the default limits.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from trio_websocket import WebSocketConnection, wrap_client_stream

import vrt
import vrt.asgi
from tests import test_tls
from tests.servers import haproxy
from tests.test_hostile import UPGRADE, closed_by_server
from tests.test_wire_errors import chat_agent, serving, session
from vrt._net.proxied import (
    PROXY_SIGNATURE,
    ProxyHeader,
    ProxyHeaderError,
    address_key,
    forwarded_client,
    networks,
    parse_proxy_header,
)
from vrt.testing import LoopbackProxy

pytestmark = [pytest.mark.network, pytest.mark.usefixtures("no_errors")]

HOST = "127.0.0.1"
TRUSTED = ["127.0.0.1/32"]
HELLO = json.dumps(
    {"type": "hello", "seq": 1, "protocol": "vrt/1", "capabilities": ["tool-stream-v1"]}
)


def proxy_v2(source: str, port: int = 40000, *, command: int = 1, extra: bytes = b"") -> bytes:
    """A PROXY protocol v2 header (TCP over IPv4 or IPv6) naming ``source:port``."""
    ip = ipaddress.ip_address(source)
    if isinstance(ip, ipaddress.IPv4Address):
        family, to = 0x11, ipaddress.IPv4Address("127.0.0.1").packed
    else:
        family, to = 0x21, ipaddress.IPv6Address("::1").packed
    body = ip.packed + to + port.to_bytes(2, "big") + (8765).to_bytes(2, "big") + extra
    return PROXY_SIGNATURE + bytes([0x20 | command, family]) + len(body).to_bytes(2, "big") + body


# -- the parsers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (proxy_v2("203.0.113.9", 5555), ProxyHeader("203.0.113.9", 5555)),
        (proxy_v2("2001:db8::7", 443), ProxyHeader("2001:db8::7", 443)),
        (proxy_v2("::ffff:198.51.100.1", 80), ProxyHeader("198.51.100.1", 80)),
        (proxy_v2("203.0.113.9", extra=b"\x03\x00\x04abcd"), ProxyHeader("203.0.113.9", 40000)),
        (proxy_v2("203.0.113.9", command=0), ProxyHeader(None)),  # LOCAL: a health check
        (PROXY_SIGNATURE + b"\x21\x00\x00\x00", ProxyHeader(None)),  # UNSPEC
        (PROXY_SIGNATURE + b"\x21\x31\x00\xd8" + bytes(216), ProxyHeader(None)),  # UNIX
        (b"GET / HTTP/1.1\r\n", None),
        (b"\x16\x03\x01\x02\x00", None),  # a TLS ClientHello
        (b"", 16),
        (PROXY_SIGNATURE[:5], 16),
        (proxy_v2("203.0.113.9")[:20], 28),
    ],
)
def test_proxy_headers(data: bytes, expected: Any) -> None:
    assert parse_proxy_header(data) == expected


@pytest.mark.parametrize(
    "data",
    [
        PROXY_SIGNATURE + b"\x11\x11\x00\x0c" + bytes(12),  # version 1 in a v2 header
        PROXY_SIGNATURE + b"\x22\x11\x00\x0c" + bytes(12),  # command 2
        PROXY_SIGNATURE + b"\x21\x11\xff\xff",  # 64 KiB announced
        PROXY_SIGNATURE + b"\x21\x11\x00\x04" + bytes(4),  # too short for IPv4 addresses
        PROXY_SIGNATURE + b"\x21\x21\x00\x0c" + bytes(12),  # too short for IPv6 ones
    ],
)
def test_bad_proxy_headers(data: bytes) -> None:
    with pytest.raises(ProxyHeaderError):
        parse_proxy_header(data)


TRUST = networks("trusted_proxies", ["10.0.0.0/8", "fd00::/8"])


@pytest.mark.parametrize(
    ("peer", "chain", "client"),
    [
        ("203.0.113.5", "198.51.100.1", "203.0.113.5"),  # not a trusted peer: its own
        ("10.0.0.2", None, "10.0.0.2"),  # trusted, but names nobody
        ("10.0.0.2", "198.51.100.1", "198.51.100.1"),
        ("10.0.0.2", "6.6.6.6, 198.51.100.1", "198.51.100.1"),  # the left is the client's
        ("10.0.0.2", "198.51.100.1, 10.1.1.1", "198.51.100.1"),  # two trusted hops
        ("10.0.0.2", "10.9.9.9, 10.1.1.1", "10.9.9.9"),  # all trusted: the last known
        ("10.0.0.2", "junk, 10.1.1.1", "10.1.1.1"),  # not an address: stop there
        ("10.0.0.2", "198.51.100.1:4711", "198.51.100.1"),
        ("10.0.0.2", "[2001:db8::1]:443", "2001:db8::1"),
        ("fd00::5", "2001:db8::1", "2001:db8::1"),
        ("::ffff:10.0.0.2", "198.51.100.1", "198.51.100.1"),
    ],
)
def test_forwarded_for(peer: str, chain: str | None, client: str) -> None:
    headers = [("host", "x")] + ([("x-forwarded-for", chain)] if chain else [])
    assert forwarded_client(peer, headers, TRUST) == client


def test_forwarded_for_reads_every_header_in_order() -> None:
    headers = [("x-forwarded-for", "198.51.100.1"), ("x-forwarded-for", "10.3.3.3")]
    assert forwarded_client("10.0.0.2", headers, TRUST) == "198.51.100.1"


def test_the_option_takes_cidrs_and_refuses_the_rest() -> None:
    assert networks("t", None) == ()
    assert networks("t", "10.0.0.0/8, 127.0.0.1") == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("127.0.0.1/32"),
    )
    assert networks("t", [ipaddress.ip_network("fd00::/8")]) == (ipaddress.ip_network("fd00::/8"),)
    for bad in (["10.0.0.1/8"], ["nope"], [7], 7):
        with pytest.raises(ValueError, match=r"^t"):
            networks("t", bad)
    with pytest.raises(ValueError, match="trusted_proxies"):
        vrt.asgi.app(chat_agent(), trusted_proxies=["300.0.0.0/8"])
    assert address_key("2001:db8::1") == "2001:db8::/64"


# -- real sockets --------------------------------------------------------------------------------


@asynccontextmanager
async def behind(
    port: int,
    header: bytes = b"",
    *,
    local: str | None = None,
    tls: ssl.SSLContext | None = None,
    forwarded_for: str | None = None,
) -> AsyncIterator[WebSocketConnection]:
    """A raw WebSocket to ``port`` from ``local``, ``header`` (a PROXY header) sent first,
    before TLS when ``tls``, and an ``X-Forwarded-For`` header: what a proxy in front of
    the server sends."""
    tcp = await trio.open_tcp_stream(HOST, port, local_address=local)
    await tcp.send_all(header)
    stream: trio.SocketStream | trio.SSLStream[trio.SocketStream] = tcp
    if tls is not None:
        stream = trio.SSLStream(tcp, tls, server_hostname=HOST)
    async with stream, trio.open_nursery() as nursery:
        headers = [(b"x-forwarded-for", forwarded_for.encode())] if forwarded_for else None
        with trio.fail_after(5):
            ws = await wrap_client_stream(nursery, stream, HOST, "/", extra_headers=headers)
        yield ws
        nursery.cancel_scope.cancel()


async def welcomed(ws: WebSocketConnection) -> None:
    await ws.send_message(HELLO)
    with trio.fail_after(5):
        assert json.loads(await ws.get_message())["type"] == "welcome"


async def closed_expired(ws: WebSocketConnection) -> None:
    with trio.fail_after(5):
        while (frame := json.loads(await ws.get_message()))["type"] != "closed":
            pass
    assert frame["reason"] == "expired", frame


async def still_open(ws: WebSocketConnection) -> None:
    with trio.move_on_after(0.2):
        frame = json.loads(await ws.get_message())
        assert frame["type"] == "ack", frame


async def test_sessions_count_by_the_client_a_proxy_header_names() -> None:
    """Every connection comes from 127.0.0.1, the trusted proxy; the PROXY header names
    the client. With one session per peer, a second client keeps the first's; the same
    client again closes its own first session (it started no turn), as without a proxy.
    ``authenticate`` sees the client's address as ``remote``."""
    seen: list[str] = []

    async def who(request: vrt.HandshakeRequest) -> None:
        seen.append(request.remote)

    async def anyone(request: vrt.HandshakeRequest) -> str:
        await who(request)
        return "anyone"

    options: dict[str, Any] = {"trusted_proxies": TRUSTED, "max_sessions_per_peer": 1}
    async with serving(chat_agent(), **options) as server:
        async with (
            behind(server.port, proxy_v2("203.0.113.1", 1111)) as a,
            behind(server.port, proxy_v2("203.0.113.2", 2222)) as b,
        ):
            await welcomed(a)
            await welcomed(b)
            await still_open(a)
            async with behind(server.port, proxy_v2("203.0.113.1", 3333)) as again:
                await welcomed(again)
                await closed_expired(a)
    async with serving(chat_agent(), authenticate=anyone, **options) as server:
        async with behind(server.port, proxy_v2("2001:db8::9", 4444)) as c:
            await welcomed(c)
    assert seen == ["[2001:db8::9]:4444"], seen


async def test_a_proxy_header_from_anyone_else_is_not_read() -> None:
    """Without ``trusted_proxies`` (or from an address not in it), a PROXY header is
    nobody's word: it is no HTTP either (400), and the connection is closed."""
    for options in ({}, {"trusted_proxies": ["10.0.0.0/8"]}):
        async with serving(chat_agent(), **options) as server:
            stream = await trio.open_tcp_stream(HOST, server.port)
            async with stream:
                await stream.send_all(proxy_v2("203.0.113.1") + UPGRADE)
                with trio.fail_after(2):
                    answer = await stream.receive_some(1024)
                assert answer.startswith(b"HTTP/1.1 400"), answer


async def test_forwarded_for_counts_only_from_a_trusted_proxy() -> None:
    """``X-Forwarded-For`` from the trusted proxy names the client; from anyone else it is
    ignored: two connections from 127.0.0.2 naming two clients are one peer."""
    options: dict[str, Any] = {"trusted_proxies": TRUSTED, "max_sessions_per_peer": 1}
    async with serving(chat_agent(), **options) as server, contextlib.AsyncExitStack() as stack:
        opened = []
        for chain, local in (
            ("198.51.100.1", HOST),
            ("198.51.100.2", HOST),
            ("198.51.100.3", "127.0.0.2"),
            ("198.51.100.4", "127.0.0.2"),
        ):
            ws = await stack.enter_async_context(
                behind(server.port, local=local, forwarded_for=chain)
            )
            await welcomed(ws)
            opened.append(ws)
        await still_open(opened[0])  # two clients through the proxy: both kept
        await closed_expired(opened[2])  # one peer, 127.0.0.2: its first made room


async def test_pending_handshakes_count_by_the_client_a_proxy_header_names() -> None:
    """Handshakes through the trusted proxy share its pool by client: a third stalled
    handshake of one client closes that client's oldest at once; those of three other
    clients are all kept, though they all come from the proxy's address."""
    options = {
        "trusted_proxies": TRUSTED,
        "max_pending_connections": 10,
        "max_pending_per_peer": 2,
        "handshake_timeout": 2,
    }
    async with serving(chat_agent(), **options) as server:
        same = []
        for port in (1, 2, 3):
            stream = await trio.open_tcp_stream(HOST, server.port)
            await stream.send_all(proxy_v2("203.0.113.1", port) + UPGRADE[:-1])
            same.append(stream)
            await trio.sleep(0.05)
        assert await closed_by_server(same[0], within=1) < 0.5
        others = []
        for i in range(3):
            stream = await trio.open_tcp_stream(HOST, server.port)
            await stream.send_all(proxy_v2(f"203.0.113.{10 + i}") + UPGRADE[:-1])
            others.append(stream)
        for stream in [*same[1:], *others]:
            with pytest.raises(trio.TooSlowError):
                await closed_by_server(stream, within=0.2)
        for stream in [*same, *others]:
            await stream.aclose()


async def test_hostile_proxy_headers_are_dropped_quietly() -> None:
    """From the trusted proxy's address: half a header then silence is cut at the
    handshake deadline; a header announcing 64 KiB, one of another version, one cut short
    by the peer leaving, are dropped at once. Nothing above DEBUG (``no_errors``), and a
    real client gets in after."""
    options = {"trusted_proxies": TRUSTED, "handshake_timeout": 0.5}
    async with serving(chat_agent(), **options) as server:
        stalled = await trio.open_tcp_stream(HOST, server.port)
        await stalled.send_all(proxy_v2("203.0.113.1")[:20])
        for bad in (
            PROXY_SIGNATURE + b"\x21\x11\xff\xff",
            PROXY_SIGNATURE + b"\x11\x11\x00\x0c" + bytes(12),
        ):
            stream = await trio.open_tcp_stream(HOST, server.port)
            await stream.send_all(bad)
            assert await closed_by_server(stream, within=1) < 0.3
            await stream.aclose()
        leaving = await trio.open_tcp_stream(HOST, server.port)
        await leaving.send_all(proxy_v2("203.0.113.1")[:10])
        await leaving.aclose()
        took = await closed_by_server(stalled, within=2)
        assert 0.2 < took < 1.0, took
        await stalled.aclose()
        async with session(server) as peer:  # the trusted proxy without a header: as usual
            await peer.run_turn()


async def test_a_proxy_header_before_tls_and_tls_without_one() -> None:
    """With TLS the PROXY header comes before the ClientHello; from the trusted proxy
    without a header, the bytes read looking for one are the ClientHello's, and TLS gets
    them back: ``vrt.connect`` over ``wss://`` works as ever."""
    async with test_tls.serving_tls(trusted_proxies=TRUSTED) as server:
        with trio.fail_after(5):
            async with behind(
                server.port, proxy_v2("203.0.113.1"), tls=test_tls.client_context()
            ) as ws:
                await welcomed(ws)
        async with vrt.connect(server.url, ssl_context=test_tls.client_context()) as client:
            async with client.subscribe() as events:
                assert (await test_tls.turn(client, events, "hi")).reason == "finished"


async def test_haproxy_sends_the_proxy_protocol_to_a_node_with_default_limits() -> None:
    """Real HAProxy (the shipped configuration, with ``send-proxy-v2`` on its server
    line, health checks included) in front of a node with the default per-peer limit (20
    sessions): 30 clients from 30 addresses all get a session and finish a turn."""
    agent = vrt.define_agent(model=vrt.ScriptedModel([[vrt.say("hi")]] * 40))
    async with serving(agent, trusted_proxies=TRUSTED) as server:
        with haproxy([server.port], "send-proxy-v2") as port:
            sources = [f"127.0.2.{i}" for i in range(1, 31)]
            proxy = LoopbackProxy(port, sources=sources)
            async with trio.open_nursery() as nursery:
                await nursery.start(proxy.run)
                done: list[str] = []

                async def one() -> None:
                    async with (
                        vrt.connect(f"ws://{HOST}:{proxy.port}/") as client,
                        client.subscribe() as events,
                    ):
                        ended = await test_tls.turn(client, events, "hi")
                        done.append(ended.reason)

                with trio.fail_after(20):
                    async with trio.open_nursery() as clients:
                        for _ in sources:
                            clients.start_soon(one)
                assert done == ["finished"] * len(sources)
                nursery.cancel_scope.cancel()
