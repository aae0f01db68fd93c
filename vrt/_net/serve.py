"""``vrt.serve``: the vrt/1 WebSocket server.

:func:`serve` listens and checks each upgrade request (origin, ``authenticate``); the
:class:`~vrt._net.hub.Hub` takes the accepted connections, opens or resumes their sessions,
and hosts one :class:`~vrt._net.actor.SessionActor` per session. A bad peer gets ``error``
frames, or is dropped; the server itself never goes down for it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any, NoReturn

import attrs
import trio
from trio_websocket import ConnectionClosed, WebSocketRequest, WebSocketServer

from vrt._engine.agent import Agent
from vrt._net.hub import Hub
from vrt._net.options import (
    HANDSHAKE_TIMEOUT,
    MAX_MESSAGES_PER_SECOND,
    MAX_OPEN_CALLS,
    MAX_QUEUED_APP_CALLS,
    MAX_SESSIONS,
    RESUME_WINDOW,
    Options,
    non_negative,
    positive,
)
from vrt._wire import messages as m
from vrt._wire.endpoint import REPLAY_LIMIT
from vrt._wire.server import MAX_MESSAGE_SIZE

log = logging.getLogger("vrt.server")


@attrs.frozen(kw_only=True)
class Server:
    """A running server, as ``nursery.start(vrt.serve, ...)`` returns it."""

    host: str
    port: int
    """The real port (when 0 was asked for, the one the OS chose)."""

    @property
    def url(self) -> str:
        """``ws://host:port/``, what ``vrt.connect`` takes."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"ws://{host}:{self.port}/"


@attrs.frozen(kw_only=True)
class HandshakeRequest:
    """What ``authenticate`` sees of a WebSocket upgrade request."""

    path: str
    """The requested resource, with its query string (``/agent?room=7``)."""
    headers: tuple[tuple[str, str], ...]
    """Every header as ``(name, value)``, names lower-case, in the order sent."""
    remote: str
    """The peer's address as ``host:port`` (behind a proxy: the proxy's)."""

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or None."""
        name = name.lower()
        return next((value for key, value in self.headers if key == name), None)


class Refuse(Exception):
    """Raise from ``authenticate`` to refuse the WebSocket upgrade with an HTTP ``status``."""

    def __init__(self, status: int = 403, reason: str = "forbidden") -> None:
        if not 400 <= status <= 599:
            raise ValueError(f"status must be an HTTP 4xx or 5xx code, not {status}")
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason


Authenticate = Callable[[HandshakeRequest], Awaitable[Any]]


async def serve(
    agent: Agent,
    host: str = "127.0.0.1",
    port: int = 8765,
    *,
    capabilities: Collection[str] = m.CAPABILITIES,
    max_message_size: int = MAX_MESSAGE_SIZE,
    resume_window: float = RESUME_WINDOW,
    max_sessions: int = MAX_SESSIONS,
    max_open_calls: int = MAX_OPEN_CALLS,
    max_queued_app_calls: int = MAX_QUEUED_APP_CALLS,
    max_messages_per_second: float = MAX_MESSAGES_PER_SECOND,
    replay_limit: int = REPLAY_LIMIT,
    handshake_timeout: float = HANDSHAKE_TIMEOUT,
    authenticate: Authenticate | None = None,
    allowed_origins: Collection[str] | None = None,
    task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Serve ``agent`` over vrt/1 WebSockets until cancelled.

    Use ``server = await nursery.start(vrt.serve, agent, host, 0)`` to learn the real
    port. ``capabilities`` is what this server supports (pass ``()`` to act as a server
    without ``tool-stream-v1``). On cancellation every open session is sent ``closed``
    with reason ``shutdown`` and its connection closed.

    Safety (each has a default; see the README's "Running the server safely"):

    - ``resume_window`` (30 s): how long a session whose connection dropped is kept for
      the client to resume; turns and server tools go on meanwhile. Then it closes
      (``expired``). 0 ends a session with its connection.
    - ``max_sessions`` (1,000): live sessions, detached ones included; a new session over
      it is refused (``error`` ``RATE_LIMITED``, ``closed`` ``rejected``).
    - ``max_open_calls`` (64): calls of one turn without a result; a call over it fails at
      once (FAILED) and the model gets that result.
    - ``max_queued_app_calls`` (32): app calls waiting for the app; one over it FAILED.
    - ``max_messages_per_second`` (100, a one-second burst): inbound frames per
      connection; frames over it are read more slowly (never dropped) and the client
      gets ``error`` ``RATE_LIMITED`` once; after :data:`RATE_CLOSE_AFTER` seconds of
      that, the session is closed (``server``).
    - ``replay_limit`` (10,000 messages): the replay buffer; the model is held while the
      client is 40 % of it behind, and a client that stops reading for 30 s is closed
      (``overflow``).
    - ``handshake_timeout`` (10 s): a peer that has not sent a valid ``hello`` by then is
      disconnected.
    - ``max_message_size`` (1 MiB): a text frame over it is answered ``TOO_LARGE`` and the
      session goes on; one over four times that is refused by the WebSocket layer (close
      code 1009).
    - ``authenticate``: ``async (vrt.HandshakeRequest) -> principal``, run before the
      upgrade; raise :class:`vrt.Refuse` (or return None: 401) to refuse the upgrade with
      an HTTP status. The principal reaches server tools as ``ctx.principal``, and a resume
      must come with the same principal.
    - ``allowed_origins``: if given, an upgrade whose ``Origin`` header is present and not
      in it is refused (403): browsers send it, so a page elsewhere cannot use a user's
      cookies to open a session. Requests without ``Origin`` (not a browser) pass.
    """
    options = Options(
        capabilities=tuple(capabilities),
        max_message_size=max_message_size,
        resume_window=non_negative("resume_window", resume_window),
        max_sessions=positive("max_sessions", max_sessions),
        max_open_calls=positive("max_open_calls", max_open_calls),
        max_queued_app_calls=positive("max_queued_app_calls", max_queued_app_calls),
        max_messages_per_second=positive("max_messages_per_second", max_messages_per_second),
        replay_limit=positive("replay_limit", replay_limit),
        handshake_timeout=positive("handshake_timeout", handshake_timeout),
        authenticate=authenticate,
        allowed_origins=None if allowed_origins is None else frozenset(allowed_origins),
    )
    # Our own listeners, closed on the way out: trio-websocket leaves them to the GC.
    listeners = await trio.open_tcp_listeners(port, host=host)
    try:
        async with trio.open_nursery() as nursery:
            hub = Hub(agent, options, nursery)
            ws_server = WebSocketServer(
                functools.partial(_handle, hub),
                listeners,
                handler_nursery=nursery,
                max_message_size=4 * max_message_size,
            )
            await nursery.start(ws_server.run)
            task_status.started(Server(host=host, port=ws_server.port))
            await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            for listener in listeners:
                await listener.aclose()
    raise AssertionError("unreachable")  # pragma: no cover


