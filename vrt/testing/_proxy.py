"""A loopback TCP proxy whose connections can be cut: fault injection on real sockets."""

from __future__ import annotations

import contextlib
import itertools
import random
from collections.abc import Sequence

import trio


class LoopbackProxy:
    """Listens on 127.0.0.1 and pipes every connection to ``target_port``; :meth:`cut`
    drops every connection through it at once, both ways, as a network failure would.

    ``port = await nursery.start(proxy.run)``; new connections keep working after a cut.
    :attr:`misbehave` makes it a broken load balancer for new connections: ``"close"``
    accepts and closes them at once, ``"stall"`` accepts them and never answers (they are
    closed when :attr:`misbehave` is set back to None), ``"502"``, ``"503"`` or ``"504"``
    reads the request and answers it with that HTTP status, as a proxy does while the
    server behind it restarts; None (the default) pipes them.

    ``sources``: the local addresses its connections to the target come from, one after
    another (``127.0.1.1``, ``127.0.1.2``...: every ``127.x.y.z`` is loopback on Linux), so
    that the target sees many clients, as behind a real network; default: the system's
    choice (all of them from ``127.0.0.1``).
    """

    def __init__(
        self,
        target_port: int,
        target_host: str = "127.0.0.1",
        *,
        sources: Sequence[str] | None = None,
    ) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self._sources = itertools.cycle(sources) if sources else None
        self.port = 0
        self.connections = 0
        """Connections accepted so far."""
        self._scopes: set[trio.CancelScope] = set()
        self.misbehave: str | None = None
        self._healed = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``task_status`` gets the proxy's port."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        try:
            async with trio.open_nursery() as nursery:
                task_status.started(self.port)
                await trio.serve_listeners(self._pipe, listeners, handler_nursery=nursery)
        finally:
            with trio.CancelScope(shield=True):
                for listener in listeners:
                    await listener.aclose()

    def heal(self) -> None:
        """Pipe new connections again (``misbehave = None``) and close the stalled ones."""
        self.misbehave = None
        self._healed.set()
        self._healed = trio.Event()

    def cut(self, count: int | None = None) -> int:
        """Drop every open connection, or ``count`` of them chosen at random; returns how
        many were dropped."""
        if count is None:
            scopes, self._scopes = self._scopes, set()
        else:
            scopes = set(random.sample(sorted(self._scopes, key=id), min(count, len(self._scopes))))
            self._scopes -= scopes
        for scope in scopes:
            scope.cancel()
        return len(scopes)

    async def _pipe(self, downstream: trio.SocketStream) -> None:
        self.connections += 1
        if self.misbehave == "close":
            await downstream.aclose()
            return
        if self.misbehave == "stall":
            async with downstream:
                await self._healed.wait()
            return
        if self.misbehave in _STATUSES:
            async with downstream:
                with trio.move_on_after(5), contextlib.suppress(trio.BrokenResourceError):
                    request = b""
                    while b"\r\n\r\n" not in request and len(request) < 65536:
                        data = await downstream.receive_some(4096)
                        if not data:
                            return
                        request += data
                    reason = _STATUSES[self.misbehave]
                    await downstream.send_all(
                        f"HTTP/1.1 {self.misbehave} {reason}\r\ncontent-length: 0\r\n"
                        "connection: close\r\n\r\n".encode()
                    )
            return
        scope = trio.CancelScope()
        self._scopes.add(scope)
        try:
            async with downstream:
                with scope:
                    source = next(self._sources) if self._sources is not None else None
                    upstream = await trio.open_tcp_stream(
                        self.target_host, self.target_port, local_address=source
                    )
                    async with upstream, trio.open_nursery() as nursery:
                        nursery.start_soon(_copy, downstream, upstream, nursery.cancel_scope)
                        nursery.start_soon(_copy, upstream, downstream, nursery.cancel_scope)
        finally:
            self._scopes.discard(scope)


_STATUSES = {"502": "Bad Gateway", "503": "Service Unavailable", "504": "Gateway Timeout"}


async def _copy(source: trio.SocketStream, sink: trio.SocketStream, done: trio.CancelScope) -> None:
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        async for data in source:
            await sink.send_all(data)
    done.cancel()  # one side closed: close the other
