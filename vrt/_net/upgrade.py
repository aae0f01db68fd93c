"""The HTTP side of a connection: the WebSocket upgrade and the checks it passes.

A connection's upgrade request is read by trio-websocket (its reader task runs in the
connection's nursery); the origin check and ``authenticate`` decide, and a refusal is an
HTTP status. The caller bounds it all with the handshake deadline.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import attrs
import trio
from trio_websocket import (
    ConnectionClosed,
    WebSocketConnection,
    WebSocketRequest,
    wrap_server_stream,
)

from vrt._engine import telemetry
from vrt._net.accept import GuardedStream
from vrt._net.options import Options
from vrt._net.web import front

log = logging.getLogger("vrt.server")

RELAY_HEADER = "x-vrt-relay"
"""The header a node adds to a resume it relays to the node running the session (the
relaying node's name): :mod:`vrt._cluster.relay`."""
HELLO_LIMIT = 64 * 1024
"""The largest frame a connection may send before its ``hello`` is accepted (a hello with a
hundred small app tools fits): a connection still in its handshake holds at most this much."""


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


class Front(Protocol):
    """What the HTTP front asks of its server: whether it is draining (``handover-v1``),
    and whether its store is out of reach (``GET /healthz``)."""

    draining: bool

    @property
    def store_unreachable(self) -> bool: ...


async def upgrade(
    nursery: trio.Nursery, stream: GuardedStream, options: Options, server: Front | None = None
) -> tuple[WebSocketConnection, Any, HandshakeRequest] | None:
    """Read and check the upgrade request on ``stream``; the connection, the principal and
    the request once it is accepted, None once it is refused (an HTTP status was sent) or
    the peer left.

    trio-websocket's reader runs in ``nursery`` for the connection's whole life. A plain
    HTTP request is answered by the front first (the browser client's files, ``/healthz``,
    or 404): None then too. While ``server`` drains, an upgrade that is not a relay from
    another node is refused with 503 (the client tries again, and the load balancer,
    whose health check now fails, sends it elsewhere).
    """
    draining = server is not None and server.draining
    try:
        unreachable = server is not None and server.store_unreachable
        if await front(
            stream,
            demo=options.web_demo,
            draining=draining,
            store_unreachable=unreachable,
            metrics=options.metrics,
        ):
            return None
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return None
    limit = min(HELLO_LIMIT, options.max_message_size)
    request = await wrap_server_stream(nursery, stream, max_message_size=limit)
    admitted, principal, handshake = await check_upgrade(options, request, draining=draining)
    if not admitted:
        return None
    try:
        ws = await request.accept()
    except ConnectionClosed:
        return None
    return ws, principal, handshake


def open_to_messages(ws: Any, max_message_size: int) -> None:
    """The hello was accepted: frames up to ``max_message_size`` may come now.

    A connection that bounds its frames keeps its limit in ``_max_message_size``, read for
    every frame: trio-websocket's, which takes it once, when the connection is made
    (tests/test_hostile.py checks that both limits hold), and ``vrt.asgi``'s. One without
    (the memory pair of :mod:`vrt.testing`) is left as it is.
    """
    if hasattr(ws, "_max_message_size"):
        ws._max_message_size = max_message_size


@attrs.frozen(kw_only=True)
class Admitted:
    """An upgrade :func:`decide` let through, with what ``authenticate`` returned."""

    principal: Any = None


@attrs.frozen(kw_only=True)
class Refused:
    """An upgrade :func:`decide` turned down: the HTTP status and body to answer with."""

    status: int
    body: bytes


async def decide(
    options: Options, handshake: HandshakeRequest, *, draining: bool = False
) -> Admitted | Refused:
    """Whether the upgrade ``handshake`` may go on (draining, origin, ``authenticate``):
    the one decision of ``vrt.serve``'s upgrade and ``vrt.asgi``'s, which only answer it.

    A refusal is logged at INFO; an ``authenticate`` that raises anything but
    :class:`Refuse` is a bug of the hook, logged with its traceback and answered 500 (the
    peer learns nothing more)."""
    try:
        if draining and handshake.header(RELAY_HEADER) is None:
            raise Refuse(503, "draining")
        origin = handshake.header("origin")
        if options.allowed_origins is not None and origin is not None:
            if origin not in options.allowed_origins:
                raise Refuse(403, "origin not allowed")
        principal = None
        if options.authenticate is not None:
            principal = await options.authenticate(handshake)
            if principal is None:
                raise Refuse(401, "unauthorized")
    except Refuse as refusal:
        log.info("refused %s: %s", handshake.remote, refusal)
        telemetry.refused("upgrade")
        return Refused(status=refusal.status, body=refusal.reason.encode("utf-8", "replace"))
    except Exception:  # the hook's bug: refuse, never crash the server
        log.exception("authenticate failed for %s", handshake.remote)
        telemetry.refused("upgrade")
        return Refused(status=500, body=b"internal server error")
    return Admitted(principal=principal)


async def check_upgrade(
    options: Options, request: WebSocketRequest, *, draining: bool = False
) -> tuple[bool, Any, HandshakeRequest]:
    """Check trio-websocket's upgrade request (:func:`decide`): ``(True, principal,
    request)``, or ``(False, None, request)`` once it is refused with an HTTP status."""
    headers = tuple(
        (key.decode("latin-1").lower(), value.decode("latin-1")) for key, value in request.headers
    )
    remote = request.remote
    handshake = HandshakeRequest(
        path=request.path,
        headers=headers,
        remote=str(remote) if isinstance(remote, str) else f"{remote.address}:{remote.port}",
    )
    verdict = await decide(options, handshake, draining=draining)
    if isinstance(verdict, Refused):
        with contextlib.suppress(ConnectionClosed, trio.BrokenResourceError):
            await request.reject(verdict.status, body=verdict.body)
        return False, None, handshake
    return True, verdict.principal, handshake
