"""Engine throughput and memory: tool calls per second in process, and bytes per finished call.

Run it as ``python -m bench.engine`` (``--quick`` for a smoke run, ``--profile`` for a
cProfile of the compiled path, ``--help`` for the knobs). What it measures:

* **Throughput.** An in-process session (:func:`vrt.open_session`) runs turns of a
  :class:`vrt.ScriptedModel`: each turn is one model step of ``K`` calls to a server no-op
  tool (``risk="low"``, a one-field JSON Schema, returns None) whose arguments arrive in 4
  ``arguments-delta`` fragments (``vrt.call(..., chunks=4)``), then an empty step that ends
  the turn. Every call takes the whole engine path: its ToolCall machine, 4 deltas, JSON
  parsing, schema validation, a task in the turn's nursery, its result, the history.
  A session holds ``--turns`` turns: the history every model step is given grows with the
  session, so the session length is fixed rather than left to the call count (one extra
  line shows one long session). A run is as many sessions as it takes to reach its call
  count, in one ``trio.run``, timed with ``time.perf_counter`` (opening and closing the
  sessions included). The same workload runs with compiled tables in this process and in
  strict mode in a child process (``VRT_STRICT_MACHINES=1``, which vrt reads at import, so
  every Session, Turn and ToolCall machine there is a real python-statemachine instance;
  the child runs one job at a time, when this process asks), each with no subscriber and
  with one subscriber
  task draining ``session.subscribe()`` with ``async for`` to its end, which is what a
  real app sees (14 events per call). Runs alternate between the modes and repeat; the
  table shows the best run and the median.
* **Spawns.** The cost of a call as a multiple of a Trio task spawn+finish measured in the
  same process between the runs (1,000 no-op tasks started into an open nursery and left
  to finish, per task; best of the repeats against the best run), so the figure means the
  same on a machine twice as fast.
* **Memory.** 10,000 calls finished in one session, their TurnResults kept; measured three
  ways, see :func:`measure_memory`.

Each process is single threaded: one ``trio.run`` on one core (``--cpu N`` pins both to N).
"""

from __future__ import annotations

import argparse
import cProfile
import enum
import gc
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from types import BuiltinFunctionType, FunctionType, ModuleType
from typing import Any

import trio

import vrt
import vrt._core.tables as tables
from bench.harness import ROOT, version, vrt_from

ARGUMENTS = {"city": "Paris"}
PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
DELTAS = 4
TARGET_RATE = 10_000.0
TARGET_RATIO = 5.0
TARGET_RECORD_BYTES = 2048
TARGET_SPAWNS = {False: 5.0, True: 8.0}  # no subscriber, one subscriber
SPAWNS = 1000
US = "\N{MICRO SIGN}s"


@vrt.server_tool(risk="low", description="Does nothing", parameters=PARAMETERS)
async def noop(args: Any, ctx: vrt.ToolContext) -> None:
    """The server no-op tool: answers output=None at once."""
    return None


def make_agent(per_step: int, turns: int) -> vrt.Agent:
    """An agent whose script is ``turns`` x (one step of ``per_step`` calls, an empty step).

    The ScriptedModel plays the script from its start for every session, so one agent
    serves every session of every run.
    """
    step = [vrt.call("noop", ARGUMENTS, chunks=DELTAS) for _ in range(per_step)]
    script: list[list[Any]] = []
    for _ in range(turns):
        script += [step, []]
    return vrt.define_agent(model=vrt.ScriptedModel(script), tools=[noop])


# -- one session ---------------------------------------------------------------------------------


async def _drain(events: vrt.Subscription[vrt.Event], counts: list[int]) -> None:
    """What an app does: read every event as it comes."""
    async for _event in events:
        counts[0] += 1


