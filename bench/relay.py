"""What a relay and a move cost (``handover-v1``), for docs/deploy.md's argument.

Run it as ``python -m bench.relay`` (``--quick``: 10 trials; ``--help``). Two ``vrt serve
bench.agents:relay_agent --store URL --node a|b`` processes on loopback share a store
(``--store auto``, the default: a redis-server started for the run), and one
:func:`vrt.connect` client in this process reaches them through a loopback proxy of this
bench's (:class:`Proxy`, this process too), which plays the load balancer: the bench points
it at a node, cuts its connections, and notes when each new connection reaches it. A turn
is ``--steps`` model steps (10), each a few words and an app call ``show`` that the client
answers at once. Each trial opens a new session (on node a and node b in turn, so that
every session's saved state is three turns long at most) and runs three turns on it, in
this order:

1. **direct**: client -> proxy -> the node that owns the session.
2. **resumed on its node**: the connection is cut after the turn's first app call has
   settled; the client resumes through the proxy, still pointed at the owner.
3. **relayed, then moved**: the same cut, but the proxy now points at the other node: the
   resume lands there, which relays it to the owner (a WebSocket to its relay port, the
   frames carried both ways), and the turn goes on through the relay; at its end the owner
   hands the session over (1012) and the client resumes at once, through the other node,
   which adopts the session from the store. The client then closes the session.

Figures (client side, ``time.perf_counter`` when the client's task reads the event):

- **App-tool round trip**: the app call's ``arguments-complete`` to its ``settled``
  (``tool.call`` down, the app tool's run, ``tool.result`` up, ``settled`` down): direct
  (turns 1, and the owner's steps of 2) against relayed (turn 3, the calls whose
  ``arguments-complete`` came after the resume).
- **Step**: one ``settled`` to the next (the model's next step, its text and the app call
  round trip), steps 3 to the end of each turn (step 2 of turns 2 and 3 holds the resume);
  **the rest of a turn**: the ``settled`` of step 2 to ``turn.ended``, the same steps.
- **Gaps**: a resume on the same node and a resume relayed to the owner, each from the
  moment the client's new connection reaches the proxy to the client's task reading
  ``vrt.Resumed`` (the TCP connection, the upgrade, the resume ``hello``, on the other node
  the owner's address from the store and a WebSocket to its relay port, the ``welcome`` and
  the replay); and the move, ``vrt.Reconnecting`` to ``vrt.Resumed`` (the owner's 1012 to
  the adopting node's welcome: the handover's last save, the close, the new connection, the
  store's load and claim, the restore).
- **CPU per turn** of each node process (``/proc/PID/stat``), by kind of turn.

vrt.connect waits a backoff before it resumes after a loss other than 1012: 25-50 ms at
first, doubled for a resume whose connection drops within 5 s of it, so here 25-50 ms
after the first cut of a session and 50-100 ms after the second (none after the 1012).
The client runs as shipped; the resume gaps start at the new connection, after that wait,
so they are the path's own cost. The wait is in the "as the app sees it" rows
(``vrt.Reconnecting`` to ``vrt.Resumed``), printed beside them.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import platform
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

import vrt
from bench.fleet import show
from bench.harness import (
    HOST,
    cpu_seconds,
    ms,
    percentile,
    shown,
    the_store,
    version,
    vrt_commit,
    vrt_serve,
)


class Proxy:
    """The load balancer: listens on loopback and pipes every connection to
    ``target_port``; :meth:`cut` drops every connection through it at once, both ways, as
    a network failure would. :attr:`accepted` holds when each connection arrived."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.accepted: list[float] = []
        """``time.perf_counter()`` as each connection was accepted."""
        self._scopes: set[trio.CancelScope] = set()

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``task_status`` gets the proxy's port."""
        listeners = await trio.open_tcp_listeners(0, host=HOST)
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            task_status.started(self.port)
            await trio.serve_listeners(self._pipe, listeners, handler_nursery=nursery)

    def cut(self) -> None:
        scopes, self._scopes = self._scopes, set()
        for scope in scopes:
            scope.cancel()

    def arrived_before(self, moment: float) -> float:
        """When the last connection before ``moment`` arrived."""
        return max(at for at in self.accepted if at <= moment)

    async def _pipe(self, downstream: trio.SocketStream) -> None:
        self.accepted.append(time.perf_counter())
        scope = trio.CancelScope()
        self._scopes.add(scope)
        try:
            async with downstream:
                with scope:
                    upstream = await trio.open_tcp_stream(HOST, self.target_port)
                    async with upstream, trio.open_nursery() as nursery:
                        nursery.start_soon(_copy, downstream, upstream, nursery.cancel_scope)
                        nursery.start_soon(_copy, upstream, downstream, nursery.cancel_scope)
        finally:
            self._scopes.discard(scope)


