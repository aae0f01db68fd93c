"""Real servers for the tests, on loopback ports: Debian's ``redis-server`` (alone, or three
of them as a Redis Cluster) and ``haproxy`` (`.ci/run` installs both), started and stopped
by the test, bounded in time.

A missing binary fails the test that needs it, with the command to install it: these
tests are in the first pass (marked ``network``), never skipped.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import attrs
import trio

ROOT = Path(__file__).parent.parent

START_TIMEOUT = 30.0


def free_port() -> int:
    """A TCP port nobody listens on now (the OS's choice)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _binary(name: str, package: str) -> str:
    found = shutil.which(name) or shutil.which(f"/usr/sbin/{name}")
    if found is None:
        raise RuntimeError(f"{name} is not installed: apt-get install {package}")
    return found


def _wait_for_port(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"{what} did not listen on {port} within {START_TIMEOUT:g} s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


@contextmanager
def redis_server() -> Iterator[str]:
    """A fresh ``redis-server`` on a free loopback port, nothing saved to disk: its URL."""
    binary = _binary("redis-server", "redis-server")
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        process = subprocess.Popen(
            [
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                folder,
                "--logfile",
                str(Path(folder) / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_for_port(port, process, "redis-server")
            yield f"redis://127.0.0.1:{port}"
        finally:
            _stop(process)


class Redis:
    """A ``redis-server`` on a loopback port, nothing saved to disk, that a test can make
    fail as a store fails in production: restarted (empty, on the same port), paused
    (SIGSTOP: it takes connections and answers nothing), flushed, a key deleted."""

    def __init__(self, folder: str) -> None:
        self.binary = _binary("redis-server", "redis-server")
        self.port = free_port()
        self.folder = folder
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", self.folder,
                "--logfile", str(Path(self.folder) / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        _wait_for_port(self.port, self.process, "redis-server")

    def stop(self) -> None:
        if self.process is not None:
            self.resume()
            _stop(self.process)

    def restart(self) -> None:
        """Stopped and started again without persistence: it has forgotten everything."""
        self.stop()
        self.start()

    def pause(self) -> None:
        """SIGSTOP: connections stay open, nothing is answered (an outage)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def cli(self, *args: str) -> str:
        """``redis-cli ARGS`` against it (FLUSHALL, DEL, EXISTS...): its output."""
        return subprocess.run(
            ["redis-cli", "-p", str(self.port), *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=START_TIMEOUT,
        ).stdout.strip()


@contextmanager
def redis() -> Iterator[Redis]:
    """A fresh :class:`Redis`, started; stopped on the way out."""
    with tempfile.TemporaryDirectory() as folder:
        server = Redis(folder)
        server.start()
        try:
            yield server
        finally:
            server.stop()


class Link:
    """The network to a store (tests/store_link.py, a process of its own): connect to
    :attr:`port`; :meth:`cut` partitions it, :meth:`mend` ends the partition."""

    def __init__(self, process: subprocess.Popen[bytes], port: int) -> None:
        self.process = process
        self.port = port

    def cut(self) -> None:
        self.process.send_signal(signal.SIGUSR1)

    def mend(self) -> None:
        self.process.send_signal(signal.SIGUSR2)


@contextmanager
def store_link(port: int) -> Iterator[Link]:
    """A :class:`Link` to ``127.0.0.1:port``; stopped on the way out."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.store_link", str(port)], cwd=ROOT, stdout=subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"tests.store_link exited with {process.wait(5)}")
        yield Link(process, int(line))
    finally:
        _stop(process)
        if process.stdout is not None:
            process.stdout.close()


@attrs.frozen(kw_only=True)
class RedisCluster:
    """A Redis Cluster on loopback: its first node's URL (what ``--store`` is given, as an
    operator gives any one node), each master's port with its slot ranges, and the port
    of a replica (of the first master)."""

    url: str
    slots: dict[int, tuple[tuple[int, int], ...]]
    replica: int

    def port_of(self, key: str) -> int:
        """The port of the master that holds ``key``."""
        slot = key_slot(key)
        return next(p for p, ranges in self.slots.items() if any(a <= slot <= b for a, b in ranges))


def key_slot(key: str) -> int:
    """A key's hash slot, as a cluster computes it (``CLUSTER KEYSLOT``, without a round
    trip): CRC16 (XMODEM) of its hash tag, the part between its first ``{`` and the next
    ``}`` if not empty, else of the whole key, modulo 16384."""
    data = key.encode()
    start = data.find(b"{")
    end = data.find(b"}", start + 1) if start >= 0 else -1
    if end > start + 1:
        data = data[start + 1 : end]
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021 if crc & 0x8000 else crc << 1) & 0xFFFF
    return crc % 16384


def redis_cli(port: int, *command: str) -> str:
    """``redis-cli -p PORT COMMAND...`` on loopback: its output, stripped."""
    binary = _binary("redis-cli", "redis-tools")
    done = subprocess.run(
        [binary, "-p", str(port), *command], capture_output=True, text=True, timeout=5
    )
    if done.returncode != 0:
        raise RuntimeError(f"redis-cli {' '.join(command)}: {done.stderr.strip()}")
    return done.stdout.strip()


@contextmanager
def redis_cluster(masters: int = 3) -> Iterator[RedisCluster]:
    """A fresh Redis Cluster of ``masters`` ``redis-server`` masters on free loopback
    ports, nothing saved to disk, made by ``redis-cli --cluster create`` as an operator
    makes one, and one replica of the first master; yielded once every node says
    ``cluster_state:ok``."""
    binary = _binary("redis-server", "redis-server")
    cli = _binary("redis-cli", "redis-tools")
    *ports, replica = [free_port() for _ in range(masters + 1)]
    # the bus ports are named: PORT + 10000 may be past 65535
    buses = {port: free_port() for port in (*ports, replica)}
    with tempfile.TemporaryDirectory() as folder:
        processes: list[subprocess.Popen[bytes]] = []
        try:
            for port in (*ports, replica):
                command = [
                    binary,
                    "--port", str(port),
                    "--bind", "127.0.0.1",
                    "--cluster-enabled", "yes",
                    "--cluster-port", str(buses[port]),
                    "--cluster-config-file", str(Path(folder) / f"nodes-{port}.conf"),
                    "--save", "",
                    "--appendonly", "no",
                    "--dir", folder,
                    "--logfile", str(Path(folder) / f"redis-{port}.log"),
                ]  # fmt: skip
                processes.append(
                    subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                )
            for port, process in zip((*ports, replica), processes, strict=True):
                _wait_for_port(port, process, "redis-server")
            create = [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports)]
            done = subprocess.run(
                [*create, "--cluster-replicas", "0", "--cluster-yes"],
                capture_output=True,
                text=True,
                timeout=START_TIMEOUT,
            )
            if done.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create: {done.stdout[-500:]}")
            # The replica: met, then told whom to follow once it knows that master.
            master = redis_cli(ports[0], "CLUSTER", "MYID")
            redis_cli(replica, "CLUSTER", "MEET", "127.0.0.1", str(ports[0]), str(buses[ports[0]]))
            deadline = time.monotonic() + START_TIMEOUT
            while master not in redis_cli(replica, "CLUSTER", "NODES"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the replica did not meet within {START_TIMEOUT:g} s")
                time.sleep(0.02)
            redis_cli(replica, "CLUSTER", "REPLICATE", master)
            nodes = (*ports, replica)
            while not all("cluster_state:ok" in redis_cli(p, "CLUSTER", "INFO") for p in nodes):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the cluster was not ok within {START_TIMEOUT:g} s")
                time.sleep(0.02)
            slots: dict[int, tuple[tuple[int, int], ...]] = {}
            for line in redis_cli(ports[0], "CLUSTER", "NODES").splitlines():
                fields = line.split()
                if "master" in fields[2].split(",") and fields[8:]:  # the replica, until
                    # the seed hears it replicates, is a master without slots
                    port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
                    slots[port] = tuple(
                        (int(r.split("-")[0]), int(r.split("-")[-1])) for r in fields[8:]
                    )
            yield RedisCluster(url=f"redis://127.0.0.1:{ports[0]}", slots=slots, replica=replica)
        finally:
            for process in processes:
                _stop(process)


SHIPPED_HAPROXY = Path(__file__).parent.parent / "docs" / "deploy" / "haproxy.cfg"
"""The configuration docs/deploy.md ships: the tests run it, on loopback ports."""


def haproxy_config(port: int, backends: list[int], server_options: str = "") -> str:
    """The shipped HAProxy configuration, bound to ``127.0.0.1:port``, its servers the
    ``backends`` (loopback ports), each with ``server_options`` too (``send-proxy-v2``)."""
    lines = []
    for line in SHIPPED_HAPROXY.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("server "):
            continue
        if stripped.startswith("bind "):
            line = f"    bind 127.0.0.1:{port}"
        elif stripped.startswith("maxconn "):
            line = "    maxconn 4096"  # (within the test's file descriptor limit)
        lines.append(line)
    lines += [
        f"    server n{i} 127.0.0.1:{b} check {server_options}".rstrip()
        for i, b in enumerate(backends)
    ]
    lines += [
        f"    server n{i}-any 127.0.0.1:{b} backup {server_options}".rstrip()
        for i, b in enumerate(backends)
    ]
    return "\n".join(lines) + "\n"


@contextmanager
def haproxy(backends: list[int], server_options: str = "") -> Iterator[int]:
    """HAProxy on a free loopback port in front of ``backends`` (loopback ports), with the
    configuration docs/deploy/haproxy.cfg ships (round robin, no stickiness; each server
    with ``server_options`` too): its port."""
    binary = _binary("haproxy", "haproxy")
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "haproxy.cfg"
        path.write_text(haproxy_config(port, backends, server_options))
        log = Path(folder) / "haproxy.log"
        with log.open("wb") as err:
            process = subprocess.Popen(
                [binary, "-f", str(path), "-db"], stdout=subprocess.DEVNULL, stderr=err
            )
            try:
                try:
                    _wait_for_port(port, process, "haproxy")
                except RuntimeError as exc:
                    raise RuntimeError(f"{exc}: {log.read_text()[-500:]}") from None
                yield port
            finally:
                _stop(process)


@asynccontextmanager
async def vrt_serve(log: Path, target: str, *flags: str) -> AsyncIterator[tuple[trio.Process, str]]:
    """``vrt serve TARGET FLAGS`` in a process of its own, its stderr in ``log``: the
    process and the line it printed first (its URL). Stopped with SIGINT (killed if it
    does not stop) on the way out; then its log must hold no ERROR and no traceback."""
    with log.open("wb") as err:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "vrt", "serve", target, *flags],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=err,
        )
        try:
            assert process.stdout is not None
            line = b""
            with trio.fail_after(30):
                while not line.endswith(b"\n"):
                    chunk = await process.stdout.receive_some(1)
                    assert chunk, (await trio.Path(log).read_text())[-2000:]
                    line += chunk
            yield process, line.decode()
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGINT)
                with trio.move_on_after(15):
                    await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
    text = await trio.Path(log).read_text()
    assert " ERROR " not in text and "Traceback" not in text, _first_error(text)


def _first_error(text: str) -> str:
    """The log around its first ERROR or traceback (what a failed test shows)."""
    at = min(i for i in (text.find(" ERROR "), text.find("Traceback")) if i >= 0)
    return text[max(0, at - 1000) : at + 3000]
