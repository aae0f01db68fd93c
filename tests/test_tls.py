"""TLS: ``vrt.serve(ssl_context=...)``, ``vrt.connect(url, ssl_context=...)`` and ``vrt serve
--certfile --keyfile``, with a CA and a server certificate made by the test (trustme).

A turn over ``wss://`` and a resume through a proxy that cuts it; a client that does not
trust the CA; peers that send plain HTTP, garbage, or stall the TLS handshake (dropped, at
once or by the deadline, without an ERROR); the HTTPS front; bad contexts; the command
line, with one process and with ``--workers``. No test logs an ERROR (``no_errors``).
"""

from __future__ import annotations

import functools
import logging
import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme

import vrt
from tests import servers
from tests.test_deploy import worker_pids
from tests.test_hostile import closed_by_server
from vrt.testing import LoopbackProxy

pytestmark = [pytest.mark.network, pytest.mark.usefixtures("no_errors")]

HOST = "127.0.0.1"
CA = trustme.CA()
CERT = CA.issue_cert(HOST, "localhost")


def server_context(cert: trustme.LeafCert = CERT) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    return context


def client_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    CA.configure_trust(context)
    return context


def _agent() -> vrt.Agent:
    return vrt.define_agent(
        model=vrt.ScriptedModel([[vrt.say("one")], [vrt.say("two")]]), client_tools="accept"
    )


@asynccontextmanager
async def serving_tls(cert: trustme.LeafCert = CERT, **options: Any) -> AsyncIterator[vrt.Server]:
    context = server_context(cert)
    async with trio.open_nursery() as nursery:
        server: vrt.Server = await nursery.start(
            functools.partial(vrt.serve, _agent(), HOST, 0, ssl_context=context, **options)
        )
        yield server
        nursery.cancel_scope.cancel()


async def turn(client: vrt.Client, events: Any, text: str) -> vrt.TurnEnded:
    await client.send_text(text)
    async for event in events:
        if isinstance(event, vrt.TurnEnded):
            return event
    raise AssertionError("no turn.ended")  # pragma: no cover


async def test_a_turn_over_wss_then_a_resume_after_a_cut() -> None:
    """Each resume's connection is a new TLS handshake with the same ``ssl_context``
    (the default one does not trust the test's CA: a resume with it would fail ``TLS``)."""
    with trio.fail_after(10):
        async with serving_tls() as server, trio.open_nursery() as nursery:
            assert server.url == f"wss://{HOST}:{server.port}/"
            proxy = LoopbackProxy(server.port)
            port = await nursery.start(proxy.run)
            url = f"wss://{HOST}:{port}/"
            async with vrt.connect(url, ssl_context=client_context()) as client:
                async with client.subscribe() as events:
                    assert (await turn(client, events, "first")).reason == "finished"
                    assert proxy.cut() == 1
                    seen = []
                    async for event in events:
                        seen.append(type(event).__name__)
                        if isinstance(event, vrt.Resumed):
                            break
                    assert (await turn(client, events, "second")).reason == "finished"
            assert seen == ["Reconnecting", "Resumed"], seen
            assert proxy.connections == 2
            nursery.cancel_scope.cancel()


async def test_a_client_that_does_not_trust_the_certificate_is_refused_at_once() -> None:
    """The system's trust store (the default) knows nothing of the test's CA: ``TLS``, with
    the verification's reason, on the first attempt (a certificate does not get better)."""
    async with serving_tls() as server:
        with trio.fail_after(5), pytest.raises(vrt.RemoteProtocolError) as caught:
            async with vrt.connect(server.url):
                pass  # pragma: no cover
        assert caught.value.code == "TLS"
        assert "unable to get local issuer certificate" in caught.value.message
    async with serving_tls(CA.issue_cert("other.example")) as server:  # another name
        with trio.fail_after(5), pytest.raises(vrt.RemoteProtocolError) as caught:
            async with vrt.connect(server.url, ssl_context=client_context()):
                pass  # pragma: no cover
        assert caught.value.code == "TLS" and "mismatch" in caught.value.message


