"""An in-memory stand-in for a WebSocket connection: tests and embedding, no sockets."""

from __future__ import annotations

import math

import trio
from trio_websocket import CloseReason, ConnectionClosed


class MemoryConnection:
    """One end of an in-memory text-frame pipe with trio-websocket's connection surface
    (``send_message``, ``get_message``, ``aclose``); closing either end closes both."""

    def __init__(
        self, send: trio.MemorySendChannel[str], receive: trio.MemoryReceiveChannel[str]
    ) -> None:
        self._send = send
        self._receive = receive
        self.peer: MemoryConnection | None = None
        self.closed: CloseReason | None = None

    async def send_message(self, message: str) -> None:
        """Send one frame; raises ``ConnectionClosed`` once either end closed."""
        if self.closed is not None:
            raise ConnectionClosed(self.closed)
        try:
            self._send.send_nowait(message)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise ConnectionClosed(self._close_reason()) from None
        await trio.lowlevel.checkpoint()

    async def get_message(self) -> str:
        """The next frame; raises ``ConnectionClosed`` once closed and drained."""
        try:
            return await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise ConnectionClosed(self._close_reason()) from None

    async def aclose(self, code: int = 1000, reason: str | None = None) -> None:
        """Close both directions (idempotent)."""
        self._shut(CloseReason(code, reason))
        if self.peer is not None:
            self.peer._shut(CloseReason(code, reason))
        await trio.lowlevel.checkpoint()

    def _shut(self, reason: CloseReason) -> None:
        if self.closed is None:
            self.closed = reason
        self._send.close()

    def _close_reason(self) -> CloseReason:
        return self.closed or CloseReason(1000, None)


def memory_connection_pair() -> tuple[MemoryConnection, MemoryConnection]:
    """Two connected ends: what one sends, the other gets."""
    a_send, b_receive = trio.open_memory_channel[str](math.inf)
    b_send, a_receive = trio.open_memory_channel[str](math.inf)
    a = MemoryConnection(a_send, a_receive)
    b = MemoryConnection(b_send, b_receive)
    a.peer, b.peer = b, a
    return a, b
