"""Interleaved windows: configurations of servers measured seconds apart, in one run.

Each figure is over a window between two samples of every counter (:class:`Sample`: the
servers' CPU from /proc, the clients' :class:`~bench.fleet.Tally`, redis's ``INFO``, the
whole machine's busy time), the sessions running all along: a paced window (``--think``
between a session's turns, offered load sessions / think, below what any configuration
completes), then one window per ``--levels`` entry with that many sessions at think 0 (each
always has a turn outstanding: the offered load is above what the server completes, so
turns/s is its saturation rate). :func:`run_configs` starts every configuration's server
and sessions at once, idle but for the one being measured, and interleaves the windows:
per round, per phase, each configuration in turn (the order reversed every other round),
so that the windows a ratio compares are seconds apart; ``--rounds`` rounds, summed by
:func:`merge`. bench/serving.py (``python -m bench.load --compare``, ``--tracing``) and
bench/asgi.py compare the :class:`Result` it returns.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from bench.fleet import LocalFleet, RemoteFleet, fleet_of
from bench.harness import (
    Redis,
    Served,
    machine_busy,
    ms,
    percentile,
    shown,
    sockets,
    vrt_serve,
)


@dataclass
class Sample:
    wall: float
    servers: dict[int, float]
    store: dict[str, Any] | None
    clients: dict[str, Any]
    machine: float
    me: float  # this process (the clients' CPU when they run here)


async def sample(served: Served, fleet: LocalFleet | RemoteFleet, redis: Redis | None) -> Sample:
    clients = await fleet.sample()
    servers = served.cpu()
    store = redis.sample() if redis is not None and "--store" in served.command else None
    me = time.process_time() if isinstance(fleet, RemoteFleet) else 0.0
    return Sample(time.perf_counter(), servers, store, clients, machine_busy(), me)


@dataclass
class Window:
    """What one window measured (the difference of two samples)."""

    label: str
    offered: str
    seconds: float
    turns: int
    server_cpu: float  # seconds, every server process
    per_process: list[float]  # seconds, by process (parent first)
    client_cpu: float
    store: dict[str, Any] | None
    turn_time: list[float]
    rtt: list[float]
    errors: Counter[str]
    resumes: int = 0
    gaps: list[float] = field(default_factory=list)
    closed: int = 0
    machine: float = 0.0  # CPU seconds of the whole machine
    others: float = 0.0  # of it, neither the servers, the clients, redis nor this process

    @property
    def rate(self) -> float:
        return self.turns / max(self.seconds, 1e-9)

    def per_turn(self, seconds: float) -> float:
        return seconds / max(self.turns, 1)


TOP_LEVEL_COMMANDS = frozenset({"evalsha", "eval", "set", "get", "hgetall", "exec"})
"""The commands vrt's RedisStore sends itself, each one round trip (a script's calls,
HGET, HSET, PEXPIRE and DEL, run inside its EVALSHA: Redis counts them as commands too).
A node's record touch, a pipeline of PEXPIRE per 500 sessions every resume_window / 2, is
not among them (one round trip a node every 30 s)."""


def window(label: str, offered: str, a: Sample, b: Sample) -> Window:
    per_process = [b.servers[pid] - a.servers.get(pid, 0.0) for pid in b.servers]
    store = None
    if a.store is not None and b.store is not None:
        by_command = {
            name: calls - a.store["by_command"].get(name, 0)
            for name, calls in b.store["by_command"].items()
        }
        store = {
            "requests": sum(
                calls for name, calls in by_command.items() if name in TOP_LEVEL_COMMANDS
            ),
            "commands": b.store["commands"] - a.store["commands"],
            "in": b.store["in"] - a.store["in"],
            "out": b.store["out"] - a.store["out"],
            "cpu": b.store["cpu"] - a.store["cpu"],
            "by_command": {k: v for k, v in by_command.items() if v and k not in ("info", "scan")},
            "memory": b.store["memory"],
        }
    errors = Counter(b.clients["errors"])
    errors.subtract(a.clients["errors"])
    machine = b.machine - a.machine
    # the servers, the clients, this process (when the clients run in a child), redis
    ours = sum(per_process) + (b.clients["cpu"] - a.clients["cpu"]) + (b.me - a.me)
    ours += store["cpu"] if store is not None else 0.0
    return Window(
        machine=machine,
        others=max(0.0, machine - ours),
        label=label,
        offered=offered,
        seconds=b.wall - a.wall,
        turns=b.clients["turns"] - a.clients["turns"],
        server_cpu=sum(per_process),
        per_process=per_process,
        client_cpu=b.clients["cpu"] - a.clients["cpu"],
        store=store,
        turn_time=b.clients["turn_time"],
        rtt=b.clients["rtt"],
        errors=+errors,
        resumes=b.clients["resumes"] - a.clients["resumes"],
        gaps=b.clients["gaps"],
        closed=b.clients["closed"] - a.clients["closed"],
    )


def print_window(w: Window) -> None:
    cores = w.server_cpu / max(w.seconds, 1e-9)
    processes = " + ".join(f"{seconds / w.seconds:.2f}" for seconds in w.per_process)
    width = max(22, len(w.label))
    print(
        f"  {w.label:<{width}} offered {w.offered:<16} {w.turns:>6,} turns in {w.seconds:4.1f} s "
        f"= {w.rate:7,.1f} turns/s; turn p50 {ms(percentile(w.turn_time, 0.5))} p99 "
        f"{ms(percentile(w.turn_time, 0.99))} ms; errors {sum(w.errors.values())}"
    )
    line = (
        f"  {'':<{width}} server CPU {w.per_turn(w.server_cpu) * 1e3:5.2f} ms/turn ({cores:.2f} "
        f"cores: {processes}); clients {w.per_turn(w.client_cpu) * 1e3:5.2f} ms/turn "
        f"({w.client_cpu / w.seconds:.2f} cores)"
    )
    if w.store is not None:
        s = w.store
        line += (
            f"\n  {'':<{width}} store: redis CPU {w.per_turn(s['cpu']) * 1e3:5.2f} ms/turn "
            f"({s['cpu'] / w.seconds:.2f} cores); per turn {s['requests'] / max(w.turns, 1):.2f}"
            f" round trips, {s['in'] / max(w.turns, 1) / 1024:,.1f} KiB in, "
            f"{s['out'] / max(w.turns, 1) / 1024:,.2f} KiB out ("
            + ", ".join(
                f"{name} {calls / max(w.turns, 1):.2f}"
                for name, calls in sorted(s["by_command"].items(), key=lambda kv: -kv[1])
            )
            + " commands)"
        )
    line += (
        f"\n  {'':<{width}} the machine: {w.machine / w.seconds:.2f} cores busy, of which "
        f"{w.others / w.seconds:.2f} other processes'"
    )
    print(line, flush=True)
    for what, count in w.errors.most_common(5):
        print(f"  {'':<{width}}   {count:>6,}  {what}")


# -- one configuration ---------------------------------------------------------------------------


@dataclass
class Config:
    label: str
    workers: int
    store: Redis | None
    otel: str | None = None  # --tracing: bench/tracing.py's mode
    serve: Callable[[str, Path, dict[str, str]], AbstractAsyncContextManager[Served]] | None = None
    """Starts the server instead of ``vrt serve`` (label, log folder, the agent's
    environment): bench/asgi.py's hypercorn."""


