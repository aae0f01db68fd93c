"""Wire cost: vrt/1 over WebSockets against raw trio-websocket and asyncio ``websockets``.

Run it as ``python -m bench.wire`` (``--quick`` for a smoke run, ``--profile`` for a
cProfile of the vrt stream flow, with ``--legacy`` in the legacy setting, ``--help`` for
the knobs). The trio side runs in one
process and one ``trio.run``, over loopback (127.0.0.1, port 0): every server shares the
thread with its client, on the raw side and the vrt side alike, so each figure covers both
ends of the connection. The asyncio ``websockets`` rows run the same way in a subprocess of
their own (``python -m bench.ws_asyncio``: server and client in one asyncio loop;
the trio process never imports ``websockets``, an extra of the bench only:
``pip install -e '.[bench]'``; without it the rows say "not installed").

vrt runs in two settings, the same servers (``vrt.serve`` offers every capability) and the
client choosing what it offers: **capabilities**, ``vrt.connect``'s default
(``tool-stream-v1``, ``batch-v1``: a frame may carry a JSON array of the messages queued
when the writer runs; ``local-preview-v1``: the client makes the ``tool.preview`` events
itself, none on the wire); and **legacy**, ``capabilities=vrt._wire.messages.LEGACY``
(``tool-stream-v1`` only: one object a frame, ``tool.preview`` frames on the wire).

At start-up the script captures vrt's frames (a class patch of trio-websocket's
``send_message``, only then) from a session of each kind in each setting. The raw echo and
stream send frames of the legacy setting, one message each, so a raw frame is the size of
one of vrt's messages; the replays send each setting's own. Counted from the captures, the
headers show the frames of one app call in each setting, and the frames per call of (b).
What it measures:

* **(a) Round trip** (``time.perf_counter``), ``--rtt`` round trips after ``--warmup``:

  - raw trio-websocket echo: a trio-websocket server echoes; the client sends a vrt
    ``tool.call`` frame (legacy, one object) and awaits it back;
  - asyncio websockets echo: the same frame, the same counts, ``websockets.asyncio``
    server and client (no compression, no pings), in the subprocess;
  - vrt app tool, capabilities and legacy: an agent with ``client_tools="accept"`` whose
    :class:`vrt.ScriptedModel` makes one app call per model step
    (``vrt.call("ping", {"i": n})``), then pauses 2 ms so no other call is on the wire;
    the client hosts the ``@vrt.app_tool`` ``ping``, which answers at once. Taken on the
    client, from the call's ``arguments-complete`` event to its ``settled`` event, both
    server messages: ``tool.call`` out, the run, ``tool.result`` back, ``settled`` out.
    A split line per setting: arguments-complete -> the app tool runs -> settled, and the
    calls whose app tool ran before the app saw ``arguments-complete`` (with ``batch-v1``
    both come in one frame, and the client's runner and its reader of events may go in
    either order);
  - raw replay, capabilities and legacy, for reference: a trio-websocket server sends the
    frames vrt sent for one app call of the captured session of that setting (from the
    frame with ``arguments-complete`` to the one with ``tool.call``), awaits vrt's
    ``tool.result`` frame, sends the frames to the one with ``settled`` (frames holding
    only acks left out); timed the same way, from the first frame received to the
    ``settled`` one. The floor for those frames over trio-websocket.

  Each row shows the median and p99 of a run's round trips, the median over the raw
  trio-websocket echo's (best runs, same run of the script), and CPU/wall inside the
  intervals (``time.process_time``): about 1 means the round trip is nothing but the CPU
  both ends spend on it.
* **(b) Stream**: messages per second and CPU per message (``time.process_time`` over the
  run, divided by the messages).

  - vrt, capabilities and legacy: a server no-op tool, each call's arguments in 8
    ``arguments-delta`` fragments (``vrt.call("noop", ..., chunks=8)``), ``--per-step``
    calls per model step, ``--steps`` steps per turn, ``--turns`` turns; the client
    subscribes and drains every event. A message is a numbered server message the client
    received (``client.proto.received_seq``; each message of a batch counts: ``tool.stream``,
    legacy ``tool.preview``, ``turn.started``, ``turn.ended``); acks, either way, and the
    client's ``input`` are carried but not counted. Also shown: frames on the wire down per
    message (every frame the client's protocol core was handed, acks included; counted by
    wrapping ``client.proto.receive`` for the run, a plain call per frame), events
    delivered to the app per message (with local previews the client adds its own
    ``tool.preview`` events), and the CPU per frame and per event;
  - raw trio-websocket frames: the server sends vrt's legacy frames of one call, round
    robin, as many times over as vrt has calls (or ``--messages`` frames), and the client
    receives them; a message is a frame;
  - asyncio websockets frames: the same frames and count, in the subprocess.

  The ratio column is CPU per message over raw trio-websocket's CPU per frame.

Every case runs once per round, the order reversed every other round, ``--repeats``
rounds; the tables show the best run and the median of the runs in brackets. Targets
(best runs, ratios within one run of the script): the app-tool round trip median with the
capabilities at most 1.5x the raw trio-websocket echo (stretch 1.2x), and the CPU per vrt
message with the capabilities at most 1.0x raw trio-websocket's CPU per frame in (b)
(stretch 0.5x).
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
from trio_websocket import (
    ConnectionClosed,
    WebSocketConnection,
    WebSocketRequest,
    open_websocket_url,
    serve_websocket,
)

import vrt
from bench.harness import ROOT, version, vrt_from
from vrt._wire.messages import CAPABILITIES, LEGACY

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
SETTINGS: dict[str, tuple[str, ...]] = {"capabilities": CAPABILITIES, "legacy": LEGACY}
"""What the vrt client offers, by setting (the servers offer every capability)."""
MEASURED = "call_3"
"""The app call of the captured (a) session whose frames are replayed."""
TARGET_RTT_RATIO = 1.5
STRETCH_RTT_RATIO = 1.2
TARGET_CPU_RATIO = 1.0
STRETCH_CPU_RATIO = 0.5
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


def _replayer(call: AppCall) -> Callable[[WebSocketRequest], Awaitable[None]]:
    """vrt's frames for one app call, replayed: on each ``"next"`` send ``call.before``,
    await the client's answer, send ``call.after`` and ``call.trailing``."""

    async def handler(request: WebSocketRequest) -> None:
        ws = await request.accept()
        try:
            while True:
                await ws.get_message()
                for frame in call.before:
                    await ws.send_message(frame)
                await ws.get_message()
                for frame in call.after + call.trailing:
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


