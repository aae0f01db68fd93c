"""The clients of a served run: sessions against a ``vrt serve`` (or any vrt/1 server) URL.

:class:`Fleet` runs ``--client vrt`` sessions (:func:`vrt.connect`: the real client, with
resumes, acks and the app tool through its runner) or ``--client light`` ones
(:class:`Light`: a minimal vrt/1 client on a raw socket, its own WebSocket framing,
``json``, no events; it sends an input, answers each ``tool.call`` at once and acks at
``turn.ended`` or every 50 messages: 0.6-0.75 ms of CPU a turn at saturation where
``vrt.connect`` takes 2.6 ms, so that the clients leave more of the machine to the
servers). A session whose index is below :attr:`Fleet.active` runs turns ``think`` seconds
apart; the others wait, connected and idle. :func:`fleet_of` gives a fleet in this process
or, with ``--clients-process``, in a child (``python -m bench.fleet``) driven by JSON
lines; both count what they saw in a
:class:`Tally` that :mod:`bench.windows` samples.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import logging
import os
import random
import struct
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import trio
import trio.lowlevel

import vrt
from bench.agents import SHOW_PARAMETERS
from bench.harness import ROOT


class SessionEnded(Exception):
    """The session cannot go on (the reason is counted already)."""


@dataclass
class Tally:
    """What the clients saw; :meth:`Fleet.sample` hands over what is new since the last."""

    turns: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    turn_time: list[float] = field(default_factory=list)
    rtt: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    resumed_at: list[float] = field(default_factory=list)  # perf_counter of each Resumed
    resumes: int = 0
    sessions: int = 0  # sessions opened (a recycled client opens a new one)
    closed: int = 0  # Closed events before the client left
    refused: int = 0  # resume attempts answered HTTP 503 (a draining worker)
    failed_attempts: int = 0  # resume attempts that failed otherwise
    failures: Counter[str] = field(default_factory=Counter)  # by exception type

    def error(self, what: str) -> None:
        self.errors[what[:160]] += 1


@vrt.app_tool(description="Shows an item", parameters=SHOW_PARAMETERS)
async def show(args: Any, ctx: vrt.ToolContext) -> Any:
    """The app tool: answers at once."""
    return {"shown": args["id"]}


class ClientLog(logging.Handler):
    """Counts what vrt.connect logs about its resume attempts (at DEBUG: a 503, a failed
    attempt) and every ``error`` frame (INFO), into a :class:`Tally`."""

    def __init__(self, tally: Tally) -> None:
        super().__init__(logging.DEBUG)
        self.tally = tally

    def emit(self, record: logging.LogRecord) -> None:
        message = record.msg if isinstance(record.msg, str) else ""
        if "HTTP 503" in message:
            self.tally.refused += 1
        elif "connection attempt" in message:
            self.tally.failed_attempts += 1
            args = record.args if isinstance(record.args, tuple) else ()
            why = type(args[2]).__name__ if len(args) > 2 else "OSError"
            self.tally.failures[why] += 1
        elif message.startswith("server error") and isinstance(record.args, tuple):
            self.tally.error(f"error frame {record.args[0]}")
        elif record.levelno >= logging.WARNING:
            self.tally.error(f"vrt.client logged {record.getMessage()}")


class Fleet:
    """Client sessions against ``url``: ``kind`` ``vrt`` (vrt.connect) or ``light``.

    Sessions whose index is below :attr:`active` run turns, ``think`` seconds apart
    (0.5-1.5x at random; 0: at once); the others wait, connected and idle. With
    ``recycle`` a client leaves after that many turns and opens a new session.
    """

    def __init__(
        self,
        url: str,
        *,
        kind: str,
        steps: int,
        recycle: int = 0,
        turn_timeout: float = 60.0,
        connect_timeout: float = 30.0,
        resume_timeout: float = 60.0,
        seed: int = 1,
    ) -> None:
        self.url = url
        self.kind = kind
        self.steps = steps
        self.recycle = recycle
        self.turn_timeout = turn_timeout
        self.connect_timeout = connect_timeout
        self.resume_timeout = resume_timeout
        self.seed = seed
        self.think = 1.0
        self.active = 0
        self.changed = trio.Event()
        self.leaving = False
        self.tally = Tally()
        self.connected = 0
        self._since = {"turn_time": 0, "rtt": 0, "gaps": 0, "resumed_at": 0}
        self._nursery: trio.Nursery | None = None
        self._count = 0

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Fleet]:
        if self.kind == "vrt":
            logger = logging.getLogger("vrt.client")
            logger.setLevel(logging.DEBUG)
            logger.propagate = False
            logger.addHandler(ClientLog(self.tally))
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            yield self
            await self.leave()

    async def connect(self, count: int, batch: int = 50) -> int:
        """Open ``count`` more sessions, ``batch`` at a time; the sessions connected."""
        assert self._nursery is not None
        for first in range(0, count, batch):
            async with trio.open_nursery() as wave:
                for _ in range(min(batch, count - first)):
                    index = self._count
                    self._count += 1
                    wave.start_soon(self._nursery.start, self._client, index)
        return self.connected

    def load(self, think: float, active: int) -> None:
        self.think = think
        self.active = active
        self.changed.set()
        self.changed = trio.Event()

    def sample(self) -> dict[str, Any]:
        t = self.tally
        out: dict[str, Any] = {
            "turns": t.turns,
            "errors": dict(t.errors),
            "resumes": t.resumes,
            "refused": t.refused,
            "failed_attempts": t.failed_attempts,
            "failures": dict(t.failures),
            "sessions": t.sessions,
            "closed": t.closed,
            "connected": self.connected,
            "cpu": time.process_time(),
            "wall": time.perf_counter(),
        }
        for name, start in self._since.items():
            values = getattr(t, name)
            out[name] = values[start:]
            self._since[name] = len(values)
        return out

    async def leave(self) -> None:
        """Every client closes its session (``close``) and leaves."""
        self.leaving = True
        self.changed.set()
        await trio.lowlevel.checkpoint()

    async def _wait_turn(self, index: int, rng: random.Random, first: bool) -> bool:
        """Wait until this session may run its next turn; False once the fleet leaves.
        The first wait after a change of load is 0-1x think (sessions not in step), the
        others 0.5-1.5x; a change of load during a wait starts it again."""
        while not self.leaving:
            changed = self.changed
            if index >= self.active:
                await changed.wait()
                first = True
                continue
            if not self.think:
                await trio.lowlevel.checkpoint()
                return not self.leaving
            wait = rng.uniform(0.0, self.think) if first else self.think * rng.uniform(0.5, 1.5)
            with trio.move_on_after(wait):
                await changed.wait()
                first = True
                continue
            return not self.leaving
        return False

    async def _client(self, index: int, *, task_status: trio.TaskStatus[None]) -> None:
        """One client: a session, and a new one each time it recycles; ``task_status``
        once the first is connected (or failed)."""
        rng = random.Random(self.seed * 100_003 + index)
        once = _Once(task_status)
        try:
            run = self._vrt_session if self.kind == "vrt" else self._light_session
            while not self.leaving:
                if not await run(index, rng, once):
                    return
        except SessionEnded:
            return
        except Exception as exc:
            self.tally.error(f"{type(exc).__name__}: {exc}")
        finally:
            once.started()

    # -- vrt.connect ------------------------------------------------------------------------------

    async def _vrt_session(self, index: int, rng: random.Random, task_status: _Once) -> bool:
        """One session of vrt.connect; True if it ended by recycling (a new one follows)."""
        t = self.tally
        async with vrt.connect(
            self.url,
            tools=[show],
            resume_timeout=self.resume_timeout,
            connect_timeout=self.connect_timeout,
        ) as client:
            async with client.subscribe() as events, trio.open_nursery() as nursery:
                state = _VrtState()
                nursery.start_soon(self._vrt_reader, events, state)
                t.sessions += 1
                self.connected += 1
                task_status.started()
                try:
                    turns = 0
                    while await self._wait_turn(index, rng, turns == 0):
                        await self._vrt_turn(client, state)
                        turns += 1
                        if self.recycle and turns >= self.recycle:
                            return True
                    return False
                finally:
                    self.connected -= 1
                    nursery.cancel_scope.cancel()

    async def _vrt_reader(self, events: Any, state: _VrtState) -> None:
        t = self.tally
        async for event in events:
            now = time.perf_counter()
            if isinstance(event, vrt.ToolStream):
                phase = event.phase
                if phase is vrt.Phase.ARGUMENTS_COMPLETE:
                    if event.kind == "app":
                        state.complete[event.call_id] = now
                elif phase is vrt.Phase.SETTLED:
                    if not event.ok:
                        t.error(f"{event.kind} call settled {event.code}")
                        continue
                    state.calls[event.kind] += 1
                    if event.kind == "app" and event.call_id in state.complete:
                        t.rtt.append(now - state.complete.pop(event.call_id))
                elif phase is vrt.Phase.CANCELLED or phase is vrt.Phase.FAILED:
                    t.error(f"{event.kind} call {phase}")
            elif isinstance(event, vrt.TurnEnded):
                state.ended = event
                state.done.set()
            elif isinstance(event, vrt.Reconnecting):
                state.lost_at = now
            elif isinstance(event, vrt.Resumed):
                t.resumes += 1
                if state.lost_at is not None:
                    t.gaps.append(now - state.lost_at)
                    t.resumed_at.append(now)
                    state.lost_at = None
            elif isinstance(event, vrt.Closed):
                if not self.leaving:
                    t.closed += 1
                    t.error(f"closed ({event.reason})")
                state.closed = True
                state.done.set()
                return

    async def _vrt_turn(self, client: vrt.Client, state: _VrtState) -> None:
        t = self.tally
        state.calls = Counter()
        state.ended = None
        state.done = trio.Event()
        sent = time.perf_counter()
        await client.send_text("show me the next one")
        with trio.move_on_after(self.turn_timeout):
            await state.done.wait()
        ended = state.ended
        if ended is None:
            if not state.closed:
                t.error(f"a turn took over {self.turn_timeout:g} s")
            raise SessionEnded
        if ended.reason != "finished":
            t.error(f"turn ended {ended.reason}")
        elif state.calls["app"] != self.steps or state.calls["server"] != self.steps:
            t.error(f"turn ended with {dict(state.calls)} calls settled")
        else:
            t.turns += 1
            t.turn_time.append(time.perf_counter() - sent)

    # -- the light client -------------------------------------------------------------------------

    async def _light_session(self, index: int, rng: random.Random, task_status: _Once) -> bool:
        """One session of the light client; True if it ended by recycling."""
        t = self.tally
        host, port = self.url.split("//")[1].rstrip("/").rsplit(":", 1)
        with trio.fail_after(self.connect_timeout):
            conn = await Light.open(host, int(port))
        async with conn.stream:
            t.sessions += 1
            self.connected += 1
            task_status.started()
            try:
                turns = 0
                while await self._wait_turn(index, rng, turns == 0):
                    with trio.move_on_after(self.turn_timeout) as scope:
                        await conn.turn(self.steps, t)
                    if scope.cancelled_caught:
                        t.error(f"a turn took over {self.turn_timeout:g} s")
                        raise SessionEnded
                    turns += 1
                    if self.recycle and turns >= self.recycle:
                        break
                else:
                    await conn.close()
                    return False
                await conn.close()
                return True
            finally:
                self.connected -= 1


class _Once:
    """A task status whose ``started`` may be called again (it does nothing then)."""

    def __init__(self, status: trio.TaskStatus[None]) -> None:
        self.status = status
        self.done = False

    def started(self) -> None:
        if not self.done:
            self.done = True
            self.status.started()


@dataclass
class _VrtState:
    calls: Counter[str] = field(default_factory=Counter)
    complete: dict[str, float] = field(default_factory=dict)
    ended: vrt.TurnEnded | None = None
    done: trio.Event = field(default_factory=trio.Event)
    lost_at: float | None = None
    closed: bool = False


LIGHT_HELLO = {
    "type": "hello",
    "seq": 1,
    "protocol": "vrt/1",
    "capabilities": list(vrt._wire.messages.CAPABILITIES),
    "tools": [{"name": "show", "description": "Shows an item", "parameters": SHOW_PARAMETERS}],
}


class Light:
    """A minimal vrt/1 client: one session on a raw TCP stream, WebSocket framing by hand
    (masked frames out, with a random key per connection; one frame per message in), the
    capabilities ``vrt.connect`` offers, one ``tool.result`` per ``tool.call``, an ack at
    each ``turn.ended`` and every 50 messages. No resume: a lost connection is an error."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()
        self.seq = 1  # the hello's
        self.last = 0  # the highest server seq read
        self.acked = 0
        self.mask = os.urandom(4)
        self._mask_int = int.from_bytes(self.mask * 1024, "big")

    @classmethod
    async def open(cls, host: str, port: int) -> Light:
        stream = await trio.open_tcp_stream(host, port)
        try:
            key = base64.b64encode(os.urandom(16)).decode()
            await stream.send_all(
                f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n".encode()
            )
            conn = cls(stream)
            while b"\r\n\r\n" not in conn.buffer:
                data = await stream.receive_some(65536)
                if not data:
                    raise SessionEnded
                conn.buffer += data
            head, _, rest = bytes(conn.buffer).partition(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 101"):
                raise RuntimeError(f"upgrade refused: {head.splitlines()[0]!r}")
            conn.buffer = bytearray(rest)
            await conn.send(json.dumps(LIGHT_HELLO))
            welcome = json.loads(await conn.receive())
            if welcome.get("type") != "welcome":
                raise RuntimeError(f"no welcome: {welcome}")
            conn.last = welcome["seq"]
            return conn
        except BaseException:
            await stream.aclose()
            raise

    async def send(self, text: str) -> None:
        payload = text.encode()
        size = len(payload)
        if size < 126:
            head = struct.pack("!BB", 0x81, 0x80 | size)
        elif size < 65536:
            head = struct.pack("!BBH", 0x81, 0x80 | 126, size)
        else:
            head = struct.pack("!BBQ", 0x81, 0x80 | 127, size)
        if size <= 4096:
            key = self._mask_int >> (8 * (4096 - size))  # the mask repeated, size bytes
        else:
            repeats = size // 4 + 1
            key = int.from_bytes(self.mask * repeats, "big") >> (8 * (4 * repeats - size))
        masked = (int.from_bytes(payload, "big") ^ key).to_bytes(size, "big")
        await self.stream.send_all(head + self.mask + masked)

    async def receive(self) -> bytes:
        """The next text message's payload (pings answered, a close is the end)."""
        while True:
            buffer = self.buffer
            if len(buffer) >= 2:
                first, second = buffer[0], buffer[1]
                size = second & 0x7F
                at = 2
                if size == 126:
                    if len(buffer) < 4:
                        size = -1
                    else:
                        size, at = struct.unpack_from("!H", buffer, 2)[0], 4
                elif size == 127:
                    if len(buffer) < 10:
                        size = -1
                    else:
                        size, at = struct.unpack_from("!Q", buffer, 2)[0], 10
                if size >= 0 and len(buffer) >= at + size:
                    payload = bytes(buffer[at : at + size])
                    del buffer[: at + size]
                    opcode = first & 0x0F
                    if not first & 0x80:
                        raise RuntimeError("a fragmented frame (the light client takes none)")
                    if opcode == 1:
                        return payload
                    if opcode == 8:
                        raise SessionEnded
                    if opcode == 9:
                        await self._control(0xA, payload)
                    continue
            data = await self.stream.receive_some(65536)
            if not data:
                raise SessionEnded
            buffer += data

    async def _control(self, opcode: int, payload: bytes) -> None:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | len(payload))
        masked = bytes(b ^ self.mask[i % 4] for i, b in enumerate(payload))
        await self.stream.send_all(head + self.mask + masked)

    async def turn(self, steps: int, t: Tally) -> None:
        sent = time.perf_counter()
        self.seq += 1
        await self.send(f'{{"type":"input","seq":{self.seq},"text":"show me the next one"}}')
        calls = 0
        called: dict[str, float] = {}
        while True:
            data = json.loads(await self.receive())
            messages = data if isinstance(data, list) else [data]
            out = []
            ended = None
            for message in messages:
                kind = message["type"]
                if kind == "ack":  # the server's ack of our messages: not numbered
                    continue
                seq = message.get("seq", 0)
                if seq > self.last:
                    self.last = seq
                if kind == "tool.call":
                    calls += 1
                    called[message["callId"]] = time.perf_counter()
                    self.seq += 1
                    call_id = json.dumps(message["callId"])
                    shown = json.dumps(message["arguments"].get("id"))
                    out.append(
                        f'{{"type":"tool.result","seq":{self.seq},"callId":{call_id},'
                        f'"epoch":{message["epoch"]},"result":{{"ok":true,"output":'
                        f'{{"shown":{shown}}}}}}}'
                    )
                elif kind == "tool.stream":
                    if message["phase"] == "settled" and message["kind"] == "app":
                        start = called.pop(message["callId"], None)
                        if start is not None:
                            t.rtt.append(time.perf_counter() - start)
                        if not message["ok"]:
                            t.error(f"app call settled {message.get('code')}")
                elif kind == "turn.ended":
                    ended = message
                elif kind == "error":
                    t.error(f"error frame {message.get('code')}")
                elif kind == "closed":
                    t.closed += 1
                    t.error(f"closed ({message.get('reason')})")
                    raise SessionEnded
            if ended is not None or self.last - self.acked >= 50:
                out.append(f'{{"type":"ack","seq":{self.last}}}')
                self.acked = self.last
            if out:
                await self.send(out[0] if len(out) == 1 else "[" + ",".join(out) + "]")
            if ended is not None:
                if ended["reason"] != "finished":
                    t.error(f"turn ended {ended['reason']}")
                elif calls != steps:
                    t.error(f"turn ended with {calls} app calls")
                else:
                    t.turns += 1
                    t.turn_time.append(time.perf_counter() - sent)
                return

    async def close(self) -> None:
        """``close`` (the session ends for good), its ``closed``, then the socket."""
        self.seq += 1
        with (
            trio.move_on_after(5),
            contextlib.suppress(SessionEnded, OSError, trio.BrokenResourceError),
        ):
            await self.send(f'{{"type":"close","seq":{self.seq}}}')
            while True:
                message = json.loads(await self.receive())
                messages = message if isinstance(message, list) else [message]
                if any(m.get("type") == "closed" for m in messages):
                    break
            await self._control(0x8, struct.pack("!H", 1000))


