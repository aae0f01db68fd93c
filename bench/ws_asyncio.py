"""The asyncio ``websockets`` rows of bench/wire.py, in a process of their own.

bench/wire.py runs it as ``sys.executable -m bench.ws_asyncio`` with a JSON job
on stdin and reads one JSON object from stdout; the trio process never imports
``websockets`` (a bench extra, ``pip install -e '.[bench]'``, never a dependency of vrt).
Server and client share one asyncio event loop (the stock loop, no uvloop) over loopback
(127.0.0.1, port 0), so each figure covers both ends, as on the trio side. Both ends run
without compression, pings or proxy, like trio-websocket's defaults; the rest is
``websockets.asyncio``'s defaults.

Jobs:

* ``{"mode": "echo", "frame": str, "count": int, "warmup": int}``: the server echoes; the
  client sends ``frame`` and awaits it back, ``warmup + count`` times. Answers
  ``{"rtts": [seconds...], "cpu": seconds}`` (after the warm-up; ``cpu`` is
  ``time.process_time`` inside the timed intervals, summed).
* ``{"mode": "stream", "frames": [str...], "count": int, "warmup": int}``: on ``"N"`` the
  server sends N frames (round robin over ``frames``), then ``"done"``; the client receives
  them. A warm-up of ``warmup`` frames, then ``count``. Answers
  ``{"messages": int, "wall": seconds, "cpu": seconds}``.

Without ``websockets`` installed it answers ``{"missing": "not installed"}``.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
from typing import Any

HOST = "127.0.0.1"
OPTIONS: dict[str, Any] = {"compression": None, "ping_interval": None, "max_size": 2**20}


async def echo_server(ws: Any) -> None:
    async for message in ws:
        await ws.send(message)


async def stream_server(ws: Any, frames: list[str]) -> None:
    async for message in ws:
        for i in range(int(message)):
            await ws.send(frames[i % len(frames)])
        await ws.send("done")


async def echo(job: dict[str, Any]) -> dict[str, Any]:
    from websockets.asyncio.client import connect
    from websockets.asyncio.server import serve

    frame, count, warmup = job["frame"], job["count"], job["warmup"]
    rtts: list[float] = []
    cpu = 0.0
    async with serve(echo_server, HOST, 0, **OPTIONS) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(f"ws://{HOST}:{port}/", proxy=None, **OPTIONS) as ws:
            gc.collect()
            for i in range(warmup + count):
                start, used = time.perf_counter(), time.process_time()
                await ws.send(frame)
                await ws.recv()
                rtts.append(time.perf_counter() - start)
                if i >= warmup:
                    cpu += time.process_time() - used
    return {"rtts": rtts[warmup:], "cpu": cpu}


async def stream(job: dict[str, Any]) -> dict[str, Any]:
    from websockets.asyncio.client import connect
    from websockets.asyncio.server import serve

    frames, count = job["frames"], job["count"]

    async def handler(ws: Any) -> None:
        await stream_server(ws, frames)

    async def receive(ws: Any, n: int) -> None:
        await ws.send(str(n))
        for _ in range(n):
            await ws.recv()
        if await ws.recv() != "done":
            raise RuntimeError("the stream did not end with 'done'")

    async with serve(handler, HOST, 0, **OPTIONS) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(f"ws://{HOST}:{port}/", proxy=None, **OPTIONS) as ws:
            await receive(ws, job["warmup"])
            gc.collect()
            wall, cpu = time.perf_counter(), time.process_time()
            await receive(ws, count)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"messages": count, "wall": wall, "cpu": cpu}


def main() -> None:
    job = json.load(sys.stdin)
    try:
        import websockets  # noqa: F401
    except ImportError:
        answer: dict[str, Any] = {"missing": "not installed"}
    else:
        answer = asyncio.run(echo(job) if job["mode"] == "echo" else stream(job))
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