async def _copy(source: trio.SocketStream, sink: trio.SocketStream, done: trio.CancelScope) -> None:
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        async for data in source:
            await sink.send_all(data)
    done.cancel()  # one side closed: close the other


@dataclass
class Seen:
    """Every event the client read, with the time its task read it."""

    events: list[tuple[float, Any]] = field(default_factory=list)
    changed: trio.Event = field(default_factory=trio.Event)

    async def read(self, channel: Any) -> None:
        async for event in channel:
            self.events.append((time.perf_counter(), event))
            self.changed.set()
            self.changed = trio.Event()

    async def until(self, test: Callable[[Any], bool], since: int) -> tuple[int, float, Any]:
        """The first event from index ``since`` on that passes ``test``: its index, time and
        the event."""
        with trio.fail_after(30):
            while True:
                for index in range(since, len(self.events)):
                    at, event = self.events[index]
                    if test(event):
                        return index, at, event
                since = len(self.events)
                await self.changed.wait()


def settled_app(event: Any) -> bool:
    return (
        isinstance(event, vrt.ToolStream)
        and event.kind == "app"
        and event.phase is vrt.Phase.SETTLED
    )


def ended(event: Any) -> bool:
    return isinstance(event, vrt.TurnEnded)


@dataclass
class Figures:
    rtt: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    steps: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    rest: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    gaps: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    cpu: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: list[str] = field(default_factory=list)
    state: list[int] = field(default_factory=list)  # the saved state's size after a trial


def account(
    seen: Seen, start: int, end: int, kind: str, cut: float, after: float, f: Figures
) -> None:
    """The round trips and steps of one turn's events ``start:end``: a call counts as
    ``kind`` if its ``arguments-complete`` came after the resume (``after``), as direct if
    it settled before the cut (``cut``); one across the cut not at all."""
    complete: dict[str, float] = {}
    settles: list[float] = []
    for at, event in seen.events[start:end]:
        if isinstance(event, vrt.ToolStream) and event.kind == "app":
            if event.phase is vrt.Phase.ARGUMENTS_COMPLETE:
                complete[event.call_id] = at
            elif event.phase is vrt.Phase.SETTLED:
                if not event.ok:
                    f.errors.append(f"app call settled {event.code}")
                settles.append(at)
                began = complete.pop(event.call_id, None)
                if began is not None and began > after:
                    f.rtt[kind].append(at - began)
                elif began is not None and at < cut:
                    f.rtt["direct"].append(at - began)
            elif event.phase in (vrt.Phase.CANCELLED, vrt.Phase.FAILED):
                f.errors.append(f"app call {event.phase}")
        elif isinstance(event, vrt.TurnEnded):
            if event.reason != "finished":
                f.errors.append(f"turn ended {event.reason}")
            if len(settles) >= 2:
                f.rest[kind].append(at - settles[1])
        elif isinstance(event, vrt.Closed):
            f.errors.append(f"closed ({event.reason})")
    for earlier, later in itertools.pairwise(settles[1:]):
        f.steps[kind].append(later - earlier)


