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
"""The header a node adds to a resume it relays to the node running the session: its
proof that it is a node (:mod:`vrt._cluster.trust`), without which it means nothing."""
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
    """The peer's address as ``host:port``: behind a proxy the proxy's, unless it is a
    trusted proxy (``trusted_proxies``) that sent a PROXY protocol header: the client's
    it names. (``X-Forwarded-For`` is among :attr:`headers`.)"""

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
    """What the upgrade asks of its server: whether it is draining (``handover-v1``),
    whether its store is out of reach (``GET /healthz``), and what a relayed upgrade's
    proof proves (None: nothing, the header means nothing)."""

    draining: bool

    @property
    def store_unreachable(self) -> bool: ...

    def relay_of(self, handshake: HandshakeRequest) -> object | None: ...


@attrs.frozen(kw_only=True)
class Upgraded:
    """A connection past its upgrade: what :func:`upgrade` returns."""

    ws: WebSocketConnection
    principal: Any
    request: HandshakeRequest
    relay: Any = None
    """What the server's ``relay_of`` said the upgrade proves (None: a plain client's)."""


async def upgrade(
    nursery: trio.Nursery,
    stream: GuardedStream,
    options: Options,
    server: Front | None = None,
    *,
    relay_only: bool = False,
) -> Upgraded | None:
    """Read and check the upgrade request on ``stream``: the connection once it is
    accepted, None once it is refused (an HTTP status was sent) or the peer left.

    trio-websocket's reader runs in ``nursery`` for the connection's whole life. A plain
    HTTP request is answered by the front first (the browser client's files, ``/healthz``,
    or 404): None then too. While ``server`` drains, an upgrade that is not a relay from
    another node (with its proof) is refused with 503 (the client tries again, and the
    load balancer, whose health check now fails, sends it elsewhere). ``relay_only`` (the
    port other nodes relay to): nothing but relays, with their proof; anything else is
    refused (403, or for a plain HTTP request whatever trio-websocket answers).
    """
    draining = server is not None and server.draining
    if not relay_only:
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
    handshake = handshake_of(request)
    relay = server.relay_of(handshake) if server is not None else None
    verdict = await decide(
        options, handshake, draining=draining, relayed=relay is not None, relay_only=relay_only
    )
    if isinstance(verdict, Refused):
        with contextlib.suppress(ConnectionClosed, trio.BrokenResourceError):
            await request.reject(verdict.status, body=verdict.body)
        return None
    try:
        ws = await request.accept()
    except ConnectionClosed:
        return None
    return Upgraded(ws=ws, principal=verdict.principal, request=handshake, relay=relay)


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
    options: Options,
    handshake: HandshakeRequest,
    *,
    draining: bool = False,
    relayed: bool = False,
    relay_only: bool = False,
) -> Admitted | Refused:
    """Whether the upgrade ``handshake`` may go on (draining, origin, ``authenticate``):
    the one decision of ``vrt.serve``'s upgrade and ``vrt.asgi``'s, which only answer it.
    ``relayed``: another node relays it, and proved it is a node (a draining server takes
    it); ``relay_only``: the port of relays, which takes nothing else (403).

    A refusal is logged at INFO; an ``authenticate`` that raises anything but
    :class:`Refuse` is a bug of the hook, logged with its traceback and answered 500 (the
    peer learns nothing more)."""
    try:
        if relay_only and not relayed:
            raise Refuse(403, "not a relay")
        if draining and not relayed:
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


def handshake_of(request: WebSocketRequest) -> HandshakeRequest:
    """What ``authenticate`` sees of trio-websocket's upgrade request."""
    headers = tuple(
        (key.decode("latin-1").lower(), value.decode("latin-1")) for key, value in request.headers
    )
    remote = request.remote
    return HandshakeRequest(
        path=request.path,
        headers=headers,
        remote=str(remote) if isinstance(remote, str) else f"{remote.address}:{remote.port}",
    )