def messages_in(frame: str) -> list[dict[str, Any]]:
    """The messages a frame carries: one object, or a ``batch-v1`` JSON array of them."""
    data = json.loads(frame)
    return data if isinstance(data, list) else [data]


def _label(message: dict[str, Any]) -> str:
    """A message's short name: its ``tool.stream`` phase, or its type."""
    if message["type"] == "tool.stream":
        return str(message["phase"])
    return str(message["type"])


def describe(frame: str) -> str:
    """A frame as its messages' short names, a batch's joined by ``+``."""
    return "+".join(_label(x) for x in messages_in(frame))


def _find(frames: Sequence[str], test: Callable[[dict[str, Any]], bool], what: str) -> int:
    for index, frame in enumerate(frames):
        if any(test(x) for x in messages_in(frame)):
            return index
    raise RuntimeError(f"no frame with {what} of {MEASURED} captured")


def _only_acks(frame: str) -> bool:
    return all(x["type"] == "ack" for x in messages_in(frame))


@dataclass
class AppCall:
    """One app call of (a) as a vrt setting put it on the wire (``MEASURED`` of a session)."""

    before: list[str]  # down: from the frame with arguments-complete to the one with tool.call
    result: str  # up: the frame with the tool.result
    after: list[str]  # down: after tool.call, to the frame with settled
    trailing: list[str]  # down: frames of the call's own after settled (outside the interval)

    @property
    def hops(self) -> int:
        """Frames on the way inside the interval (after the arguments-complete frame)."""
        return len(self.before) - 1 + 1 + len(self.after)

    def path(self) -> str:
        """The interval's frames in order: down ones as their messages, the up one marked."""
        down = [describe(f) for f in self.before]
        tail = [describe(f) for f in self.after]
        return " > ".join([*down, f"up {describe(self.result)}", *tail])


