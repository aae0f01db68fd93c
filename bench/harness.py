"""What the benchmarks share: the machine they run on, its processes and the servers they start.

- **Figures.** :func:`percentile`, :func:`ms`, :func:`verdict` (PASS or MISS against a
  target), and the header facts: :func:`version` of a distribution, :func:`vrt_commit`.
- **CPU and sockets from /proc**: :func:`cpu_seconds` of a process (utime + stime, in
  10 ms ticks), :func:`threads_cpu` by thread name, :func:`machine_busy` (every core),
  :func:`children`, :func:`sockets`, :func:`listening`; Linux only.
- **The store**: :func:`the_store` (``--store``: none, ``auto`` for a ``redis-server``
  started for the run on a free loopback port, or a URL used as is), and :class:`Redis`,
  which reads ``INFO`` and the saved records over a socket of its own.
- **The servers**: :func:`vrt_serve` runs ``python -m vrt serve bench.agents:agent ...``
  (the CLI, from the repository's root, so ``bench.agents`` imports) with
  :data:`SERVE_FLAGS`, its stderr in a log; :func:`stop` ends a process (SIGINT, then
  SIGKILL).

Every bench runs from the repository's root as ``python -m bench.NAME``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import trio
import trio.lowlevel

import vrt

HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parent.parent
"""The repository's root: the working directory of every process a bench starts."""
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- figures -------------------------------------------------------------------------------------


def version(name: str) -> str:
    """The installed version of distribution ``name``, or ``?``."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "?"


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


def vrt_from() -> str:
    """``vrt from DIR at COMMIT``: which vrt a bench measures (the one of the directory it
    runs from, first on ``sys.path``), for its first line."""
    return f"vrt from {os.path.dirname(vrt.__file__)}{vrt_commit()}"


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank), NaN if there are none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(seconds: float) -> str:
    """``seconds`` in milliseconds, one decimal."""
    return f"{seconds * 1e3:,.1f}"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def shown(command: Sequence[str]) -> list[str]:
    """A command line as printed: ``python`` for this interpreter's path."""
    return ["python" if part == sys.executable else part for part in command]


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


def alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


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


# -- the store: redis-server and INFO ------------------------------------------------------------


class Redis:
    """A Redis (or Valkey) server the bench reads ``INFO`` from, over a socket of its own."""

    def __init__(self, url: str, pid: int | None = None) -> None:
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
        """The size of every session's saved state (``HSTRLEN vrt:{*}:session state``), or
        of those owned by a node of one of ``pids`` (a node's default name is
        ``host:pid[:worker]``)."""
        cursor, sizes = "0", []
        wanted = None if pids is None else {str(pid) for pid in pids}
        while True:
            cursor_bytes, keys = self.call(
                "SCAN", cursor, "MATCH", "vrt:{*}:session", "COUNT", "1000"
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

SERVE_FLAGS = (
    "--max-sessions", "100000",
    "--max-sessions-per-peer", "100000",  # every session comes from 127.0.0.1
    "--max-pending-per-peer", "256",
    "--max-messages-per-second", "100000",  # a session at think 0 sends ~400 frames/s
    "--resume-window", "60",
    "--drain-timeout", "10",
    "--log-level", "warning",
)  # fmt: skip
"""Every ``vrt serve`` a bench starts: vrt.serve's defaults but the per-peer and rate limits
(every session here comes from one address, and a session at think 0 is fast)."""


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
    """The ``vrt serve`` command line; with ``otel`` (``traces``, ``traces+metrics``...)
    through bench/tracing.py, which installs the OpenTelemetry SDK first (``--tracing``)."""
    launcher = ["-m", "bench.tracing", otel] if otel else ["-m", "vrt"]
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
    target: str = "bench.agents:agent",
    env: dict[str, str] | None = None,
    extra: Sequence[str] = (),
    otel: str | None = None,
) -> AsyncIterator[Served]:
    """``vrt serve`` in a process of its own (cwd: the repository's root, so ``bench.agents``
    imports), until SIGINT on the way out."""
    port = free_port()
    command = serve_command(workers, store, port, target, otel) + list(extra)
    log = folder / f"{label.replace(' ', '-').replace(',', '')}.log"
    environment = {**os.environ, **(env or {})}
    with log.open("wb") as err:
        process = await trio.lowlevel.open_process(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, env=environment
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
