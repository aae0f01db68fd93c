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
from collections.abc import Awaitable, Callable, Collection

import attrs
import trio

from vrt._cluster.node import Node, default_name
from vrt._cluster.store import RedisStore, Store, open_store
from vrt._engine.agent import Agent
from vrt._net.accept import Accepting, Pending, accept_loop
from vrt._net.options import (
    DRAIN_TIMEOUT,
    FIRST_TURN_TIMEOUT,
    HANDSHAKE_TIMEOUT,
    MAX_HISTORY_BYTES,
    MAX_MESSAGES_PER_SECOND,
    MAX_OPEN_CALLS,
    MAX_PENDING_CONNECTIONS,
    MAX_PENDING_PER_PEER,
    MAX_QUEUED_APP_CALLS,
    MAX_SESSIONS,
    MAX_SESSIONS_PER_PEER,
    RESUME_WINDOW,
    make_options,
    positive_number,
)
from vrt._net.tls import server_context
from vrt._net.upgrade import Authenticate, HandshakeRequest, Refuse
from vrt._server.hub import Hub
from vrt._wire import messages as m
from vrt._wire.endpoint import REPLAY_LIMIT, REPLAY_LIMIT_BYTES
from vrt._wire.server import MAX_MESSAGE_SIZE

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
    capabilities: Collection[str] = m.CAPABILITIES,
    max_message_size: int = MAX_MESSAGE_SIZE,
    resume_window: float = RESUME_WINDOW,
    max_sessions: int = MAX_SESSIONS,
    max_open_calls: int = MAX_OPEN_CALLS,
    max_queued_app_calls: int = MAX_QUEUED_APP_CALLS,
    max_messages_per_second: float = MAX_MESSAGES_PER_SECOND,
    replay_limit: int = REPLAY_LIMIT,
    replay_limit_bytes: int = REPLAY_LIMIT_BYTES,
    handshake_timeout: float = HANDSHAKE_TIMEOUT,
    max_pending_connections: int = MAX_PENDING_CONNECTIONS,
    max_pending_per_peer: int = MAX_PENDING_PER_PEER,
    max_sessions_per_peer: int = MAX_SESSIONS_PER_PEER,
    first_turn_timeout: float = FIRST_TURN_TIMEOUT,
    max_history_bytes: int = MAX_HISTORY_BYTES,
    authenticate: Authenticate | None = None,
    allowed_origins: Collection[str] | None = None,
    web_demo: bool = False,
    metrics: bool = False,
    capture_content: bool | None = None,
    store: str | Store | None = None,
    node: str | None = None,
    drain_timeout: float = DRAIN_TIMEOUT,
    relay_host: str | None = None,
    reuse_port: bool = False,
    ssl_context: ssl.SSLContext | None = None,
    task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``agent`` over vrt/1 WebSockets until cancelled (or drained).

    Use ``server = await nursery.start(vrt.serve, agent, host, 0)`` to learn the real
    port. Plain HTTP on the same port gets the browser client (``GET /vrt.js``,
    ``/vrt.d.ts``, ``/machines.js``); ``web_demo=True`` also serves the demo page at ``/``
    (``vrt demo --web``). ``capabilities`` is what this server supports (pass ``()`` to
    act as a server without ``tool-stream-v1``). On cancellation every open session is
    sent ``closed`` with reason ``shutdown`` and its connection closed. Raises OSError at
    once if it cannot listen (a busy port, an unknown host), ValueError for a bad option.

    ``ssl_context``: serve TLS (``wss://``, and ``https://`` for the HTTP front) with this
    server-side context (``ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)`` with
    ``load_cert_chain``); :attr:`Server.url` then says ``wss://``. The TLS handshake is part
    of the connection's handshake: it counts in ``handshake_timeout`` and in the pool of
    pending connections, and a peer that fails it (plain HTTP, garbage, a certificate it
    refuses) is dropped quietly, like a bad upgrade. TypeError if it is not an SSLContext,
    ValueError if it is a client's or has no certificate. The relays between nodes of a
    store (``relay_host``) stay plain ``ws://``: they are meant for a private network,
    like the store's own connection (put them on one, or use ``rediss://`` and a VPN).

    Safety (each has a default; see "Serve safely" in the documentation):

    - ``handshake_timeout`` (10 s): from the TCP accept to a valid ``hello`` (the HTTP
      upgrade, ``authenticate`` and the hello); a peer slower than that is cut off.
    - ``max_pending_connections`` (256): connections still in their handshake, at most
      ``max_pending_per_peer`` (64) of them from one IP address (an IPv6 /64). A new
      connection is always let in: when the pool, or its address's share, is full, the
      connection of that pool that has waited longest is closed instead (a real client
      finishes in milliseconds), so slow handshakes cannot lock anyone out. Behind a
      reverse proxy every connection has the proxy's address: raise
      ``max_pending_per_peer`` to ``max_pending_connections`` there. A peer that leaves
      mid-handshake is forgotten at once. Running out of file descriptors is one warning
      a time, not a log flood.
    - ``max_sessions`` (1,000): live sessions, detached ones included. At it, the oldest
      session that never started a turn is closed (``expired``) to make room; if every
      session has, a new one is refused (``error`` ``RATE_LIMITED``, ``closed``
      ``rejected``).
    - ``max_sessions_per_peer`` (20): the same, per principal (what ``authenticate``
      returns) or, without one, per remote IP address.
    - ``first_turn_timeout`` (300 s): a session that starts no turn by then is closed
      (``expired``).
    - ``resume_window`` (30 s): how long a session whose connection dropped is kept for
      the client to resume; turns and server tools go on meanwhile. Then it closes
      (``expired``). 0 ends a session with its connection.
    - ``max_open_calls`` (64): calls of one turn without a result; a call over it fails at
      once (FAILED) and the model gets that result.
    - ``max_queued_app_calls`` (32): app calls waiting for the app; one over it FAILED.
    - ``max_messages_per_second`` (100, a one-second burst): inbound frames per
      connection; frames over it are read more slowly (never dropped) and the client
      gets ``error`` ``RATE_LIMITED`` once; after 5 seconds of
      that, the session is closed (``server``).
    - ``replay_limit`` (10,000 messages) and ``replay_limit_bytes`` (2 MiB): the replay
      buffer, and each connection's unwritten backlog; the model is held while the client
      is 40 % of either behind; over the limit, or held 30 s without progress, the session
      closes (``overflow``) and a connection stuck behind unread frames is reset at once.
    - ``max_message_size`` (1 MiB, at least 1,024): a frame over it in characters closes
      the connection (1009; a hello over 64 KiB too); one within it in characters but over
      it in UTF-8 bytes is answered ``TOO_LARGE`` and the session goes on. The server sends
      no frame over it (``vrt.connect``'s default is the same): a call's arguments are
      bounded to an eighth of it (a call over fails), ``ctx.emit`` progress to half.
    - ``max_history_bytes`` (1 MiB): past it, the oldest whole turns are dropped from
      what the model is sent.
    - ``authenticate``: ``async (vrt.HandshakeRequest) -> principal``, run before the
      upgrade; raise :class:`vrt.Refuse` (or return None: 401) to refuse the upgrade with
      an HTTP status. The principal reaches server tools as ``ctx.principal``, and a resume
      must come with the same principal.
    - ``allowed_origins``: if given, an upgrade whose ``Origin`` header is present and not
      in it is refused (403): browsers send it, so a page elsewhere cannot use a user's
      cookies to open a session. Requests without ``Origin`` (not a browser) pass.

    Observability (OpenTelemetry, through its API: a no-op until the application configures
    the SDK; see "Traces and metrics" in the documentation):

    - Every turn, model step and call is a span (``invoke_agent``, ``chat``,
      ``execute_tool``), with no content (user text, arguments, outputs, messages) unless
      ``capture_content=True`` (None: ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``).
    - ``metrics=True`` serves ``GET /metrics`` on the HTTP front, in Prometheus' text format:
      ``prometheus_client``'s default registry, which the SDK's Prometheus reader fills
      (``trio-vrt[metrics]``; ``vrt serve --metrics`` installs both). ValueError if
      ``prometheus_client`` is missing.

    Serving in production (``handover-v1``, docs/deploy.md):

    - ``store``: ``"redis://HOST:PORT[/DB]"`` or ``"valkey://..."`` (valkey-glide), or a
      store object shared by servers of one process (``vrt._cluster.store.MemoryStore``).
      Each session is saved there at every turn boundary; a resume that reaches another
      server sharing the store is relayed to the one running the session, or adopts it
      there once it was handed over (:meth:`Server.drain`) or its server died (after a
      lease of 5 s: the turn that was running ends ``interrupted``). Records expire with
      ``resume_window``. Raises :class:`~vrt._cluster.store.StoreError` at once if the store
      does not answer. Without a store, sessions live in this process only, as always.
    - ``node``: this server's name in the store and in logs (default ``host:pid``).
    - ``drain_timeout`` (30 s): how long a drain waits for a turn to end before it
      interrupts it.
    - ``relay_host``: the address other servers reach this one at for relayed resumes
      (a port of its own is opened there; default: ``host``, or this machine's address
      when ``host`` is a wildcard).
    - ``reuse_port``: listen with ``SO_REUSEPORT`` (``vrt serve --workers``: several
      processes on one port, the kernel spreading connections across them).
    """
    options = make_options(
        capabilities=capabilities,
        max_message_size=max_message_size,
        resume_window=resume_window,
        max_sessions=max_sessions,
        max_open_calls=max_open_calls,
        max_queued_app_calls=max_queued_app_calls,
        max_messages_per_second=max_messages_per_second,
        replay_limit=replay_limit,
        replay_limit_bytes=replay_limit_bytes,
        handshake_timeout=handshake_timeout,
        max_pending_connections=max_pending_connections,
        max_pending_per_peer=max_pending_per_peer,
        max_sessions_per_peer=max_sessions_per_peer,
        first_turn_timeout=first_turn_timeout,
        max_history_bytes=max_history_bytes,
        authenticate=authenticate,
        allowed_origins=allowed_origins,
        web_demo=web_demo,
        metrics=metrics,
        capture_content=capture_content,
    )
    drain_timeout = positive_number("drain_timeout", drain_timeout, zero=True)
    if ssl_context is not None:
        ssl_context = server_context(ssl_context)
    the_store = open_store(store) if isinstance(store, str) else store
    listeners: list[trio.SocketListener] = []
    relays: list[trio.SocketListener] = []
    try:
        node_ = None
        if the_store is not None:
            # The store first: a worker that listened before it could serve would be
            # handed connections by the kernel (SO_REUSEPORT) meanwhile.
            if isinstance(the_store, RedisStore):
                await the_store.connect()
            bound_host = relay_host or _reachable(host)
            relays = await trio.open_tcp_listeners(0, host=bound_host)
            node_ = Node(the_store, node or default_name(), resume_window=options.resume_window)
            relay_port = relays[0].socket.getsockname()[1]
            node_.address = (
                f"[{bound_host}]:{relay_port}"
                if ":" in bound_host
                else f"{bound_host}:{relay_port}"
            )
        if reuse_port:
            listeners = await _reuse_port_listeners(port, host)
        else:
            listeners = await trio.open_tcp_listeners(port, host=host)
        async with trio.open_nursery() as nursery:
            accepting = Accepting(options.max_pending_connections, options.max_pending_per_peer)
            hub = Hub(agent, options, nursery, accepting, node_)
            drain = None
            if node_ is not None:
                await nursery.start(node_.run)
                # Relays come from the other nodes: a pool of their own, no per-address
                # share (every relay of a node has its address).
                from_nodes = Accepting(options.max_pending_connections)
                for listener in relays:
                    nursery.start_soon(
                        accept_loop, listener, from_nodes, hub.handle_stream, nursery
                    )
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
                if reuse_port:
                    # Workers share the port: the kernel sends new connections to the
                    # others once this one no longer listens.
                    public.cancel()
                    with trio.CancelScope(shield=True):
                        for listener in listeners:
                            await listener.aclose()
                await hub.drain(drain_timeout)
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


def _reachable(host: str) -> str:
    """The address other nodes reach a server bound to ``host`` at."""
    if host in ("", "0.0.0.0", "::"):
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return "127.0.0.1"
    return host


async def _reuse_port_listeners(port: int, host: str) -> list[trio.SocketListener]:
    """Listeners on ``host:port`` with ``SO_REUSEPORT``: every worker of ``vrt serve
    --workers`` binds the same port, and the kernel spreads new connections across them."""
    listeners: list[trio.SocketListener] = []
    for family, kind, proto, _, address in await trio.socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    ):
        sock = trio.socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            await sock.bind(address)
            sock.listen(4096)
        except OSError:
            sock.close()
            for listener in listeners:
                await listener.aclose()
            raise
        listeners.append(trio.SocketListener(sock))
    return listeners
