"""Accepting TCP connections: the accept loop, and the stream each connection is read through.

trio's ``serve_listeners`` logs an ERROR with a traceback every 0.1 s while the process is
out of file descriptors, and trio-websocket keeps a connection that has not finished its
upgrade for 60 s, even after the peer closed it. Here: a cap on connections not yet in a
session (beyond it new ones are closed at once), a warning a minute at most while out of
file descriptors or at that cap, and a :class:`GuardedStream` that tells the handshake the
moment the peer leaves.
"""

from __future__ import annotations

import errno
import logging
import math
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import trio

log = logging.getLogger("vrt.server")

_CAPACITY = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
"""accept() errors that mean "no room now", not "this listener is broken"."""
_RETRY_AFTER = 0.1


class GuardedStream(trio.abc.HalfCloseableStream):
    """A TCP stream that reports the peer's leaving (EOF or a broken connection) through
    :attr:`on_close`, and can be torn down at once (:meth:`abort`).

    trio-websocket reads a connection in its own task and, before the upgrade completes,
    never wakes whoever waits for it when TCP ends; a callback from the read itself does.
    """

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.on_close: Callable[[], object] | None = None
        self.gone = False
        """The peer closed, or the connection broke."""
        self.aborted = False
        self._unread = b""

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
            data, self._unread = self._unread[:size], self._unread[size:]
            await trio.lowlevel.checkpoint()
            return data
        try:
            data = await self.stream.receive_some(max_bytes)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._left()
            raise
        if not data:
            self._left()
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._left()
            raise

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.stream.send_eof()

    async def aclose(self) -> None:
        self._left()  # trio-websocket closes it when the upgrade or the connection failed
        await self.stream.aclose()

    def abort(self) -> None:
        """Close the socket now, discarding what the kernel still holds to send (RST)."""
        self.aborted = True
        abort(self.stream)


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


class Accepting:
    """The connections not yet in a session, counted against ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pending = 0
        self._full = Throttled()

    def admit(self) -> bool:
        """Whether a new connection may start its handshake (counted if so)."""
        if self.pending >= self.limit:
            self._full.warn(
                "%d connections are in their handshake (max_pending_connections): a new one "
                "was closed at once",
                self.pending,
            )
            return False
        self.pending += 1
        return True

    def done(self) -> None:
        """A counted connection finished its handshake, or ended."""
        self.pending -= 1


async def accept_loop(
    listener: trio.SocketListener,
    accepting: Accepting,
    handle: Callable[[trio.SocketStream], Awaitable[Any]],
    nursery: trio.Nursery,
) -> NoReturn:
    """Accept connections on ``listener`` until cancelled; each counted one is handed to
    ``handle`` in a task of ``nursery`` (which must call ``accepting.done()``)."""
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
        if not accepting.admit():
            abort(stream)
            await trio.lowlevel.checkpoint()
            continue
        nursery.start_soon(handle, stream)
