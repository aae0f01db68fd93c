"""Serving in production, measured: ``vrt serve --workers N --store URL`` against one worker
without a store, in one run (issue 19, item 7); a rolling restart under load; tracing on
against off (issue 21). ``python -m bench.load --compare ...``, ``--workers``, ``--store``
and ``--tracing`` run it (bench/README.md, "Serving in production").

- **The servers** are ``vrt serve bench.agents:agent`` processes (the CLI: with
  ``--workers N`` a parent and N workers on its listening socket), started on a free
  loopback port (:func:`bench.harness.vrt_serve`), their stderr in a log that must end
  with no ERROR. Their CPU is read from ``/proc/PID/stat`` (utime + stime) of the parent
  and of every child (the workers): summed per window.
- **The store** (``--store auto``): a ``redis-server`` on a free loopback port, nothing
  saved to disk, started for the run and stopped after it. Its CPU and its traffic come
  from ``INFO`` (``used_cpu_user`` + ``used_cpu_sys``, ``total_commands_processed``,
  ``total_net_input_bytes``, ``total_net_output_bytes``, ``commandstats``) before and
  after each window: the bench's own INFO calls are subtracted, the nodes' heartbeats and
  record touches (one a second per node) are counted in.
- **The clients** (bench/fleet.py): ``--client light`` (a minimal vrt/1 client on a raw
  socket) or ``--client vrt`` (:func:`vrt.connect`), in this process or with
  ``--clients-process`` in a child.
- **Windows** (bench/windows.py): a paced window, then one per ``--levels`` entry at think
  0, every configuration's windows interleaved round by round.
- **Rolling restart** (``--rolling``): ``vrt.connect`` sessions at ``--rolling-think``,
  each worker in turn sent SIGTERM (it drains: its sessions are handed over at their next
  turn boundary, their clients closed with 1012 and resumed on the other worker; the
  parent starts it again); the gap each client sees (``vrt.Reconnecting`` to
  ``vrt.Resumed``), and every turn that failed or session that closed.
- **Tracing on against off** (``--tracing``): one worker without a store as ``vrt serve``
  and as bench/tracing.py's launcher (the OpenTelemetry SDK installed first), the windows
  interleaved the same way; server CPU per turn traced over untraced, and the spans the
  launcher reports at exit against the turns the clients finished.
- **Where the time goes** (``--py-spy``): one more window at the largest level with py-spy
  on every server process.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio
import trio.lowlevel

import vrt
from bench.fleet import LocalFleet, RemoteFleet, fleet_of
from bench.harness import (
    Redis,
    Served,
    alive,
    listening_sockets,
    ms,
    percentile,
    sockets,
    the_store,
    threads_cpu,
    verdict,
    vrt_commit,
)
from bench.windows import (
    Config,
    Result,
    Running,
    Window,
    print_rounds,
    run_configs,
    sample,
    window,
)

# -- where the servers' time goes (--py-spy) -------------------------------------------------------

FOCUS: list[tuple[str, tuple[str, ...]]] = [
    (
        "the store: the state encoded (record.encode_state)",
        ("encode_state (vrt/_cluster/record.py)",),
    ),
    (
        "the store: the session's state gathered (state())",
        ("state (vrt/_server/actor.py)", "state (vrt/_cluster/keeper.py)"),
    ),
    (
        "the store: RedisStore.save() (valkey-glide)",
        ("save (vrt/_cluster/store.py)", "save (vrt/_cluster/redis.py)"),
    ),
    (
        "the store: the saver task",
        ("_saver (vrt/_server/actor.py)", "_saver (vrt/_cluster/keeper.py)"),
    ),
    ("the store: heartbeat and touch", ("run (vrt/_cluster/node.py)",)),
    ("vrt/_cluster, all of it (store, record codec, keeper, relays)", ("(vrt/_cluster/",)),
    ("anyio (glide's async calls under Trio)", ("(anyio/",)),
    ("glide's Python side", ("(glide/",)),
    ("the engine (vrt/_engine)", ("(vrt/_engine/",)),
    ("the wire codec (vrt/_wire)", ("(vrt/_wire/",)),
    ("trio-websocket", ("(trio_websocket/",)),
    ("wsproto", ("(wsproto/",)),
    ("sending (SocketStream.send_all)", ("send_all (trio/_highlevel_socket.py)",)),
    ("waiting for I/O (epoll)", ("get_events (trio/_core/_io_epoll.py)",)),
    ("a new connection: the HTTP upgrade", ("upgrade (vrt/_net/upgrade.py)",)),
    ("a new connection: the hello", ("_handshake (vrt/_server/hub.py)",)),
    ("a new session: SessionActor._open_session", ("_open_session (vrt/_server/actor.py)",)),
    ("jsonschema", ("(jsonschema/",)),
    (
        "a session's end: its record deleted",
        ("_forget_in_store (vrt/_server/actor.py)", "forget (vrt/_cluster/keeper.py)"),
    ),
]
"""What the profile sums (a sample counts once per label if any of its frames matches)."""


async def profile_window(
    args: argparse.Namespace,
    served: Served,
    fleet: LocalFleet | RemoteFleet,
    folder: Path,
    label: str,
) -> None:
    """One more window at the largest level with py-spy on every server process that runs
    sessions: the CPU of each thread (by name), then where the Python threads spend it."""
    spy = shutil.which("py-spy")
    if spy is None:
        print("  --py-spy: py-spy is not installed (pip install py-spy)")
        return
    level = max(args.levels)
    await fleet.load(0.0, level)
    await trio.sleep(args.settle)
    pids = list(served.worker_pids().values())
    threads = {pid: threads_cpu(pid) for pid in pids}
    outputs = {
        pid: folder / f"{label.replace(' ', '-').replace(',', '')}-{pid}.raw" for pid in pids
    }
    a = await sample(served, fleet, None)
    async with trio.open_nursery() as nursery:
        for pid in pids:
            command = spy_command(pid, args.window, outputs[pid])
            nursery.start_soon(
                functools.partial(
                    trio.run_process, command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
            )
    b = await sample(served, fleet, None)
    w = window(f"profiled, {level} sessions", "above capacity", a, b)
    print(
        f"  py-spy on {len(pids)} server process(es), {level} sessions at think 0, "
        f"{w.seconds:.1f} s: {w.rate:,.1f} turns/s (with the profiler's own cost)"
    )
    for pid in pids:
        print_profile(pid, threads[pid], outputs[pid], args.top)


def spy_command(pid: int, seconds: float, output: Path) -> list[str]:
    spy = shutil.which("py-spy") or "py-spy"
    command = [spy, "record", "-p", str(pid), "-d", str(max(1, round(seconds))), "-r", "100"]
    return [*command, "-f", "raw", "--nolineno", "--nonblocking", "-o", str(output)]


def print_profile(
    pid: int,
    threads_before: Counter[str],
    output: Path,
    top: int,
    threads_after: Counter[str] | None = None,
) -> None:
    """The CPU of each thread of ``pid`` since ``threads_before`` (to ``threads_after``, or
    now), then where its Python threads spent it (py-spy's samples in ``output``):
    inclusive for :data:`FOCUS`, and the frames with the most samples of their own."""
    after = threads_cpu(pid) if threads_after is None else threads_after
    spent = Counter({name: after[name] - threads_before.get(name, 0.0) for name in after})
    total = sum(spent.values())
    print(
        f"    pid {pid}: CPU {total:.2f} s = "
        + ", ".join(f"{name} {sec:.2f} s" for name, sec in spent.most_common(6) if sec > 0)
    )
    stacks = _read_raw(output)
    samples = sum(stacks.values())
    if not samples:
        return
    leaf: Counter[str] = Counter()
    focus: Counter[str] = Counter()
    for stack, count in stacks.items():
        frames = stack.split(";")
        leaf[frames[-1]] += count
        for name, needles in FOCUS:
            if any(needle in frame for frame in frames for needle in needles):
                focus[name] += count
    print(f"      {samples:,} samples of the Python threads; inclusive:")
    for name, _ in FOCUS:
        if focus[name]:
            print(f"        {focus[name] / samples:6.1%}  {name}")
    print("      top frames by own time:")
    for frame, count in leaf.most_common(top):
        print(f"        {count / samples:6.1%}  {frame}")


def _read_raw(path: Path) -> Counter[str]:
    stacks: Counter[str] = Counter()
    try:
        text = path.read_text()
    except OSError:
        return stacks
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks[stack] += int(count)
    return stacks


# -- the rolling restart -------------------------------------------------------------------------


async def rolling_restart(args: argparse.Namespace, served: Served, redis: Redis) -> dict[str, Any]:
    """SIGTERM to each worker in turn (the parent starts it again) under load of
    ``vrt.connect`` sessions; the resume gaps and every failure."""
    sessions, think = args.rolling_sessions, args.rolling_think
    print(
        f"\n  rolling restart: {sessions} vrt.connect sessions, think {think:g} s (offered "
        f"{sessions / think:,.0f} turns/s); SIGTERM to each of the {served.workers} workers "
        "in turn, the next once the last is back",
        flush=True,
    )
    async with fleet_of(args, served.url, "vrt") as fleet:
        await fleet.connect(sessions)
        await fleet.load(think, sessions)
        await trio.sleep(args.settle + think)
        before_a = await sample(served, fleet, redis)
        await trio.sleep(args.window / 2)
        before_b = await sample(served, fleet, redis)
        before = window("before", "", before_a, before_b)
        drains = []
        start = await sample(served, fleet, redis)
        profiled = None
        signalled: list[float] = []
        for index in sorted(served.worker_pids()):
            pid = served.worker_pids()[index]
            owned = sockets(pid)
            if args.py_spy and profiled is None:  # the worker the first drain moves to
                other = next(p for i, p in served.worker_pids().items() if i != index)
                output = Path(args.logs or tempfile.gettempdir()) / f"rolling-{other}.raw"
                profiled = (other, threads_cpu(other), output)
                spy = await trio.lowlevel.open_process(
                    spy_command(other, 3, output),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                await trio.sleep(0.3)  # py-spy attached
            began = time.perf_counter()
            signalled.append(began)
            os.kill(pid, signal.SIGTERM)
            with trio.fail_after(60):
                while served.worker_pids().get(index) == pid and alive(pid):  # noqa: ASYNC110
                    await trio.sleep(0.01)
            drained = time.perf_counter() - began
            with trio.fail_after(60):
                while served.worker_pids().get(index) in (None, pid):  # noqa: ASYNC110
                    await trio.sleep(0.05)
            new = served.worker_pids()[index]
            with trio.fail_after(60):  # and it holds the parent's listening socket
                while listening_sockets(new) < 1:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            back = time.perf_counter() - began
            with trio.fail_after(60):  # and it accepts: its relay listener is open
                while listening_sockets(new) < 2:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            ready = time.perf_counter() - began
            drains.append((index, owned, drained, back, ready))
            if profiled is not None and len(profiled) == 3:
                await spy.wait()
                profiled = (*profiled, args.top, threads_cpu(profiled[0]))
            print(
                f"    worker {index} (pid {pid}, {owned} sockets): exited {drained:.2f} s after "
                f"SIGTERM, a new one listening {back:.2f} s after, accepting {ready:.2f} s "
                "after (its relay listener open: the store connected)",
                flush=True,
            )
            await trio.sleep(args.rolling_pause)
        await trio.sleep(think * 2)
        end = await sample(served, fleet, redis)
        during = window("restart", "", start, end)
        spread = [sockets(pid) for pid in served.worker_pids().values()]
        await fleet.load(think, 0)
    gaps = during.gaps
    refused = end.clients["refused"] - start.clients["refused"]
    failed = end.clients["failed_attempts"] - start.clients["failed_attempts"]
    why = Counter(end.clients["failures"])
    why.subtract(start.clients["failures"])
    print(
        f"    {during.turns:,} turns completed in {during.seconds:.1f} s during the restart "
        f"({during.rate:,.1f} turns/s; {before.rate:,.1f} before); turn p50 "
        f"{ms(percentile(during.turn_time, 0.5))} p99 {ms(percentile(during.turn_time, 0.99))}"
        f" max {ms(max(during.turn_time, default=float('nan')))} ms (before: p99 "
        f"{ms(percentile(before.turn_time, 0.99))} ms)"
    )
    print(
        f"    {during.resumes:,} resumes; resume gap (vrt.Reconnecting -> vrt.Resumed) p50 "
        f"{ms(percentile(gaps, 0.5))} p99 {ms(percentile(gaps, 0.99))} max "
        f"{ms(max(gaps, default=float('nan')))} ms; turns failed {sum(during.errors.values())},"
        f" sessions closed {during.closed}\n    resume attempts refused with HTTP 503 (a "
        f"draining worker that had accepted it): {refused}; other failed attempts: "
        f"{failed} ({', '.join(f'{k} {v}' for k, v in (+why).most_common()) or 'none'}); "
        f"sockets per worker afterwards: {', '.join(map(str, spread))}",
        flush=True,
    )
    for what, count in during.errors.most_common(5):
        print(f"      {count:>6,}  {what}")
    resumed_at = end.clients["resumed_at"]
    for i, at in enumerate(signalled):
        until = signalled[i + 1] if i + 1 < len(signalled) else float("inf")
        after = sorted(t - at for t in resumed_at if at <= t < until)
        if after:
            print(
                f"    SIGTERM {i + 1}: {len(after)} resumes done, the first {after[0]:.2f} s "
                f"after it, half by {after[len(after) // 2]:.2f} s, the last {after[-1]:.2f} s"
            )
    if profiled is not None:
        print(
            "    py-spy on the worker the first drain moved the sessions to, 3 s from just "
            "before the SIGTERM:"
        )
        print_profile(*profiled)
    return {"before": before, "during": during, "drains": drains}


# -- the comparison ------------------------------------------------------------------------------

TARGET_RATE = 1.7
TARGET_CPU = 1.25


def print_comparison(
    base: Result, scaled: Result, args: argparse.Namespace, *, targets: bool = True
) -> None:
    b, s = base.saturated, scaled.saturated
    print(f"\n== {scaled.config.label} against {base.config.label}, this run")
    rate = s.rate / b.rate
    print(
        f"  saturation turns/s: {s.rate:,.1f} ({s.label}) / {b.rate:,.1f} ({b.label}) = "
        f"{rate:.2f}x"
        + (f"   target >= {TARGET_RATE}x  {verdict(rate >= TARGET_RATE)}" if targets else "")
    )
    for name, bw, sw in (("paced", base.paced, scaled.paced), ("at saturation", b, s)):
        base_cpu = bw.per_turn(bw.server_cpu + (bw.store["cpu"] if bw.store is not None else 0.0))
        with_store = sw.per_turn(sw.server_cpu)
        store_cpu = sw.per_turn(sw.store["cpu"]) if sw.store is not None else 0.0
        ratio = (with_store + store_cpu) / base_cpu
        print(
            f"  CPU per turn, {name}: servers {with_store * 1e3:.2f} + redis "
            f"{store_cpu * 1e3:.2f} = {(with_store + store_cpu) * 1e3:.2f} ms / "
            f"{base_cpu * 1e3:.2f} ms = {ratio:.2f}x (servers alone {with_store / base_cpu:.2f}x)"
            + (
                f"   target <= {TARGET_CPU}x  {verdict(ratio <= TARGET_CPU)}"
                if name == "paced" and targets
                else ""
            )
        )
    for name, w in (("paced", scaled.paced), ("at saturation", s)):
        if w.store is not None:
            print(
                f"  store per turn, {name}: {w.store['requests'] / max(w.turns, 1):.2f} round "
                f"trips ({w.store['commands'] / max(w.turns, 1):.2f} commands with the "
                f"scripts' own), {w.store['in'] / max(w.turns, 1):,.0f} B to redis, "
                f"{w.store['out'] / max(w.turns, 1):,.0f} B back"
            )
    if scaled.records:
        mean = sum(scaled.records) / len(scaled.records)
        print(
            f"  saved records at the end: {len(scaled.records)}, {mean:,.0f} B mean, "
            f"{max(scaled.records):,} B max; {scaled.turns_per_session:.1f} turns per "
            "session on average"
        )
    if targets and scaled.config.workers > 1:
        # Not measured: what the same CPU per turn would give with the clients elsewhere
        # and every core for the servers and redis (at most one core per worker).
        cores = min(os.cpu_count() or 1, scaled.config.workers)
        per_turn = s.per_turn(s.server_cpu + (s.store["cpu"] if s.store else 0.0))
        projected = cores / per_turn
        print(
            f"  projection, not measured: {cores} cores for the servers and redis alone at "
            f"{per_turn * 1e3:.2f} ms per turn would complete {projected:,.0f} turns/s = "
            f"{projected / b.rate:.2f}x; {TARGET_RATE}x needs at most "
            f"{cores / (TARGET_RATE * b.rate) * 1e3:.2f} ms per turn "
            f"({cores / (TARGET_RATE * b.rate) / b.per_turn(b.server_cpu):.2f}x the storeless "
            "figure at saturation)"
        )
    clients = (s.client_cpu + b.client_cpu) / max(1, s.turns + b.turns)
    print(
        f"  the clients ({args.client}) took {clients * 1e3:.2f} ms of CPU per turn; at "
        f"saturation the machine ran at {(b.server_cpu + b.client_cpu) / b.seconds:.2f} "
        f"cores ({base.config.label}) and "
        f"{(s.server_cpu + s.client_cpu + (s.store['cpu'] if s.store else 0)) / s.seconds:.2f} "
        f"cores ({scaled.config.label}) of {os.cpu_count()}"
    )


# -- tracing on against off (--tracing) ----------------------------------------------------------

TARGET_TRACING = 1.15
"""Issue 21: CPU per turn with tracing on (SDK, batch processor, in-memory exporter) at
most 1.15x tracing off, paced, in one run."""

TRACING_MARK = "vrt-bench-tracing "  # bench/tracing.py's line in the server's log


def tracing_report(log: Path | None) -> dict[str, Any] | None:
    """bench/tracing.py's last line in a server's log: what the SDK recorded."""
    if log is None:
        return None
    found = None
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith(TRACING_MARK):
            found = json.loads(line[len(TRACING_MARK) :])
    return found


def _cpu(w: Window) -> float:
    return w.per_turn(w.server_cpu)


def print_tracing(results: list[Result], args: argparse.Namespace) -> None:
    """Each traced configuration against the untraced one: server CPU per turn (paced: the
    target; at saturation beside it) and turns/s, per round and over the run; then what
    the SDK recorded against what the clients saw."""
    base = results[0]
    steps = args.steps
    per_turn = {"invoke_agent": 1, "chat": steps + 1, "execute_tool": 2 * steps}
    for traced in results[1:]:
        print(f"\n== {traced.config.label} against {base.config.label}, this run")
        for i in range(len(base.rounds["paced"])):
            parts = []
            for phase in base.rounds:
                b, t = base.rounds[phase][i], traced.rounds[phase][i]
                parts.append(
                    f"{phase}: CPU/turn {_cpu(t) * 1e3:.2f} / {_cpu(b) * 1e3:.2f} ms = "
                    f"{_cpu(t) / _cpu(b):.3f}x, turns/s {t.rate:,.1f} / {b.rate:,.1f} = "
                    f"{t.rate / b.rate:.3f}x"
                )
            print(f"  round {i + 1}: " + "; ".join(parts))
        for b, t in ((base.paced, traced.paced), *zip(base.levels, traced.levels, strict=True)):
            ratio = _cpu(t) / _cpu(b)
            target = (
                f"   target <= {TARGET_TRACING}x  {verdict(ratio <= TARGET_TRACING)}"
                if b is base.paced
                else ""
            )
            print(
                f"  {b.label}, every round: server CPU per turn {_cpu(t) * 1e3:.3f} / "
                f"{_cpu(b) * 1e3:.3f} ms = {ratio:.3f}x; turns/s {t.rate:,.1f} / {b.rate:,.1f}"
                f" = {t.rate / b.rate:.3f}x" + target
            )
        report = tracing_report(traced.log)
        if report is None:
            print("  NO REPORT from bench/tracing.py in the server's log: spans unchecked")
            continue
        turns = traced.turns_total
        threads = report.get("threads", {})
        worker = threads.get("OtelBatchSpanRecordProcessor", 0.0)
        print(
            f"  the server's threads over the whole run: {sum(threads.values()):,.2f} s of CPU, "
            f"of which the batch processor's worker {worker:,.2f} s ("
            f"{worker / max(turns, 1) * 1e6:,.0f} us a turn); "
            + ", ".join(f"{name} {cpu:,.2f} s" for name, cpu in threads.items())
        )
        if "spans" in report:
            spans = report["spans"]
            expected = {name: turns * n for name, n in per_turn.items()}
            ok = all(spans.get(name, 0) == count for name, count in expected.items())
            print(
                f"  spans exported: {sum(spans.values()):,} in {report['batches']:,} batches ("
                + ", ".join(f"{name} {spans.get(name, 0):,}" for name in per_turn)
                + f"); the clients finished {turns:,} turns: expected "
                + ", ".join(f"{count:,}" for count in expected.values())
                + f" ({sum(per_turn.values())} a turn)  {'OK' if ok else 'MISMATCH'}"
            )
        if "metrics" in report:
            sums = report["metrics"]["sums"]
            points = sum(report["metrics"]["points"].values())
            recorded = sums.get("vrt.turn.duration count", 0)
            print(
                f"  metrics: {len(report['metrics']['points'])} instruments, {points} data "
                f"points; turns recorded {recorded:,} ({'OK' if recorded == turns else 'MISMATCH'}"
                f"), calls {sums.get('vrt.tool.calls', 0):,.0f} (expected {2 * steps * turns:,})"
                f", frames {sums.get('vrt.frames', 0):,.0f}"
            )


def after_windows(
    args: argparse.Namespace, folder: Path
) -> Callable[[list[Running], list[Result]], Awaitable[None]]:
    """What runs once the windows are summed, the servers still up: ``--py-spy``'s
    profiled window of each configuration, then ``--rolling``'s restart of the last."""

    async def after(runs: list[Running], results: list[Result]) -> None:
        if args.py_spy:
            for run in runs:
                await profile_window(args, run.served, run.fleet, folder, run.config.label)
        last = runs[-1]
        if args.rolling and last.config.store is not None and last.config.workers > 1:
            await last.clients.aclose()  # its sessions would be handed over too
            results[-1].rolling = await rolling_restart(args, last.served, last.config.store)

    return after


async def compare_configs(
    args: argparse.Namespace, redis: Redis | None, folder: Path
) -> list[Result]:
    """``--compare`` (or one configuration): run them, print the comparisons."""
    if args.store is not None and args.store != "auto":
        print(f"store: {args.store} (used as is)")
    configs = []
    if args.compare:
        configs.append(Config("1 worker, no store", 1, None))
        if redis is not None and args.workers > 1:
            configs.append(Config("1 worker, store", 1, redis))  # the store's own cost
    label = f"{args.workers} worker{'s' if args.workers > 1 else ''}"
    configs.append(Config(label + (", store" if redis else ", no store"), args.workers, redis))
    results = await run_configs(args, configs, folder, after_windows(args, folder))
    if len(results) > 1:
        print_comparison(results[0], results[-1], args)
    if len(results) > 2:
        print_comparison(results[0], results[1], args, targets=False)
        print_comparison(results[1], results[2], args, targets=False)
    return results


async def run_all(args: argparse.Namespace) -> None:
    with the_store(args.store) as redis, tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.logs) if args.logs else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        if args.tracing:
            configs = [Config("tracing off", 1, None)]
            configs += [
                Config(mode if mode != "off" else "tracing.py off", 1, None, otel=mode)
                for mode in args.tracing_modes
            ]
            results = await run_configs(args, configs, folder, after_windows(args, folder))
            print_tracing(results, args)
        else:
            results = await compare_configs(args, redis, folder)
        problems = sum(len(r.problems) for r in results)
        errors = sum(sum(w.errors.values()) for r in results for w in [r.paced, *r.levels])
        if len(results) > 1 and args.rounds > 1 and not args.tracing:
            print_rounds(results)
        print(f"\n  client errors in the windows: {errors}; server log warnings/errors: {problems}")


def main(args: argparse.Namespace) -> None:
    print(
        f"vrt production-serving benchmark: Python {sys.version.split()[0]}, trio "
        f"{trio.__version__}, {os.cpu_count()} CPUs, loopback; vrt from "
        f"{os.path.dirname(vrt.__file__)}{vrt_commit()}; clients: {args.client}"
        + (" in a second process" if args.clients_process else " in this process")
        + f"\nworkload: {args.sessions} sessions, {args.steps} steps a turn (a server call, "
        f"then an app call); a paced window at think {args.think:g} s, then think 0 with "
        f"{', '.join(map(str, args.levels))} sessions; windows of {args.window:g} s after "
        f"{args.settle:g} s to settle"
        + (f"; a client opens a new session every {args.recycle} turns" if args.recycle else "")
    )
    start = time.perf_counter()
    trio.run(run_all, args)
    print(f"  wall time {time.perf_counter() - start:,.1f} s")