async def run(args: argparse.Namespace) -> Figures:
    f = Figures()
    env = {"VRT_RELAY_STEPS": str(args.steps), "VRT_RELAY_TURNS": str(3 * args.trials + 5)}
    with the_store(args.store) as redis, tempfile.TemporaryDirectory() as tmp:
        assert redis is not None
        folder = Path(tmp)
        async with contextlib.AsyncExitStack() as stack:
            nodes = []
            for name in ("a", "b"):
                served = await stack.enter_async_context(
                    vrt_serve(
                        f"node {name}",
                        1,
                        redis.url,
                        folder,
                        target="bench.agents:relay_agent",
                        env=env,
                        extra=["--node", name],
                    )
                )
                print(f"node {name}: {' '.join(shown(served.command))}")
                nodes.append(served)
            proxy = Proxy(nodes[0].port)
            nursery = await stack.enter_async_context(trio.open_nursery())
            await nursery.start(proxy.run)
            for trial in range(-1, args.trials):  # -1: a warm-up (imports, caches)
                owner = trial % 2  # a new session each trial, on each node in turn
                proxy.target_port = nodes[owner].port
                async with (
                    vrt.connect(
                        f"ws://127.0.0.1:{proxy.port}/", tools=[show], resume_timeout=30
                    ) as client,
                    client.subscribe() as channel,
                    trio.open_nursery() as reading,
                ):
                    seen = Seen()
                    reading.start_soon(seen.read, channel)
                    warm = trial < 0
                    await turn(client, seen, nodes, proxy, f, "direct", None, owner, warm)
                    await turn(client, seen, nodes, proxy, f, "resumed", proxy.cut, owner, warm)
                    other = 1 - owner

                    def relay(other: int = other) -> None:
                        proxy.target_port = nodes[other].port
                        proxy.cut()

                    await turn(client, seen, nodes, proxy, f, "relayed", relay, owner, warm)
                    if redis is not None and not warm:
                        f.state.append(max(redis.session_records(), default=0))
                    reading.cancel_scope.cancel()
                if trial % 10 == 9:
                    print(f"  {trial + 1} trials", flush=True)
            nursery.cancel_scope.cancel()
        for served in nodes:
            for line in served.log_problems():
                f.errors.append(f"node log: {line}")
    return f


async def turn(
    client: vrt.Client,
    seen: Seen,
    nodes: list[Any],
    proxy: Proxy,
    f: Figures,
    kind: str,
    cut: Callable[[], None] | None,
    owner: int,
    warm: bool = False,
) -> None:
    """One turn of ``kind`` on the session ``nodes[owner]`` owns; with ``cut``, called
    once the first app call settled."""
    start = len(seen.events)
    before = [cpu_seconds(n.process.pid) for n in nodes]
    await client.send_text("go")
    after = cut_at = float("inf")
    if cut is not None:
        index, _, _ = await seen.until(settled_app, start)
        cut_at = time.perf_counter()
        cut()
        index, lost, _ = await seen.until(lambda e: isinstance(e, vrt.Reconnecting), index)
        index, back, _ = await seen.until(lambda e: isinstance(e, vrt.Resumed), index)
        if not warm:
            f.gaps[kind].append(back - proxy.arrived_before(back))
            f.gaps[kind + ", as the app sees it"].append(back - lost)
        after = back
    index, _, _ = await seen.until(ended, start)
    if kind == "relayed":  # the owner hands the session over at the turn's end: 1012
        index, lost, _ = await seen.until(lambda e: isinstance(e, vrt.Reconnecting), index)
        index, back, _ = await seen.until(lambda e: isinstance(e, vrt.Resumed), index)
        if not warm:
            f.gaps["moved"].append(back - lost)
    await trio.sleep(0.05)  # the nodes' last frames of the turn (acks), in their CPU
    spent = [cpu_seconds(n.process.pid) - was for n, was in zip(nodes, before, strict=True)]
    if not warm:
        f.cpu[kind].append(spent[owner])
        f.cpu[kind + ", the other node"].append(spent[1 - owner])
        account(seen, start, len(seen.events), kind, cut_at, after, f)