# -- the clients in a second process -------------------------------------------------------------


class RemoteFleet:
    """A :class:`Fleet` in a child process (``--clients-process``): the same calls, as JSON
    lines on its stdin and stdout."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self._buffer = b""

    async def _ask(self, **command: Any) -> Any:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        await self.process.stdin.send_all(json.dumps(command).encode() + b"\n")
        while b"\n" not in self._buffer:
            chunk = await self.process.stdout.receive_some(1 << 20)
            if not chunk:
                raise RuntimeError("the clients' process exited")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    async def connect(self, count: int, batch: int = 50) -> int:
        answer: int = await self._ask(do="connect", count=count, batch=batch)
        return answer

    async def load(self, think: float, active: int) -> None:
        await self._ask(do="load", think=think, active=active)

    async def sample(self) -> dict[str, Any]:
        answer: dict[str, Any] = await self._ask(do="sample")
        return answer


class LocalFleet:
    """A :class:`Fleet` in this process, with :class:`RemoteFleet`'s async calls."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    async def connect(self, count: int, batch: int = 50) -> int:
        return await self.fleet.connect(count, batch)

    async def load(self, think: float, active: int) -> None:
        self.fleet.load(think, active)

    async def sample(self) -> dict[str, Any]:
        return self.fleet.sample()


