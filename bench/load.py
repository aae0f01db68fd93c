"""Load: many concurrent vrt/1 sessions over loopback; round trips, memory, CPU and errors.

Run it as ``python -m bench.load`` from the repository's root (``--quick`` for a smoke run,
``--soak MINUTES`` for a soak, ``--clients-process`` to run the clients in a second
process, ``--help`` for the knobs). A :func:`vrt.serve` server on 127.0.0.1 (port 0) and
``--sessions`` clients (:func:`vrt.connect`), by default all in one ``trio.run`` in one
process. What it measures:

* **The workload.** The agent's :class:`vrt.ScriptedModel` gives each turn ``--steps``
  model steps; each step says a few words, calls the server tool ``lookup`` (``risk="low"``,
  a two-field JSON Schema, arguments in 2 ``arguments-delta`` fragments, answers at once)
  and then the app tool ``show`` (hosted by the client, answers at once); an empty step
  ends the turn. Each client subscribes and reads every event. It sends a turn's input,
  reads to the turn's ``turn.ended``, waits ``--think`` seconds (0.5-1.5x at random; the
  first wait is 0-1x, so sessions do not start in step) and sends the next: the offered
  load is ``--sessions / --think`` turns per second.
* **Ramp.** Sessions connect ``--batch`` at a time; a batch starts once the previous one
  has finished its handshakes, so the listen backlog never holds more than a batch.
* **RSS per idle session.** VmRSS (``/proc/self/status``, after ``gc.collect()``) once
  every session is connected, subscribed and idle, minus VmRSS before the first of them
  connected (after a warm-up session that ran a turn and left), over the sessions. In one
  process the figure covers both ends of every session (the server's session and the
  client); with ``--clients-process`` each process reports its own side. Then a window of
  ``--idle`` seconds with every session idle: CPU (``time.process_time``) and the garbage
  collector's work in it.
* **App-tool round trip**, taken on the client: from the moment the session's task reads
  the app call's ``arguments-complete`` event to the moment it reads the call's
  ``settled`` event (``tool.call`` down, the app tool's run, ``tool.result`` up,
  ``settled`` down, and every wait for the thread in between). A second figure starts
  when the app tool's run starts. p50 and p99 are over every app call of every session.
  A pause that holds the thread before the client reads ``arguments-complete`` is not
  in that interval; the third figure, a whole turn (input sent -> ``turn.ended`` read),
  shows it.
* **Errors.** Any ``error`` frame a client receives (vrt's client logs each one; a
  logging handler counts them), a ``Closed`` before the client leaves, a call that ends
  other than ``settled`` ok, a turn that ends other than ``finished`` or with other calls
  than the script's, a turn slower than ``--turn-timeout``, a failed connection, any
  exception in a session's task, and anything vrt logs at WARNING or above.
* **CPU and GC per phase.** ``time.process_time`` over the phase's wall time, and the
  time ``gc.callbacks`` see the collector spend per generation (full collections apart).
* **Soak** (``--soak MINUTES``). After the measured turns the same sessions go on running
  turns at ``--soak-think`` (a modest rate) for that long; every ``--every`` seconds a row
  shows RSS (after ``gc.collect()``), the interval's turns and app-tool round trips, and
  the errors so far. ``--recycle N`` makes every client leave and reconnect after N soak
  turns (a fresh session), to tell a leak from a history that grows. The flat-memory
  verdict compares the last row with the middle one: recycled sessions reach their steady
  state (histories of up to N turns) in the first half. The clients keep
  five floats per turn for the percentiles (about 150 B per turn in their process).

``--gc-threshold N`` (``gc.set_threshold(N)``) and ``--gc-freeze`` (``gc.freeze()`` once
the sessions are idle) are the application's own GC tuning, off by default, to compare.

``--workers N``, ``--store URL`` (or ``auto``), ``--compare`` and ``--rolling`` run the
server as ``vrt serve`` processes instead, with a store, and compare configurations in one
run (bench/serving.py; bench/README.md, "Serving in production").

``--tracing`` runs one worker without a store as ``vrt serve`` and again through
bench/tracing.py, which installs the OpenTelemetry SDK in the server's process first
(``--tracing-modes``: traces, traces+metrics), the windows interleaved; server CPU per turn
traced over untraced, per round and over the run, and the spans the SDK exported against
the turns the clients finished (bench/README.md, "Tracing on against off").

``--profile`` (cProfile of the measured turns, one process) and ``--tracemalloc``
(allocation sites of the idle sessions, and of the soak's growth) find where a figure
comes from. Wall time is printed per phase and in total.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import json
import logging
import os
import platform
import pstats
import random
import resource
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import trio

import vrt
from bench.agents import SHOW_PARAMETERS, make_agent
from bench.harness import ROOT, ms, percentile, verdict, version, vrt_from

HOST = "127.0.0.1"
TARGET_SESSIONS = 1000
TARGET_P99 = 0.250
TARGET_IDLE_KB = 50.0
TARGET_SOAK_GROWTH = 0.02
"""Flat memory: the soak's last RSS row at most 2% above its first."""


SERVE_OPTIONS = {"max_sessions_per_peer": 100_000}
"""vrt.serve's defaults, but every session comes from one address here (127.0.0.1)."""


@dataclass
class Tally:
    """One session's app calls in flight, on the client (perf_counter by call id)."""

    complete: dict[str, float] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)


