"""Serving in production, measured: ``vrt serve --workers N --store URL`` against one worker
without a store, in one run (issue 19, item 7). ``python bench/load.py --compare ...``
runs it (bench/README.md, "Serving in production"); this module is its machinery.

- **The servers** are ``vrt serve load_agent:agent`` processes (the CLI: with
  ``--workers N`` a parent and N workers on one port, SO_REUSEPORT), started by this
  script on a free loopback port, their stderr in a log that must end with no ERROR.
  Their CPU is read from ``/proc/PID/stat`` (utime + stime) of the parent and of every
  child (the workers): summed per window.
- **The store** (``--store auto``): a ``redis-server`` on a free loopback port, nothing
  saved to disk, started for the run and stopped after it. Its CPU and its traffic come
  from ``INFO`` (``used_cpu_user`` + ``used_cpu_sys``, ``total_commands_processed``,
  ``total_net_input_bytes``, ``total_net_output_bytes``, ``commandstats``) before and
  after each window: the bench's own INFO calls are subtracted, the nodes' heartbeats and
  record touches (one a second per node) are counted in.
- **The clients** (:class:`Fleet`): ``--client vrt`` sessions are :func:`vrt.connect` (the
  real client: resumes, acks, the app tool through its runner); ``--client light`` are a
  minimal vrt/1 client on a raw socket (its own WebSocket framing, ``json``, no events:
  it sends an input, answers each ``tool.call`` at once, acks at ``turn.ended`` or every
  50 messages), about a tenth of ``vrt.connect``'s CPU per turn, so that the clients
  leave more of the machine to the servers. In this process, or with
  ``--clients-process`` in a child that takes its commands as JSON lines.
- **Windows.** Each figure is over a window between two samples of every counter, the
  sessions running all along: a paced window (``--think`` between a session's turns,
  offered load sessions / think, below what either configuration completes), then one
  window per ``--levels`` entry with that many sessions at think 0 (each always has a turn
  outstanding: the offered load is above what the server completes, so turns/s is its
  saturation rate; the levels show it no longer grows). Every configuration's server and
  sessions run from the start, idle but for the one being measured, and the windows are
  interleaved: per round, per phase, each configuration in turn (the order reversed every
  other round), so that the windows a ratio compares are seconds apart; ``--rounds``
  rounds, summed.
- **Rolling restart** (``--rolling``): ``vrt.connect`` sessions at ``--rolling-think``,
  each worker in turn sent SIGTERM (it drains: its sessions are handed over at their next
  turn boundary, their clients closed with 1012 and resumed on the other worker; the
  parent starts it again); the gap each client sees (``vrt.Reconnecting`` to
  ``vrt.Resumed``), and every turn that failed or session that closed.
- **Tracing on against off** (``--tracing``): one worker without a store as ``vrt serve``
  and as bench/tracing.py's launcher (the OpenTelemetry SDK installed first), the windows
  interleaved the same way; server CPU per turn traced over untraced, and the spans the
  launcher reports at exit against the turns the clients finished.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import json
import logging
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio.lowlevel
from load_agent import SHOW_PARAMETERS

import vrt

HOST = "127.0.0.1"
BENCH = Path(__file__).resolve().parent
THIS_FILE = str(Path(__file__).resolve())
CLK_TCK = os.sysconf("SC_CLK_TCK")
SERVE_FLAGS = (
    "--max-sessions", "100000",
    "--max-sessions-per-peer", "100000",  # every session comes from 127.0.0.1
    "--max-pending-per-peer", "256",
    "--max-messages-per-second", "100000",  # a session at think 0 sends ~400 frames/s
    "--resume-window", "60",
    "--drain-timeout", "10",
    "--log-level", "warning",
)  # fmt: skip
"""Both configurations' flags: vrt.serve's defaults but the per-peer and rate limits
(every session here comes from one address, and a session at think 0 is fast)."""


# -- /proc ---------------------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def cpu_seconds(pid: int) -> float:
    """utime + stime of a live process, in seconds (0 once it is gone)."""
    fields = _stat(pid)
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / CLK_TCK


def threads_cpu(pid: int) -> Counter[str]:
    """CPU seconds of each thread of ``pid``, summed by thread name (``comm``)."""
    found: Counter[str] = Counter()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                text = f.read()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rfind(")")]
        fields = text[text.rfind(")") + 2 :].split()
        found[name] += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return found


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (every core; /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def children(pid: int) -> list[int]:
    """The live child processes of ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None and int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry))
    return sorted(found)


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [part.decode() for part in f.read().split(b"\0") if part]
    except OSError:
        return []


