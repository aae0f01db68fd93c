"""Wire cost: vrt/1 over WebSockets against raw trio-websocket, side by side.

Run it as ``python bench/wire.py`` (``--quick`` for a smoke run, ``--profile`` for a
cProfile of the vrt stream flow, ``--help`` for the knobs). Everything runs in one process
and one ``trio.run``, over loopback (127.0.0.1, port 0): every server shares the thread
with its client, on the raw side and the vrt side alike, so each figure covers both ends
of the connection. The raw side sends vrt's own frames (captured once from a vrt session
at start-up), so frame sizes match. What it measures:

* **(a) Round trip** (``time.perf_counter``), ``--rtt`` round trips after ``--warmup``:

  - raw echo: a trio-websocket server echoes; the client sends a vrt ``tool.call`` frame
    and awaits it back;
  - vrt: an agent with ``client_tools="accept"`` whose :class:`vrt.ScriptedModel` makes
    one app call per model step (``vrt.call("ping", {"i": n})``), then pauses 2 ms so no
    other call is on the wire; the client hosts the ``@vrt.app_tool`` ``ping``, which
    answers at once. Taken on the client, from the call's ``arguments-complete`` event to
    its ``settled`` event, both server messages: ``tool.call`` out, the run,
    ``tool.result`` back, ``settled`` out;
  - raw replay, for reference: a trio-websocket server sends the frames vrt sends in that
    interval (arguments-complete ``tool.stream`` and ``tool.preview``, ``tool.call``),
    awaits vrt's ``tool.result`` frame, sends ``settled`` (``tool.stream`` and
    ``tool.preview``); timed the same way. The floor for vrt/1's frames over
    trio-websocket.

  Each row also shows CPU/wall inside the intervals (``time.process_time``): about 1 means
  the round trip is nothing but the CPU both ends spend on it.
* **(b) Stream**: messages per second and CPU per message (``time.process_time`` over the
  run, divided by the messages).

  - vrt: a server no-op tool, each call's arguments in 8 ``arguments-delta`` fragments
    (``vrt.call("noop", ..., chunks=8)``), ``--per-step`` calls per model step,
    ``--steps`` steps per turn, ``--turns`` turns; the client subscribes and drains every
    event. A message is a frame the client received and handed on as an event
    (``tool.stream``, ``tool.preview``, ``turn.started``, ``turn.ended``); acks, either
    way, and the client's ``input`` are carried but not counted;
  - raw: the server sends as many frames (vrt's 22 frames of one call, round robin, or
    ``--messages``) and the client receives them.

Every case runs once per round, the order reversed every other round, ``--repeats``
rounds; the tables show the best run and the median of the runs in brackets.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import json
import os
import platform
import pstats
import statistics
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio
from bench_common import version
from trio_websocket import (
    ConnectionClosed,
    WebSocketConnection,
    WebSocketRequest,
    open_websocket_url,
    serve_websocket,
)

import vrt

HOST = "127.0.0.1"
DELTAS = 8
PAUSE = 0.002
"""The model's pause after each app call in (a): no call overlaps the one measured."""
NOOP_ARGUMENTS = {"city": "Paris", "country": "France"}
NOOP_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
    "required": ["city"],
}
PING_PARAMETERS = {
    "type": "object",
    "properties": {"i": {"type": "integer"}},
    "required": ["i"],
}
TARGET_RTT_RATIO = 1.5
TARGET_CPU_RATIO = 2.0
US = "\N{MICRO SIGN}s"


@vrt.server_tool(risk="low", description="Does nothing", parameters=NOOP_PARAMETERS)
async def noop(args: Any, ctx: vrt.ToolContext) -> None:
    """The server no-op tool of (b): answers output=None at once."""
    return None


def make_ping(started: dict[str, float]) -> vrt.AppTool:
    """The app tool of (a): notes when it runs and answers at once."""

    @vrt.app_tool(name="ping", description="Answers at once", parameters=PING_PARAMETERS)
    async def ping(args: Any, ctx: vrt.ToolContext) -> Any:
        started[ctx.call_id] = time.perf_counter()
        return {"i": args["i"]}

    return ping