async def test_plain_http_and_garbage_to_the_tls_port_are_dropped_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A ``ws://`` client, a plain HTTP request or bytes that are not TLS fail the TLS
    handshake: dropped at once (not at the 10 s deadline), noted at DEBUG only."""
    async with serving_tls() as server:
        for data in (
            b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
            b"\x00" * 64,
            b"\x16\x03\x01\x00\x05hello",  # a TLS record head, then nonsense
        ):
            stream = await trio.open_tcp_stream(HOST, server.port)
            async with stream:
                await stream.send_all(data)
                assert await closed_by_server(stream, within=2) < 1
        with trio.fail_after(5), pytest.raises(vrt.RemoteProtocolError) as caught:
            async with vrt.connect(f"ws://{HOST}:{server.port}/", connect_timeout=1):
                pass  # pragma: no cover
        assert caught.value.code == "CLOSED", caught.value  # on every attempt
        # the server still serves
        async with vrt.connect(server.url, ssl_context=client_context()) as client:
            async with client.subscribe() as events:
                assert (await turn(client, events, "hi")).reason == "finished"
    dropped = [r for r in caplog.records if "no TLS handshake" in r.getMessage()]
    assert len(dropped) >= 4 and all(r.levelno == logging.DEBUG for r in dropped)


async def test_a_stalled_tls_handshake_is_cut_at_the_deadline() -> None:
    """Nothing sent, or half a ClientHello: reset at ``handshake_timeout``, as a stalled
    upgrade is."""
    async with serving_tls(handshake_timeout=0.5) as server:
        silent = await trio.open_tcp_stream(HOST, server.port)
        half = await trio.open_tcp_stream(HOST, server.port)
        hello = _client_hello()
        await half.send_all(hello[: len(hello) // 2])
        async with silent, half:
            async with trio.open_nursery() as nursery:
                took: list[float] = []

                async def wait(stream: trio.SocketStream) -> None:
                    took.append(await closed_by_server(stream, within=3))

                nursery.start_soon(wait, silent)
                nursery.start_soon(wait, half)
        assert all(0.4 < t < 1.5 for t in took), took


async def test_stalled_tls_handshakes_count_in_the_pending_pool() -> None:
    """With room for two handshakes from one address, a third connection closes the one
    that waited longest, at once: a TLS handshake is a handshake like any other."""
    async with serving_tls(max_pending_connections=2, max_pending_per_peer=2) as server:
        first = await trio.open_tcp_stream(HOST, server.port)
        second = await trio.open_tcp_stream(HOST, server.port)
        async with first, second:
            await trio.sleep(0.1)  # both accepted, in that order
            async with vrt.connect(server.url, ssl_context=client_context()) as client:
                async with client.subscribe() as events:
                    assert (await turn(client, events, "hi")).reason == "finished"
            assert await closed_by_server(first, within=2) < 0.5
            with trio.move_on_after(0.2):  # the second is still waiting for its handshake
                await closed_by_server(second, within=5)
                raise AssertionError("the second connection was closed too")


async def test_the_http_front_answers_over_https() -> None:
    async with serving_tls(web_demo=True) as server:
        for path, expected in (("/healthz", b"ok\n"), ("/vrt.js", b"export "), ("/", b"<html")):
            status, body = await _https_get(server.port, path)
            assert status == 200 and expected in body, (path, status, body[:200])


async def test_bad_contexts_are_refused_at_once() -> None:
    client_side = ssl.create_default_context()
    no_certificate = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    for context, error, message in (
        ("cert.pem", TypeError, "must be an ssl.SSLContext, not str"),
        (client_side, ValueError, "is a client's"),
        (no_certificate, ValueError, "has no certificate"),
    ):
        with pytest.raises(error, match=message):
            await vrt.serve(_agent(), HOST, 0, ssl_context=context)  # type: ignore[arg-type]
    wrong: object
    for url, wrong, error, message in (
        (f"ws://{HOST}:1/", client_context(), ValueError, "for wss:// URLs"),
        (f"wss://{HOST}:1/", server_context(), ValueError, "is a server's"),
        (f"wss://{HOST}:1/", b"x", TypeError, "not bytes"),
    ):
        with pytest.raises(error, match=message):
            async with vrt.connect(url, ssl_context=wrong):  # type: ignore[arg-type]
                pass  # pragma: no cover


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The server certificate (and its chain) and its key, as PEM files."""
    folder = tmp_path_factory.mktemp("pem")
    certfile, keyfile = folder / "cert.pem", folder / "key.pem"
    certfile.write_bytes(b"".join(blob.bytes() for blob in CERT.cert_chain_pems))
    CERT.private_key_pem.write_to_path(str(keyfile))
    return str(certfile), str(keyfile)