@dataclass
class Result:
    config: Config
    paced: Window
    levels: list[Window]
    records: list[int] = field(default_factory=list)
    turns_per_session: float = 0.0
    problems: list[str] = field(default_factory=list)
    rolling: dict[str, Any] | None = None
    rounds: dict[str, list[Window]] = field(default_factory=dict)  # every window, by phase
    turns_total: int = 0  # every turn its clients finished, windows or not
    log: Path | None = None

    @property
    def saturated(self) -> Window:
        return max(self.levels, key=lambda w: w.rate)


@dataclass
class Running:
    """One configuration while the run goes on: its server, its clients, its windows."""

    config: Config
    served: Served
    fleet: LocalFleet | RemoteFleet
    clients: contextlib.AsyncExitStack  # closing it closes the sessions
    windows: dict[str, list[Window]] = field(default_factory=dict)


async def start_config(
    args: argparse.Namespace, config: Config, folder: Path, stack: contextlib.AsyncExitStack
) -> Running:
    """The configuration's ``vrt serve`` and its sessions, connected and idle."""
    store_url = config.store.url if config.store is not None else None
    served = await stack.enter_async_context(
        vrt_serve(
            config.label, config.workers, store_url, folder, env=agent_env(args), otel=config.otel
        )
        if config.serve is None
        else config.serve(config.label, folder, agent_env(args))
    )
    print(f"\n== {config.label}\nserver: {' '.join(shown(served.command))}")
    clients = contextlib.AsyncExitStack()
    stack.push_async_callback(clients.aclose)
    fleet = await clients.enter_async_context(
        fleet_of(args, served.url, args.client, recycle=args.recycle)
    )
    ramp = time.perf_counter()
    connected = await fleet.connect(args.sessions)
    spread = [sockets(pid) for pid in served.worker_pids().values()]
    print(
        f"  {connected:,} {args.client} sessions connected in {time.perf_counter() - ramp:.1f} s"
        f" (sockets per server process: {', '.join(map(str, spread))})",
        flush=True,
    )
    return Running(config, served, fleet, clients)


async def measure(args: argparse.Namespace, run: Running, phase: str, think: float, n: int) -> None:
    """One window of ``run``: ``n`` sessions at ``think`` (the others idle), then all idle."""
    await run.fleet.load(think, n)
    await trio.sleep(args.settle)
    a = await sample(run.served, run.fleet, run.config.store)
    await trio.sleep(args.window)
    b = await sample(run.served, run.fleet, run.config.store)
    await run.fleet.load(args.think, 0)
    offered = f"{n / think:,.0f} turns/s" if think else "above capacity"
    w = window(f"{phase} ({run.config.label})", offered, a, b)
    run.windows.setdefault(phase, []).append(w)
    print_window(w)


