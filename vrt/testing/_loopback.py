"""What :class:`~vrt.testing.FakeProvider` and :class:`~vrt.testing.FakeRealtime` share: a
TCP server on a free loopback port, held by ``async with`` (its :attr:`port` known once it
listens), each connection handed to the subclass's ``_connection``."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import Self

import trio


class LoopbackServer:
    """A server on ``127.0.0.1``, port 0, for the life of an ``async with`` block."""

    def __init__(self) -> None:
        self.port = 0
        """The port it listens on (0 until it does)."""
        self._cm: AbstractAsyncContextManager[Self] | None = None

    async def __aenter__(self) -> Self:
        self._cm = self._serving()
        return await self._cm.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._cm is not None
        return await self._cm.__aexit__(exc_type, exc, tb)

    @asynccontextmanager
    async def _serving(self) -> AsyncIterator[Self]:
        async with trio.open_nursery() as nursery:
            serve = functools.partial(trio.serve_tcp, self._connection, 0, host="127.0.0.1")
            listeners = await nursery.start(serve)
            self.port = listeners[0].socket.getsockname()[1]
            try:
                yield self
            finally:
                await self._closing()
                nursery.cancel_scope.cancel()

    async def _connection(self, stream: trio.SocketStream) -> None:
        raise NotImplementedError

    async def _closing(self) -> None:
        """Before the server stops (its connections are then cancelled): nothing here."""