async def run_session(agent: vrt.Agent, turns: int, per_step: int, *, subscriber: bool) -> int:
    """Run ``turns`` turns in a fresh session; return the events the subscriber received.

    With a subscriber, the session is closed once the last turn ended and this returns
    only after the subscriber has read its stream to the end (``Closed``).
    """
    counts = [0]
    async with AsyncExitStack() as stack:
        session = await stack.enter_async_context(vrt.open_session(agent))
        # The mode really is this process's (every machine follows the same switch).
        assert isinstance(session._machine, tables.StrictMachine) is tables.STRICT
        if subscriber:
            events = await stack.enter_async_context(session.subscribe())
        # Innermost, so that leaving waits for the subscriber to read to the end.
        nursery = await stack.enter_async_context(trio.open_nursery())
        if subscriber:
            nursery.start_soon(_drain, events, counts)
        for _ in range(turns):
            turn = await session.start_turn("go")
            result = await turn.wait()
            if result.status != "finished" or len(result.calls) != per_step:
                raise RuntimeError(f"unexpected turn result: {result!r}")
        session.close()  # the subscriber gets Closed and finishes reading
    return counts[0]


# -- throughput ----------------------------------------------------------------------------------


@dataclass
class Run:
    calls: int
    wall: float
    cpu: float
    events: int

    @property
    def rate(self) -> float:
        return self.calls / self.wall


@dataclass
class Cell:
    runs: list[Run] = field(default_factory=list)

    @property
    def best(self) -> float:
        return max(run.rate for run in self.runs)

    @property
    def median(self) -> float:
        return statistics.median(run.rate for run in self.runs)

    @property
    def cpu_share(self) -> float:
        return sum(run.cpu for run in self.runs) / sum(run.wall for run in self.runs)


@dataclass
class Throughput:
    cells: dict[tuple[bool, bool], Cell]  # (strict, subscriber) -> its runs
    long: Cell  # compiled, no subscriber, each run one long session
    spawns: list[float]  # seconds per spawn+finish, one figure per repeat

    @property
    def spawn(self) -> float:
        return min(self.spawns)


async def _nothing() -> None:
    return None


def timed_spawns() -> float:
    """Seconds per Trio task spawn+finish: ``SPAWNS`` no-op tasks started into an open
    nursery, the nursery then waiting for them all; the best of ten rounds."""
    gc.collect()
    out: list[float] = []

    async def body() -> None:
        async with trio.open_nursery() as outer:  # the engine's nurseries are open too
            outer.start_soon(trio.sleep_forever)
            for _ in range(10):
                start = time.perf_counter()
                async with trio.open_nursery() as nursery:
                    for _ in range(SPAWNS):
                        nursery.start_soon(_nothing)
                out.append((time.perf_counter() - start) / SPAWNS)
            outer.cancel_scope.cancel()

    trio.run(body)
    return min(out)