@contextlib.asynccontextmanager
async def fleet_of(
    args: argparse.Namespace, url: str, kind: str, *, recycle: int = 0
) -> AsyncIterator[LocalFleet | RemoteFleet]:
    options = {"kind": kind, "steps": args.steps, "recycle": recycle, "seed": args.seed}
    if not args.clients_process:
        async with Fleet(url, **options).running() as fleet:
            yield LocalFleet(fleet)
        return
    command = [sys.executable, "-m", "bench.fleet", "--url", url, "--options"]
    process = await trio.lowlevel.open_process(
        [*command, json.dumps(options)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        remote = RemoteFleet(process)
        yield remote
        await remote._ask(do="leave")
        with trio.fail_after(30):
            await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def fleet_child(url: str, options: dict[str, Any]) -> None:
    """The clients' process: a Fleet driven by JSON lines on stdin."""
    logging.getLogger("vrt").setLevel(logging.ERROR)
    async with Fleet(url, **options).running() as fleet:
        while True:
            line = await trio.to_thread.run_sync(sys.stdin.readline)
            if not line:
                return
            command = json.loads(line)
            do = command.pop("do")
            if do == "connect":
                answer: Any = await fleet.connect(command["count"], command["batch"])
            elif do == "load":
                fleet.load(command["think"], command["active"])
                answer = True
            elif do == "sample":
                answer = fleet.sample()
            else:
                await fleet.leave()
                print(json.dumps(True), flush=True)
                return
            print(json.dumps(answer), flush=True)


if __name__ == "__main__":  # the clients' process of --clients-process
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--options", required=True)
    child = parser.parse_args()
    trio.run(fleet_child, child.url, json.loads(child.options))