def _app_call(captured: Captured) -> AppCall:
    """Pick ``MEASURED``'s frames out of a captured (a) session."""

    def mine(test: Callable[[dict[str, Any]], bool]) -> Callable[[dict[str, Any]], bool]:
        return lambda x: x.get("callId") == MEASURED and test(x)

    down = [f for f in captured.down if not _only_acks(f)]
    complete = _find(
        down,
        mine(lambda x: x["type"] == "tool.stream" and x["phase"] == "arguments-complete"),
        "arguments-complete",
    )
    call = _find(down, mine(lambda x: x["type"] == "tool.call"), "tool.call")
    settled = _find(
        down,
        mine(lambda x: x["type"] == "tool.stream" and x["phase"] == "settled"),
        "settled",
    )
    if not complete <= call < settled:
        order = f"{complete}, {call}, {settled}"
        raise RuntimeError(f"{MEASURED}: arguments-complete, tool.call, settled in frames {order}")
    trailing = []
    for frame in down[settled + 1 :]:
        ids = {x.get("callId") for x in messages_in(frame)}
        if ids != {MEASURED}:
            break
        trailing.append(frame)
    up = [f for f in captured.up if any(x.get("callId") == MEASURED for x in messages_in(f))]
    result = _find(up, mine(lambda x: x["type"] == "tool.result"), "tool.result")
    return AppCall(
        before=down[complete : call + 1],
        result=up[result],
        after=down[call + 1 : settled + 1],
        trailing=trailing,
    )


@dataclass
class StreamCapture:
    """What a captured (b) session put on the wire."""

    calls: int
    down: int  # frames server -> client, the whole session
    up: int  # frames client -> server (hello, input, acks, close)
    messages: int  # messages server -> client, each of a batch counted, acks included
    acks: int  # the client's ack messages
    call: list[str]  # the frames holding a message of call_1


@dataclass
class Setting:
    """Everything captured with one setting's capabilities."""

    negotiated: list[str]
    app: AppCall
    stream: StreamCapture


async def capture_setting(
    rtt_url: str, stream_url: str, turns: int, capabilities: Sequence[str]
) -> Setting:
    """A vrt session of each kind, frames recorded. The app-call session stops once
    ``MEASURED`` settled; the stream session runs its turns."""
    async with capture() as captured:
        async with vrt.connect(rtt_url, tools=[make_ping({})], capabilities=capabilities) as c:
            async with c.subscribe() as events:
                await c.send_text("go")
                async for event in events:
                    if isinstance(event, vrt.ToolStream) and event.phase is vrt.Phase.SETTLED:
                        if event.call_id == MEASURED:
                            break
    welcome = messages_in(captured.down[0])[0]
    if welcome["type"] != "welcome":
        raise RuntimeError(f"the first frame captured is not a welcome: {captured.down[0]}")
    app = _app_call(captured)
    async with capture() as captured:
        async with vrt.connect(stream_url, capabilities=capabilities) as client:
            async with client.subscribe() as events:
                _messages, _events, calls = await drive_stream(client, events, turns)
    down = [x for f in captured.down for x in messages_in(f)]
    up = [x for f in captured.up for x in messages_in(f)]
    call = [f for f in captured.down if '"callId":"call_1"' in f]
    return Setting(
        negotiated=list(welcome["capabilities"]),
        app=app,
        stream=StreamCapture(
            calls=calls,
            down=len(captured.down),
            up=len(captured.up),
            messages=len(down),
            acks=sum(1 for x in up if x["type"] == "ack"),
            call=call,
        ),
    )