def worker_index(pid: int) -> int | None:
    """The ``--worker-index`` of a ``vrt serve`` worker."""
    line = cmdline(pid)
    if "--worker-index" in line:
        return int(line[line.index("--worker-index") + 1])
    return None


def sockets(pid: int) -> int:
    """How many sockets ``pid`` holds open (its sessions' connections, and a few more)."""
    try:
        return sum(
            1
            for fd in os.listdir(f"/proc/{pid}/fd")
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        )
    except OSError:
        return 0


def listening(port: int) -> int:
    """How many sockets listen on 127.0.0.1:``port`` (one per worker: SO_REUSEPORT)."""
    count = 0
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


def listening_sockets(pid: int) -> int:
    """How many TCP sockets of ``pid`` listen (a worker: its public listener, then its
    relay listener once its store is connected, just before it starts accepting)."""
    try:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return 0
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[3] == "0A" and fields[9] in inodes:
                        count += 1
        except OSError:
            continue
    return count


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f}"


# -- the store: redis-server and INFO ------------------------------------------------------------


class Redis:
    """A Redis (or Valkey) server the bench reads ``INFO`` from, over a socket of its own."""

    def __init__(self, url: str, pid: int | None = None) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        self.url = url
        self.host = parts.hostname or HOST
        self.port = parts.port or 6379
        self.password = parts.password
        self.username = parts.username
        self.pid = pid
        self.calls = 0
        """Commands this bench sent (subtracted from total_commands_processed)."""

    def call(self, *args: str) -> Any:
        """One command, its reply (RESP2: strings, integers, arrays)."""
        with socket.create_connection((self.host, self.port), timeout=5) as sock:
            reader = sock.makefile("rb")
            commands = [args]
            if self.password is not None:
                auth = (self.username, self.password) if self.username else (self.password,)
                commands.insert(0, ("AUTH", *auth))
            for command in commands:
                out = f"*{len(command)}\r\n".encode()
                for arg in command:
                    data = arg.encode()
                    out += b"$%d\r\n%s\r\n" % (len(data), data)
                sock.sendall(out)
                self.calls += 1
                reply = _resp(reader)
            return reply

    def info(self) -> dict[str, str]:
        text = self.call("INFO", "all")
        fields = {}
        for line in text.decode().splitlines():
            if ":" in line and not line.startswith("#"):
                key, _, value = line.partition(":")
                fields[key] = value
        return fields

    def sample(self) -> dict[str, Any]:
        """What a window subtracts: commands (the bench's own calls so far excluded; this
        INFO is processed after it counts itself, so +1), bytes each way, CPU seconds, and
        the calls per command."""
        info = self.info()
        commands: dict[str, int] = {}
        for key, value in info.items():
            if key.startswith("cmdstat_"):
                calls = dict(part.split("=") for part in value.split(","))
                commands[key[8:]] = int(calls["calls"])
        return {
            "commands": int(info["total_commands_processed"]) - self.calls + 1,
            "in": int(info["total_net_input_bytes"]),
            "out": int(info["total_net_output_bytes"]),
            "cpu": float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
            "by_command": commands,
            "memory": int(info["used_memory"]),
        }

    def session_records(self, pids: Sequence[int] | None = None) -> list[int]:
        """The size of every session's saved state (``HSTRLEN vrt:session:* state``), or
        of those owned by a node of one of ``pids`` (a node's default name is
        ``host:pid[:worker]``)."""
        cursor, sizes = "0", []
        wanted = None if pids is None else {str(pid) for pid in pids}
        while True:
            cursor_bytes, keys = self.call(
                "SCAN", cursor, "MATCH", "vrt:session:*", "COUNT", "1000"
            )
            for key in keys:
                if wanted is not None:
                    owner = (self.call("HGET", key.decode(), "owner") or b"").decode().split(":")
                    if len(owner) < 2 or owner[1] not in wanted:
                        continue
                sizes.append(int(self.call("HSTRLEN", key.decode(), "state")))
            cursor = cursor_bytes.decode()
            if cursor == "0":
                return sizes


