"""``vrt.serve``: the vrt/1 WebSocket server.

:func:`serve` listens and accepts (:mod:`vrt._net.accept`); the :class:`~vrt._server.hub.Hub`
takes each connection through its upgrade (:mod:`vrt._net.upgrade`) and ``hello``, opens or
resumes its session, and hosts one :class:`~vrt._server.actor.SessionActor` per session. A bad
peer gets ``error`` frames, or is dropped; the server itself never goes down for it.
"""

from __future__ import annotations

import functools
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Unpack

import attrs
import trio

from vrt._cluster.node import Node, default_name
from vrt._cluster.redis import RedisStore
from vrt._cluster.store import open_store
from vrt._cluster.trust import Endpoint, Trust
from vrt._engine.agent import Agent
from vrt._net.accept import Accepting, Pending, accept_loop
from vrt._net.options import Options, with_options
from vrt._net.tls import certificate_pin
from vrt._net.upgrade import HandshakeRequest, Refuse
from vrt._server.hub import Hub
from vrt._server.option_types import ServerOptions
from vrt._server.options import SERVE, serve_options

__all__ = ["HandshakeRequest", "Refuse", "Server", "serve"]

log = logging.getLogger("vrt.server")


@attrs.frozen(kw_only=True)
class Server:
    """A running server, as ``nursery.start(vrt.serve, ...)`` returns it."""

    host: str
    port: int
    """The real port (when 0 was asked for, the one the OS chose)."""
    node: str | None = None
    """This process's name among the nodes sharing its store (None without a store)."""
    tls: bool = False
    """Whether it serves TLS (``ssl_context``): ``wss://`` and ``https://``."""
    _drain: trio.Event | None = attrs.field(default=None, eq=False, repr=False, alias="drain")

    @property
    def url(self) -> str:
        """``ws://host:port/`` (``wss://`` with TLS), what ``vrt.connect`` takes."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'wss' if self.tls else 'ws'}://{host}:{self.port}/"

    def drain(self) -> None:
        """Start draining (what SIGTERM does to ``vrt serve``): ``/healthz`` says 503 at
        once, new sessions are refused (503), every session is handed over to another
        node at its next turn boundary (a turn still open after ``drain_timeout`` is
        interrupted first), then :func:`serve` returns. Sync, idempotent. Only with a
        store: ValueError without one (a session has nowhere to go)."""
        if self._drain is None:
            raise ValueError(
                "a server without a store cannot drain: its sessions have nowhere to go"
            )
        self._drain.set()


async def serve(
    agent: Agent,
    host: str = "127.0.0.1",
    port: int = 8765,
    *,
    task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED,
    **options: Unpack[ServerOptions],
) -> None:
    """Serve ``agent`` over vrt/1 WebSockets until cancelled (or drained).

    Use ``server = await nursery.start(vrt.serve, agent, host, 0)`` to learn the real
    port. Plain HTTP on the same port gets the browser client (``GET /vrt.js``, the
    modules it imports, ``/vrt.d.ts``). On cancellation every open session is sent ``closed``
    with reason ``shutdown`` and its connection closed. Raises OSError at once if it cannot
    listen (a busy port, an unknown host), ValueError for a bad option, TypeError for an
    unknown one.

    ``options``: the keywords of :class:`vrt.ServerOptions`, each optional, which documents
    each with its default and its ``vrt serve`` flag: safety limits (every one has a
    default; see "Serve safely" in the documentation), ``authenticate`` and
    ``allowed_origins``, TLS (``ssl_context``), traces and ``GET /metrics``, and serving in
    production with a ``store`` (``handover-v1``, docs/deploy.md).
    """
    common, serving = serve_options(options)
    ssl_context = serving.ssl_context
    store = serving.store
    the_store = open_store(store) if isinstance(store, str) else store
    listeners: list[trio.SocketListener] = []
    relays: list[trio.SocketListener] = []
    try:
        node_ = None
        if the_store is not None:
            # The store first: a server that cannot save fails before it listens.
            if isinstance(the_store, RedisStore):
                await the_store.connect()
            bound_host = serving.relay_host or _reachable(host)
            relays = await trio.open_tcp_listeners(0, host=bound_host)
            trust = Trust(serving.cluster_secret)
            node_ = Node(
                the_store,
                serving.node or default_name(),
                resume_window=common.resume_window,
                trust=trust,
            )
            # The lease says where other nodes relay to, the key they prove it with, and
            # (with TLS) the certificate they must find there.
            node_.address = Endpoint(
                host=bound_host,
                port=relays[0].socket.getsockname()[1],
                key=trust.published,
                pin=certificate_pin(ssl_context) if ssl_context is not None else None,
            ).encode()
        if serving.sockets is not None:
            listeners = [
                trio.SocketListener(trio.socket.from_stdlib_socket(sock))
                for sock in serving.sockets
            ]
        else:
            listeners = await trio.open_tcp_listeners(port, host=host)
        async with trio.open_nursery() as nursery:
            accepting = Accepting(
                common.max_pending_connections,
                common.max_pending_per_peer,
                trusted=common.proxies,
            )
            hub = Hub(agent, common, nursery, accepting, node_)
            drain = None
            if node_ is not None:
                await nursery.start(node_.run)
                await nursery.start(_relay_port, relays, hub, common, ssl_context, nursery)
                drain = trio.Event()
            public = trio.CancelScope()
            handle = functools.partial(hub.handle_stream, ssl_context=ssl_context)
            await nursery.start(_accept_all, public, listeners, accepting, handle, nursery)
            bound = listeners[0].socket.getsockname()[1]
            server = Server(
                host=host,
                port=bound,
                node=node_.name if node_ else None,
                tls=ssl_context is not None,
                drain=drain,
            )
            log.info("serving on %s%s", server.url, f" as node {node_.name}" if node_ else "")
            task_status.started(server)
            if drain is None:
                await trio.sleep_forever()
            else:
                await drain.wait()
                log.info("draining: %d sessions to hand over", len(hub.sessions))
                if serving.sockets is not None:
                    # Others hold these sockets too (the other workers): they accept the
                    # new connections once this one no longer does.
                    public.cancel()
                    with trio.CancelScope(shield=True):
                        for listener in listeners:
                            await listener.aclose()
                await hub.drain(serving.drain_timeout)
                assert node_ is not None
                await node_.stop()
                log.info("drained")
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            for listener in [*listeners, *relays]:
                await listener.aclose()
            if the_store is not None and isinstance(store, str):
                await the_store.aclose()


# inspect.signature() and help() show every option, as if each were spelled out.
serve.__signature__ = with_options(serve, SERVE)  # type: ignore[attr-defined]


async def _accept_all(
    scope: trio.CancelScope,
    listeners: list[trio.SocketListener],
    accepting: Accepting,
    handle: Callable[[trio.SocketStream, Pending], Awaitable[object]],
    nursery: trio.Nursery,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The public listeners' accept loops (started before ``task_status``), until
    ``scope`` is cancelled (a worker's drain); the connections' tasks run ``handle`` in
    ``nursery``."""
    with scope:
        async with trio.open_nursery() as loops:
            for listener in listeners:
                loops.start_soon(accept_loop, listener, accepting, handle, nursery)
            task_status.started()


async def _relay_port(
    relays: list[trio.SocketListener],
    hub: Hub,
    options: Options,
    ssl_context: ssl.SSLContext | None,
    nursery: trio.Nursery,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The accept loops of the port other nodes relay resumes to, until cancelled: only
    relays with their proof (``relay_only``), over TLS when the server has a certificate,
    in a pool of pending connections of their own with the public port's bounds (one
    node's relays come from one address: ``max_pending_per_peer`` of them at a time)."""
    from_nodes = Accepting(options.max_pending_connections, options.max_pending_per_peer)
    handle = functools.partial(hub.handle_stream, ssl_context=ssl_context, relay_only=True)
    async with trio.open_nursery() as loops:
        for listener in relays:
            loops.start_soon(accept_loop, listener, from_nodes, handle, nursery)
        task_status.started()


def _reachable(host: str) -> str:
    """The address other nodes reach a server bound to ``host`` at."""
    if host in ("", "0.0.0.0", "::"):
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return "127.0.0.1"
    return host