@dataclass
class Frames:
    """vrt's frames, by setting, and what the raw sides send."""

    settings: dict[str, Setting]

    @property
    def echo(self) -> str:
        """(a)'s echo frame: the legacy ``tool.call`` of ``MEASURED`` (one object)."""
        return self.settings["legacy"].app.before[-1]

    @property
    def call(self) -> list[str]:
        """(b)'s raw frames: the legacy frames of one call, one message each."""
        return self.settings["legacy"].stream.call


async def capture_frames(rtt_url: str, stream_url: str, turns: int) -> Frames:
    """Capture each setting; check that legacy is one object a frame."""
    settings = {
        name: await capture_setting(rtt_url, stream_url, turns, capabilities)
        for name, capabilities in SETTINGS.items()
    }
    legacy = settings["legacy"]
    for frame in [*legacy.app.before, *legacy.app.after, *legacy.stream.call]:
        if frame.startswith("["):
            raise RuntimeError(f"a batch on the legacy wire: {frame[:80]}")
    for name, setting in settings.items():
        missing = set(SETTINGS[name]) - set(setting.negotiated)
        if missing:
            raise RuntimeError(f"{name}: the server did not take {sorted(missing)}")
    return Frames(settings=settings)


# -- (a) round trip ------------------------------------------------------------------------------


@dataclass
class Latency:
    rtts: list[float]  # seconds, after warm-up
    cpu: float  # process CPU time spent inside the measured intervals, summed
    to_run: list[float] = field(default_factory=list)  # vrt: arguments-complete -> run starts
    from_run: list[float] = field(default_factory=list)  # vrt: run starts -> settled

    @property
    def inverted(self) -> int:
        """vrt: calls whose app tool ran before the app saw arguments-complete."""
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


async def raw_replay(url: str, call: AppCall, count: int, warmup: int) -> Latency:
    """vrt's frames for one app call over raw trio-websocket: from the client receiving
    the frame with ``arguments-complete`` to it receiving the one with ``settled``."""
    rtts: list[float] = []
    cpu = 0.0
    async with open_websocket_url(url) as ws:
        gc.collect()
        for i in range(warmup + count):
            await ws.send_message("next")
            await ws.get_message()  # the frame with arguments-complete
            start, used = time.perf_counter(), time.process_time()
            for _ in call.before[1:]:
                await ws.get_message()  # to the one with tool.call
            await ws.send_message(call.result)
            for _ in call.after:
                await ws.get_message()  # to the one with settled
            rtts.append(time.perf_counter() - start)
            if i >= warmup:
                cpu += time.process_time() - used
            for _ in call.trailing:
                await ws.get_message()
    return Latency(rtts=rtts[warmup:], cpu=cpu)


async def vrt_rtt(url: str, count: int, warmup: int, capabilities: Sequence[str]) -> Latency:
    """One session of ``warmup + count`` app calls; per call, from the client seeing
    ``arguments-complete`` to it seeing ``settled``."""
    started: dict[str, float] = {}
    complete: dict[str, float] = {}
    settled: dict[str, float] = {}
    cpu: dict[str, float] = {}  # CPU time at arguments-complete, then the CPU spent until settled
    tools = [make_ping(started)]
    async with vrt.connect(url, tools=tools, capabilities=capabilities) as client:
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
    # pump task used to allow it), the app tool would run before the interval starts. In
    # one batch, the client's runner and the app's reader of events both wake on the same
    # frame, and either may go first.
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
    frames: int = 0  # vrt: frames down the client's core was handed (raw: = messages)
    events: int = 0  # vrt: events delivered to the app (raw: = messages)

    @property
    def rate(self) -> float:
        return self.messages / self.wall

    @property
    def cpu_per_message(self) -> float:
        return self.cpu / self.messages

    @property
    def busy(self) -> float:
        return self.cpu / self.wall


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
    return Run(messages=count, wall=wall, cpu=cpu, frames=count, events=count)