def rtt_agent(calls: int) -> vrt.Agent:
    """One turn: ``calls`` model steps of one app call each, then the model pauses."""
    script: list[list[Any]] = [[vrt.call("ping", {"i": i}), vrt.pause(PAUSE)] for i in range(calls)]
    return vrt.define_agent(
        model=vrt.ScriptedModel(script), client_tools="accept", max_steps=calls + 1
    )


def stream_agent(turns: int, steps: int, per_step: int) -> vrt.Agent:
    """``turns`` turns of ``steps`` model steps of ``per_step`` no-op calls (8 deltas each).

    An empty step ends each turn. Keep a turn under about 10,000 messages (450 calls): the
    server does not wait for the client, so within a turn it runs ahead, and vrt closes a
    session with ``overflow`` once 10,000 messages are unacked (see bench/README.md).
    """
    step = [vrt.call("noop", NOOP_ARGUMENTS, chunks=DELTAS) for _ in range(per_step)]
    script: list[list[Any]] = []
    for _ in range(turns):
        script += [step] * steps + [[]]
    return vrt.define_agent(model=vrt.ScriptedModel(script), tools=[noop], max_steps=steps + 1)


# -- the raw servers -----------------------------------------------------------------------------


async def _echo(request: WebSocketRequest) -> None:
    ws = await request.accept()
    try:
        while True:
            await ws.send_message(await ws.get_message())
    except ConnectionClosed:
        pass


def _streamer(frames: Sequence[str]) -> Callable[[WebSocketRequest], Awaitable[None]]:
    """A server that answers ``"N"`` with N frames (round robin over ``frames``), then
    ``"done"``."""

    async def handler(request: WebSocketRequest) -> None:
        ws = await request.accept()
        try:
            while True:
                count = int(await ws.get_message())
                for i in range(count):
                    await ws.send_message(frames[i % len(frames)])
                await ws.send_message("done")
        except ConnectionClosed:
            pass

    return handler


def _replayer(
    before: Sequence[str], after: Sequence[str]
) -> Callable[[WebSocketRequest], Awaitable[None]]:
    """vrt's frames for one app call, replayed: on each ``"next"`` send ``before``,
    await the client's answer, send ``after``."""

    async def handler(request: WebSocketRequest) -> None:
        ws = await request.accept()
        try:
            while True:
                await ws.get_message()
                for frame in before:
                    await ws.send_message(frame)
                await ws.get_message()
                for frame in after:
                    await ws.send_message(frame)
        except ConnectionClosed:
            pass

    return handler


async def _start_raw(
    nursery: trio.Nursery, handler: Callable[[WebSocketRequest], Awaitable[None]]
) -> str:
    server = await nursery.start(serve_websocket, handler, HOST, 0, None)
    return f"ws://{HOST}:{server.port}/"


# -- capturing vrt's frames ----------------------------------------------------------------------


@dataclass
class Captured:
    """Every frame sent while capturing, by direction (server to client, or back)."""

    down: list[str] = field(default_factory=list)
    up: list[str] = field(default_factory=list)


@asynccontextmanager
async def capture() -> AsyncIterator[Captured]:
    """Record every ``WebSocketConnection.send_message`` (a class patch, only in here): a
    client connection's frames are ``up``, a server connection's ``down``."""
    captured = Captured()
    original = WebSocketConnection.send_message

    async def spy(self: WebSocketConnection, message: str | bytes) -> None:
        assert isinstance(message, str)
        (captured.up if self.is_client else captured.down).append(message)
        await original(self, message)

    WebSocketConnection.send_message = spy  # type: ignore[method-assign]
    try:
        yield captured
    finally:
        WebSocketConnection.send_message = original  # type: ignore[method-assign]


@dataclass
class Frames:
    echo: str  # a vrt tool.call frame of (a)
    before: list[str]  # (a) server -> client: arguments-complete (stream, preview), tool.call
    result: str  # (a) client -> server: tool.result
    after: list[str]  # (a) server -> client: settled (stream, preview)
    call: list[str]  # every frame the server sends for one call of (b)
    per_call_down: float  # frames server -> client per call in (b), all of them
    per_call_up: float  # frames client -> server per call in (b) (input, acks)


