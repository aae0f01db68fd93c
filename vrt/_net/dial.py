"""``vrt.connect``: open the client's WebSocket connections to a URL and run a client on them.

Every connection, the first and each resume's, is opened here (TCP, TLS for ``wss://``,
the HTTP upgrade); :mod:`vrt._net.client` pumps the protocol on them.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import trio
from trio_websocket import ConnectionRejected, WebSocketConnection, wrap_client_stream

from vrt._engine.groups import single_unwrapped
from vrt._engine.tools import AppTool
from vrt._errors import RemoteProtocolError
from vrt._net import client as _client
from vrt._net.client import RESUME_TIMEOUT, Client, open_client
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
) -> AsyncIterator[Client]:
    """Connect to a vrt/1 server and open a session, hosting the app ``tools``.

    Raises :class:`~vrt.RemoteProtocolError` if the server refuses the hello (e.g. an app
    tool named like a server tool: ``TOOL_CONFLICT``) or the upgrade (``HTTP_401``, ...:
    ``authenticate`` or the origin check). ``headers`` go with every upgrade request (for
    instance ``[("authorization", "Bearer ...")]``).

    A lost connection is resumed (``resume=True``): the client reconnects with backoff
    while the app sees :class:`~vrt.Reconnecting`, then :class:`~vrt.Resumed` and the
    events it missed, in order; a running app tool goes on and its result goes through
    after the resume. If the server refuses the resume, :class:`~vrt.Closed` with reason
    ``expired``; if no connection resumes it within ``resume_timeout`` seconds, ``lost``.

    Leaving the block ends the session for good (``close``, then waits up to 5 s for
    ``closed``; while reconnecting it does not wait); cancelling it closes the connection
    at once. ``capabilities`` is what this client supports (pass ``()`` to act as a client
    without ``tool-stream-v1``: then only ``ToolPreview`` events arrive).
    """
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ValueError(f"not a ws:// or wss:// URL: {url!r}")
    secure = parts.scheme == "wss"
    host = parts.hostname
    port = parts.port or (443 if secure else 80)
    resource = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    extra = [(key.encode("latin-1"), value.encode("latin-1")) for key, value in headers]

    @asynccontextmanager
    async def open_ws() -> AsyncIterator[WebSocketConnection]:
        # We open (and always close) the TCP stream ourselves: trio-websocket's client
        # leaves it open when the server ends the connection first.
        stream: trio.SocketStream | trio.SSLStream[trio.SocketStream]
        if secure:
            stream = await trio.open_ssl_over_tcp_stream(
                host, port, ssl_context=ssl.create_default_context()
            )
        else:
            stream = await trio.open_tcp_stream(host, port)
        try:
            with _rejection_as_error(), single_unwrapped():
                async with trio.open_nursery() as nursery:
                    ws = await wrap_client_stream(
                        nursery,
                        stream,
                        host,
                        resource,
                        extra_headers=extra,
                        max_message_size=4 * max_message_size,
                    )
                    try:
                        yield ws
                    finally:
                        if ws.closed is None:  # a lost one needs no close handshake
                            with trio.move_on_after(_client.CLOSE_TIMEOUT) as scope:
                                scope.shield = True
                                await ws.aclose()
                        nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()

    with single_unwrapped():
        async with (
            open_ws() as ws,
            open_client(
                ws,
                tools,
                capabilities=capabilities,
                reconnect=open_ws if resume else None,
                resume_timeout=resume_timeout,
            ) as client,
        ):
            yield client


@contextlib.contextmanager
def _rejection_as_error() -> Iterator[None]:
    """A refused upgrade (HTTP 4xx/5xx: trio-websocket's ConnectionRejected, raised from its
    reader task, unwrapped from the nursery's group) as RemoteProtocolError
    ``HTTP_<status>``."""
    try:
        yield
    except ConnectionRejected as exc:
        body = (exc.body or b"").decode("utf-8", "replace")[:200]
        raise RemoteProtocolError(
            f"HTTP_{exc.status_code}",
            f"the server refused the connection: HTTP {exc.status_code}"
            + (f" {body}" if body else ""),
        ) from None
