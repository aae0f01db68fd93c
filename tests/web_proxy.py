"""A cutting proxy for the browser tests: ``python tests/web_proxy.py TARGET_PORT`` prints
its own port, then drops every connection through it each time a line ``cut`` arrives on
stdin (it answers ``cut N``); new connections go through."""

from __future__ import annotations

import sys

import trio

from vrt.testing import LoopbackProxy


async def main(target: int) -> None:
    proxy = LoopbackProxy(target)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(proxy.run)
        print(port, flush=True)
        stdin = trio.lowlevel.FdStream(0)
        buffer = b""
        while chunk := await stdin.receive_some():
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line.strip() == b"cut":
                    print(f"cut {proxy.cut()}", flush=True)
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]))