async def capture_frames(rtt_url: str, stream_url: str, turns: int) -> Frames:
    """A vrt session of each kind, frames recorded: what the raw side sends.

    The app-call session stops after its third call, whose frames are kept (picked by type
    and phase, put in protocol order); the stream session runs its turns.
    """
    async with capture() as captured:
        async with vrt.connect(rtt_url, tools=[make_ping({})]) as client:
            async with client.subscribe() as events:
                await client.send_text("go")
                async for event in events:
                    if isinstance(event, vrt.ToolStream) and event.phase is vrt.Phase.SETTLED:
                        if event.call_id == "call_3":
                            break
    mine: dict[tuple[str, object], str] = {}
    for frame in captured.down:
        data = json.loads(frame)
        if data.get("callId") == "call_3":
            mine[data["type"], data.get("phase", data.get("complete"))] = frame  # last wins
    result = next(f for f in captured.up if '"callId":"call_3"' in f)
    try:
        before = [
            mine["tool.stream", "arguments-complete"],
            mine["tool.preview", True],  # sent with arguments-complete and again with settled
            mine["tool.call", None],
        ]
        after = [mine["tool.stream", "settled"], mine["tool.preview", True]]
    except KeyError as exc:
        raise RuntimeError(f"frames of an app call missing: {exc}") from None
    async with capture() as captured:
        async with vrt.connect(stream_url) as client:
            async with client.subscribe() as events:
                _received, calls = await drive_stream(client, events, turns)
    one = [f for f in captured.down if '"callId":"call_1"' in f]
    assert len(one) == 2 * (DELTAS + 3), one  # tool.stream + tool.preview per phase
    return Frames(
        echo=before[2],
        before=before,
        result=result,
        after=after,
        call=one,
        per_call_down=len(captured.down) / calls,
        per_call_up=len(captured.up) / calls,
    )


# -- (a) round trip ------------------------------------------------------------------------------


@dataclass
class Latency:
    rtts: list[float]  # seconds, after warm-up
    cpu: float  # process CPU time spent inside the measured intervals, summed
    to_run: list[float] = field(default_factory=list)  # vrt: arguments-complete -> run starts
    from_run: list[float] = field(default_factory=list)  # vrt: run starts -> settled

    @property
    def inverted(self) -> int:
        """vrt: calls whose app tool ran before the client saw arguments-complete."""
        return sum(1 for x in self.to_run if x < 0)

    @property
    def median(self) -> float:
        return statistics.median(self.rtts)

    @property
    def busy(self) -> float:
        """CPU / wall inside the intervals: about 1 when the round trip is the CPU both
        ends spend on it (nothing waits: loopback in one thread)."""
        return self.cpu / sum(self.rtts)

    @property
    def p99(self) -> float:
        return _percentile(self.rtts, 0.99)


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def raw_echo(url: str, frame: str, count: int, warmup: int) -> Latency:
    """Send ``frame``, await its echo; ``warmup + count`` times."""
    rtts: list[float] = []
    cpu = 0.0
    async with open_websocket_url(url) as ws:
        gc.collect()
        for i in range(warmup + count):
            start, used = time.perf_counter(), time.process_time()
            await ws.send_message(frame)
            await ws.get_message()
            rtts.append(time.perf_counter() - start)
            if i >= warmup:
                cpu += time.process_time() - used
    return Latency(rtts=rtts[warmup:], cpu=cpu)


async def raw_replay(url: str, frames: Frames, count: int, warmup: int) -> Latency:
    """vrt's frames for one app call over raw trio-websocket: from the client receiving
    the ``arguments-complete`` frame to it receiving the ``settled`` frame."""
    rtts: list[float] = []
    cpu = 0.0
    async with open_websocket_url(url) as ws:
        gc.collect()
        for i in range(warmup + count):
            await ws.send_message("next")
            await ws.get_message()  # tool.stream arguments-complete
            start, used = time.perf_counter(), time.process_time()
            await ws.get_message()  # tool.preview
            await ws.get_message()  # tool.call
            await ws.send_message(frames.result)
            await ws.get_message()  # tool.stream settled
            rtts.append(time.perf_counter() - start)
            if i >= warmup:
                cpu += time.process_time() - used
            await ws.get_message()  # tool.preview
    return Latency(rtts=rtts[warmup:], cpu=cpu)


