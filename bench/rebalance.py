"""How fast sessions spread out again after a worker restart (rebalancing, issue 26).

Run it as ``python -m bench.rebalance`` (``--sessions N``, ``--limit S``, ``--help``). One
``vrt serve bench.agents:agent --workers 2 --store auto`` (a redis-server started for the
run) and ``--sessions`` clients (:func:`vrt.connect`, this process), each of which runs one
turn and then stays idle. The bench reads each node's session count from the store's
census (``vrt:census``: what the nodes themselves share out by), then restarts a worker
the planned way (SIGTERM: it drains, its sessions move to the other worker, the parent
starts it again, empty), and prints the spread every second until it is within 70/30 or
``--limit`` seconds pass. Every client then runs one more turn; the figures: seconds from
the restarted worker being back to a spread within 70/30 (and within 55/45), how many
sessions moved, and how many clients saw ``closed`` (the target: none).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import tempfile
from pathlib import Path
from typing import Any

import trio

import vrt
from bench import harness


def spread(redis: harness.Redis, pids: set[int]) -> dict[str, int]:
    """Each worker's session count, as the census has it: of the workers alive now (a
    worker's node name is ``host:pid:i``; a dead one's count stays a few seconds)."""
    found = redis.call("HGETALL", "vrt:census") or []
    counts = {}
    for i in range(0, len(found) - 1, 2):
        name = found[i].decode()
        _, count = found[i + 1].decode().split()
        if int(count) >= 0 and int(name.split(":")[-2]) in pids:
            counts[name] = int(count)
    return counts


def seconds(value: float | None, otherwise: str) -> str:
    return otherwise if value is None else f"{value:.1f} s"


def within(counts: dict[str, int], most: float) -> bool:
    total = sum(counts.values())
    return len(counts) == 2 and total > 0 and max(counts.values()) <= most * total


async def client(url: str, ready: trio.Event, go: trio.Event, seen: list[Any]) -> None:
    async with vrt.connect(url, connect_timeout=30) as session, session.subscribe() as events:
        await session.send_text("hi")
        async for event in events:
            seen.append(event)
            if isinstance(event, vrt.TurnEnded):
                break
        ready.set()
        await go.wait()
        await session.send_text("again")
        async for event in events:
            seen.append(event)
            if isinstance(event, vrt.TurnEnded):
                break


async def main(args: argparse.Namespace) -> None:
    print(f"vrt from {harness.vrt_from()}")
    with harness.redis_auto() as redis, tempfile.TemporaryDirectory() as folder:
        async with harness.vrt_serve(
            "rebalance", 2, redis.url, Path(folder), extra=["--log-level", "info"]
        ) as served:
            go = trio.Event()
            seen: list[list[Any]] = [[] for _ in range(args.sessions)]
            async with trio.open_nursery() as nursery:
                readies = []
                for i in range(args.sessions):
                    ready = trio.Event()
                    readies.append(ready)
                    nursery.start_soon(client, served.url, ready, go, seen[i])
                with trio.fail_after(60):
                    for ready in readies:
                        await ready.wait()
                await trio.sleep(3)  # a census round or two
                alive = set(served.worker_pids().values())
                print(f"{args.sessions} idle sessions: {spread(redis, alive)}")
                workers = served.worker_pids()
                busiest = max(workers.values(), key=harness.cpu_seconds)
                index = next(i for i, pid in workers.items() if pid == busiest)
                print(f"SIGTERM to worker {index} (pid {busiest}): it drains, then starts again")
                started = trio.current_time()
                with contextlib.suppress(ProcessLookupError):
                    os.kill(busiest, signal.SIGTERM)
                with trio.fail_after(60):
                    while served.worker_pids().get(index) in (None, busiest):  # noqa: ASYNC110
                        await trio.sleep(0.05)  # another process: nothing to wait on here
                back = trio.current_time()
                print(f"worker {index} back after {back - started:.1f} s")
                even = balanced = None
                alive = set(served.worker_pids().values())
                while trio.current_time() - back < args.limit:
                    counts = spread(redis, alive)
                    now = trio.current_time() - back
                    print(f"  {now:5.1f} s: {counts}")
                    if even is None and within(counts, 0.7):
                        even = now
                    if balanced is None and within(counts, 0.55):
                        balanced = now
                        break
                    await trio.sleep(1.0)
                go.set()
            closed = sum(any(isinstance(e, vrt.Closed) for e in s) for s in seen)
            resumed = sum(sum(isinstance(e, vrt.Resumed) for e in s) for s in seen)
            finished = sum(
                sum(isinstance(e, vrt.TurnEnded) and e.reason == "finished" for e in s)
                for s in seen
            )
        if args.log:
            print((Path(folder) / "rebalance.log").read_text()[-args.log :])
    print()
    print(f"within 70/30: {seconds(even, 'MISS')} after the worker was back")
    print(f"within 55/45: {seconds(balanced, 'not within the limit')}")
    print(f"resumes seen by the clients: {resumed}; turns finished: {finished}")
    print(f"clients that saw closed: {closed}   target 0  {harness.verdict(closed == 0)}")
    target = even is not None and even <= 60
    print(f"70/30 within 60 s: {harness.verdict(target)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=100, help="idle sessions (100)")
    parser.add_argument("--limit", type=float, default=60.0, help="seconds to wait (60)")
    parser.add_argument("--log", type=int, default=0, help="print this much of the log's end")
    trio.run(main, parser.parse_args())
