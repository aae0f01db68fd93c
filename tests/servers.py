"""Real servers for the tests, on loopback ports: Debian's ``redis-server`` and ``haproxy``
(`.ci/run` installs both), started and stopped by the test, bounded in time.

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

import trio

ROOT = Path(__file__).parent.parent

START_TIMEOUT = 10.0


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