def _resp(reader: Any) -> Any:
    line = reader.readline()
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest
    if kind == b"-":
        raise RuntimeError(f"redis: {rest.decode()}")
    if kind == b":":
        return int(rest)
    if kind == b"$":
        size = int(rest)
        if size < 0:
            return None
        data = reader.read(size + 2)
        return data[:-2]
    if kind == b"*":
        return [_resp(reader) for _ in range(int(rest))]
    raise RuntimeError(f"redis: unexpected reply {line!r}")


REDIS_COMMAND = [
    "--bind", HOST, "--save", "", "--appendonly", "no", "--protected-mode", "yes",
]  # fmt: skip


@contextlib.contextmanager
def redis_auto() -> Iterator[Redis]:
    """A fresh ``redis-server`` on a free loopback port (nothing saved to disk), stopped
    on the way out."""
    binary = shutil.which("redis-server") or shutil.which("valkey-server")
    if binary is None:
        raise SystemExit("--store auto needs redis-server: apt-get install redis-server")
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        command = [binary, "--port", str(port), *REDIS_COMMAND, "--dir", folder]
        command += ["--logfile", str(Path(folder) / "redis.log")]
        print(f"store: {' '.join(command)}")
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            redis = Redis(f"redis://{HOST}:{port}", pid=process.pid)
            deadline = time.monotonic() + 10
            while True:
                try:
                    redis.call("PING")
                    break
                except OSError:
                    if time.monotonic() > deadline or process.poll() is not None:
                        raise SystemExit("redis-server did not start") from None
                    time.sleep(0.05)
            yield redis
        finally:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


@contextlib.contextmanager
def the_store(url: str | None) -> Iterator[Redis | None]:
    """``--store``: None, ``auto`` (a redis-server for the run) or a URL (used as is;
    nothing in it is deleted)."""
    if url is None:
        yield None
    elif url == "auto":
        with redis_auto() as redis:
            yield redis
    else:
        yield Redis(url)


# -- the servers: vrt serve ----------------------------------------------------------------------


@dataclass
class Served:
    """A running ``vrt serve``: its parent process, its URL, its log."""

    process: trio.Process
    url: str
    port: int
    command: list[str]
    log: Path
    workers: int

    def pids(self) -> list[int]:
        return [self.process.pid, *children(self.process.pid)]

    def cpu(self) -> dict[int, float]:
        """CPU seconds of the parent and of each live worker, by pid."""
        return {pid: cpu_seconds(pid) for pid in self.pids()}

    def worker_pids(self) -> dict[int, int]:
        """pid by worker index (``--workers``), or the one process as index 0."""
        if self.workers == 1:
            return {0: self.process.pid}
        found = {}
        for pid in children(self.process.pid):
            index = worker_index(pid)
            if index is not None:
                found[index] = pid
        return found

    def log_problems(self) -> list[str]:
        text = self.log.read_text(errors="replace")
        return [
            line[:240]
            for line in text.splitlines()
            if " ERROR " in line or "Traceback" in line or " WARNING " in line
        ]