async def drive_stream(
    client: vrt.Client, events: vrt.Subscription[vrt.Event], turns: int
) -> tuple[int, int, int]:
    """Run ``turns`` turns, draining every event; return (messages received, events
    delivered, calls settled)."""
    seq = client.proto.received_seq
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
    return client.proto.received_seq - seq, received, settled


async def vrt_stream(url: str, turns: int, calls: int, capabilities: Sequence[str]) -> Run:
    """One session of the stream agent, ``turns`` turns; the client drains every event.

    The frames the client reads are counted by wrapping its protocol core's ``receive``
    (looked up on each frame by the client's reader) for the run."""
    async with vrt.connect(url, capabilities=capabilities) as client:
        async with client.subscribe() as events:
            proto = client.proto
            receive = proto.receive
            frames = 0

            def counted(frame: str | bytes) -> list[Any]:
                nonlocal frames
                frames += 1
                return receive(frame)

            proto.receive = counted  # type: ignore[method-assign]
            gc.collect()
            wall, cpu = time.perf_counter(), time.process_time()
            messages, received, settled = await drive_stream(client, events, turns)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            del proto.receive
    # Legacy: every message is an event. Local previews add the client's own. No frame
    # counted: the client's reader no longer looks receive up on each frame.
    expected = messages == received if capabilities == LEGACY else messages <= received
    if settled != calls or not expected or not frames:
        raise RuntimeError(
            f"{settled} calls settled of {calls}, {received} events, {messages} messages, "
            f"{frames} frames"
        )
    return Run(messages=messages, wall=wall, cpu=cpu, frames=frames, events=received)


# -- asyncio websockets, in a subprocess ---------------------------------------------------------


async def asyncio_job(job: dict[str, Any]) -> dict[str, Any] | None:
    """Run a job of bench/ws_asyncio.py in a fresh ``sys.executable``; None if
    ``websockets`` is not installed there."""
    done = await trio.run_process(
        [sys.executable, "-m", "bench.ws_asyncio"],
        cwd=ROOT,
        stdin=json.dumps(job).encode(),
        capture_stdout=True,
    )
    answer: dict[str, Any] = json.loads(done.stdout)
    return None if "missing" in answer else answer


async def asyncio_echo(frame: str, count: int, warmup: int) -> Latency | None:
    answer = await asyncio_job({"mode": "echo", "frame": frame, "count": count, "warmup": warmup})
    return None if answer is None else Latency(rtts=answer["rtts"], cpu=answer["cpu"])


async def asyncio_stream(frames: Sequence[str], count: int, warmup: int) -> Run | None:
    job = {"mode": "stream", "frames": list(frames), "count": count, "warmup": warmup}
    answer = await asyncio_job(job)
    if answer is None:
        return None
    n = answer["messages"]
    return Run(messages=n, wall=answer["wall"], cpu=answer["cpu"], frames=n, events=n)


# -- the whole run -------------------------------------------------------------------------------


RTT_ROWS = {
    "echo": "raw trio-websocket echo",
    "asyncio echo": "asyncio websockets echo (subprocess)",
    "replay capabilities": "raw trio-websocket, vrt's frames: capabilities",
    "replay legacy": "raw trio-websocket, vrt's frames: legacy",
    "vrt capabilities": "vrt app tool, capabilities (default)",
    "vrt legacy": "vrt app tool, legacy",
}
STREAM_ROWS = {
    "raw": "raw trio-websocket frames",
    "asyncio": "asyncio websockets frames (subprocess)",
    "vrt capabilities": "vrt, capabilities (default)",
    "vrt legacy": "vrt, legacy",
}


Case = Callable[[], Awaitable[str]]
"""One measurement of a round: runs, keeps its result, and says what it measured."""


@dataclass
class Results:
    frames: Frames
    messages: int  # raw frames a (b) run
    rtt: dict[str, list[Latency]] = field(default_factory=dict)
    stream: dict[str, list[Run]] = field(default_factory=dict)


