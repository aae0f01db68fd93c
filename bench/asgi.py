"""The ASGI path's cost: CPU per turn through hypercorn's Trio worker and ``vrt.asgi``
against ``vrt serve``'s, the same load, in one run.

``python -m bench.asgi`` (``--help``: bench/load.py's knobs; ``--quick`` is not for this,
use ``--sessions 200 --levels 50 --window 5``). Both servers run from the start, each in
processes of its own on a free loopback port: ``vrt serve bench.agents:agent`` and
``hypercorn --worker-class trio 'bench.agents:make_asgi_app()'`` (the same agent, the same
options: bench/agents.py). The machinery is bench/windows.py's: the light raw-socket
clients (or ``--client vrt``), a paced window then windows at think 0, both servers' windows
interleaved round by round (the order reversed every other round), CPU from ``/proc`` of
every server process (hypercorn's parent and its worker). It prints each window, the sums,
each round's ratios and the ratio of CPU per turn (ASGI / vrt serve), paced and at
saturation.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import trio

import vrt
from bench import load
from bench.harness import (
    HOST,
    ROOT,
    Served,
    children,
    free_port,
    sockets,
    stop,
    version,
    vrt_commit,
)
from bench.serving import after_windows
from bench.windows import Config, Result, print_rounds, run_configs


class HypercornServed(Served):
    """hypercorn's parent process and its one worker, which holds the sockets (the other
    child is multiprocessing's resource tracker)."""

    def worker_pids(self) -> dict[int, int]:
        return {0: max([self.process.pid, *children(self.process.pid)], key=sockets)}


@contextlib.asynccontextmanager
async def hypercorn(label: str, folder: Path, env: dict[str, str]) -> AsyncIterator[Served]:
    """``hypercorn --worker-class trio`` serving ``vrt.asgi`` (cwd: the repository's root),
    until SIGINT on the way out; its log (hypercorn's and vrt's) in ``folder``."""
    port = free_port()
    command = [
        sys.executable, "-m", "hypercorn", "--worker-class", "trio", "--bind", f"{HOST}:{port}",
        "bench.agents:make_asgi_app()",
    ]  # fmt: skip
    log = folder / "hypercorn.log"
    with log.open("wb") as out:
        process = await trio.lowlevel.open_process(
            command, cwd=ROOT, stdout=out, stderr=out, env={**os.environ, **env}
        )
        try:
            with trio.fail_after(60):
                while not await _answers(port):
                    if process.returncode is not None:
                        raise RuntimeError(f"hypercorn exited: {log.read_text()[-2000:]}")
                    await trio.sleep(0.1)
            yield HypercornServed(process, f"ws://{HOST}:{port}/", port, command, log, 1)
        finally:
            await stop(process)


async def _answers(port: int) -> bool:
    """Whether ``GET /healthz`` on ``port`` answers 200 (the app's sessions are open)."""
    try:
        async with await trio.open_tcp_stream(HOST, port) as stream:
            await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := await stream.receive_some(4096):
                data += chunk
    except OSError:
        return False
    return data.startswith(b"HTTP/1.1 200")


def print_ratios(base: Result, asgi: Result) -> None:
    """CPU per turn of the ASGI path over vrt serve's (every server process), and turns/s."""
    print(f"\n== {asgi.config.label} against {base.config.label}, this run")
    b, a = base.saturated, asgi.saturated
    print(
        f"  saturation turns/s: {a.rate:,.1f} ({a.label}) / {b.rate:,.1f} ({b.label}) = "
        f"{a.rate / b.rate:.2f}x"
    )
    for name, bw, aw in (("paced", base.paced, asgi.paced), ("at saturation", b, a)):
        base_cpu, asgi_cpu = bw.per_turn(bw.server_cpu), aw.per_turn(aw.server_cpu)
        print(
            f"  server CPU per turn, {name}: {asgi_cpu * 1e3:.2f} ms / {base_cpu * 1e3:.2f} ms"
            f" = {asgi_cpu / base_cpu:.2f}x"
        )


async def run(args: argparse.Namespace, folder: Path) -> None:
    configs = [
        Config("vrt serve", 1, None),
        Config("hypercorn + vrt.asgi", 1, None, serve=hypercorn),
    ]
    results = await run_configs(args, configs, folder, after_windows(args, folder))
    print_rounds(results)
    print_ratios(results[0], results[1])
    problems = sum(len(r.problems) for r in results)
    errors = sum(sum(w.errors.values()) for r in results for w in [r.paced, *r.levels])
    print(f"\n  client errors in the windows: {errors}; server log warnings/errors: {problems}")


def main() -> None:
    args = load.parse(["--compare", *sys.argv[1:]])
    print(
        f"vrt ASGI benchmark: Python {sys.version.split()[0]}, trio {trio.__version__}, "
        f"hypercorn {version('hypercorn')}, {os.cpu_count()} CPUs, loopback; vrt from "
        f"{os.path.dirname(vrt.__file__)}{vrt_commit()}; clients: {args.client}"
        + (" in a second process" if args.clients_process else " in this process")
        + f"\nworkload: {args.sessions} sessions, {args.steps} steps a turn (a server call, "
        f"then an app call), a new session every {args.recycle} turns; a paced window at "
        f"think {args.think:g} s, then think 0 with {', '.join(map(str, args.levels))} "
        f"sessions; windows of {args.window:g} s after {args.settle:g} s to settle, "
        f"{args.rounds} rounds"
    )
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.logs or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        trio.run(run, args, folder)
    print(f"  wall time {time.perf_counter() - start:,.1f} s")


if __name__ == "__main__":
    main()