def timed_run(agent: vrt.Agent, calls: int, turns: int, per_step: int, *, subscriber: bool) -> Run:
    """Run sessions of ``turns`` turns until at least ``calls`` calls ran; time them (in this
    process's mode: compiled, or strict in the strict child)."""
    per_session = turns * per_step
    sessions = max(1, -(-calls // per_session))
    gc.collect()
    out: dict[str, float] = {}

    async def body() -> None:
        events = 0
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(sessions):
            events += await run_session(agent, turns, per_step, subscriber=subscriber)
        out["wall"] = time.perf_counter() - wall
        out["cpu"] = time.process_time() - cpu
        out["events"] = events

    trio.run(body)
    return Run(
        calls=sessions * per_session, wall=out["wall"], cpu=out["cpu"], events=int(out["events"])
    )


class StrictChild:
    """Strict mode's runs, in a child process started with ``VRT_STRICT_MACHINES=1`` (this
    process's machines stay compiled): :meth:`run` sends it one job as a JSON line and
    waits for its :class:`Run`."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process

    def run(self, calls: int, turns: int, per_step: int, *, subscriber: bool) -> Run:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        job = {"calls": calls, "turns": turns, "per_step": per_step, "subscriber": subscriber}
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("the strict-mode process exited")
        return Run(**json.loads(line))


@contextmanager
def strict_child() -> Iterator[StrictChild]:
    command = [sys.executable, "-m", "bench.engine", "--strict-child"]
    env = {**os.environ, "VRT_STRICT_MACHINES": "1"}
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as process:
        try:
            yield StrictChild(process)
        finally:
            assert process.stdin is not None
            process.stdin.close()  # the child's end of input: it exits


def serve_strict_runs() -> None:
    """``--strict-child``: a job per line on stdin, its :class:`Run` as a line on stdout."""
    if not tables.STRICT:
        raise SystemExit("--strict-child needs VRT_STRICT_MACHINES=1 in its environment")
    agents: dict[tuple[int, int], vrt.Agent] = {}
    for line in sys.stdin:
        job = json.loads(line)
        key = (job["per_step"], job["turns"])
        if key not in agents:
            agents[key] = make_agent(*key)
        agent = agents[key]
        run = timed_run(
            agent, job["calls"], job["turns"], job["per_step"], subscriber=job["subscriber"]
        )
        print(json.dumps(asdict(run)), flush=True)


def _say(args: argparse.Namespace, repeat: int, label: str, run: Run) -> None:
    if args.verbose:
        print(
            f"  run {repeat + 1}: {label:26} {run.calls:>7,} calls {run.wall:7.3f} s "
            f"{run.rate:>9,.0f} calls/s",
            file=sys.stderr,
        )


def measure_throughput(args: argparse.Namespace) -> Throughput:
    """Compiled and strict runs, alternating, with and without a subscriber, ``repeats``
    times each; then compiled runs of one long session of ``memory_calls`` calls."""
    turns, per_step = args.turns, args.per_step
    agent = make_agent(per_step, turns)
    cells = {(strict, sub): Cell() for sub in (False, True) for strict in (False, True)}
    spawns: list[float] = []
    with strict_child() as child:

        def timed(strict: bool, calls: int, subscriber: bool) -> Run:
            if strict:
                return child.run(calls, turns, per_step, subscriber=subscriber)
            return timed_run(agent, calls, turns, per_step, subscriber=subscriber)

        for strict in (False, True):  # warm up: imports, validators, the library's caches
            for sub in (False, True):
                timed(strict, turns * per_step, sub)
        for repeat in range(args.repeats):
            spawns.append(timed_spawns())
            order = (False, True) if repeat % 2 == 0 else (True, False)
            for sub in (False, True):
                for strict in order:
                    calls = args.strict_calls if strict else args.calls
                    run = timed(strict, calls, sub)
                    cells[strict, sub].runs.append(run)
                    mode = "strict" if strict else "compiled"
                    _say(args, repeat, f"{mode} {'subscriber' if sub else 'no subscriber'}", run)
    long_turns = max(1, args.memory_calls // per_step)
    long_agent = make_agent(per_step, long_turns)
    long = Cell()
    for repeat in range(min(args.repeats, 3)):
        run = timed_run(long_agent, 0, long_turns, per_step, subscriber=False)
        long.runs.append(run)
        _say(args, repeat, "compiled, one long session", run)
    return Throughput(cells=cells, long=long, spawns=spawns)


# -- memory --------------------------------------------------------------------------------------


def _shared(obj: object) -> bool:
    """Objects no record owns: classes, modules, functions, enum members, singletons."""
    return (
        obj is None
        or obj is True
        or obj is False
        or isinstance(obj, type | ModuleType | FunctionType | BuiltinFunctionType | enum.Enum)
    )


def deep_size(roots: Iterable[object]) -> tuple[int, Counter[str]]:
    """``sys.getsizeof`` summed over every object reachable from ``roots``, each counted once.

    Follows ``gc.get_referents`` (slot values, dict values, tuple items) and dict keys. An
    object shared by many records (the tool's name, ``"server"``) is counted once in all.
    """
    seen: set[int] = set()
    by_type: Counter[str] = Counter()
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or _shared(obj):
            continue
        seen.add(id(obj))
        by_type[type(obj).__name__] += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
        if type(obj) is dict:  # gc does not visit the keys of a dict whose keys are all str
            stack.extend(obj)
    return sum(by_type.values()), by_type


@dataclass
class Memory:
    calls: int
    turns: int
    deep: int
    deep_by_type: Counter[str]
    records_traced: int
    session_traced: int
    history_items: int


def measure_memory(calls: int, per_step: int) -> Memory:
    """Memory of ``calls`` finished calls in one session (compiled), TurnResults kept.

    * ``deep``: a gc walk from the CallRecords: CallRecord + ToolResult + the arguments
      dict + the strings they own (call id, the argument's key and value).
    * ``records_traced``: tracemalloc; what is still allocated once the session, the
      TurnResults and ``trio.run`` are gone and only a list of the CallRecords is kept
      (the list itself excluded), against a baseline taken before ``trio.run``.
    * ``session_traced``: tracemalloc; what the open session holds after the calls
      finished, from just after it opened: the history (a UserInput per turn, a
      CallRecord per call), the TurnResults and the list keeping them, the session's set
      of seen call ids, and whatever else the engine or Trio kept.
    """
    turns = max(1, calls // per_step)
    agent = make_agent(per_step, turns)

    async def warm() -> None:  # lazily built validators, caches, interned strings
        await run_session(make_agent(per_step, 2), 2, per_step, subscriber=False)

    trio.run(warm)
    out: dict[str, int] = {}

    async def body() -> list[vrt.CallRecord]:
        results: list[vrt.TurnResult] = []
        async with vrt.open_session(agent) as session:
            gc.collect()
            start = tracemalloc.get_traced_memory()[0]
            for _ in range(turns):
                turn = await session.start_turn("go")
                results.append(await turn.wait())
            gc.collect()
            out["session"] = tracemalloc.get_traced_memory()[0] - start
            out["history"] = len(session.history)
        return [record for result in results for record in result.calls]

    gc.collect()
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        records = trio.run(body)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before - sys.getsizeof(records)
    finally:
        tracemalloc.stop()
    deep, by_type = deep_size(records)
    return Memory(
        calls=len(records),
        turns=turns,
        deep=deep,
        deep_by_type=by_type,
        records_traced=kept,
        session_traced=out["session"],
        history_items=out["history"],
    )


# -- profile -------------------------------------------------------------------------------------


def _package(filename: str) -> str:
    """The package a profiled function belongs to (``vrt``, ``trio``, ``json``, ...)."""
    if filename.startswith("<attrs generated"):
        return "attrs-generated __init__"
    if filename == "~" or filename.startswith("<"):
        return "builtins (C)"
    parts = filename.replace("\\", "/").split("/")
    if "site-packages" in parts:
        rest = parts[parts.index("site-packages") + 1 :]
        return rest[0].removesuffix(".py") if rest else filename
    for mine in ("vrt", "machines", "bench"):
        if mine in parts:
            return mine
    if "lib" in parts:  # the standard library: lib/python3.X/<module>
        rest = parts[parts.index("lib") + 2 :]
        if rest:
            return rest[0].removesuffix(".py")
    return parts[-1]


def _where(filename: str, line: int) -> str:
    if filename == "~":
        return "C"
    parts = filename.replace("\\", "/").split("/")
    for anchor in ("site-packages", "vrt", "machines", "bench"):
        if anchor in parts:
            index = parts.index(anchor) + (anchor == "site-packages")
            return "/".join(parts[index:]) + f":{line}"
    return f"{'/'.join(parts[-2:])}:{line}"


def profile(args: argparse.Namespace, agent: vrt.Agent, subscriber: bool) -> None:
    """cProfile one compiled run; print the top functions by tottime and a per-package sum.

    Times are per call of the tool (profiler overhead included: about 3x the real cost).
    """
    turns, per_step = args.turns, args.per_step
    timed_run(agent, turns * per_step, turns, per_step, subscriber=subscriber)
    profiler = cProfile.Profile()
    profiler.enable()
    run = timed_run(agent, args.calls, turns, per_step, subscriber=subscriber)
    profiler.disable()
    raw: dict[Any, Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in raw.values())
    label = "one subscriber" if subscriber else "no subscriber"
    print(
        f"\nprofile: compiled, {label}, {run.calls:,} calls ({run.rate:,.0f} calls/s under "
        f"cProfile); top {args.top} by tottime, per tool call"
    )
    print(f"  {'tottime':>10} {'share':>6} {'ncalls':>7}  function")
    rows = sorted(raw.items(), key=lambda item: item[1][2], reverse=True)[: args.top]
    for (filename, line, name), (_cc, ncalls, tottime, _cum, _callers) in rows:
        print(
            f"  {tottime / run.calls * 1e6:7.2f} {US} {tottime / total:6.1%} "
            f"{ncalls / run.calls:7.2f}  {name} ({_where(filename, line)})"
        )
    packages: Counter[str] = Counter()
    for (filename, _line, _name), entry in raw.items():
        packages[_package(filename)] += entry[2]
    print("  by package:")
    for package, seconds in packages.most_common(8):
        print(f"  {seconds / run.calls * 1e6:7.2f} {US} {seconds / total:6.1%}  {package}")


# -- report --------------------------------------------------------------------------------------


def _verdict(ok: bool, value: float, target: float) -> str:
    return "PASS" if ok else f"MISS ({value / target - 1:+.0%})"


def _case(subscriber: bool) -> str:
    return "one subscriber" if subscriber else "no subscriber"


def report(args: argparse.Namespace, result: Throughput, memory: Memory) -> None:
    cells = result.cells
    print(
        f"\nthroughput, calls/s: best of {args.repeats} runs (median); compiled runs of "
        f"{cells[False, False].runs[0].calls:,} calls, strict runs of "
        f"{cells[True, False].runs[0].calls:,} calls, alternating"
    )
    print(
        f"  {'':15}{'compiled':>17}{'strict':>16}{'ratio':>8}{US + '/call':>11}"
        f"{US + '/call':>10}{'events':>8}{'cpu/':>6}"
    )
    print(f"  {'':56}{'compiled':>11}{'strict':>10}{'/call':>8}{'wall':>6}")
    for sub in (False, True):
        fast, slow = cells[False, sub], cells[True, sub]
        print(
            f"  {_case(sub):15}{fast.best:>9,.0f} ({fast.median:>6,.0f})"
            f"{slow.best:>8,.0f} ({slow.median:>5,.0f})"
            f"{fast.best / slow.best:>7.1f}x{1e6 / fast.best:>11.1f}{1e6 / slow.best:>10.1f}"
            f"{fast.runs[0].events / fast.runs[0].calls:>8.1f}{fast.cpu_share:>6.2f}"
        )
    spawn = result.spawn
    print(
        f"  in trio task spawns: a spawn+finish took {spawn * 1e6:.2f} {US} (best of "
        f"{len(result.spawns)}, median {statistics.median(result.spawns) * 1e6:.2f}); a call "
        + ", ".join(
            f"{1 / cells[False, sub].best / spawn:.1f} spawns {_case(sub)}" for sub in (False, True)
        )
    )
    long = result.long
    items = long.runs[0].calls + long.runs[0].calls // args.per_step
    print(
        f"  one long session instead ({long.runs[0].calls:,} calls, compiled, no subscriber; "
        f"every model step sees the\n  whole history, {items:,} items at the end): "
        f"{long.best:,.0f} ({long.median:,.0f}) calls/s, {1e6 / long.best:.1f} {US}/call"
    )

    n = memory.calls
    print(f"\nmemory: {n:,} calls finished in one session ({memory.turns:,} turns), compiled")
    rows = [
        (
            memory.deep,
            "per record, gc walk: CallRecord + ToolResult + arguments dict (with its key and "
            "value\n           strings) + call id string",
        ),
        (memory.records_traced, "per record, tracemalloc: only a list of the CallRecords kept"),
        (
            memory.session_traced,
            f"per call, tracemalloc: the whole open session (history of "
            f"{memory.history_items:,} items,\n           TurnResults and their list, "
            "seen call ids, anything else kept)",
        ),
    ]
    for size, what in rows:
        print(f"  {size / n:5.0f} B  {what}")
        if size is memory.deep:
            parts = ", ".join(
                f"{kind} {part / n:.0f}" for kind, part in memory.deep_by_type.most_common()
            )
            print(f"           of which: {parts}")

    spawn = result.spawn
    print("\ntargets:")
    for sub in (False, True):
        rate = cells[False, sub].best
        print(
            f"  >= {TARGET_RATE:,.0f} calls/s compiled, {_case(sub):16}{rate:>9,.0f} calls/s  "
            f"{_verdict(rate >= TARGET_RATE, rate, TARGET_RATE)}"
        )
    for sub in (False, True):
        spawns = 1 / cells[False, sub].best / spawn
        target = TARGET_SPAWNS[sub]
        print(
            f"  <= {target:.0f} spawns a call, compiled, {_case(sub):20}{spawns:>9.1f}    "
            f"{_verdict(spawns <= target, spawns, target)}"
        )
    for sub in (False, True):
        ratio = cells[False, sub].best / cells[True, sub].best
        print(
            f"  >= {TARGET_RATIO:.0f}x strict, {_case(sub):31}{ratio:>9.1f}x  "
            f"{_verdict(ratio >= TARGET_RATIO, ratio, TARGET_RATIO)}"
        )
    record = max(memory.deep, memory.records_traced) / n
    whole = memory.session_traced / n
    limit = TARGET_RECORD_BYTES
    print(
        f"  < 2 KB per finished call record{'':>15}{record:>9,.0f} B        "
        f"{_verdict(record < limit, record, limit)}"
    )
    print(
        f"  < 2 KB per finished call, whole session{'':>7}{whole:>9,.0f} B        "
        f"{_verdict(whole < limit, whole, limit)}"
    )


# -- main ----------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Engine throughput (compiled tables vs strict mode) and memory per call."
    )
    add = parser.add_argument
    add("--quick", action="store_true", help="a fast smoke run (a few hundred calls)")
    add("--profile", action="store_true", help="cProfile the compiled path and stop")
    add("--calls", type=int, default=10_000, help="calls per compiled run (10,000)")
    add("--strict-calls", type=int, default=2_000, help="calls per strict run (2,000)")
    add("--per-step", type=int, default=10, help="calls per model step, K (10)")
    add("--turns", type=int, default=100, help="turns per session (100)")
    add("--repeats", type=int, default=5, help="runs per mode and case (5)")
    add("--memory-calls", type=int, default=10_000, help="finished calls measured (10,000)")
    add("--top", type=int, default=25, help="functions --profile shows (25)")
    add("--cpu", type=int, default=None, help="pin the process to this CPU")
    add("-v", "--verbose", action="store_true", help="print every run on stderr")
    add("--strict-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.calls, args.strict_calls, args.turns = 400, 200, 20
        args.repeats, args.memory_calls = 2, 400
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.strict_child:
        serve_strict_runs()
        return
    if tables.STRICT:
        raise SystemExit("run it without VRT_STRICT_MACHINES: strict mode runs in a child")
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    print(
        f"vrt engine benchmark: Python {platform.python_version()}, trio {version('trio')}, "
        f"python-statemachine {version('python-statemachine')}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs ({allowed} allowed), one thread\n{vrt_from()}"
    )
    print(
        f"workload: server no-op tool (JSON Schema checked), {DELTAS} arguments-delta per "
        f"call, {args.per_step} calls per model step, one step per turn, {args.turns} turns "
        f"per session ({args.turns * args.per_step:,} calls)"
    )
    if args.profile:
        agent = make_agent(args.per_step, args.turns)
        for subscriber in (False, True):
            profile(args, agent, subscriber)
        return
    throughput = measure_throughput(args)
    memory = measure_memory(args.memory_calls, args.per_step)
    report(args, throughput, memory)


if __name__ == "__main__":
    main()