@dataclass
class Urls:
    echo: str = ""
    replay: dict[str, str] = field(default_factory=dict)
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
        for name, setting in frames.settings.items():
            urls.replay[name] = await _start_raw(nursery, _replayer(setting.app))
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
        messages = args.messages or args.calls * len(frames.call)
        r = Results(frames=frames, messages=messages)
        rtt, warmup = args.rtt, args.warmup

        def latency(key: str, run: Callable[[], Awaitable[Latency | None]]) -> Case:
            async def case() -> str:
                result = await run()
                if result is None:
                    return f"{key}: websockets not installed"
                r.rtt.setdefault(key, []).append(result)
                return f"{key}, median {result.median * 1e6:.0f} {US}"

            return case

        def flow(key: str, run: Callable[[], Awaitable[Run | None]]) -> Case:
            async def case() -> str:
                result = await run()
                if result is None:
                    return f"{key}: websockets not installed"
                r.stream.setdefault(key, []).append(result)
                per = result.cpu_per_message * 1e6
                return f"{key} stream {result.rate:,.0f} msg/s, {per:.1f} {US}/msg"

            return case

        rtt_cases = [latency("echo", lambda: raw_echo(urls.echo, frames.echo, rtt, warmup))]
        stream_cases = [flow("raw", lambda: raw_stream(urls.raw_stream, messages))]
        probe = {"mode": "echo", "frame": "x", "count": 1, "warmup": 0}
        if await asyncio_job(probe) is not None:  # else the rows say "not installed"
            rtt_cases.append(
                latency("asyncio echo", lambda: asyncio_echo(frames.echo, rtt, warmup))
            )
            warm = min(messages, 2000)
            stream_cases.append(
                flow("asyncio", lambda: asyncio_stream(frames.call, messages, warm))
            )
        for name, capabilities in SETTINGS.items():
            call = frames.settings[name].app
            rtt_cases.append(
                latency(
                    f"replay {name}",
                    functools.partial(raw_replay, urls.replay[name], call, rtt, warmup),
                )
            )
            rtt_cases.append(
                latency(
                    f"vrt {name}",
                    functools.partial(vrt_rtt, urls.rtt, rtt, warmup, capabilities),
                )
            )
            stream_cases.append(
                flow(
                    f"vrt {name}",
                    functools.partial(
                        vrt_stream, urls.vrt_stream, args.turns, args.calls, capabilities
                    ),
                )
            )

        # warm up: imports, validators, caches, the kernel's sockets
        await raw_echo(urls.echo, frames.echo, warmup, 0)
        await raw_stream(urls.raw_stream, min(messages, 2000))
        for name, capabilities in SETTINGS.items():
            await raw_replay(urls.replay[name], frames.settings[name].app, warmup, 0)
            await vrt_rtt(urls.rtt, warmup, 0, capabilities)
            await vrt_stream(urls.vrt_stream, args.turns, args.calls, capabilities)
        for repeat in range(args.repeats):
            for cases in (rtt_cases, stream_cases):
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
    capabilities = SETTINGS[args.setting]
    async with servers(args) as (urls, _frames):
        await vrt_stream(urls.vrt_stream, args.turns, args.calls, capabilities)  # warm up
        await _settle()
        profiler = cProfile.Profile()
        profiler.enable()
        run = await vrt_stream(urls.vrt_stream, args.turns, args.calls, capabilities)
        profiler.disable()
        return run, profiler


