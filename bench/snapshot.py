"""What a session's save costs as its history grows (``handover-v1``).

Run it as ``python -m bench.snapshot`` (``--turns N``, 200 by default). One in-process
``vrt.serve`` with a ``MemoryStore`` (no network to the store: the server's own cost) and
one ``vrt.connect`` session running bench/load.py's turns (2 steps: words, a server call
and an app call each) back to back. Every save at a turn boundary (one at the turn's start,
one at its end) encodes the session's state (``encode_state``) and the history items the
store lacks (``encode_item``), which this script wraps (in this process only) to time
them, and writes them (``MemoryStore.save``, wrapped to note the bytes written); the
table shows them at a few points of the session's life.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from typing import Any

import trio

import vrt
import vrt._server.actor
from bench.agents import make_agent
from bench.fleet import show
from vrt._cluster.store import MemoryStore

POINTS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


async def run(turns: int) -> list[tuple[int, int, int, float]]:
    """(history items stored, replay entries, bytes written, seconds encoding) of every
    save."""
    saves: list[tuple[int, int, int, float]] = []
    spent = [0.0]
    state_of, item_of = vrt._server.actor.encode_state, vrt._server.actor.encode_item

    def timed_state(state: Any, limit: int) -> bytes:
        start = time.perf_counter()
        data: bytes = state_of(state, limit)
        spent[0] += time.perf_counter() - start
        return data

    def timed_item(item: Any) -> bytes:
        start = time.perf_counter()
        data: bytes = item_of(item)
        spent[0] += time.perf_counter() - start
        return data

    class Store(MemoryStore):
        async def save(self, *args: Any, items: Any = (), **kwargs: Any) -> bool:
            kept = await super().save(*args, items=items, **kwargs)
            record = self._sessions[args[0]][0]
            replay = json.loads(record.state)["replay"]
            size = len(record.state) + sum(len(item) for item in items)
            saves.append((len(record.history), len(replay), size, spent[0]))
            spent[0] = 0.0
            return kept

    vrt._server.actor.encode_state = timed_state  # type: ignore[assignment]
    vrt._server.actor.encode_item = timed_item  # type: ignore[assignment]
    try:
        agent = make_agent(2, turns + 1)
        async with trio.open_nursery() as nursery:
            server = await nursery.start(
                functools.partial(
                    vrt.serve,
                    agent,
                    "127.0.0.1",
                    0,
                    store=Store(),
                    node="a",
                    max_messages_per_second=1e6,  # turns back to back: over the default rate
                )
            )
            async with vrt.connect(server.url, tools=[show]) as client, client.subscribe() as ev:
                for _ in range(turns):
                    await client.send_text("show me the next one")
                    async for event in ev:
                        if isinstance(event, vrt.TurnEnded):
                            break
            nursery.cancel_scope.cancel()
    finally:
        vrt._server.actor.encode_state = state_of
        vrt._server.actor.encode_item = item_of
    return saves


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200, help="turns of the session (200)")
    args = parser.parse_args()
    saves = trio.run(run, args.turns)
    print(
        f"vrt save per turn boundary: one session, {args.turns} turns of 2 steps; vrt from "
        f"{vrt.__file__.rsplit('/', 2)[0]}"
    )
    print(
        f"  {'after turn':>10} {'history items':>14} {'replay':>7} {'written':>9} {'encoding':>11}"
    )
    for turn in POINTS:
        index = 2 * turn - 1  # the save at the end of that turn
        if index < len(saves):
            items, replay, size, seconds = saves[index]
            print(f"  {turn:>10} {items:>14,} {replay:>7} {size:>9,} {seconds * 1e3:>8.2f} ms")
    total = sum(size for _, _, size, _ in saves)
    spent = sum(seconds for *_, seconds in saves)
    print(
        f"  {len(saves)} saves, {total / max(1, args.turns):,.0f} B and "
        f"{spent / max(1, args.turns) * 1e3:.2f} ms of encoding per turn on average over the "
        "session (two saves a turn)"
    )


if __name__ == "__main__":
    main()