def serve_command(
    workers: int, store: str | None, port: int, target: str, otel: str | None = None
) -> list[str]:
    """The ``vrt serve`` command line; with ``otel`` (``traces``, ``traces+metrics``) through
    bench/tracing.py, which installs the OpenTelemetry SDK first (``--tracing``)."""
    launcher = ["tracing.py", otel] if otel else ["-m", "vrt"]
    command = [sys.executable, *launcher, "serve", target, "--host", HOST, "--port", str(port)]
    if workers > 1:
        command += ["--workers", str(workers)]
    if store is not None:
        command += ["--store", store]
    return command + list(SERVE_FLAGS)


@contextlib.asynccontextmanager
async def vrt_serve(
    label: str,
    workers: int,
    store: str | None,
    folder: Path,
    *,
    target: str = "load_agent:agent",
    env: dict[str, str] | None = None,
    extra: Sequence[str] = (),
    otel: str | None = None,
) -> AsyncIterator[Served]:
    """``vrt serve`` in a process of its own (cwd: bench/, so ``load_agent`` imports),
    until SIGINT on the way out."""
    port = free_port()
    command = serve_command(workers, store, port, target, otel) + list(extra)
    log = folder / f"{label.replace(' ', '-').replace(',', '')}.log"
    environment = {**os.environ, **(env or {})}
    with log.open("wb") as err:
        process = await trio.lowlevel.open_process(
            command, cwd=BENCH, stdout=subprocess.PIPE, stderr=err, env=environment
        )
        try:
            assert process.stdout is not None
            line = b""
            with trio.fail_after(60):
                while not line.endswith(b"\n"):
                    chunk = await process.stdout.receive_some(1)
                    if not chunk:
                        raise RuntimeError(f"vrt serve exited: {log.read_text()[-2000:]}")
                    line += chunk
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_discard, process.stdout)
                served = Served(process, f"ws://{HOST}:{port}/", port, command, log, workers)
                if workers > 1:
                    with trio.fail_after(30):
                        while len(served.worker_pids()) < workers:  # noqa: ASYNC110
                            await trio.sleep(0.05)
                yield served
                nursery.cancel_scope.cancel()
        finally:
            await stop(process)


async def stop(process: trio.Process) -> None:
    """SIGINT, 20 s to exit, then SIGKILL."""
    if process.returncode is None:
        process.send_signal(signal.SIGINT)
        with trio.move_on_after(20):
            await process.wait()
    if process.returncode is None:
        process.kill()
        await process.wait()


async def _discard(stream: Any) -> None:
    while await stream.receive_some(4096):
        pass


# -- the clients ---------------------------------------------------------------------------------


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
    command = [sys.executable, THIS_FILE, "--url", url, "--options"]
    process = await trio.lowlevel.open_process(
        [*command, json.dumps(options)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
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


# -- windows -------------------------------------------------------------------------------------


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
            config.label, config.workers, store_url, folder, env=_agent_env(args), otel=config.otel
        )
        if config.serve is None
        else config.serve(config.label, folder, _agent_env(args))
    )
    print(f"\n== {config.label}\nserver: (cd bench && {' '.join(_shown(served.command))})")
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
    args: argparse.Namespace, configs: list[Config], folder: Path
) -> list[Result]:
    """Every configuration's server and sessions at once, idle; then the windows, one
    configuration at a time, interleaved: for each round, for each phase (paced, then each
    level at think 0), each configuration in turn (in reverse order every other round), so
    that the windows compared are seconds apart, not minutes."""
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
        if args.py_spy:
            for run in runs:
                await profile_window(args, run.served, run.fleet, folder, run.config.label)
        last = runs[-1]
        if args.rolling and last.config.store is not None and last.config.workers > 1:
            await last.clients.aclose()  # its sessions would be handed over too
            results[-1].rolling = await rolling_restart(args, last.served, last.config.store)
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


# -- where the servers' time goes (--py-spy) -------------------------------------------------------