async def vrt_rtt(url: str, count: int, warmup: int) -> Latency:
    """One session of ``warmup + count`` app calls; per call, from the client seeing
    ``arguments-complete`` to it seeing ``settled``."""
    started: dict[str, float] = {}
    complete: dict[str, float] = {}
    settled: dict[str, float] = {}
    cpu: dict[str, float] = {}  # CPU time at arguments-complete, then the CPU spent until settled
    async with vrt.connect(url, tools=[make_ping(started)]) as client:
        async with client.subscribe() as events:
            gc.collect()
            await client.send_text("go")
            async for event in events:
                now, used = time.perf_counter(), time.process_time()
                if type(event) is vrt.ToolStream:
                    if event.phase is vrt.Phase.ARGUMENTS_COMPLETE:
                        complete[event.call_id], cpu[event.call_id] = now, used
                    elif event.phase is vrt.Phase.SETTLED:
                        if not event.ok:
                            raise RuntimeError(f"call {event.call_id} settled {event.code}")
                        settled[event.call_id] = now
                        cpu[event.call_id] = used - cpu[event.call_id]
                        if len(settled) == warmup + count:
                            break
                elif type(event) is vrt.TurnEnded:
                    if event.reason != "finished":
                        raise RuntimeError(f"the turn ended {event.reason}")
                    break
    ids = [f"call_{i}" for i in range(warmup + 1, warmup + count + 1)]
    if len(settled) != warmup + count:
        raise RuntimeError(f"{len(settled)} calls settled, not {warmup + count}")
    # A check: were tool.call ever sent ahead of the call's arguments-complete (an event
    # pump task used to allow it), the app tool would run before the interval starts.
    return Latency(
        rtts=[settled[i] - complete[i] for i in ids],
        cpu=sum(cpu[i] for i in ids),
        to_run=[started[i] - complete[i] for i in ids],
        from_run=[settled[i] - started[i] for i in ids],
    )


# -- (b) stream ----------------------------------------------------------------------------------


@dataclass
class Run:
    messages: int
    wall: float
    cpu: float

    @property
    def rate(self) -> float:
        return self.messages / self.wall

    @property
    def cpu_per_message(self) -> float:
        return self.cpu / self.messages


async def raw_stream(url: str, count: int) -> Run:
    """Ask the streaming server for ``count`` frames and receive them."""
    async with open_websocket_url(url) as ws:
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        await ws.send_message(str(count))
        for _ in range(count):
            await ws.get_message()
        if await ws.get_message() != "done":
            raise RuntimeError("the raw stream did not end with 'done'")
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return Run(messages=count, wall=wall, cpu=cpu)


async def drive_stream(
    client: vrt.Client, events: vrt.Subscription[vrt.Event], turns: int
) -> tuple[int, int]:
    """Run ``turns`` turns, draining every event; return (events, calls settled)."""
    received = settled = 0
    for _ in range(turns):
        await client.send_text("go")
        async for event in events:
            received += 1
            if type(event) is vrt.ToolStream and event.phase is vrt.Phase.SETTLED:
                settled += 1
            elif type(event) is vrt.TurnEnded:
                if event.reason != "finished":
                    raise RuntimeError(f"the turn ended {event.reason}")
                break
            elif type(event) is vrt.Closed:
                hint = " (fewer --steps or --per-step)" if event.reason == "overflow" else ""
                raise RuntimeError(f"the session closed: {event.reason}{hint}")
    return received, settled


async def vrt_stream(url: str, turns: int, calls: int) -> Run:
    """One session of the stream agent, ``turns`` turns; the client drains every event."""
    async with vrt.connect(url) as client:
        async with client.subscribe() as events:
            gc.collect()
            seq = client.proto.received_seq
            wall, cpu = time.perf_counter(), time.process_time()
            received, settled = await drive_stream(client, events, turns)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            numbered = client.proto.received_seq - seq
    if settled != calls or numbered != received:
        raise RuntimeError(f"{settled} calls settled, {received} events, {numbered} messages")
    return Run(messages=received, wall=wall, cpu=cpu)


# -- the whole run -------------------------------------------------------------------------------


@dataclass
class Results:
    frames: Frames
    echo: list[Latency] = field(default_factory=list)
    replay: list[Latency] = field(default_factory=list)
    app: list[Latency] = field(default_factory=list)
    raw: list[Run] = field(default_factory=list)
    vrt: list[Run] = field(default_factory=list)


@dataclass
class Urls:
    echo: str = ""
    replay: str = ""
    rtt: str = ""
    raw_stream: str = ""
    vrt_stream: str = ""