def merge(label: str, windows: list[Window]) -> Window:
    """Several windows of one configuration and phase as one: their sums."""
    first = windows[0]
    store = None
    if first.store is not None:
        by_command: Counter[str] = Counter()
        for w in windows:
            assert w.store is not None
            by_command.update(w.store["by_command"])
        store = {
            key: sum(w.store[key] for w in windows if w.store is not None)
            for key in ("requests", "commands", "in", "out", "cpu")
        }
        store["by_command"] = dict(by_command)
    return Window(
        label=label,
        offered=first.offered,
        seconds=sum(w.seconds for w in windows),
        turns=sum(w.turns for w in windows),
        server_cpu=sum(w.server_cpu for w in windows),
        per_process=[sum(parts) for parts in zip(*(w.per_process for w in windows), strict=False)],
        client_cpu=sum(w.client_cpu for w in windows),
        store=store,
        turn_time=[t for w in windows for t in w.turn_time],
        rtt=[t for w in windows for t in w.rtt],
        errors=sum((w.errors for w in windows), Counter()),
        machine=sum(w.machine for w in windows),
        others=sum(w.others for w in windows),
    )


async def run_configs(
    args: argparse.Namespace,
    configs: list[Config],
    folder: Path,
    after: Callable[[list[Running], list[Result]], Awaitable[None]] | None = None,
) -> list[Result]:
    """Every configuration's server and sessions at once, idle; then the windows, one
    configuration at a time, interleaved: for each round, for each phase (paced, then each
    level at think 0), each configuration in turn (in reverse order every other round), so
    that the windows compared are seconds apart, not minutes. ``after`` runs once the
    results are summed, the servers still up (``--py-spy``, ``--rolling``); then each
    server's log is read for warnings and errors."""
    phases = [("paced", args.think, args.sessions)]
    phases += [(f"think 0, {level} sessions", 0.0, level) for level in args.levels]
    results = []
    async with contextlib.AsyncExitStack() as stack:
        runs = [await start_config(args, config, folder, stack) for config in configs]
        for round_ in range(args.rounds):
            print(f"\n-- round {round_ + 1} of {args.rounds}")
            order = runs if round_ % 2 == 0 else runs[::-1]
            for phase, think, n in phases:
                for run in order:
                    await measure(args, run, phase, think, n)
        if args.tracing:
            await trio.sleep(2)  # the last turns end: every span is counted against a turn
        print(f"\n-- every round together ({args.rounds} windows of each)")
        for run in runs:
            merged = {phase: merge(phase, ws) for phase, ws in run.windows.items()}
            for w in merged.values():
                w.label = f"{w.label} ({run.config.label})"
                print_window(w)
            levels = [merged[phase] for phase, _, _ in phases[1:]]
            for w, (phase, _, _) in zip(levels, phases[1:], strict=True):
                w.label = phase
            merged["paced"].label = "paced"
            result = Result(run.config, merged["paced"], levels)
            result.rounds = run.windows
            end = await run.fleet.sample()
            result.turns_per_session = end["turns"] / max(1, end["sessions"])
            result.turns_total = end["turns"]
            result.log = run.served.log
            if run.config.store is not None:
                result.records = run.config.store.session_records(run.served.pids())
            results.append(result)
        if after is not None:
            await after(runs, results)
        for run, result in zip(runs, results, strict=True):
            result.problems = run.served.log_problems()
            if result.problems:
                print(
                    f"  {run.config.label}: the server's log holds {len(result.problems)} "
                    "warnings or errors, e.g."
                )
                for line in result.problems[:5]:
                    print(f"    {line}")
    return results


def agent_env(args: argparse.Namespace) -> dict[str, str]:
    """What bench/agents.py's ``agent`` reads: steps a turn, turns in its script."""
    return {"VRT_LOAD_STEPS": str(args.steps), "VRT_LOAD_TURNS": str(args.script_turns)}


def print_rounds(results: list[Result]) -> None:
    """The target ratios of each round on its own: the spread within the run."""
    base, scaled = results[0], results[-1]
    print(f"\n== each round on its own: {scaled.config.label} against {base.config.label}")
    for i in range(len(base.rounds["paced"])):

        def best(result: Result, i: int = i) -> Window:
            levels = [ws[i] for phase, ws in result.rounds.items() if phase != "paced"]
            return max(levels, key=lambda w: w.rate)

        def cpu(w: Window) -> float:
            return w.per_turn(w.server_cpu + (w.store["cpu"] if w.store else 0.0))

        b, s = best(base), best(scaled)
        bp, sp = base.rounds["paced"][i], scaled.rounds["paced"][i]
        print(
            f"  round {i + 1}: saturation turns/s {s.rate:,.1f} / {b.rate:,.1f} = "
            f"{s.rate / b.rate:.2f}x; CPU per turn paced {cpu(sp) / cpu(bp):.2f}x, at "
            f"saturation {cpu(s) / cpu(b):.2f}x"
        )
