"""What a session's save costs as its history grows (``handover-v1``).

Run it as ``python -m bench.snapshot`` (``--turns N``, 200 by default; ``--quick``: 20).
One in-process ``vrt.serve`` with a store of this bench's (:class:`Recorder`: the in-memory
store, ``vrt._cluster.store.MemoryStore``, behind the store port ``vrt.serve(store=...)``
takes, noting what each save writes) and one ``vrt.connect`` session running
bench/load.py's turns (2 steps: words, a server call and an app call each) back to back.
The server saves at every turn boundary (one at the turn's start, one at its end): the
session's state (``encode_state``) and the history items the store lacks (``encode_item``).

Then, for the saves at a few points of the session's life, it times the record codec
(``vrt._cluster.record``) itself on that save's real state: the record read back
(``restore``), ``encode_state`` of it and ``encode_item`` of each item that save
appended, best of ``--repeat``. The server runs unchanged: nothing of it is wrapped.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import trio

import vrt
from bench.agents import make_agent
from bench.fleet import show
from bench.harness import vrt_commit
from vrt._cluster import record
from vrt._cluster.store import MemoryStore, Saved
from vrt.models import HistoryItem

POINTS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
NO_LIMIT = 1 << 40
"""``encode_state``'s bound, out of the way: this times the encoding, it bounds nothing."""


@dataclass
class Save:
    """One save as the store got it."""

    state: bytes
    items: int  # history items appended by this save
    written: int  # bytes: the state and the appended items
    history: tuple[bytes, ...]  # the whole stored history after it


class Recorder:
    """A store for ``vrt.serve(store=...)``: a :class:`MemoryStore` that notes each save."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.saves: list[Save] = []

    async def heartbeat(self, node: str, address: str, ttl: float) -> bool:
        return await self.inner.heartbeat(node, address, ttl)

    async def node_address(self, node: str) -> str | None:
        return await self.inner.node_address(node)

    async def forget_node(self, node: str) -> None:
        await self.inner.forget_node(node)

    async def save(
        self,
        session_id: str,
        node: str,
        owner: str,
        state: bytes,
        ttl: float,
        *,
        front: int = 0,
        first: int = 0,
        items: Sequence[bytes] = (),
    ) -> bool:
        before = await self.inner.load(session_id)
        end = max(before.front + len(before.history), front) if before is not None else front
        kept = await self.inner.save(
            session_id, node, owner, state, ttl, front=front, first=first, items=items
        )
        after = await self.inner.load(session_id)
        if kept and after is not None:
            appended = after.front + len(after.history) - end
            new = after.history[len(after.history) - appended :] if appended else ()
            written = len(state) + sum(len(item) for item in new)
            self.saves.append(Save(state, appended, written, after.history))
        return kept

    async def load(self, session_id: str) -> Saved | None:
        return await self.inner.load(session_id)

    async def claim(self, session_id: str, expected: str, node: str) -> Saved | None:
        return await self.inner.claim(session_id, expected, node)

    async def delete(self, session_id: str, node: str) -> None:
        await self.inner.delete(session_id, node)

    async def touch(self, session_ids: Iterable[str], ttl: float) -> set[str]:
        return await self.inner.touch(session_ids, ttl)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def run(turns: int) -> list[Save]:
    """Every save of one session of ``turns`` turns."""
    store = Recorder()
    agent = make_agent(2, turns + 1)
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            functools.partial(
                vrt.serve,
                agent,
                "127.0.0.1",
                0,
                store=store,
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
    return store.saves


def best(repeat: int, work: Callable[[], object]) -> float:
    """The fastest of ``repeat`` runs of ``work``, in seconds."""
    fastest = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        fastest = min(fastest, time.perf_counter() - start)
    return fastest


def encode_save(state: record.State, items: Sequence[HistoryItem]) -> None:
    """What the server encodes for one save: the state, and each item it appends."""
    record.encode_state(state, NO_LIMIT)
    for item in items:
        record.encode_item(item)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200, help="turns of the session (200)")
    parser.add_argument("--repeat", type=int, default=20, help="timings per save, best kept (20)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 20 turns")
    args = parser.parse_args()
    if args.quick:
        args.turns = 20
    saves = trio.run(run, args.turns)
    print(
        f"vrt save per turn boundary: one session, {args.turns} turns of 2 steps; vrt from "
        f"{vrt.__file__.rsplit('/', 2)[0]}{vrt_commit()}; the record codec timed on each "
        f"save's state, best of {args.repeat}"
    )
    print(
        f"  {'after turn':>10} {'history items':>14} {'replay':>7} {'written':>9} "
        f"{'encode':>9} {'(state':>9} {'+ items)':>9}"
    )
    for turn in POINTS:
        index = 2 * turn - 1  # the save at the end of that turn
        if index >= len(saves):
            continue
        save = saves[index]
        state = record.restore(save.state, save.history)
        appended = state.history[len(state.history) - save.items :] if save.items else ()
        whole = best(args.repeat, functools.partial(encode_save, state, appended))
        alone = best(args.repeat, functools.partial(record.encode_state, state, NO_LIMIT))
        print(
            f"  {turn:>10} {len(state.history):>14,} {len(state.replay):>7} "
            f"{save.written:>9,} {whole * 1e3:>6.3f} ms {alone * 1e3:>6.3f} ms "
            f"{(whole - alone) * 1e3:>6.3f} ms"
        )
    total = sum(save.written for save in saves)
    print(
        f"  {len(saves)} saves, {total / max(1, args.turns):,.0f} B written per turn on "
        "average over the session (two saves a turn)"
    )


if __name__ == "__main__":
    main()