@asynccontextmanager
async def servers(args: argparse.Namespace) -> AsyncIterator[tuple[Urls, Frames]]:
    """Every server on port 0: vrt's two, and the raw ones that send vrt's frames."""
    # One client sends calls back to back, well over the default 100 frames a second that
    # protects a server from a flooding peer: the limit off, the protocol's cost is measured.
    serve = functools.partial(vrt.serve, max_messages_per_second=1e9)
    async with trio.open_nursery() as nursery:
        urls = Urls()
        rtt = await nursery.start(serve, rtt_agent(args.rtt + args.warmup), HOST, 0)
        agent = stream_agent(args.turns, args.steps, args.per_step)
        stream = await nursery.start(serve, agent, HOST, 0)
        urls.rtt, urls.vrt_stream = rtt.url, stream.url
        frames = await capture_frames(urls.rtt, urls.vrt_stream, args.turns)
        urls.echo = await _start_raw(nursery, _echo)
        urls.replay = await _start_raw(nursery, _replayer(frames.before, frames.after))
        urls.raw_stream = await _start_raw(nursery, _streamer(frames.call))
        yield urls, frames
        nursery.cancel_scope.cancel()


async def _settle() -> None:
    """Let the previous connection finish closing before the next measurement."""
    await trio.sleep(0.05)
    gc.collect()


def _say(args: argparse.Namespace, text: str) -> None:
    if args.verbose:
        print(f"  {text}", file=sys.stderr)


async def measure(args: argparse.Namespace) -> Results:
    """Warm up, then ``repeats`` rounds; each round runs every case once, the order of
    the cases reversed every other round."""
    async with servers(args) as (urls, frames):
        r = Results(frames=frames)
        messages = args.messages or round(args.calls * frames.per_call_down)

        async def echo() -> str:
            r.echo.append(await raw_echo(urls.echo, frames.echo, args.rtt, args.warmup))
            return f"raw echo, median {r.echo[-1].median * 1e6:.0f} {US}"

        async def replay() -> str:
            r.replay.append(await raw_replay(urls.replay, frames, args.rtt, args.warmup))
            return f"raw, vrt's frames, median {r.replay[-1].median * 1e6:.0f} {US}"

        async def app() -> str:
            r.app.append(await vrt_rtt(urls.rtt, args.rtt, args.warmup))
            return f"vrt app call, median {r.app[-1].median * 1e6:.0f} {US}"

        async def raw() -> str:
            r.raw.append(run := await raw_stream(urls.raw_stream, messages))
            return f"raw stream {run.rate:,.0f} msg/s, {run.cpu_per_message * 1e6:.1f} {US}/msg"

        async def stream() -> str:
            r.vrt.append(run := await vrt_stream(urls.vrt_stream, args.turns, args.calls))
            return f"vrt stream {run.rate:,.0f} msg/s, {run.cpu_per_message * 1e6:.1f} {US}/msg"

        # warm up: imports, validators, caches, the kernel's sockets
        await raw_echo(urls.echo, frames.echo, args.warmup, 0)
        await raw_replay(urls.replay, frames, args.warmup, 0)
        await vrt_rtt(urls.rtt, args.warmup, 0)
        await raw_stream(urls.raw_stream, min(messages, 2000))
        await vrt_stream(urls.vrt_stream, args.turns, args.calls)
        for repeat in range(args.repeats):
            for cases in ([echo, replay, app], [raw, stream]):
                for case in cases if repeat % 2 == 0 else cases[::-1]:
                    await _settle()
                    _say(args, f"round {repeat + 1}: {await case()}")
        return r


# -- profile -------------------------------------------------------------------------------------


def _package(filename: str) -> str:
    """The package a profiled function belongs to (``vrt``, ``trio``, ``wsproto``, ...)."""
    if filename.startswith("<attrs generated"):
        return "attrs-generated"
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


async def _profiled(args: argparse.Namespace) -> tuple[Run, cProfile.Profile]:
    async with servers(args) as (urls, _frames):
        await vrt_stream(urls.vrt_stream, args.turns, args.calls)  # warm up
        await _settle()
        profiler = cProfile.Profile()
        profiler.enable()
        run = await vrt_stream(urls.vrt_stream, args.turns, args.calls)
        profiler.disable()
        return run, profiler