def report(f: Figures, args: argparse.Namespace) -> None:
    def row(label: str, values: list[float]) -> str:
        return (
            f"  {label:<44} {len(values):>5}  p50 {ms(percentile(values, 0.5)):>7}  p99 "
            f"{ms(percentile(values, 0.99)):>7}  max {ms(max(values, default=float('nan'))):>7} ms"
        )

    print(f"\n{args.trials} trials, {args.steps} steps a turn; client-side times")
    print(row("app-tool round trip, direct", f.rtt["direct"]))
    print(row("app-tool round trip, relayed", f.rtt["relayed"]))
    print(row("a step (settled -> settled), direct", f.steps["direct"]))
    print(row("a step, relayed", f.steps["relayed"]))
    print(row(f"the rest of a turn ({args.steps - 2} steps), direct", f.rest["direct"]))
    print(row(f"the rest of a turn ({args.steps - 2} steps), relayed", f.rest["relayed"]))
    print(row("resume gap, on the same node", f.gaps["resumed"]))
    print(row("resume gap, relayed to the owner", f.gaps["relayed"]))
    seen_by_app = "  as the app sees it (+ the client's wait)"
    print(row(seen_by_app, f.gaps["resumed, as the app sees it"]))
    print(row("  the same, relayed", f.gaps["relayed, as the app sees it"]))
    print(row("move gap (1012 -> adopted elsewhere)", f.gaps["moved"]))
    direct = percentile(f.rtt["direct"], 0.5)
    relayed = percentile(f.rtt["relayed"], 0.5)
    step_direct = percentile(f.steps["direct"], 0.5)
    step_relayed = percentile(f.steps["relayed"], 0.5)
    print(
        f"  relayed / direct (p50): app round trip {relayed / direct:.2f}x "
        f"(+{ms(relayed - direct)} ms), step {step_relayed / step_direct:.2f}x"
    )
    print(
        "  CPU per turn (mean, ms, from 10 ms clock ticks): the node owning the session, the other"
    )
    for kind in ("direct", "resumed", "relayed"):
        means = []
        for key in (kind, kind + ", the other node"):
            values = f.cpu[key]
            means.append(sum(values) / max(1, len(values)))
        note = (
            " (the other relays, then adopts: the move's save, load and claim)"
            if kind == "relayed"
            else ""
        )
        print(f"    {kind:<10} {means[0] * 1e3:6.1f} + {means[1] * 1e3:5.1f}{note}")
    if f.state:
        print(
            f"  the session's saved state after its 3 turns: {sum(f.state) / len(f.state):,.0f} B"
            " (a new session each trial)"
        )
    print(f"  errors: {len(f.errors)}")
    for error in f.errors[:10]:
        print(f"    {error}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=50, help="trials, 3 turns each (50)")
    parser.add_argument("--steps", type=int, default=10, help="steps a turn, an app call each (10)")
    parser.add_argument("--store", default="auto", help="redis://HOST:PORT, or auto (auto)")
    parser.add_argument("--quick", action="store_true", help="10 trials")
    args = parser.parse_args()
    if args.quick:
        args.trials = 10
    if args.steps < 4:
        parser.error("--steps must be at least 4")
    print(
        f"vrt relay benchmark: Python {platform.python_version()}, trio {version('trio')}, "
        f"{os.cpu_count()} CPUs, loopback; vrt from {os.path.dirname(vrt.__file__)}"
        f"{vrt_commit()}\ntwo vrt serve nodes, one vrt.connect client (as shipped) and a "
        "loopback proxy in this process; a resume gap starts when the new connection reaches "
        "the proxy"
    )
    start = time.perf_counter()
    figures = trio.run(run, args)
    report(figures, args)
    print(f"  wall time {time.perf_counter() - start:,.1f} s")


if __name__ == "__main__":
    main()