async def _handle(hub: Hub, request: WebSocketRequest) -> None:
    admitted, principal = await _check_upgrade(hub.options, request)
    if not admitted:
        return
    try:
        ws = await request.accept()
    except ConnectionClosed:
        return
    await hub.serve_connection(ws, principal)


async def _check_upgrade(options: Options, request: WebSocketRequest) -> tuple[bool, Any]:
    """Check the upgrade request (origin, ``authenticate``): ``(True, principal)``, or
    ``(False, None)`` once it is refused with an HTTP status."""
    headers = tuple(
        (key.decode("latin-1").lower(), value.decode("latin-1")) for key, value in request.headers
    )
    remote = request.remote
    handshake = HandshakeRequest(
        path=request.path,
        headers=headers,
        remote=str(remote) if isinstance(remote, str) else f"{remote.address}:{remote.port}",
    )
    try:
        origin = handshake.header("origin")
        if options.allowed_origins is not None and origin is not None:
            if origin not in options.allowed_origins:
                raise Refuse(403, "origin not allowed")
        principal = None
        if options.authenticate is not None:
            with trio.fail_after(options.handshake_timeout):
                principal = await options.authenticate(handshake)
            if principal is None:
                raise Refuse(401, "unauthorized")
    except Refuse as refusal:
        log.info("refused %s: %s", handshake.remote, refusal)
        with contextlib.suppress(ConnectionClosed, trio.BrokenResourceError):
            await request.reject(refusal.status, body=refusal.reason.encode())
        return False, None
    except Exception:  # the hook's bug, or its timeout: refuse, never crash the server
        log.exception("authenticate failed for %s", handshake.remote)
        with contextlib.suppress(ConnectionClosed, trio.BrokenResourceError):
            await request.reject(500, body=b"internal server error")
        return False, None
    return True, principal