def profile(args: argparse.Namespace) -> None:
    """cProfile one vrt stream run (both ends); top functions by tottime, per wire message.

    Times include the profiler's overhead (about 2-3x the real cost), the shares do not.
    """
    run, profiler = trio.run(_profiled, args)
    raw: dict[Any, Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in raw.values())
    n = run.messages
    print(
        f"\nprofile: vrt stream, {n:,} wire messages ({run.rate:,.0f}/s under cProfile), "
        f"server and client; top {args.top} by tottime, per wire message"
    )
    print(f"  {'tottime':>10} {'share':>6} {'ncalls':>7}  function")
    rows = sorted(raw.items(), key=lambda item: item[1][2], reverse=True)[: args.top]
    for (filename, line, name), (_cc, ncalls, tottime, _cum, _callers) in rows:
        print(
            f"  {tottime / n * 1e6:7.2f} {US} {tottime / total:6.1%} "
            f"{ncalls / n:7.2f}  {name} ({_where(filename, line)})"
        )
    packages: Counter[str] = Counter()
    for (filename, _line, _name), entry in raw.items():
        packages[_package(filename)] += entry[2]
    print("  by package:")
    for package, seconds in packages.most_common(10):
        print(f"  {seconds / n * 1e6:7.2f} {US} {seconds / total:6.1%}  {package}")


# -- report --------------------------------------------------------------------------------------


def _verdict(ok: bool, value: float, target: float) -> str:
    return "PASS" if ok else f"MISS ({value / target - 1:+.0%})"


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f}"


def _best(values: Sequence[float], low: bool = True) -> tuple[float, float]:
    """The best of the runs (lowest, or highest) and their median."""
    return (min(values) if low else max(values)), statistics.median(values)


def report(args: argparse.Namespace, r: Results) -> tuple[float, float]:
    """Print the tables and the targets; return the two ratios the targets are about."""
    frames = r.frames
    sizes = [len(f.encode()) for f in frames.call]
    before = sum(len(f.encode()) for f in frames.before)
    after = sum(len(f.encode()) for f in frames.after)
    print(
        f"\n(a) round trip, {US}: best run (median of {args.repeats} runs); per run the median"
        f" and p99 of {args.rtt:,} round trips\n    after {args.warmup} warm-up. Frames "
        f"on the way: echo {len(frames.echo.encode())} B out and back; an app call\n"
        f"    {len(frames.before)} down ({before} B: arguments-complete stream and preview, "
        f"tool.call), 1 up ({len(frames.result.encode())} B), {len(frames.after)} down "
        f"({after} B: settled stream and preview)"
    )
    print(f"  {'':44}{'median':>15}{'p99':>15}{'/ echo':>9}{'CPU/wall':>10}")
    echo = _best([x.median for x in r.echo])
    rows = [
        ("raw trio-websocket echo", r.echo),
        ("raw trio-websocket, vrt's frames replayed", r.replay),
        ("vrt app tool, arguments-complete -> settled", r.app),
    ]
    for label, runs in rows:
        median = _best([x.median for x in runs])
        p99 = _best([x.p99 for x in runs])
        busy = statistics.median(x.busy for x in runs)
        print(
            f"  {label:44}{_us(median[0]):>7} ({_us(median[1]):>5})"
            f"{_us(p99[0]):>7} ({_us(p99[1]):>5}){median[0] / echo[0]:>8.2f}x{busy:>10.2f}"
        )
    to_run = statistics.median(x for a in r.app for x in a.to_run)
    from_run = statistics.median(x for a in r.app for x in a.from_run)
    print(
        f"  vrt, split (medians of all calls): arguments-complete -> the app tool runs "
        f"{_us(to_run)} {US};\n  the app tool runs -> settled {_us(from_run)} {US}; "
        f"tool.call ahead of arguments-complete: {sum(a.inverted for a in r.app)} of "
        f"{sum(len(a.rtts) for a in r.app):,} calls"
    )
    rtt_ratio = min(x.median for x in r.app) / echo[0]

    print(
        f"\n(b) stream: best run (median of {args.repeats} runs). vrt: {args.calls:,} calls "
        f"of {DELTAS} deltas, {args.per_step} per model step,\n    {args.steps} steps per "
        f"turn, {args.turns} turns; {frames.per_call_down:.1f} frames per call down, "
        f"{frames.per_call_up:.2f} up (input, acks).\n    raw: vrt's {len(sizes)} frames of "
        f"one call round robin ({min(sizes)}-{max(sizes)} B, mean "
        f"{statistics.mean(sizes):.0f} B)"
    )
    print(f"  {'':28}{'messages':>10}{'messages/s':>19}{'CPU ' + US + '/message':>20}")
    for label, stream in (("raw trio-websocket", r.raw), ("vrt tool.stream flow", r.vrt)):
        rate = _best([x.rate for x in stream], low=False)
        cpu = _best([x.cpu_per_message for x in stream])
        print(
            f"  {label:28}{stream[0].messages:>10,}{rate[0]:>11,.0f} ({rate[1]:>6,.0f})"
            f"{cpu[0] * 1e6:>12.1f} ({cpu[1] * 1e6:>5.1f})"
        )
    raw_cpu = _best([x.cpu_per_message for x in r.raw])
    vrt_cpu = _best([x.cpu_per_message for x in r.vrt])
    cpu_ratio = vrt_cpu[0] / raw_cpu[0]
    speed = max(x.rate for x in r.vrt) / max(x.rate for x in r.raw)
    print(
        f"  {'vrt / raw':28}{'':10}{speed:>10.2f}x{'':8}{cpu_ratio:>10.2f}x "
        f"({vrt_cpu[1] / raw_cpu[1]:.2f}x)"
    )
    share = sum(x.cpu for x in r.vrt) / sum(x.wall for x in r.vrt)
    per_call = vrt_cpu[0] * frames.per_call_down * 1e6
    print(f"  vrt: CPU/wall {share:.2f}, {per_call:,.0f} {US} CPU per call (both ends)")

    print("\ntargets (best runs):")
    print(
        f"  app-tool round trip median <= {TARGET_RTT_RATIO}x raw echo{'':9}{rtt_ratio:>6.2f}x  "
        f"{_verdict(rtt_ratio <= TARGET_RTT_RATIO, rtt_ratio, TARGET_RTT_RATIO)}"
    )
    print(
        f"  CPU per wire message <= {TARGET_CPU_RATIO:.0f}x raw trio-websocket{'':6}"
        f"{cpu_ratio:>6.2f}x  "
        f"{_verdict(cpu_ratio <= TARGET_CPU_RATIO, cpu_ratio, TARGET_CPU_RATIO)}"
    )
    return rtt_ratio, cpu_ratio


