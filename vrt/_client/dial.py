"""``vrt.connect``: open the client's WebSocket connections to a URL and run a client on them.

Every connection, the first and each resume's, is opened here (TCP, TLS for ``wss://``,
the HTTP upgrade) under the attempt's deadline (``connect_timeout``, which the client also
holds over the ``welcome``); :mod:`vrt._client.client` pumps the protocol on them. A peer that
closes or answers nonsense during the upgrade is an error at once, never a hang.
"""

from __future__ import annotations

import contextlib
import functools
import ssl
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import trio
from trio_websocket import (
    ConnectionRejected,
    HandshakeError,
    WebSocketConnection,
    wrap_client_stream,
)

from vrt._client.client import Client, open_client
from vrt._client.reconnect import CLOSE_TIMEOUT, CONNECT_TIMEOUT, RESUME_TIMEOUT, Lost
from vrt._engine.groups import single_unwrapped
from vrt._engine.tools import AppTool
from vrt._errors import RemoteProtocolError
from vrt._net.accept import GuardedStream
from vrt._net.pumps import patiently
from vrt._net.tls import client_context
from vrt._wire import messages as m
from vrt._wire.server import MAX_MESSAGE_SIZE


@asynccontextmanager
async def connect(
    url: str,
    tools: Sequence[AppTool] = (),
    *,
    capabilities: Sequence[str] = m.CAPABILITIES,
    max_message_size: int = MAX_MESSAGE_SIZE,
    headers: Sequence[tuple[str, str]] = (),
    resume: bool = True,
    resume_timeout: float = RESUME_TIMEOUT,
    connect_timeout: float = CONNECT_TIMEOUT,
    ssl_context: ssl.SSLContext | None = None,
    audio: bool = False,
) -> AsyncIterator[Client]:
    """Connect to a vrt/1 server and open a session, hosting the app ``tools``.

    Each connection attempt (TCP, TLS, the upgrade, the ``welcome``) must be done within
    ``connect_timeout`` seconds. Raises :class:`~vrt.RemoteProtocolError` if the server
    refuses the hello (e.g. an app tool named like a server tool: ``TOOL_CONFLICT``) or the
    upgrade (``HTTP_401``, ...: ``authenticate`` or the origin check), answers what is not
    a WebSocket upgrade (``HANDSHAKE``) or fails TLS (``TLS``), closes the connection
    during the handshake on every try (``CLOSED``) or does not welcome the client within
    ``connect_timeout`` (``TIMEOUT``); an OSError if nothing accepts the TCP connection.
    ``headers`` go with every upgrade request (for instance
    ``[("authorization", "Bearer ...")]``).

    ``ssl_context``: for ``wss://``, the client-side context every connection (each
    resume's too) checks the server with; by default ``ssl.create_default_context()``, the
    system's trusted CAs. For a private CA, ``ssl.create_default_context(cafile=...)``. A
    certificate it does not trust is ``TLS`` at once (not tried again). ValueError if it is
    given with a ``ws://`` URL or is a server's context, TypeError if it is not one.

    A lost connection is resumed (``resume=True``): the client reconnects with backoff
    while the app sees :class:`~vrt.Reconnecting`, then :class:`~vrt.Resumed` and the
    events it missed, in order; a running app tool goes on and its result goes through
    after the resume. A failed or timed-out attempt is one attempt of the backoff. If the
    server refuses the resume, :class:`~vrt.Closed` with reason ``expired``; if no
    connection resumes it within ``resume_timeout`` seconds, ``lost``. A frame over
    ``max_message_size`` from either side (close code 1009) ends the session,
    ``Closed("too_large")``: resuming would replay it.

    ``max_message_size`` (1 MiB, the server's default) bounds the frames both ways: a
    larger one from the server is refused; ``send_text`` raises ValueError rather than
    send one, and an app tool's output over it is answered FAILED.

    Leaving the block ends the session for good (``close``, then waits up to 5 s for
    ``closed``; while reconnecting it does not wait). Cancelling it returns within a
    second in every state: ``close`` is sent if it can be, nothing is waited for long.
    ``capabilities`` is what this client supports (pass ``()`` to act as a client without
    ``tool-stream-v1``: then only ``ToolPreview`` events arrive).

    ``audio=True`` offers ``audio-v1`` too: with a server whose agent has a realtime model,
    ``client.audio`` then gives the rates, ``client.send_audio(pcm)`` sends the user's
    voice, the model's comes as :class:`~vrt.AudioDelta` events and what was said as
    :class:`~vrt.Transcript` events, and ``client.interrupt(heard_ms=...)`` says how much
    of it the user heard. Otherwise (the default) the session is exactly as without it.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ValueError(f"not a ws:// or wss:// URL: {url!r}")
    for name, value in (("connect_timeout", connect_timeout), ("resume_timeout", resume_timeout)):
        if not (isinstance(value, int | float) and value > 0):
            raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
    if not (isinstance(max_message_size, int) and max_message_size >= 1024):
        raise ValueError(f"max_message_size must be at least 1024, not {max_message_size!r}")
    secure = parts.scheme == "wss"
    if ssl_context is not None:
        ssl_context = client_context(ssl_context)
        if not secure:
            raise ValueError(f"ssl_context is for wss:// URLs, not {url!r}")
    elif secure:
        ssl_context = ssl.create_default_context()  # once: each attempt reuses it
    port = parts.port or (443 if secure else 80)
    resource = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    extra = [(key.encode("latin-1"), value.encode("latin-1")) for key, value in headers]
    opener = functools.partial(
        _open_ws, parts.hostname, port, resource, extra, ssl_context, max_message_size
    )
    async with open_client(
        None,
        tools,
        capabilities=capabilities,
        reconnect=opener,
        resume=resume,
        resume_timeout=resume_timeout,
        connect_timeout=connect_timeout,
        max_message_size=max_message_size,
        audio=audio,
    ) as client:
        yield client


@asynccontextmanager
async def _open_ws(
    host: str,
    port: int,
    resource: str,
    headers: list[tuple[bytes, bytes]],
    ssl_context: ssl.SSLContext | None,
    max_message_size: int,
) -> AsyncIterator[WebSocketConnection]:
    """One WebSocket connection: TCP (and TLS with ``ssl_context``), then the upgrade. A
    peer that leaves before the upgrade is done raises :class:`~vrt._client.client.Lost` at
    once."""
    # We open (and always close) the TCP stream ourselves: trio-websocket's client leaves
    # it open when the server ends the connection first.
    tcp = await trio.open_tcp_stream(host, port)
    guarded = GuardedStream(tcp)
    upgraded = False
    stream: trio.abc.Stream = guarded
    try:
        if ssl_context is not None:
            tls = trio.SSLStream(guarded, ssl_context, server_hostname=host, https_compatible=True)
            await _tls_handshake(tls)
            stream = tls
        with _handshake_errors(lambda: upgraded), single_unwrapped():
            async with trio.open_nursery() as nursery:
                with trio.CancelScope() as upgrade:
                    guarded.on_close = upgrade.cancel  # trio-websocket would wait forever
                    ws = await wrap_client_stream(
                        nursery,
                        stream,  # type: ignore[arg-type]
                        host,
                        resource,
                        extra_headers=headers,
                        max_message_size=max_message_size,
                    )
                    guarded.on_close = None
                if upgrade.cancelled_caught:
                    nursery.cancel_scope.cancel()
                    raise Lost("the server closed the connection during the upgrade")
                upgraded = True
                try:
                    yield ws
                finally:
                    try:
                        if ws.closed is None:  # a lost one needs no close handshake
                            await patiently(ws.aclose, CLOSE_TIMEOUT)
                    finally:
                        nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await tcp.aclose()


async def _tls_handshake(tls: trio.SSLStream[GuardedStream]) -> None:
    """TLS first, on its own: trio-websocket would swallow its failure in its reader task
    and leave the upgrade waiting. A peer that closes is a lost attempt (tried again); a
    refused certificate, or a peer that does not speak TLS, is ``TLS`` at once."""
    try:
        await tls.do_handshake()
    except trio.BrokenResourceError as exc:
        cause = exc.__cause__
        if not isinstance(cause, ssl.SSLError) or isinstance(cause, ssl.SSLEOFError):
            raise Lost("the server closed the connection during the TLS handshake") from None
        reason = getattr(cause, "verify_message", None) or cause.reason or type(cause).__name__
        raise RemoteProtocolError("TLS", f"the TLS handshake failed: {reason}") from None


@contextlib.contextmanager
def _handshake_errors(upgraded: Callable[[], bool]) -> Iterator[None]:
    """What goes wrong in an upgrade, as :class:`~vrt.RemoteProtocolError`: a refusal
    (HTTP 4xx/5xx: trio-websocket's ConnectionRejected, raised from its reader task and
    unwrapped from the nursery's group) is ``HTTP_<status>``; a reply that is not HTTP, or
    not an upgrade, is ``HANDSHAKE``. The message is short: the status, and the body only
    when it is a line of plain text (a reason, never an HTML page)."""
    try:
        yield
    except ConnectionRejected as exc:  # raised before the upgrade completes, by nature
        text = f"the server refused the upgrade: HTTP {exc.status_code}"
        reason = _reason(exc.body)
        raise RemoteProtocolError(
            f"HTTP_{exc.status_code}", text + (f" ({reason})" if reason else "")
        ) from None
    except (Lost, HandshakeError, trio.Cancelled, RemoteProtocolError):
        raise
    except Exception as exc:
        if upgraded() or type(exc).__module__.split(".")[0] not in ("h11", "wsproto"):
            raise
        # h11/wsproto found the reply broken (trio-websocket lets it escape its reader)
        raise RemoteProtocolError(
            "HANDSHAKE", f"the server's reply is not a WebSocket upgrade ({type(exc).__name__})"
        ) from None


def _reason(body: bytes | None) -> str | None:
    """A refusal's body if it is a short line of printable text, else None."""
    if not body or len(body) > 80:
        return None
    text = body.decode("ascii", "replace")
    if not text.isprintable() or "<" in text:
        return None
    return text.strip() or None
