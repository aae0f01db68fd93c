"""The network between the nodes and their store, in a process of its own, for
tests/test_store_faults.py: ``python -m tests.store_link PORT`` pipes TCP connections
to ``127.0.0.1:PORT`` and prints its own port. SIGUSR1 cuts it (every connection dropped,
new ones accepted and never answered: a partition, in which nothing sent reaches the
store), SIGUSR2 mends it (the connections held meanwhile are closed, new ones piped).

A process of its own because valkey-glide connects with a blocking call: a proxy in the
test's event loop could not accept the connection the call waits for. Trio alone (no
vrt), so that it starts at once.
"""

from __future__ import annotations

import contextlib
import signal
import sys

import trio


class Link:
    def __init__(self, target: int) -> None:
        self.target = target
        self.cut = False
        self.scopes: set[trio.CancelScope] = set()
        """One per connection: cancelled when the link is cut (piped ones) or mended
        (those held while it was cut)."""

    async def pipe(self, downstream: trio.SocketStream) -> None:
        with trio.CancelScope() as scope:
            self.scopes.add(scope)
            try:
                async with downstream:
                    if self.cut:
                        await trio.sleep_forever()  # accepted, never answered
                    upstream = await trio.open_tcp_stream("127.0.0.1", self.target)
                    async with upstream, trio.open_nursery() as nursery:
                        nursery.start_soon(copy, downstream, upstream, nursery.cancel_scope)
                        nursery.start_soon(copy, upstream, downstream, nursery.cancel_scope)
            finally:
                self.scopes.discard(scope)

    def switch(self, cut: bool) -> None:
        self.cut = cut
        for scope in list(self.scopes):
            scope.cancel()


async def copy(source: trio.SocketStream, sink: trio.SocketStream, done: trio.CancelScope) -> None:
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        async for data in source:
            await sink.send_all(data)
    done.cancel()


async def main(target: int) -> None:
    link = Link(target)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    with trio.open_signal_receiver(signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, link.pipe, listeners)
            print(listeners[0].socket.getsockname()[1], flush=True)
            async for signum in signals:
                if signum == signal.SIGTERM:
                    nursery.cancel_scope.cancel()
                else:
                    link.switch(cut=signum == signal.SIGUSR1)


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]))
