"""``vrt serve --workers N``: N processes on one port, kept running.

The parent starts N ``vrt serve`` processes with the same options and ``SO_REUSEPORT`` on
one port (the kernel spreads new connections across them), each a node of the store under
the name ``NODE:i`` (``host:pid:i`` by default). A worker that exits while the parent is
not stopping is started again: a worker that was sent SIGTERM on its own drained first
(its sessions moved to the others), one that crashed lost only its turns in flight (the
others adopt its sessions). SIGTERM to the parent drains every worker and exits 0 once
they all have; a second SIGTERM, or SIGINT, stops them at once (exit 130).
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import trio

from vrt._cli.flags import option_argv

log = logging.getLogger("vrt.server")

START_TIMEOUT = 30.0
"""Seconds a worker has to say it listens."""
RESTART_PAUSE = 1.0
"""Seconds before a worker that ran less than a few seconds is started again."""


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host if host not in ("", "0.0.0.0") else "127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def worker_command(args: argparse.Namespace, port: int, index: int) -> list[str]:
    """The command line of worker ``index``: this ``vrt serve``'s options, one port."""
    command = [sys.executable, "-m", "vrt", "serve", args.target, "--host", args.host]
    command += ["--port", str(port), "--log-level", args.log_level]
    command += ["--worker-index", str(index)]
    if args.certfile:
        command += ["--certfile", args.certfile, "--keyfile", args.keyfile]
    # Every option's flag, from its declaration; the node's name is the worker's own.
    node = f"{args.node}:{index}" if args.node else None  # else host:pid:index
    return command + option_argv(argparse.Namespace(**{**vars(args), "node": node}))


def supervise(args: argparse.Namespace) -> int:
    """Run ``args.workers`` workers until SIGTERM (drain, exit 0) or SIGINT (exit 130)."""
    port = args.port or _free_port(args.host)
    count = args.workers
    outcome = {"status": 0}

    async def run() -> None:
        stopping = trio.Event()
        processes: dict[int, trio.Process] = {}

        async def worker(index: int, *, task_status: trio.TaskStatus[None]) -> None:
            started = False
            while not stopping.is_set():
                process = await trio.lowlevel.open_process(
                    worker_command(args, port, index), stdout=subprocess.PIPE
                )
                processes[index] = process
                began = time.monotonic()
                try:
                    assert process.stdout is not None
                    with trio.move_on_after(START_TIMEOUT):
                        await _first_line(process.stdout)
                    if not started:
                        started = True
                        task_status.started()
                    async with trio.open_nursery() as reading:
                        reading.start_soon(_discard, process.stdout)
                        await process.wait()
                        reading.cancel_scope.cancel()
                finally:
                    if process.returncode is None:  # cancelled: stop it, then wait for it
                        with trio.CancelScope(shield=True), trio.move_on_after(10):
                            process.send_signal(signal.SIGINT)
                            await process.wait()
                        if process.returncode is None:
                            process.kill()
                if stopping.is_set():
                    return
                log.warning("worker %d exited (%s): starting it again", index, process.returncode)
                if time.monotonic() - began < 5:
                    await trio.sleep(RESTART_PAUSE)

        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                for index in range(count):
                    await nursery.start(worker, index)
                host = f"[{args.host}]" if ":" in args.host else args.host
                s = "s" if args.certfile else ""  # TLS: wss:// and https://
                print(
                    f"vrt serve: {args.target} on ws{s}://{host}:{port}/ ({count} workers)",
                    flush=True,
                )
                if args.web_demo:
                    from vrt._cli.commands import DEMO_AGENT

                    page = f"http{s}://{host}:{port}/"
                    print(f"vrt serve: the demo page is {page}", flush=True)
                    if args.target == DEMO_AGENT:  # the page's story needs its agent
                        print(f"vrt serve: {page}?autorun plays the demo by itself", flush=True)
                drained = False
                async for signum in signals:
                    if signum == signal.SIGTERM and not drained:
                        drained = True
                        stopping.set()
                        log.info("SIGTERM: draining every worker")
                        for process in processes.values():
                            _signal(process, signal.SIGTERM)
                        nursery.start_soon(_stop_when_all_exit, processes, nursery.cancel_scope)
                        continue
                    stopping.set()
                    outcome["status"] = 130
                    for process in processes.values():
                        _signal(process, signal.SIGINT)
                    nursery.cancel_scope.cancel()
                    break

    trio.run(run)
    return outcome["status"]


async def _first_line(stream: Any) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        chunk = await stream.receive_some(1)
        if not chunk:
            break
        line += chunk
    return line


async def _discard(stream: Any) -> None:
    """Read what a worker prints after its first line (nobody needs it; a full pipe
    would stop the worker)."""
    while await stream.receive_some(4096):
        pass


def _signal(process: trio.Process, signum: int) -> None:
    if process.returncode is None:
        process.send_signal(signum)


async def _stop_when_all_exit(processes: dict[int, trio.Process], scope: trio.CancelScope) -> None:
    for process in list(processes.values()):
        await process.wait()
    scope.cancel()