# -- main ----------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="vrt/1 over WebSockets against raw trio-websocket: round trip and stream."
    )
    add = parser.add_argument
    add("--quick", action="store_true", help="a fast smoke run")
    add("--profile", action="store_true", help="cProfile the vrt stream flow and stop")
    add("--rtt", type=int, default=1000, help="round trips per run (1,000)")
    add("--warmup", type=int, default=100, help="round trips dropped at the start (100)")
    add("--turns", type=int, default=5, help="turns per vrt stream run (5)")
    add("--steps", type=int, default=10, help="model steps per turn in (b) (10)")
    add("--per-step", type=int, default=20, help="calls per model step in (b) (20)")
    add("--messages", type=int, default=0, help="raw stream frames a run (default: as vrt)")
    add("--repeats", type=int, default=5, help="rounds: runs of each case (5)")
    add("--top", type=int, default=30, help="functions --profile shows (30)")
    add("--cpu", type=int, default=None, help="pin the process to this CPU")
    add("-v", "--verbose", action="store_true", help="print every run on stderr")
    args = parser.parse_args(argv)
    if args.quick:
        args.rtt, args.warmup, args.turns, args.steps, args.repeats = 200, 20, 1, 5, 2
    args.calls = args.turns * args.steps * args.per_step
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    print(
        f"vrt wire benchmark: Python {platform.python_version()}, trio {version('trio')}, "
        f"trio-websocket {version('trio-websocket')}, wsproto {version('wsproto')}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs ({allowed} allowed), one thread, "
        f"loopback, server and client in one trio.run"
    )
    print(
        f"workload: (a) app tool ping, one call per model step then a {PAUSE * 1e3:g} ms pause;"
        f" (b) server no-op\ntool, {DELTAS} arguments-delta per call, a subscribed client "
        f"draining every event"
    )
    if args.profile:
        profile(args)
        return
    report(args, trio.run(measure, args))


if __name__ == "__main__":
    main()