def profile(args: argparse.Namespace) -> None:
    """cProfile one vrt stream run (both ends); top functions by tottime, per message.

    Times include the profiler's overhead (about 2-3x the real cost), the shares do not.
    """
    run, profiler = trio.run(_profiled, args)
    raw: dict[Any, Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in raw.values())
    n = run.messages
    print(
        f"\nprofile: vrt stream, {args.setting}, {n:,} messages in {run.frames:,} frames "
        f"({run.rate:,.0f} messages/s under cProfile),\nserver and client; top {args.top} "
        f"by tottime, per message"
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


def _size(frames: Sequence[str]) -> int:
    return sum(len(f.encode()) for f in frames)


def report_rtt(args: argparse.Namespace, r: Results) -> float:
    """Print (a); return the ratio its target is about."""
    frames = r.frames
    print(
        f"\n(a) round trip, {US}: best run (median of {args.repeats} runs); per run the median"
        f" and p99 of {args.rtt:,} round trips\n    after {args.warmup} warm-up. The echo: "
        f"{len(frames.echo.encode())} B out and back. An app call's frames, from the one with"
        f"\n    arguments-complete to the one with settled (captured; '>' between frames, "
        f"'+' between\n    the messages of a batch):"
    )
    for name, setting in frames.settings.items():
        call = setting.app
        size = _size([*call.before[1:], call.result, *call.after])
        print(f"    {name + ':':13} {call.path()}")
        print(f"    {'':13} {call.hops} frames on the way after the first ({size} B)")
    print(f"  {'':46}{'median':>14}{'p99':>16}{'/ echo':>8}{'CPU/wall':>10}")
    echo = _best([x.median for x in r.rtt["echo"]])
    for key, label in RTT_ROWS.items():
        runs = r.rtt.get(key)
        if not runs:
            print(f"  {label:46}{'not installed':>14}")
            continue
        median = _best([x.median for x in runs])
        p99 = _best([x.p99 for x in runs])
        busy = statistics.median(x.busy for x in runs)
        print(
            f"  {label:46}{_us(median[0]):>6} ({_us(median[1]):>5})"
            f"{_us(p99[0]):>8} ({_us(p99[1]):>5}){median[0] / echo[0]:>7.2f}x{busy:>10.2f}"
        )
    for name in SETTINGS:
        runs = r.rtt[f"vrt {name}"]
        to_run = statistics.median(x for a in runs for x in a.to_run)
        from_run = statistics.median(x for a in runs for x in a.from_run)
        print(
            f"  vrt {name}, split (medians of all calls): arguments-complete -> the app tool "
            f"runs {_us(to_run)} {US},\n    the app tool runs -> settled {_us(from_run)} {US}; "
            f"the app tool ran before the app saw arguments-complete\n    in "
            f"{sum(a.inverted for a in runs):,} of {sum(len(a.rtts) for a in runs):,} calls"
        )
    return min(x.median for x in r.rtt["vrt capabilities"]) / echo[0]


def report_stream(args: argparse.Namespace, r: Results) -> float:
    """Print (b); return the ratio its target is about."""
    frames = r.frames
    sizes = [len(f.encode()) for f in frames.call]
    print(
        f"\n(b) stream: best run (median of {args.repeats} runs). vrt: {args.calls:,} calls "
        f"of {DELTAS} deltas, {args.per_step} per model step,\n    {args.steps} steps per "
        f"turn, turns: {args.turns}. Raw: vrt legacy's {len(sizes)} frames of one call, round "
        f"robin\n    ({min(sizes)}-{max(sizes)} B, mean {statistics.mean(sizes):.0f} B), "
        f"{r.messages:,} a run. Captured, per call, whole sessions:"
    )
    for name, setting in frames.settings.items():
        s = setting.stream
        print(
            f"    {name + ':':13} {s.down / s.calls:.2f} frames down ({s.messages / s.calls:.2f}"
            f" messages, acks included), {s.up / s.calls:.2f} up ({s.acks / s.calls:.2f} acks)"
        )
    print(
        f"  {'':40}{'messages':>8}{'messages/s':>20}{'CPU ' + US + '/message':>16}"
        f"{'/ raw':>7}{'CPU/wall':>10}"
    )
    raw = _best([x.cpu_per_message for x in r.stream["raw"]])
    for key, label in STREAM_ROWS.items():
        runs = r.stream.get(key)
        if not runs:
            print(f"  {label:40}{'not installed':>15}")
            continue
        rate = _best([x.rate for x in runs], low=False)
        cpu = _best([x.cpu_per_message for x in runs])
        print(
            f"  {label:40}{runs[0].messages:>8,}{rate[0]:>10,.0f} ({rate[1]:>7,.0f})"
            f"{cpu[0] * 1e6:>8.1f} ({cpu[1] * 1e6:>5.1f}){cpu[0] / raw[0]:>6.2f}x"
            f"{statistics.median(x.busy for x in runs):>10.2f}"
        )
    print(
        f"  {'vrt, per message (median of the runs)':40}{'frames':>8}{'events':>8}"
        f"  {'CPU ' + US + ' per frame':>20}{'per event':>16}"
    )
    for name in SETTINGS:
        runs = r.stream[f"vrt {name}"]
        per_frame = _best([x.cpu / x.frames for x in runs])
        per_event = _best([x.cpu / x.events for x in runs])
        print(
            f"  {STREAM_ROWS[f'vrt {name}']:40}"
            f"{statistics.median(x.frames / x.messages for x in runs):>8.3f}"
            f"{statistics.median(x.events / x.messages for x in runs):>8.2f}"
            f"  {per_frame[0] * 1e6:>10,.1f} ({per_frame[1] * 1e6:>7,.1f})"
            f"{per_event[0] * 1e6:>7.1f} ({per_event[1] * 1e6:>6.1f})"
        )
    return min(x.cpu_per_message for x in r.stream["vrt capabilities"]) / raw[0]


def _target(label: str, value: float, target: float, stretch: float) -> None:
    print(f"  {label:64}{value:>6.2f}x  {_verdict(value <= target, value, target)}")
    verdict = _verdict(value <= stretch, value, stretch)
    print(f"  {f'  stretch <= {stretch:g}x (info)':64}{'':7}  {verdict}")


def report(args: argparse.Namespace, r: Results) -> tuple[float, float]:
    """Print the tables and the targets; return the two ratios the targets are about."""
    rtt_ratio = report_rtt(args, r)
    cpu_ratio = report_stream(args, r)
    print("\ntargets (best runs, ratios within this run):")
    _target(
        f"app-tool round trip median, capabilities <= {TARGET_RTT_RATIO:g}x raw echo",
        rtt_ratio,
        TARGET_RTT_RATIO,
        STRETCH_RTT_RATIO,
    )
    _target(
        f"CPU per vrt message, capabilities <= {TARGET_CPU_RATIO:g}x raw CPU per frame",
        cpu_ratio,
        TARGET_CPU_RATIO,
        STRETCH_CPU_RATIO,
    )
    return rtt_ratio, cpu_ratio


# -- main ----------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="vrt/1 over WebSockets against raw trio-websocket and asyncio websockets: "
        "round trip and stream."
    )
    add = parser.add_argument
    add("--quick", action="store_true", help="a fast smoke run")
    add("--profile", action="store_true", help="cProfile the vrt stream flow and stop")
    add("--legacy", action="store_true", help="--profile the legacy setting, not capabilities")
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
    args.setting = "legacy" if args.legacy else "capabilities"
    if args.rtt + args.warmup < int(MEASURED.removeprefix("call_")):
        parser.error(f"--rtt plus --warmup must make at least {MEASURED}'s number of calls")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    print(
        f"vrt wire benchmark: Python {platform.python_version()}, trio {version('trio')}, "
        f"trio-websocket {version('trio-websocket')}, wsproto {version('wsproto')}, "
        f"websockets {version('websockets')} (asyncio, a subprocess), {platform.machine()}, "
        f"{os.cpu_count()} CPUs ({allowed} allowed); the trio side in one thread, "
        f"loopback, server and client in one trio.run\n{vrt_from()}"
    )
    print(
        f"workload: (a) app tool ping, one call per model step then a {PAUSE * 1e3:g} ms pause;"
        f" (b) server no-op\ntool, {DELTAS} arguments-delta per call, a subscribed client "
        f"draining every event. vrt settings:\ncapabilities = {', '.join(CAPABILITIES)} "
        f"(the default); legacy = {', '.join(LEGACY)}"
    )
    if args.profile:
        profile(args)
        return
    results = trio.run(measure, args)
    if "websockets" in sys.modules:
        raise RuntimeError("the trio process imported websockets: it must stay in the subprocess")
    report(args, results)


if __name__ == "__main__":
    main()
