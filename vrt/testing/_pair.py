"""``open_pair``: the whole vrt/1 protocol over in-memory connections, and fault injection."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio
from trio_websocket import CloseReason, ConnectionClosed

from vrt._client.client import Client, open_client
from vrt._engine.agent import Agent
from vrt._engine.groups import single_unwrapped
from vrt._engine.tools import AppTool
from vrt._net.memory import MemoryConnection, memory_connection_pair
from vrt._net.options import Options
from vrt._server.hub import Hub
from vrt._wire import messages as m


@asynccontextmanager
async def open_pair(
    agent: Agent,
    tools: Sequence[AppTool] = (),
    *,
    capabilities: Sequence[str] = m.CAPABILITIES,
    server_capabilities: Collection[str] = m.CAPABILITIES,
    resume: bool = True,
    transport: Callable[[MemoryConnection], Any] | None = None,
    **server: Any,
) -> AsyncIterator[Client]:
    """A client connected to a server session of ``agent`` over in-memory connections.

    The same protocol cores and actors as ``vrt.serve``/``vrt.connect``, without sockets;
    ``server`` takes ``vrt.serve``'s safety options (``resume_window``, ``max_open_calls``,
    ...). A lost connection is resumed on a new in-memory connection unless ``resume`` is
    False. ``transport`` wraps each client end (e.g. in a :class:`CuttingConnection`).
    Leaving the block closes the session and stops the server side.
    """
    options = Options(capabilities=tuple(server_capabilities), **server)

    @asynccontextmanager
    async def connection() -> AsyncIterator[Any]:
        server_end, client_end = memory_connection_pair()
        nursery.start_soon(hub.serve_connection, server_end)
        try:
            yield client_end if transport is None else transport(client_end)
        finally:
            await client_end.aclose()

    with single_unwrapped():
        async with trio.open_nursery() as nursery:
            hub = Hub(agent, options, nursery)
            async with (
                connection() as ws,
                open_client(
                    ws,
                    tools,
                    capabilities=capabilities,
                    reconnect=connection if resume else None,
                ) as client,
            ):
                yield client
            nursery.cancel_scope.cancel()


class CuttingConnection:
    """A client connection that is cut once: before or after its ``n``-th message in one
    direction (``"send"``: client to server; ``"receive"``: server to client).

    Fault injection for resume tests. Acks are not counted (their timing varies), every
    other frame is. "Before" loses the ``n``-th message (it never arrives); "after"
    delivers it, then cuts. After the cut both ends see the connection closed, and frames
    still in flight towards the client are lost.
    """

    def __init__(self, ws: Any, *, direction: str, n: int, before: bool) -> None:
        if direction not in ("send", "receive"):
            raise ValueError(f"direction is 'send' or 'receive', not {direction!r}")
        self.ws = ws
        self.direction = direction
        self.n = n
        self.before = before
        self.count = 0
        self.cut = False

    async def send_message(self, message: str) -> None:
        """Send one frame (see the class for when the cut happens)."""
        if self.cut:
            raise ConnectionClosed(CloseReason(1006, "cut"))
        if self.direction == "send" and self._counts(message):
            if self.before:
                await self._cut()
                raise ConnectionClosed(CloseReason(1006, "cut"))
            await self.ws.send_message(message)
            await self._cut()
            return
        await self.ws.send_message(message)

    async def get_message(self) -> str:
        """The next frame (see the class for when the cut happens)."""
        if self.cut:
            raise ConnectionClosed(CloseReason(1006, "cut"))
        message: str = await self.ws.get_message()
        if self.direction == "receive" and self._counts(message):
            await self._cut()
            if self.before:
                raise ConnectionClosed(CloseReason(1006, "cut"))
        return message

    async def aclose(self) -> None:
        """Close the connection."""
        await self.ws.aclose()

    def _counts(self, message: str) -> bool:
        if '"type":"ack"' in message:
            return False
        self.count += 1
        return self.count == self.n

    async def _cut(self) -> None:
        self.cut = True
        await self.ws.aclose(1006, "cut")