SESSION: ContextVar[Tally] = ContextVar("SESSION")
"""The session whose client runs the app tool: set in the session's task before
``vrt.connect``, whose runner task inherits it (a Trio task starts with a copy of the
context of the task that spawned it), so one app tool serves every client."""


@vrt.app_tool(description="Shows an item", parameters=SHOW_PARAMETERS)
async def show(args: Any, ctx: vrt.ToolContext) -> Any:
    """The app tool: notes when its run starts and answers at once."""
    SESSION.get().started[ctx.call_id] = time.perf_counter()
    return {"shown": args["id"]}


# -- figures -------------------------------------------------------------------------------------


@dataclass
class Stats:
    """What the clients saw in one phase."""

    connected: int = 0
    turns: int = 0
    calls: Counter[str] = field(default_factory=Counter)  # settled ok, by kind
    rtt: list[float] = field(default_factory=list)  # arguments-complete -> settled
    run_rtt: list[float] = field(default_factory=list)  # the app tool's run -> settled
    turn_time: list[float] = field(default_factory=list)  # input sent -> turn.ended read
    errors: Counter[str] = field(default_factory=Counter)

    def error(self, what: str) -> None:
        self.errors[what] += 1

    def to_json(self, since: int = 0) -> dict[str, Any]:
        return {
            "connected": self.connected,
            "turns": self.turns,
            "calls": dict(self.calls),
            "rtt": self.rtt[since:],
            "run_rtt": self.run_rtt[since:],
            "turn_time": self.turn_time[since:],
            "errors": dict(self.errors),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Stats:
        return cls(
            connected=data["connected"],
            turns=data["turns"],
            calls=Counter(data["calls"]),
            rtt=data["rtt"],
            run_rtt=data["run_rtt"],
            turn_time=data["turn_time"],
            errors=Counter(data["errors"]),
        )


class LogCounter(logging.Handler):
    """Counts what vrt logs: each ``error`` frame a client received (vrt's client logs it
    at INFO as ``server error CODE: ...``) and anything at WARNING or above."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.errors: Counter[str] = Counter()
        self.samples: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == "server error %s: %s (ref %s)" and isinstance(record.args, tuple):
            self.errors[f"error frame {record.args[0]}"] += 1
        elif record.levelno >= logging.WARNING:
            self.errors[f"{record.name} logged {record.levelname}"] += 1
        else:
            return
        if len(self.samples) < 5:
            self.samples.append(f"{record.name}: {record.getMessage()}"[:200])


def count_logs() -> LogCounter:
    handler = LogCounter()
    logger = logging.getLogger("vrt")
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    logger.propagate = False  # counted, not printed: a thousand tracebacks say less
    return handler


class GcClock:
    """Collections and seconds the garbage collector spends, per generation."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            generation = info["generation"]
            self.count[generation] += 1
            self.seconds[generation] += time.perf_counter() - self._start


GC = GcClock()


@dataclass
class Meter:
    """Wall, CPU and GC of one phase of one process."""

    wall: float = 0.0
    cpu: float = 0.0
    young: float = 0.0  # seconds in generation 0 and 1 collections
    full: int = 0  # full (generation 2) collections
    full_seconds: float = 0.0

    @classmethod
    def start(cls) -> Meter:
        return cls(
            wall=time.perf_counter(),
            cpu=time.process_time(),
            young=GC.seconds[0] + GC.seconds[1],
            full=GC.count[2],
            full_seconds=GC.seconds[2],
        )

    def stop(self) -> Meter:
        return Meter(
            wall=time.perf_counter() - self.wall,
            cpu=time.process_time() - self.cpu,
            young=GC.seconds[0] + GC.seconds[1] - self.young,
            full=GC.count[2] - self.full,
            full_seconds=GC.seconds[2] - self.full_seconds,
        )

    def describe(self) -> str:
        gc_seconds = self.young + self.full_seconds
        each = f", {self.full_seconds / self.full * 1e3:,.0f} ms each" if self.full else ""
        return (
            f"CPU {self.cpu:,.1f} s in {self.wall:,.1f} s ({self.cpu / self.wall:.0%} of one "
            f"core); GC {gc_seconds:,.1f} s ({gc_seconds / max(self.cpu, 1e-9):.0%} of the "
            f"CPU): {self.full} full collections{each}, {self.young:,.1f} s young"
        )


def traced() -> tracemalloc.Snapshot:
    """What Python has allocated, after a full collection (cyclic garbage would count)."""
    gc.collect()
    return tracemalloc.take_snapshot()


def rss_kb() -> int:
    """This process's VmRSS, in kB, after a full collection."""
    gc.collect()
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def raise_open_files() -> tuple[int, int]:
    """Raise the soft limit on open files to the hard limit; return (soft, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            print(f"could not raise the open-files limit: {exc}", file=sys.stderr)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft, hard


# -- one session ---------------------------------------------------------------------------------


class SessionEnded(Exception):
    """The session cannot go on (the reason is counted already)."""


@dataclass
class Plan:
    """What every session does, the signals they share, the Stats of the current phase."""

    url: str
    steps: int
    think: float
    turns: int
    turn_timeout: float
    connect_timeout: float
    soak_think: float
    recycle: int
    rng: random.Random
    stats: Stats = field(default_factory=Stats)
    go: trio.Event = field(default_factory=trio.Event)
    soak: trio.Event = field(default_factory=trio.Event)
    soak_until: float = 0.0  # trio.current_time() at which soak turns stop
    measuring: int = 0  # sessions still in their measured turns
    measured: trio.Event = field(default_factory=trio.Event)
    leave: trio.Event = field(default_factory=trio.Event)


class Progress:
    """One client's way through the plan."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.measuring = True

    def done_measuring(self) -> None:
        if self.measuring:
            self.measuring = False
            self.plan.measuring -= 1
            if self.plan.measuring == 0:
                self.plan.measured.set()


async def one_turn(
    client: vrt.Client, events: vrt.Subscription[vrt.Event], tally: Tally, plan: Plan
) -> None:
    """Send an input and read the turn's events up to its ``turn.ended``."""
    s = plan.stats
    sent = time.perf_counter()
    await client.send_text("show me the next one")
    calls: Counter[str] = Counter()
    with trio.move_on_after(plan.turn_timeout):
        async for event in events:
            now = time.perf_counter()
            if isinstance(event, vrt.ToolStream):
                phase = event.phase
                if phase is vrt.Phase.ARGUMENTS_COMPLETE:
                    if event.kind == "app":
                        tally.complete[event.call_id] = now
                elif phase is vrt.Phase.SETTLED:
                    if not event.ok:
                        s.error(f"{event.kind} call settled {event.code}")
                        continue
                    calls[event.kind] += 1
                    if event.kind == "app":
                        s.rtt.append(now - tally.complete.pop(event.call_id))
                        s.run_rtt.append(now - tally.started.pop(event.call_id))
                elif phase is vrt.Phase.CANCELLED or phase is vrt.Phase.FAILED:
                    s.error(f"{event.kind} call {phase}")
            elif isinstance(event, vrt.TurnEnded):
                if event.reason != "finished":
                    s.error(f"turn ended {event.reason}")
                elif calls["app"] != plan.steps or calls["server"] != plan.steps:
                    s.error(f"turn ended with {dict(calls)} calls settled")
                else:
                    s.turns += 1
                    s.calls.update(calls)
                    s.turn_time.append(now - sent)
                return
            elif isinstance(event, vrt.Closed):
                s.error(f"closed ({event.reason})")
                raise SessionEnded
        s.error("the events ended before turn.ended")
        raise SessionEnded
    s.error(f"a turn took over {plan.turn_timeout:g} s")
    raise SessionEnded


async def run_session(
    plan: Plan, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """One client: connect, report started, run the measured turns after ``plan.go``, the
    soak's after ``plan.soak`` (in a new session every ``plan.recycle`` turns), leave."""
    progress = Progress(plan)
    try:
        ok = await _connection(plan, progress, task_status)
        while ok and plan.recycle and trio.current_time() < plan.soak_until:
            ok = await _connection(plan, progress, None)
    finally:
        progress.done_measuring()


async def _connection(
    plan: Plan, progress: Progress, task_status: trio.TaskStatus[None] | None
) -> bool:
    """One connection of a client (the first if ``task_status``); True if it did all it
    had to do."""
    SESSION.set(tally := Tally())
    started = False
    rng = plan.rng
    try:
        with trio.CancelScope(deadline=trio.current_time() + plan.connect_timeout) as scope:
            async with vrt.connect(plan.url, tools=[show]) as client:
                async with client.subscribe() as events:
                    scope.deadline = float("inf")
                    started = True
                    if task_status is not None:
                        plan.stats.connected += 1
                        task_status.started()
                        await plan.go.wait()
                        wait = rng.uniform(0.0, plan.think)
                        for _ in range(plan.turns):
                            await trio.sleep(wait)
                            await one_turn(client, events, tally, plan)
                            wait = plan.think * rng.uniform(0.5, 1.5)
                        progress.done_measuring()
                        await plan.soak.wait()
                    turns = 0
                    wait = rng.uniform(0.0, plan.soak_think)
                    while trio.current_time() + wait < plan.soak_until:
                        await trio.sleep(wait)
                        await one_turn(client, events, tally, plan)
                        wait = plan.soak_think * rng.uniform(0.5, 1.5)
                        turns += 1
                        if turns == plan.recycle:
                            break
                    else:  # every session stays until the last soak row is taken
                        await plan.leave.wait()
        if scope.cancelled_caught:
            plan.stats.error("connect timed out")
            return False
        return True
    except SessionEnded:
        return False
    except Exception as exc:
        plan.stats.error(f"{type(exc).__name__}: {exc}"[:120])
        return False
    finally:
        if not started and task_status is not None:
            task_status.started()


async def warm_up(url: str, steps: int) -> None:
    """One session, one turn: imports, compiled validators, caches, before RSS is read."""
    plan = Plan(
        url=url,
        steps=steps,
        think=0.0,
        turns=1,
        turn_timeout=30.0,
        connect_timeout=30.0,
        soak_think=0.0,
        recycle=0,
        rng=random.Random(0),
    )
    plan.go.set()
    plan.soak.set()
    plan.leave.set()
    plan.measuring = 1
    await run_session(plan)
    if plan.stats.errors or plan.stats.turns != 1:
        raise RuntimeError(f"the warm-up session failed: {dict(plan.stats.errors)}")


# -- the clients, in this process or in a second one ---------------------------------------------


class Hooks:
    """Where the clients report to, and where the go comes from."""

    async def connected(self, side: dict[str, Any]) -> None:
        """Every session is connected and idle; return when the turns may start."""
        raise NotImplementedError

    async def measured(self, s: Stats, side: dict[str, Any]) -> None:
        raise NotImplementedError

    async def tick(self, s: Stats, side: dict[str, Any]) -> None:
        """A soak row: the soak's turns so far, the interval's round trips."""
        raise NotImplementedError

    async def done(self, measured: Stats, soak: Stats, side: dict[str, Any]) -> None:
        raise NotImplementedError


async def drive(args: argparse.Namespace, url: str, hooks: Hooks) -> None:
    """Warm up, ramp, measure idle, run the turns, soak, leave; report to ``hooks``."""
    await warm_up(url, args.steps)
    snapshot = None
    if args.tracemalloc:
        tracemalloc.start(1)
        snapshot = traced()
    before = rss_kb()
    plan = Plan(
        url=url,
        steps=args.steps,
        think=args.think,
        turns=args.turns,
        turn_timeout=args.turn_timeout,
        connect_timeout=args.connect_timeout,
        soak_think=args.soak_think,
        recycle=args.recycle,
        rng=random.Random(args.seed),
    )
    plan.measuring = args.sessions
    measured = plan.stats
    soak = Stats()
    async with trio.open_nursery() as nursery:
        ramp = Meter.start()
        for first in range(0, args.sessions, args.batch):
            async with trio.open_nursery() as batch:
                for _ in range(first, min(args.sessions, first + args.batch)):
                    batch.start_soon(nursery.start, run_session, plan)
        side: dict[str, Any] = {"ramp": ramp.stop().wall, "before": before, "after": rss_kb()}
        if args.gc_freeze:
            gc.freeze()  # every object so far: never traversed by a collection again
        if snapshot is not None:
            print_tracemalloc(snapshot, traced(), args.sessions, "idle")
            _out("(RSS figures include tracemalloc's own memory)")
        idle = Meter.start()
        await trio.sleep(args.idle)
        side["idle"] = idle.stop().__dict__
        await hooks.connected(side)

        turns = Meter.start()
        profiler = cProfile.Profile() if args.profile else None
        if profiler is not None:
            profiler.enable()
        plan.go.set()
        if plan.measuring:
            await plan.measured.wait()
        if profiler is not None:
            profiler.disable()
            print_profile(profiler, args.top)
        await hooks.measured(measured, {"turns": turns.stop().__dict__})

        soaked = None
        if args.soak:
            plan.stats = soak
            plan.soak_until = trio.current_time() + args.soak * 60
            snapshot = traced() if args.tracemalloc else None
            soaked = Meter.start()
            plan.soak.set()
            since = 0
            while trio.current_time() < plan.soak_until:
                await trio.sleep(min(args.every, plan.soak_until - trio.current_time()))
                interval = Stats(turns=soak.turns, rtt=soak.rtt[since:], errors=soak.errors)
                since = len(soak.rtt)
                await hooks.tick(interval, {"rss": rss_kb()})
            soaked = soaked.stop()
            if snapshot is not None:
                done = traced()
                print_tracemalloc(snapshot, done, max(1, soak.turns), "soak, per soak turn")
        plan.soak.set()
        plan.leave.set()
        leave = time.perf_counter()
    side = {"leave": time.perf_counter() - leave}
    if soaked is not None:
        side["soak"] = soaked.__dict__
    await hooks.done(measured, soak, side)


# -- printing ------------------------------------------------------------------------------------


def meter(data: dict[str, Any]) -> Meter:
    return Meter(**data)


OUT = sys.stdout
"""Where --profile and --tracemalloc print (stderr in the clients' process, whose stdout
carries its JSON lines)."""


def _out(*parts: str) -> None:
    print(*parts, file=OUT)


def print_profile(profiler: cProfile.Profile, top: int) -> None:
    raw: dict[Any, Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in raw.values())
    _out()
    _out(f"profile of the measured turns: top {top} by tottime ({total:,.1f} s profiled)")
    rows = sorted(raw.items(), key=lambda item: item[1][2], reverse=True)[:top]
    for (filename, line, name), (_cc, ncalls, tottime, cumtime, _callers) in rows:
        where = "/".join(filename.split("/")[-2:])
        _out(
            f"  {tottime:7.2f} s {tottime / total:6.1%} cum {cumtime:7.2f} s {ncalls:>10,}  "
            f"{name} ({where}:{line})"
        )


def print_tracemalloc(
    before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, n: int, label: str
) -> None:
    """The allocation sites that grew between two snapshots, per session (or per turn)."""
    stats = after.compare_to(before, "lineno")
    total = sum(stat.size_diff for stat in stats)
    _out()
    _out(f"tracemalloc ({label}): {total / n:,.0f} B per unit between the snapshots")
    files: Counter[str] = Counter()
    for stat in stats:
        files["/".join(stat.traceback[0].filename.split("/")[-2:])] += stat.size_diff
    for name, size in files.most_common(15):
        _out(f"  {size / n:>9,.0f} B  {name}")
    _out("  top lines:")
    for stat in stats[:20]:
        frame = stat.traceback[0]
        where = "/".join(frame.filename.split("/")[-2:])
        _out(
            f"  {stat.size_diff / n:>9,.0f} B {stat.count_diff / n:>7.1f} blocks  "
            f"{where}:{frame.lineno}"
        )


def print_idle(sides: dict[str, dict[str, Any]], sessions: int) -> dict[str, float]:
    """RSS per idle session and the idle window, per process; return kB per session."""
    per_idle = {}
    for name, side in sides.items():
        per = (side["after"] - side["before"]) / max(1, sessions)
        per_idle[name] = per
        idle = meter(side["idle"])
        print(
            f"  {name}: RSS {side['before'] / 1024:,.1f} MB before, {side['after'] / 1024:,.1f}"
            f" MB with every session idle: {per:,.1f} kB per idle session\n"
            f"    idle {idle.describe()}"
        )
    return per_idle


def print_turns(s: Stats, label: str, seconds: float) -> None:
    rtt, run = s.rtt, s.run_rtt
    print(
        f"  {label}: {s.turns:,} turns completed in {seconds:,.1f} s "
        f"({s.turns / max(seconds, 1e-9):,.1f} turns/s); calls settled ok: "
        f"{s.calls['server']:,} server, {s.calls['app']:,} app"
    )
    print(
        f"  app-tool round trip, {len(rtt):,} calls, ms: arguments-complete -> settled p50 "
        f"{ms(percentile(rtt, 0.5))}, p99 {ms(percentile(rtt, 0.99))}, max "
        f"{ms(max(rtt, default=float('nan')))}\n    (the app tool's run starts -> settled:"
        f" p50 {ms(percentile(run, 0.5))}, p99 {ms(percentile(run, 0.99))}; a whole turn, "
        f"input sent -> turn.ended read: p50 {ms(percentile(s.turn_time, 0.5))}, p99 "
        f"{ms(percentile(s.turn_time, 0.99))})"
    )


def print_errors(errors: Counter[str], samples: Sequence[str]) -> None:
    total = sum(errors.values())
    print(f"  errors: {total:,}" + ("" if total else " (none)"))
    for what, count in errors.most_common(10):
        print(f"    {count:>7,}  {what}")
    for sample in samples[:5]:
        print(f"    e.g. {sample}")


class Printer:
    """Prints the figures as the processes report them, and the targets at the end."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.per_idle: dict[str, float] = {}
        self.soak_rows: list[dict[str, int]] = []
        self.soak_turns: list[int] = []  # soak turns completed at each row
        self.measured = Stats()
        self.soak = Stats()
        self.start = time.perf_counter()
        self.times: dict[str, float] = {}
        self._tick = time.perf_counter()
        self._turns = 0

    def connected(self, sides: dict[str, dict[str, Any]]) -> None:
        ramp = max(side["ramp"] for side in sides.values())
        self.times["ramp"] = ramp
        print(f"\nconnected: {self.args.sessions:,} sessions in {ramp:,.1f} s")
        self.per_idle = print_idle(sides, self.args.sessions)
        self.start = time.perf_counter()

    def measured_turns(self, s: Stats, sides: dict[str, dict[str, Any]]) -> None:
        self.measured = s
        turns = {name: meter(side["turns"]) for name, side in sides.items()}
        wall = max(m.wall for m in turns.values())
        self.times["turns"] = wall
        offered = self.args.sessions / self.args.think if self.args.think else float("inf")
        print(
            f"\nturns: offered {offered:,.0f} turns/s ({self.args.sessions:,} sessions, think "
            f"{self.args.think:g} s)"
        )
        print_turns(s, f"{s.connected:,} sessions", wall)
        wanted = self.args.sessions * self.args.turns
        print(
            f"  completed {s.turns:,} of the {wanted:,} turns offered (the rate above is "
            "bounded by the think times and the last session's tail, not by the server)"
        )
        for name, m in turns.items():
            print(f"  {name}: {m.describe()}")
            # CPU per turn: comparable across commits and machines' load, saturated or not
            per_turn = m.cpu / max(s.turns, 1) * 1e3
            gc_share = (m.young + m.full_seconds) / max(m.cpu, 1e-9)
            print(f"    {name} CPU per turn {per_turn:,.2f} ms ({gc_share:.0%} of it in GC)")
        print_errors(s.errors, [])
        self.start = time.perf_counter()  # the soak starts now

    def tick(self, s: Stats, rss: dict[str, int]) -> None:
        now = time.perf_counter()
        if not self.soak_rows:
            self._tick = self.start
            self._turns = 0
            print(
                f"\nsoak: {self.args.sessions:,} sessions, think {self.args.soak_think:g} s "
                f"(offered {self.args.sessions / self.args.soak_think:,.0f} turns/s)"
                + (f", a new session every {self.args.recycle} turns" if self.args.recycle else "")
                + "\n  a row per interval: RSS after gc.collect(); the interval's turns, app-tool"
                " round trips; errors so far"
            )
            print(
                f"  {'min':>5}"
                + "".join(f"  {'RSS MB, ' + name:>{max(20, len(name) + 8)}}" for name in rss)
                + f"{'turns':>8}{'turns/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}"
            )
        self.soak_rows.append(rss)
        self.soak_turns.append(s.turns)
        span, self._tick = now - self._tick, now
        turns, self._turns = s.turns - self._turns, s.turns
        print(
            f"  {(now - self.start) / 60:>5.1f}"
            + "".join(f"  {kb / 1024:>{max(20, len(name) + 8)},.1f}" for name, kb in rss.items())
            + f"{turns:>8,}{turns / max(span, 1e-9):>9,.1f}{ms(percentile(s.rtt, 0.5)):>9}"
            f"{ms(percentile(s.rtt, 0.99)):>9}{sum(s.errors.values()):>8,}",
            flush=True,
        )

    def done(self, s: Stats, sides: dict[str, dict[str, Any]]) -> None:
        leave = max(side["leave"] for side in sides.values())
        if not self.soak_rows:
            self.times["leave"] = leave
            return
        self.soak = s
        soak = {name: meter(side["soak"]) for name, side in sides.items()}
        wall = max(m.wall for m in soak.values())
        self.times["soak"] = wall
        self.times["leave"] = leave
        print("\nsoak, all of it")
        print_turns(s, "soak", wall)
        for name, m in soak.items():
            print(f"  {name}: {m.describe()}")
        turns = self.soak_turns[-1] - self.soak_turns[0]
        for name in self.soak_rows[0]:
            grew = self.soak_rows[-1][name] - self.soak_rows[0][name]
            print(
                f"  {name}: RSS {grew / 1024:+,.1f} MB from the first row to the last, over "
                f"{turns:,} turns: {grew * 1024 / max(1, turns):+,.0f} B per turn"
            )
        print_errors(s.errors, [])

    def final(self, errors: Counter[str], samples: Sequence[str], wall: float) -> None:
        args, s = self.args, self.measured
        total = Counter(s.errors) + Counter(self.soak.errors) + errors
        print("\nfinal")
        print(f"  sessions connected: {s.connected:,} of {args.sessions:,}")
        print_errors(total, samples)
        print(
            f"  wall time {wall:,.1f} s ("
            + ", ".join(f"{phase} {seconds:,.1f} s" for phase, seconds in self.times.items())
            + ")"
        )
        p99 = percentile([*s.rtt, *self.soak.rtt], 0.99)
        print("\ntargets (every turn, measured and soak):")
        ok = s.connected >= TARGET_SESSIONS and s.connected == args.sessions
        print(f"  {TARGET_SESSIONS:,} concurrent sessions{'':31}{s.connected:>9,}  {verdict(ok)}")
        count = sum(total.values())
        print(f"  zero errors{'':42}{count:>9,}  {verdict(count == 0)}")
        label = f"app-tool round trip p99 < {TARGET_P99 * 1e3:.0f} ms"
        print(f"  {label:53}{ms(p99):>9} ms  {verdict(p99 < TARGET_P99)}")
        for name, per in self.per_idle.items():
            label = f"RSS per idle session <= {TARGET_IDLE_KB:.0f} kB ({name})"
            print(f"  {label:53}{per:>9,.1f} kB  {verdict(per <= TARGET_IDLE_KB)}")
        if self.soak_rows:
            # The second half: sessions that recycle reach their steady state first (their
            # histories fill up to --recycle turns), sessions that go on keep growing.
            rows = self.soak_rows
            for name in rows[0]:
                first, last = rows[(len(rows) - 1) // 2][name], rows[-1][name]
                growth = last / first - 1
                label = f"soak: flat RSS over its second half ({name})"
                print(f"  {label:53}{growth:>+9.1%}  {verdict(growth <= TARGET_SOAK_GROWTH)}")


# -- one process ---------------------------------------------------------------------------------


class LocalHooks(Hooks):
    """Server and clients in this process: print as it comes."""

    NAME = "server and clients"

    def __init__(self, printer: Printer) -> None:
        self.printer = printer

    async def connected(self, side: dict[str, Any]) -> None:
        self.printer.connected({self.NAME: side})

    async def measured(self, s: Stats, side: dict[str, Any]) -> None:
        self.printer.measured_turns(s, {self.NAME: side})

    async def tick(self, s: Stats, side: dict[str, Any]) -> None:
        self.printer.tick(s, {self.NAME: side["rss"]})

    async def done(self, measured: Stats, soak: Stats, side: dict[str, Any]) -> None:
        self.printer.done(soak, {self.NAME: side})


async def one_process(args: argparse.Namespace, printer: Printer) -> None:
    async with trio.open_nursery() as nursery:
        agent = make_agent(args.steps, args.script_turns)
        server = await nursery.start(functools.partial(vrt.serve, agent, HOST, 0, **SERVE_OPTIONS))
        await drive(args, server.url, LocalHooks(printer))
        nursery.cancel_scope.cancel()


# -- two processes: the server here, the clients in a child --------------------------------------


class ChildHooks(Hooks):
    """In the clients' process: JSON lines on stdout; the go read from stdin."""

    def __init__(self, logs: LogCounter) -> None:
        self.logs = logs

    def _say(self, kind: str, **data: Any) -> None:
        print(json.dumps({"kind": kind, **data}), flush=True)

    async def connected(self, side: dict[str, Any]) -> None:
        self._say("connected", side=side)
        if await trio.to_thread.run_sync(sys.stdin.readline) != "go\n":
            raise RuntimeError("the server's process did not say go")

    async def measured(self, s: Stats, side: dict[str, Any]) -> None:
        self._say("measured", stats=s.to_json(), side=side)

    async def tick(self, s: Stats, side: dict[str, Any]) -> None:
        self._say("tick", stats=s.to_json(), side=side)

    async def done(self, measured: Stats, soak: Stats, side: dict[str, Any]) -> None:
        self._say(
            "done",
            soak=soak.to_json(),
            side=side,
            errors=dict(self.logs.errors),
            samples=self.logs.samples,
        )


def child_command(args: argparse.Namespace, url: str) -> list[str]:
    """This script, as the clients' process, with the same workload."""
    forwarded = {
        "sessions": args.sessions,
        "turns": args.turns,
        "steps": args.steps,
        "think": args.think,
        "batch": args.batch,
        "idle": args.idle,
        "soak": args.soak,
        "soak-think": args.soak_think,
        "every": args.every,
        "recycle": args.recycle,
        "turn-timeout": args.turn_timeout,
        "connect-timeout": args.connect_timeout,
        "seed": args.seed,
        "gc-threshold": args.gc_threshold,
    }
    flags = [name for name in ("gc_freeze", "tracemalloc") if getattr(args, name)]
    return [
        sys.executable,
        "-m",
        "bench.load",
        "--role=clients",
        f"--url={url}",
        *(f"--{name}={value}" for name, value in forwarded.items()),
        *(f"--{name.replace('_', '-')}" for name in flags),
    ]


async def _lines(stream: trio.abc.ReceiveStream) -> AsyncIterator[dict[str, Any]]:
    buffer = b""
    async for chunk in stream:
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield json.loads(line)


async def two_processes(
    args: argparse.Namespace, printer: Printer
) -> tuple[Counter[str], list[str]]:
    """The server in this process, the clients in a child reporting in JSON lines; return
    the child's logged errors and samples."""
    errors: Counter[str] = Counter()
    samples: list[str] = []
    async with trio.open_nursery() as nursery:
        agent = make_agent(args.steps, args.script_turns)
        server = await nursery.start(functools.partial(vrt.serve, agent, HOST, 0, **SERVE_OPTIONS))
        await warm_up(server.url, args.steps)
        snapshot = last = None
        if args.tracemalloc:
            tracemalloc.start(1)
            snapshot = traced()
        mine: dict[str, Any] = {"before": rss_kb()}
        ramp = Meter.start()
        process = await trio.lowlevel.open_process(
            child_command(args, server.url), cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert process.stdin is not None
        assert process.stdout is not None
        phase = Meter.start()
        async for data in _lines(process.stdout):
            kind = data["kind"]
            if kind == "connected":
                mine.update(ramp=ramp.stop().wall, after=rss_kb())
                if snapshot is not None:
                    now = traced()
                    print_tracemalloc(snapshot, now, args.sessions, "server process, idle")
                    snapshot = None
                idle = Meter.start()
                await trio.sleep(args.idle)
                mine["idle"] = idle.stop().__dict__
                printer.connected({"server process": mine, "clients process": data["side"]})
                phase = Meter.start()
                await process.stdin.send_all(b"go\n")
            elif kind == "measured":
                sides = {"server process": {"turns": phase.stop().__dict__}}
                sides["clients process"] = data["side"]
                printer.measured_turns(Stats.from_json(data["stats"]), sides)
                if args.tracemalloc and args.soak:
                    snapshot = traced()
                phase = Meter.start()
            elif kind == "tick":
                rss = {"server": rss_kb(), "clients": data["side"]["rss"]}
                if snapshot is not None:
                    last = traced()  # the sessions are still there
                printer.tick(Stats.from_json(data["stats"]), rss)
            elif kind == "done":
                mine = {"leave": 0.0}
                if "soak" in data["side"]:
                    mine["soak"] = phase.stop().__dict__
                sides = {"server process": mine, "clients process": data["side"]}
                soak = Stats.from_json(data["soak"])
                if snapshot is not None and last is not None:
                    turns = max(1, soak.turns)
                    print_tracemalloc(snapshot, last, turns, "server process, per soak turn")
                printer.done(soak, sides)
                errors.update(data["errors"])
                samples.extend(data["samples"])
        if await process.wait() != 0:
            errors["the clients' process failed"] += 1
        nursery.cancel_scope.cancel()
    return errors, samples


async def clients_child(args: argparse.Namespace) -> None:
    global OUT
    OUT = sys.stderr
    await drive(args, args.url, ChildHooks(count_logs()))


# -- main ----------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Many concurrent vrt/1 sessions over loopback: round trip, memory, errors."
    )
    add = parser.add_argument
    add("--sessions", type=int, default=1000, help="concurrent sessions (1,000)")
    add("--turns", type=int, default=3, help="measured turns per session (3)")
    add("--steps", type=int, default=2, help="steps per turn, a server and an app call each (2)")
    add("--think", type=float, default=10.0, help="seconds between a session's turns (10)")
    add("--batch", type=int, default=50, help="sessions connecting at once in the ramp (50)")
    add("--idle", type=float, default=5.0, help="seconds of the idle window (5)")
    add("--soak", type=float, default=0.0, help="then run turns for this many minutes (0)")
    add("--soak-think", type=float, default=30.0, help="seconds between soak turns (30)")
    add("--every", type=float, default=30.0, help="seconds between soak rows (30)")
    add(
        "--recycle",
        type=int,
        default=None,
        help="a new session every N turns (0: never; soak 0, --compare and --store 20)",
    )
    add("--turn-timeout", type=float, default=30.0, help="a longer turn is an error (30 s)")
    add("--connect-timeout", type=float, default=30.0, help="a slower connect is an error (30 s)")
    add("--seed", type=int, default=1, help="random seed of the think times (1)")
    add("--gc-threshold", type=int, default=0, help="gc.set_threshold(N): app GC tuning (700)")
    add("--gc-freeze", action="store_true", help="gc.freeze() once the sessions are idle")
    add("--clients-process", action="store_true", help="run the clients in a second process")
    add("--profile", action="store_true", help="cProfile the measured turns (one process)")
    add("--tracemalloc", action="store_true", help="allocation sites of idle sessions and soak")
    add("--top", type=int, default=30, help="rows --profile shows (30)")
    add("--quick", action="store_true", help="a smoke run: 100 sessions, 2 turns, think 1 s")
    group = parser.add_argument_group(
        "serving in production (bench/serving.py; the server runs as vrt serve)"
    )
    add = group.add_argument
    add("--workers", type=int, help="vrt serve --workers N (1; given alone: that server only)")
    add("--store", help="vrt serve --store URL (redis://HOST:PORT), or auto: a redis-server")
    add(
        "--compare",
        action="store_true",
        help="1 worker without the store, 1 with it, --workers N with it: windows interleaved",
    )
    add("--client", choices=["light", "vrt"], default="light", help="the clients (light)")
    add(
        "--levels",
        default=None,
        help="sessions at think 0, one window each (50,200; --tracing: 50)",
    )
    add("--window", type=float, default=10.0, help="seconds of each window (10)")
    add("--settle", type=float, default=2.0, help="seconds before a window (2)")
    add("--rounds", type=int, default=2, help="rounds of windows, configurations interleaved (2)")
    add("--rolling", action="store_true", help="then a rolling restart of the workers")
    add("--rolling-sessions", type=int, default=200, help="vrt.connect sessions in it (200)")
    add("--rolling-think", type=float, default=1.0, help="their think time (1 s)")
    add("--rolling-pause", type=float, default=2.0, help="s between two workers' restarts (2)")
    add("--logs", default="", help="keep the servers' logs (and --py-spy's) in this folder")
    add("--py-spy", action="store_true", help="then a window with py-spy on the servers")
    group = parser.add_argument_group(
        "tracing on against off (bench/tracing.py installs the OpenTelemetry SDK in the server)"
    )
    add = group.add_argument
    add(
        "--tracing",
        action="store_true",
        help="1 worker, no store, as vrt serve and through bench/tracing.py: windows interleaved",
    )
    add(
        "--tracing-modes",
        default="traces,traces+metrics",
        help="the servers through bench/tracing.py, by its mode: traces, traces+metrics, "
        "metrics, sampled (traces, a tenth of the turns), off (the launcher alone); "
        "traces,traces+metrics",
    )
    add = parser.add_argument
    add("--role", choices=["all", "clients"], default="all", help=argparse.SUPPRESS)
    add("--url", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.sessions, args.turns, args.think, args.idle = 100, 2, 1.0, 1.0
    nodes = args.compare or args.store is not None or args.workers is not None or args.rolling
    nodes = nodes or args.tracing
    if args.tracing:
        if args.compare or args.store is not None or (args.workers or 1) > 1 or args.rolling:
            parser.error("--tracing runs 1 worker without a store: no --compare, --store, ...")
        args.tracing_modes = [mode for mode in args.tracing_modes.split(",") if mode]
        modes = {"traces", "traces+metrics", "metrics", "sampled", "off"}
        if not args.tracing_modes or not set(args.tracing_modes) <= modes:
            parser.error(f"--tracing-modes: of {', '.join(sorted(modes))}")
    if args.levels is None:
        args.levels = "50" if args.tracing else "50,200"
    args.workers = args.workers or 1
    if args.recycle is None:
        args.recycle = 20 if nodes else 0
    # The script must hold every turn a session can run: the measured ones, and one per
    # half soak think time (the shortest wait) or per recycled session's turns.
    soak_turns = int(args.soak * 60 / max(0.5 * args.soak_think, 0.01)) + 2 if args.soak else 0
    args.script_turns = args.turns + soak_turns + 1
    args.nodes = nodes
    if args.nodes:
        if args.workers > 1 and args.store is None:
            parser.error("--workers above 1 needs --store (vrt serve refuses it)")
        if args.rolling and (args.store is None or args.workers < 2):
            parser.error("--rolling needs --workers 2 or more and --store")
        args.levels = [int(level) for level in args.levels.split(",") if level]
        if max(args.levels, default=0) > args.sessions:
            parser.error("--levels: more sessions than --sessions")
        # Every turn a session can run (at think 0 a few thousand), or --recycle's.
        args.script_turns = args.recycle + 1 if args.recycle else 5000
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    soft, hard = raise_open_files()
    if args.gc_threshold:
        gc.set_threshold(args.gc_threshold, *gc.get_threshold()[1:])
    if args.role == "clients":
        trio.run(clients_child, args)
        return
    if args.nodes:
        from bench import serving

        serving.main(args)
        return
    print(
        f"vrt load benchmark: Python {platform.python_version()}, trio {version('trio')}, "
        f"trio-websocket {version('trio-websocket')}, wsproto {version('wsproto')}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs, loopback, "
        + ("server and clients in two processes" if args.clients_process else "one process")
        + f"\n{vrt_from()}"
    )
    print(
        f"open files: soft limit raised to {soft:,} (hard {hard:,}); {args.sessions:,} "
        f"sessions need about {2 * args.sessions + 20:,} in one process"
    )
    print(
        f"workload: {args.sessions:,} sessions connecting {args.batch} at a time; {args.turns} "
        f"turns each, {args.steps} steps a turn (a server call, then an app call), think "
        f"{args.think:g} s"
        + (f"; then a {args.soak:g}-minute soak, think {args.soak_think:g} s" if args.soak else "")
    )
    printer = Printer(args)
    logs = count_logs()
    samples: list[str] = []
    errors: Counter[str] = Counter()
    start = time.perf_counter()
    if args.clients_process:
        errors, samples = trio.run(two_processes, args, printer)
    else:
        trio.run(one_process, args, printer)
    printer.final(logs.errors + errors, [*logs.samples, *samples], time.perf_counter() - start)


if __name__ == "__main__":
    main()