FOCUS = [
    ("the store: snapshot() (the state to JSON)", "snapshot (vrt/_cluster/record.py)"),
    ("the store: SessionActor.state()", "state (vrt/_server/actor.py)"),
    ("the store: RedisStore.save() (valkey-glide)", "save (vrt/_cluster/store.py)"),
    ("the store: the saver task", "_saver (vrt/_server/actor.py)"),
    ("the store: heartbeat and touch", "run (vrt/_cluster/node.py)"),
    ("anyio (glide's async calls under Trio)", "(anyio/"),
    ("glide's Python side", "(glide/"),
    ("the engine (vrt/_engine)", "(vrt/_engine/"),
    ("the wire codec (vrt/_wire)", "(vrt/_wire/"),
    ("trio-websocket and wsproto", "(trio_websocket/"),
    ("wsproto", "(wsproto/"),
    ("sending (SocketStream.send_all)", "send_all (trio/_highlevel_socket.py)"),
    ("waiting for I/O (epoll)", "get_events (trio/_core/_io_epoll.py)"),
    ("a new connection: the HTTP upgrade", "upgrade (vrt/_net/upgrade.py)"),
    ("a new connection: the hello", "_handshake (vrt/_server/hub.py)"),
    ("a new session: SessionActor._open_session", "_open_session (vrt/_server/actor.py)"),
    ("jsonschema", "(jsonschema/"),
    ("a session's end: SessionActor.run's cleanup", "_forget_in_store (vrt/_server/actor.py)"),
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
        for name, needle in FOCUS:
            if any(needle in frame for frame in frames):
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


def _agent_env(args: argparse.Namespace) -> dict[str, str]:
    return {"VRT_LOAD_STEPS": str(args.steps), "VRT_LOAD_TURNS": str(args.script_turns)}


def _shown(command: list[str]) -> list[str]:
    return ["python" if part == sys.executable else part for part in command]


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
                while served.worker_pids().get(index) == pid and _alive(pid):  # noqa: ASYNC110
                    await trio.sleep(0.01)
            drained = time.perf_counter() - began
            with trio.fail_after(60):
                while served.worker_pids().get(index) in (None, pid):  # noqa: ASYNC110
                    await trio.sleep(0.05)
            with trio.fail_after(60):  # and it listens
                while listening(served.port) < served.workers:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            back = time.perf_counter() - began
            new = served.worker_pids()[index]
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
        f"draining worker still in the SO_REUSEPORT group): {refused}; other failed attempts: "
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


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


# -- the comparison ------------------------------------------------------------------------------

TARGET_RATE = 1.7
TARGET_CPU = 1.25


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


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
    results = await run_configs(args, configs, folder)
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
            results = await run_configs(args, configs, folder)
            print_tracing(results, args)
        else:
            results = await compare_configs(args, redis, folder)
        problems = sum(len(r.problems) for r in results)
        errors = sum(sum(w.errors.values()) for r in results for w in [r.paced, *r.levels])
        if len(results) > 1 and args.rounds > 1 and not args.tracing:
            print_rounds(results)
        print(f"\n  client errors in the windows: {errors}; server log warnings/errors: {problems}")


def vrt_commit() -> str:
    """`` at COMMIT`` (``+ changes`` if vrt/ differs from it) when vrt is in a git tree."""
    root = Path(vrt.__file__).resolve().parent.parent
    if (root / "COMMIT").exists():  # a copy of a commit's vrt/ (git archive), its id beside
        return f" at {(root / 'COMMIT').read_text().strip()[:7]} (a copy of that commit's vrt/)"
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "log", "-1", "--format=%h"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "vrt"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return ""
    return f" at {commit}" + (" + uncommitted changes" if dirty else "")


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


if __name__ == "__main__":  # the clients' process of --clients-process
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--options", required=True)
    child = parser.parse_args()
    trio.run(fleet_child, child.url, json.loads(child.options))
