"""``vrt.asgi``: vrt/1 as an ASGI 3 application, for hypercorn's Trio worker or mounted in
Starlette or Quart-Trio.

``vrt.asgi.app(agent, **options)`` takes ``vrt.serve``'s options (:class:`AppOptions` lists them)
and runs the same protocol core: a WebSocket scope is handed to the same
:class:`~vrt._server.hub.Hub` as a connection ``vrt.serve`` accepted (its hello, its session,
resume, limits, ``authenticate``), through :class:`AsgiConnection`, which gives the ASGI
WebSocket trio-websocket's shape; an HTTP scope gets the answer of the same route table
(:func:`vrt._net.web.respond`: the browser client's files, ``/healthz``, ``/metrics``).

Sessions outlive their connections (resume), so they live in a nursery of the app's own,
open while the ASGI ``lifespan`` runs (hypercorn runs it for the app it serves) or while
:meth:`App.open_sessions` does (mounted in another framework, whose lifespan does not reach
mounted apps: Starlette's ``lifespan=vrt_app.lifespan``). A request that comes while it is
not open is refused (HTTP 503, or a WebSocket close) with one WARNING that says so.

What the ASGI server owns is not vrt's: it accepts TCP and reads the upgrade request (so
``vrt.serve``'s pending pool, ``max_pending_connections`` and ``max_pending_per_peer``, has
no counterpart here: hypercorn caps no number of connections, and closes one that has not
sent a whole request head within its ``keep_alive_timeout``, 5 s), reads whole frames
before the app sees them (hypercorn's ``websocket_max_message_size``, 16 MiB, bounds them
first; vrt's limits apply to each frame it is handed: the hello limit, then
``max_message_size``), and keeps the socket: a connection stuck behind unread frames gets
its session closed (``overflow``) as with ``vrt.serve``, but its socket is the server's to
time out (hypercorn shields its sends).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any, Unpack

import trio
from trio_websocket import CloseReason, ConnectionClosed

from vrt._engine.agent import Agent
from vrt._net.options import Options, with_options
from vrt._net.proxied import forwarded_client
from vrt._net.upgrade import HELLO_LIMIT, HandshakeRequest, Refused, decide
from vrt._net.web import Response, respond
from vrt._server.hub import Hub
from vrt._server.option_types import AppOptions
from vrt._server.options import APP, app_options
from vrt._server.peers import peer_of

__all__ = ["App", "AppOptions", "AsgiConnection", "app"]

log = logging.getLogger("vrt.server")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

NOT_STARTED = (
    "vrt.asgi: a request came while the app's sessions are not open, refused (503): serve "
    "the app with an ASGI server that runs its lifespan (hypercorn does), or, mounted in "
    "another app, open them there: Starlette(lifespan=vrt_app.lifespan), or in Quart-Trio "
    "'async with vrt_app.open_sessions(): yield' in a while_serving function"
)


def app(agent: Agent, *, store: None = None, **options: Unpack[AppOptions]) -> App:
    """An ASGI 3 application serving ``agent`` over vrt/1: the same sessions, limits,
    ``authenticate`` hook and resume as :func:`vrt.serve`, whose options it takes with the
    same meaning and the same checks (ValueError for a bad value): :class:`AppOptions`.

    ``handshake_timeout`` runs from the moment the ASGI server hands the upgrade to the app
    (``authenticate`` and the hello within it); ``max_sessions_per_peer`` counts by principal,
    else by the client's address as the ASGI server reports it (behind a proxy, the proxy's),
    or, when that is a proxy named in ``trusted_proxies``, by the client its
    ``X-Forwarded-For`` names.

    Not taken (TypeError, as for any unknown option): ``host``, ``port`` and ``sockets``
    (the ASGI server listens), ``max_pending_connections`` and ``max_pending_per_peer`` (it
    accepts TCP and reads the upgrade), ``ssl_context`` (it serves TLS), ``relay_host``,
    ``node``, ``cluster_secret`` and ``drain_timeout``. ``store`` (sessions across
    processes: relays, handover, drain) is ``vrt.serve``'s only: any value but None is a
    ValueError.
    """
    if store is not None:
        raise ValueError(
            "vrt.asgi.app takes no store: serving across processes (relayed resumes, "
            "handover, drain) needs vrt.serve's own listeners (vrt serve --store)"
        )
    return App(agent, app_options(options))


# inspect.signature() and help() show every option, as if each were spelled out.
app.__signature__ = with_options(app, APP)  # type: ignore[attr-defined]


class App:
    """The ASGI application :func:`app` returns: call it with a scope, ``receive`` and
    ``send`` (ASGI 3). WebSocket scopes are vrt/1 sessions; HTTP scopes the browser client's
    files, ``/healthz`` and (with ``metrics``) ``/metrics``, 404 elsewhere; ``lifespan``
    opens and closes its sessions (:meth:`open_sessions`)."""

    def __init__(self, agent: Agent, options: Options) -> None:
        self.agent = agent
        self.options = options
        self._hub: Hub | None = None
        self._warned = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "websocket":
            await self._websocket(scope, receive, send)
        elif kind == "http":
            await self._http(scope, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    @contextlib.asynccontextmanager
    async def open_sessions(self) -> AsyncIterator[None]:
        """Host this app's sessions for the block: requests are served while it runs.

        The ASGI ``lifespan`` of a server that serves the app itself does this; mounted in
        another framework, use :meth:`lifespan` (Starlette) or this in its own startup
        (Quart-Trio: ``async with vrt_app.open_sessions(): yield`` in a ``while_serving``
        function). When the block ends, or is cancelled, every session still open is sent
        ``closed`` with reason ``shutdown``, as ``vrt.serve``'s are when it is cancelled.
        RuntimeError if they are open already.
        """
        if self._hub is not None:
            raise RuntimeError("the app's sessions are open already")
        async with trio.open_nursery() as nursery:
            self._hub = Hub(self.agent, self.options, nursery)
            try:
                yield
            finally:
                self._hub = None
                nursery.cancel_scope.cancel()

    def lifespan(self, app: object) -> contextlib.AbstractAsyncContextManager[None]:
        """Starlette's ``lifespan=`` (it passes its app, unused here): the sessions are
        open while the enclosing app runs. See :meth:`open_sessions`."""
        return self.open_sessions()

    # -- lifespan ---------------------------------------------------------------------------------

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        message = await receive()
        if message["type"] != "lifespan.startup":
            return
        if self._hub is not None:  # one app served twice, or mounted and served
            await send({"type": "lifespan.startup.failed", "message": "already open"})
            return
        async with self.open_sessions():
            await send({"type": "lifespan.startup.complete"})
            while message["type"] != "lifespan.shutdown":
                message = await receive()
        await send({"type": "lifespan.shutdown.complete"})

    def _not_started(self) -> None:
        if not self._warned:
            self._warned = True
            log.warning(NOT_STARTED)
        else:
            log.debug("refused a request: the app's sessions are not open")

    # -- HTTP -------------------------------------------------------------------------------------

    async def _http(self, scope: Scope, send: Send) -> None:
        if self._hub is None:
            self._not_started()
            response = _plain(503, b"not started\n")
        else:
            headers = {key.lower(): value for key, value in scope.get("headers", ())}
            response = respond(
                scope.get("method", "GET").encode("latin-1"),
                _route_path(scope),
                headers,
                demo=self.options.web_demo,
                draining=self._hub.draining,
                metrics=self.options.metrics,
            )
        await send(
            {
                "type": "http.response.start",
                "status": response.status,
                "headers": list(response.headers),
            }
        )
        await send({"type": "http.response.body", "body": response.body})

    # -- WebSocket --------------------------------------------------------------------------------

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = trio.current_time()
        if (await receive())["type"] != "websocket.connect":
            return
        hub = self._hub
        if hub is None:
            self._not_started()
            await _refuse(scope, send, _plain(503, b"not started\n"))
            return
        options = self.options
        deadline = start + options.handshake_timeout
        peer, remote = _client(scope)
        handshake = HandshakeRequest(path=_target(scope), headers=_headers(scope), remote=remote)
        host = forwarded_client(peer, handshake.headers, options.proxies)
        verdict = None
        with trio.move_on_at(deadline):
            verdict = await decide(options, handshake, draining=hub.draining)
        if verdict is None:  # authenticate outlasted the handshake timeout
            log.debug("%s: no upgrade within the timeout", remote)
            await send({"type": "websocket.close", "code": 1008})
            return
        if isinstance(verdict, Refused):
            await _refuse(scope, send, _plain(verdict.status, verdict.body))
            return
        await send({"type": "websocket.accept"})
        log.info("connection from %s", remote if host == peer else f"{host} (through {remote})")
        ws = AsgiConnection(receive, send, min(HELLO_LIMIT, options.max_message_size))
        try:
            await hub.serve_connection(
                ws,
                verdict.principal,
                peer=peer_of(verdict.principal, host),
                deadline=deadline,
                request=handshake,
            )
        finally:
            with trio.move_on_after(1.0) as scope_:
                scope_.shield = True
                await ws.aclose()  # (once: a no-op if the session's writer closed it)


class AsgiConnection:
    """An ASGI WebSocket (after ``websocket.accept``) with trio-websocket's shape, which
    the hub serves as it does a trio-websocket connection: ``get_message``,
    ``send_message``, ``aclose(code=)``, ConnectionClosed once it is over.

    Frames over ``_max_message_size`` (in characters, as trio-websocket counts them) close
    the connection with 1009 and trio-websocket's reason; the hub raises the limit once the
    hello is accepted (:func:`vrt._net.upgrade.open_to_messages`).
    """

    __slots__ = ("_close_sent", "_closed", "_max_message_size", "_receive", "_send")

    def __init__(self, receive: Receive, send: Send, max_message_size: int) -> None:
        self._receive = receive
        self._send = send
        self._max_message_size = max_message_size
        self._closed: CloseReason | None = None
        """Why it is over, once the peer left (or a send found it gone)."""
        self._close_sent = False

    @property
    def closed(self) -> CloseReason | None:
        """Why the connection is over (None while it is not), as trio-websocket says."""
        return self._closed

    async def get_message(self) -> str | bytes:
        """The next frame; ConnectionClosed once the peer is gone (or a frame too large
        closed the connection)."""
        if self._closed is not None:
            raise ConnectionClosed(self._closed)
        while True:
            message = await self._receive()
            kind = message["type"]
            if kind == "websocket.receive":
                text = message.get("text")
                data: str | bytes = text if text is not None else (message.get("bytes") or b"")
                if len(data) > self._max_message_size:
                    reason = f"Exceeded maximum message size: {self._max_message_size} bytes"
                    await self.aclose(1009, reason)
                    self._closed = CloseReason(1009, reason)
                    raise ConnectionClosed(self._closed)
                return data
            if kind == "websocket.disconnect":
                self._closed = CloseReason(message.get("code", 1005), message.get("reason"))
                raise ConnectionClosed(self._closed)

    async def send_message(self, message: str | bytes) -> None:
        """Send one frame; ConnectionClosed if the connection is over or closing."""
        if self._closed is not None or self._close_sent:
            raise ConnectionClosed(self._closed or CloseReason(1000, None))
        key = "text" if isinstance(message, str) else "bytes"
        try:
            await self._send({"type": "websocket.send", key: message})
        except Exception as exc:
            self._gone(exc)
            raise ConnectionClosed(self._closed) from None

    async def aclose(self, code: int = 1000, reason: str | None = None) -> None:
        """Close the connection with ``code`` (once; nothing if the peer is gone)."""
        if self._close_sent or self._closed is not None:
            return
        self._close_sent = True
        message: Message = {"type": "websocket.close", "code": code}
        if reason:
            message["reason"] = reason
        try:
            await self._send(message)
        except Exception as exc:
            self._gone(exc)

    def _gone(self, exc: Exception) -> None:
        """A send failed: the connection is over for us, whatever the server raised. ASGI
        says an OSError; hypercorn (0.18) can also let trio's BusyResourceError out, when
        the peer's close and a send of ours meet on the socket. The peer's timing, so a
        DEBUG line, never an ERROR."""
        log.debug("the ASGI server could not send: %r", exc)
        if self._closed is None:
            self._closed = CloseReason(1006, None)


def _plain(status: int, body: bytes) -> Response:
    return Response(
        status=status,
        headers=(
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"x-content-type-options", b"nosniff"),
        ),
        body=body,
    )


async def _refuse(scope: Scope, send: Send, response: Response) -> None:
    """Turn the upgrade down with ``response`` (ASGI's ``websocket.http.response``
    extension, which hypercorn offers), or by closing it (the server answers 403)."""
    if "websocket.http.response" in (scope.get("extensions") or {}):
        await send(
            {
                "type": "websocket.http.response.start",
                "status": response.status,
                "headers": list(response.headers),
            }
        )
        await send({"type": "websocket.http.response.body", "body": response.body})
    else:
        await send({"type": "websocket.close", "code": 1008})


def _route_path(scope: Scope) -> str:
    """The path below where the app is mounted (``root_path``), as Starlette routes it:
    servers and frameworks that keep ``root_path`` in ``path`` and those that do not."""
    path: str = scope.get("path", "/")
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("", "/"):
        return path[len(root) :] or "/"
    return path


def _target(scope: Scope) -> str:
    """The requested resource as ``vrt.serve`` sees it: the whole path (``root_path``
    included) and the query string."""
    path: str = scope.get("path", "/")
    root: str = scope.get("root_path", "")
    if root and not path.startswith(root):
        path = root + path
    query: bytes = scope.get("query_string", b"")
    return f"{path}?{query.decode('latin-1')}" if query else path


def _headers(scope: Scope) -> tuple[tuple[str, str], ...]:
    return tuple(
        (key.decode("latin-1").lower(), value.decode("latin-1"))
        for key, value in scope.get("headers", ())
    )


def _client(scope: Scope) -> tuple[str, str]:
    """The peer's address, and ``host:port`` (what ``HandshakeRequest.remote`` holds)."""
    client = scope.get("client")
    if not client:
        return "unknown", "unknown"
    host, port = client[0], client[1]
    return str(host), f"{host}:{port}"
