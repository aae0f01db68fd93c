"""Accepting TCP connections: the accept loop, and the stream each connection is read through.

trio's ``serve_listeners`` logs an ERROR with a traceback every 0.1 s while the process is
out of file descriptors, and trio-websocket keeps a connection that has not finished its
upgrade for 60 s, even after the peer closed it. Here: a bounded pool of connections not
yet in a session, with a share per peer address, where a newcomer always gets in and the
connection that has waited longest makes room (:class:`Accepting`); a warning a minute at
most while out of file descriptors or evicting; and a :class:`GuardedStream` that tells the
handshake the moment the peer leaves.
"""

from __future__ import annotations

import errno
import logging
import math
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import trio

from vrt._engine import telemetry
from vrt._net.proxied import Networks, ProxyHeader, address_key, read_proxy_header, trusts

log = logging.getLogger("vrt.server")

_CAPACITY = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
"""accept() errors that mean "no room now", not "this listener is broken"."""
_RETRY_AFTER = 0.1


class GuardedStream(trio.abc.HalfCloseableStream):
    """A TCP stream (with TLS over it, given a server's ``ssl_context``) that reports the
    peer's leaving (EOF or a broken connection) through :attr:`on_close`, and can be torn
    down at once (:meth:`abort`).

    trio-websocket reads a connection in its own task and, before the upgrade completes,
    never wakes whoever waits for it when TCP ends; a callback from the read itself does.
    """

    def __init__(
        self, stream: trio.SocketStream, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.stream = stream
        """The TCP stream: its socket gives the peer's address, and :meth:`abort` resets it."""
        self.tls: trio.SSLStream[trio.abc.Stream] | None = None
        """With ``ssl_context`` (a server's): TLS over :attr:`stream`, which every read and
        write then goes through (:meth:`start_tls` first)."""
        self._ssl_context = ssl_context
        if ssl_context is not None:
            self.tls = trio.SSLStream(stream, ssl_context, server_side=True, https_compatible=True)
        self._io: trio.abc.Stream = stream if self.tls is None else self.tls
        self.client: tuple[str, int] | None = None
        """The client's address and port as a trusted proxy's PROXY header gave them
        (:meth:`proxy_header`): who the connection is from, in its ``repr`` too."""
        self.on_close: Callable[[], object] | None = None
        self.gone = False
        """The peer closed, or the connection broke."""
        self.aborted = False
        self._unread = b""

    def __repr__(self) -> str:
        # trio-websocket names a stream it cannot read an address from by its repr (a
        # refused upgrade is logged with it, and it is HandshakeRequest.remote): the
        # peer's address, as for a plain socket (the client's, from a PROXY header).
        if self.client is not None:
            host, port = self.client
            return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            host, port, *_ = self.stream.socket.getpeername()
        except (OSError, ValueError):
            return "<a closed connection>"
        return f"{host}:{port}"

    async def start_tls(self) -> bool:
        """The TLS handshake, if the stream has TLS (else nothing): False if it failed (a
        peer that sends plain HTTP or garbage, refuses the certificate, or leaves), which
        counts as the peer leaving. The caller bounds it in time, like the upgrade."""
        if self.tls is None:
            return True
        try:
            await self.tls.do_handshake()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            cause = exc.__cause__
            reason = getattr(cause, "reason", None) or type(cause or exc).__name__
            log.debug("%r: no TLS handshake (%s)", self, reason)
            self._left()
            return False
        return True

    async def proxy_header(self) -> ProxyHeader | None:
        """The PROXY protocol v2 header the connection starts with (a trusted proxy's),
        read before TLS: its client becomes :attr:`client`. None if it starts otherwise
        (what was read is read again, by TLS or HTTP). ProxyHeaderError if it is
        malformed, or the peer leaves within it (which counts as the peer leaving). The
        caller bounds it in time, like the upgrade."""
        try:
            header, rest = await read_proxy_header(self.stream)
        except ValueError:
            self._left()
            raise
        if header is not None and header.host is not None:
            self.client = (header.host, header.port)
        if rest:
            if self.tls is None:
                self.unread(rest)
            else:  # below TLS: the bytes were the start of its ClientHello
                assert self._ssl_context is not None
                self.tls = trio.SSLStream(
                    _Rewound(self.stream, rest),
                    self._ssl_context,
                    server_side=True,
                    https_compatible=True,
                )
                self._io = self.tls
        return header

    def unread(self, data: bytes) -> None:
        """Put ``data`` back: the next read returns it first (the HTTP front read a
        WebSocket upgrade's head that trio-websocket must now read)."""
        self._unread = data + self._unread

    def _left(self) -> None:
        self.gone = True
        callback, self.on_close = self.on_close, None
        if callback is not None:
            callback()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._unread:
            size = len(self._unread) if max_bytes is None else max_bytes
            unread, self._unread = self._unread[:size], self._unread[size:]
            await trio.lowlevel.checkpoint()
            return unread
        try:
            data = await self._io.receive_some(max_bytes)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._left()
            raise
        if not data:
            self._left()
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        try:
            await self._io.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._left()
            raise

    async def wait_send_all_might_not_block(self) -> None:
        await self._io.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        if self.tls is not None:
            raise NotImplementedError("TLS has no half-close")
        await self.stream.send_eof()

    async def aclose(self) -> None:
        self._left()  # trio-websocket closes it when the upgrade or the connection failed
        await self._io.aclose()  # TLS (https_compatible): no close_notify to wait on

    def abort(self) -> None:
        """Close the socket now, discarding what the kernel still holds to send (RST)."""
        self.aborted = True
        abort(self.stream)


class _Rewound(trio.abc.Stream):
    """A TCP stream whose first reads return ``data`` (bytes read off it already, that
    TLS must see): what a trusted proxy's connection without a PROXY header is read
    through."""

    def __init__(self, stream: trio.SocketStream, data: bytes) -> None:
        self.stream = stream
        self._data = data

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._data:
            size = len(self._data) if max_bytes is None else max_bytes
            data, self._data = self._data[:size], self._data[size:]
            await trio.lowlevel.checkpoint()
            return data
        return await self.stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.stream.aclose()


def peer_host(stream: trio.SocketStream) -> str:
    """The IP address a connection comes from (``unknown`` once it is closed)."""
    try:
        return str(stream.socket.getpeername()[0])
    except OSError:
        return "unknown"


def peer_address(stream: trio.SocketStream) -> str:
    """Who a connection counts against in ``max_pending_per_peer``: its IP address, or for
    IPv6 its /64 network (what one host is usually given)."""
    return address_key(peer_host(stream))


def abort(stream: trio.SocketStream) -> None:
    """Close ``stream``'s socket at once: linger 0, so its unsent bytes are dropped and the
    file descriptor is free now, whatever the peer does."""
    sock = stream.socket
    if sock.fileno() == -1:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:  # already reset by the peer
        pass
    sock.close()


class Throttled:
    """A warning a peer can cause again and again, logged at most once per ``interval``
    seconds, saying how often it happened since the last line."""

    __slots__ = ("_last", "_missed", "interval")

    def __init__(self, interval: float = 60.0) -> None:
        self.interval = interval
        self._last = -math.inf
        self._missed = 0

    def warn(self, message: str, *args: object) -> None:
        now = trio.current_time()
        if now - self._last < self.interval:
            self._missed += 1
            return
        if self._missed:
            message += f" (and {self._missed} more times in the last {self.interval:g} s)"
        log.warning(message, *args)
        self._last, self._missed = now, 0


class Pending:
    """One connection in its handshake: where it came from, and how to cut it short.

    Each phase of the handshake (the upgrade, then the ``hello``) runs in a cancel scope
    given to :meth:`guard`; an eviction cancels the one running, or the next one at once.
    """

    __slots__ = ("address", "evicted", "pool", "proxy", "scope")

    def __init__(self, address: str, pool: Accepting | None = None, *, proxy: bool = False) -> None:
        self.address = address
        self.pool = pool
        """The pool it is counted in (:meth:`done` tells it)."""
        self.proxy = proxy
        """From a trusted proxy: counted by the client it names once that is known
        (:meth:`Accepting.rekey`), not by the proxy's address."""
        self.evicted = False
        self.scope: trio.CancelScope | None = None

    def done(self) -> None:
        """Its handshake finished, or it ended (again: nothing)."""
        if self.pool is not None:
            self.pool.done(self)

    def guard(self, scope: trio.CancelScope) -> None:
        """``scope`` bounds the handshake's current phase: an eviction cancels it."""
        self.scope = scope
        if self.evicted:
            scope.cancel()

    def evict(self) -> None:
        self.evicted = True
        if self.scope is not None:
            self.scope.cancel()


class Accepting:
    """The connections not yet in a session: at most ``limit`` of them, at most
    ``per_peer`` from one address.

    A full pool never turns a newcomer away: the connection that has waited longest (from
    the newcomer's address when that address is at ``per_peer``, else from anywhere) is
    closed instead. A real client finishes its handshake in milliseconds; a slow one had
    its chance, and refusing newcomers instead would let a few hundred slow connections
    lock everyone out (probe a01).
    """

    def __init__(self, limit: int, per_peer: int | None = None, *, trusted: Networks = ()) -> None:
        self.limit = limit
        self.per_peer = limit if per_peer is None else min(per_peer, limit)
        self.trusted = trusted
        """The networks of trusted proxies (``trusted_proxies``): a connection from one
        is counted by the client it names (:meth:`rekey`), and until then in the pool
        only, not in its proxy's share."""
        self._oldest_first: dict[Pending, None] = {}
        self._by_address: dict[str, dict[Pending, None]] = {}
        self.evicted = 0
        """Connections closed to make room, since the start (for tests and statistics)."""
        self._full = Throttled()

    @property
    def pending(self) -> int:
        """Connections in their handshake now."""
        return len(self._oldest_first)

    def admit(self, address: str, *, proxy: bool = False) -> Pending:
        """Count a new connection from ``address``, closing the longest-waiting one to make
        room if the pool (or the address's share of it) is full. ``proxy``: from a trusted
        proxy, whose share is not counted (its clients' are, once :meth:`rekey` names
        them)."""
        same = self._by_address.get(address)
        if not proxy and same is not None and len(same) >= self.per_peer:
            self._evict_same(same)
        elif len(self._oldest_first) >= self.limit:
            self._evict(next(iter(self._oldest_first)), "max_pending_connections", self.limit)
        entry = Pending(address, self, proxy=proxy)
        self._oldest_first[entry] = None
        self._by_address.setdefault(address, {})[entry] = None
        return entry

    def admit_stream(self, stream: trio.SocketStream) -> Pending:
        """:meth:`admit` a connection by its peer's address."""
        return self.admit(peer_address(stream), proxy=trusts(self.trusted, peer_host(stream)))

    def rekey(self, entry: Pending, address: str) -> None:
        """Count ``entry`` (from a trusted proxy) as from ``address`` now, the client the
        proxy named: if that address is at its share, its longest-waiting connection is
        closed to make room."""
        if entry not in self._oldest_first or entry.address == address:
            return
        self._forget(entry)
        same = self._by_address.get(address)
        if same is not None and len(same) >= self.per_peer:
            self._evict_same(same)
        entry.address = address
        self._by_address.setdefault(address, {})[entry] = None

    def _evict_same(self, same: dict[Pending, None]) -> None:
        option = "max_pending_per_peer" if self.per_peer < self.limit else None
        self._evict(next(iter(same)), option or "max_pending_connections", len(same))

    def done(self, entry: Pending) -> None:
        """``entry`` finished its handshake, or ended (again: nothing)."""
        if entry not in self._oldest_first:
            return
        del self._oldest_first[entry]
        self._forget(entry)

    def _forget(self, entry: Pending) -> None:
        """``entry`` out of its address's share (not out of the pool)."""
        same = self._by_address[entry.address]
        del same[entry]
        if not same:
            del self._by_address[entry.address]

    def _evict(self, entry: Pending, option: str, count: int) -> None:
        self.done(entry)
        entry.evict()
        self.evicted += 1
        telemetry.refused("pending_cap")
        self._full.warn(
            "%d connections are in their handshake (%s): the one waiting longest was "
            "closed to let a new one in",
            count,
            option,
        )


async def accept_loop(
    listener: trio.SocketListener,
    accepting: Accepting,
    handle: Callable[[trio.SocketStream, Pending], Awaitable[Any]],
    nursery: trio.Nursery,
) -> NoReturn:
    """Accept connections on ``listener`` until cancelled; each is counted in ``accepting``
    and handed to ``handle`` in a task of ``nursery`` (which must call
    ``accepting.done(entry)`` when its handshake ends)."""
    out_of_fds = Throttled()
    while True:
        try:
            stream = await listener.accept()
        except OSError as exc:
            if exc.errno not in _CAPACITY:
                raise
            out_of_fds.warn(
                "cannot accept connections: %s; retrying every %g s",
                errno.errorcode.get(exc.errno or 0, exc),
                _RETRY_AFTER,
            )
            await trio.sleep(_RETRY_AFTER)
            continue
        nursery.start_soon(handle, stream, accepting.admit_stream(stream))