async def test_vrt_serve_certfile_keyfile(tmp_path: Path, pem: tuple[str, str]) -> None:
    certfile, keyfile = pem
    flags = ("--port", "0", "--certfile", certfile, "--keyfile", keyfile)
    async with servers.vrt_serve(tmp_path / "serve.log", "tests.serve_agent:agent", *flags) as (
        _,
        line,
    ):
        url = line.split(" on ")[1].strip()
        assert url.startswith(f"wss://{HOST}:"), line
        async with vrt.connect(url, ssl_context=client_context()) as client:
            async with client.subscribe() as events:
                assert (await turn(client, events, "ping?")).reason == "finished"


async def test_vrt_serve_workers_with_tls(tmp_path: Path, pem: tuple[str, str]) -> None:
    """``--workers 2``: each worker serves TLS on the shared port. Then the parent is
    killed: its workers drain and exit, and nobody listens on the port any more (no
    orphan keeps it)."""
    certfile, keyfile = pem
    port = servers.free_port()
    with servers.redis_server() as store:
        tls = ("--certfile", certfile, "--keyfile", keyfile)
        flags = ("--port", str(port), "--store", store, "--workers", "2", *tls)
        async with servers.vrt_serve(
            tmp_path / "workers.log", "tests.serve_agent:agent", *flags
        ) as (
            parent,
            line,
        ):
            assert f"wss://{HOST}:{port}/ (2 workers)" in line, line
            for _ in range(4):  # whichever worker accepts first: most likely both answer
                async with vrt.connect(f"wss://{HOST}:{port}/", ssl_context=client_context()) as c:
                    async with c.subscribe() as events:
                        assert (await turn(c, events, "ping?")).reason == "finished"
            workers = worker_pids(parent.pid)
            assert len(workers) == 2
            parent.kill()
            with trio.fail_after(10):
                while any(map(alive, workers)):  # noqa: ASYNC110 - other processes
                    await trio.sleep(0.05)
            with socket.socket() as again:
                again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as vrt serve
                again.bind((HOST, port))
                again.listen()


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--certfile", "cert.pem"), "--certfile and --keyfile go together"),
        (("--keyfile", "key.pem"), "--certfile and --keyfile go together"),
        (("--certfile", "no-such.pem", "--keyfile", "key.pem"), "cannot read no-such.pem"),
        (("--certfile", "README.md", "--keyfile", "README.md"), "are not a PEM certificate"),
    ],
)
def test_vrt_serve_bad_tls_flags_are_one_line(
    flags: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked before anything else (the agent's import, the workers): exit status 2."""
    from vrt._cli.commands import main

    assert main(["serve", "tests.serve_agent:agent", "--port", "0", *flags]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


# -- raw TLS peers ------------------------------------------------------------------------------


def _client_hello() -> bytes:
    """The first flight of a TLS client (its ClientHello), as bytes."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = client_context().wrap_bio(incoming, outgoing, server_hostname=HOST)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


async def _https_get(port: int, path: str) -> tuple[int, bytes]:
    """``GET path`` over TLS: the status and the body (the front closes the connection)."""
    stream = await trio.open_ssl_over_tcp_stream(
        HOST, port, ssl_context=client_context(), https_compatible=True
    )
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
        data = b""
        with trio.fail_after(5):
            while chunk := await stream.receive_some(65536):
                data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body
