"""``vrt serve --workers N``: N processes on one port, started for sure or not at all.

Theory of operation:

- **One listening socket, the parent's.** The parent binds ``HOST:PORT`` itself, without
  ``SO_REUSEPORT``, and every worker inherits that very socket (``pass_fds``) and serves
  on it (``vrt.serve(sockets=...)``). Linux queues a new connection on the socket while
  any process holds it, and the worker that accepts first takes it. So the port is this
  deployment's alone: any other bind of it fails with ``EADDRINUSE`` (another ``vrt
  serve``, with or without ``--workers``), where ``SO_REUSEPORT`` would have let any
  process of the same user join the group and receive a share of the clients. A worker
  that dies or drains takes no queued connection with it, and one that starts takes none
  before it accepts. The parent closes its copy when it stops.
- **Ready or not.** Each worker has a socket pair to the parent (``--supervisor-fd``): it
  says ``ready NODE`` once it serves, or ``failed LINE`` with the one line it would have
  printed (a store that refuses, a bad ``MODULE:AGENT``). The parent prints its banner
  only once every worker said ready; if one cannot start, it prints that worker's line,
  stops the others and exits 2, as one ``vrt serve`` does. The same link tells a worker
  that its parent is gone (end of file): it drains, so no orphan keeps the port.
- **Crashes.** A worker that was ready and exits 0 drained on a SIGTERM of its own (a
  planned restart): it is started again at once, logged at INFO. Any other exit, and a
  start that fails, is a crash: logged at WARNING with its cause, started again after a
  pause that doubles with each crash in a row (:class:`Restarts`); the ``LIMIT``-th crash
  in a row gives up: one line, the other workers drain, exit 1. A worker that ran
  ``STABLE`` seconds before it crashed starts the count again.
- **Stopping.** SIGTERM drains every worker (exit 0 once they all have); a second
  SIGTERM, or SIGINT, stops them at once (exit 130). Workers are in a session of their
  own, so a terminal's Ctrl-C reaches them only through the parent; a worker that is not
  ready yet has nothing to lose and is killed. Every wait has a deadline.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence

import attrs
import trio

from vrt._cli.flags import option_argv

log = logging.getLogger("vrt.server")

START_TIMEOUT = 30.0
"""Seconds a worker has to say it is ready."""
FIRST_PAUSE = 0.25
"""Seconds before a crashed worker is started again, doubled with each crash in a row."""
LIMIT = 5
"""The crash in a row at which the parent gives up."""
STABLE = 60.0
"""Seconds a worker runs after which its next crash is the first in a row again."""
STOP_TIMEOUT = 10.0
"""Seconds workers stopped at once (SIGINT) have to exit before they are killed."""
DRAIN_MARGIN = 30.0
"""Seconds a drain may take beyond ``--drain-timeout`` before the workers are killed."""
PREFIX = "vrt serve: "


def worker_command(
    args: argparse.Namespace, port: int, index: int, listen: Sequence[int], supervisor: int
) -> list[str]:
    """The command line of worker ``index``: this ``vrt serve``'s options, the parent's
    listening sockets (``listen``, inherited file descriptors) and its end of the link to
    the parent (``supervisor``)."""
    command = [sys.executable, "-m", "vrt", "serve", args.target, "--host", args.host]
    command += ["--port", str(port), "--log-level", args.log_level]
    command += ["--worker-index", str(index), "--supervisor-fd", str(supervisor)]
    for fd in listen:
        command += ["--listen-fd", str(fd)]
    if args.certfile:
        command += ["--certfile", args.certfile, "--keyfile", args.keyfile]
    # Every option's flag, from its declaration; the node's name is the worker's own.
    node = f"{args.node}:{index}" if args.node else None  # else host:pid:index
    return command + option_argv(argparse.Namespace(**{**vars(args), "node": node}))


@attrs.define
class Restarts:
    """When a crashed worker is started again, and when the parent stops trying (one
    record per worker; no I/O, no clock: ``ran`` is given)."""

    in_a_row: int = 0
    """Crashes since the worker last ran ``STABLE`` seconds."""

    def crashed(self, ran: float | None) -> float | None:
        """A crash after ``ran`` seconds of serving (None: it never got ready): the pause
        before the next start, or None to give up."""
        if ran is not None and ran >= STABLE:
            self.in_a_row = 0
        self.in_a_row += 1
        if self.in_a_row >= LIMIT:
            return None
        return FIRST_PAUSE * float(2 ** (self.in_a_row - 1))


class CannotStart(Exception):
    """A worker exited, or said why it could not start, before it was ready."""

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line
        """What to print: the worker's own line, or what the parent saw."""


# -- the worker's side ----------------------------------------------------------------------------


class Parent:
    """A worker's end of its link to the parent (``--supervisor-fd``), and the listening
    sockets it inherited (``--listen-fd``)."""

    def __init__(self, supervisor: int, listen: Sequence[int]) -> None:
        self._link = socket.socket(fileno=supervisor)
        self.sockets = [socket.socket(fileno=fd) for fd in listen]
        for sock in (self._link, *self.sockets):
            sock.set_inheritable(False)  # the agent's own subprocesses get none of them

    def ready(self, node: str | None) -> None:
        """Tell the parent this worker serves (as node ``node``)."""
        self._say(f"ready {node or ''}")

    def failed(self, line: str) -> None:
        """Tell the parent why this worker stops: ``line`` is what one ``vrt serve``
        would print."""
        self._say(f"failed {line}")

    def _say(self, text: str) -> None:
        try:
            self._link.sendall((" ".join(text.split()) + "\n").encode())
        except OSError:
            pass  # the parent is gone: the worker drains (watch)

    async def gone(self) -> None:
        """Return once the parent is gone (its end of the link closed). The parent never
        writes, so readable means closed. Cancellable."""
        while True:
            await trio.lowlevel.wait_readable(self._link)
            try:
                if not self._link.recv(64, socket.MSG_DONTWAIT):
                    return
            except BlockingIOError:
                continue
            except OSError:
                return


# -- the parent's side ----------------------------------------------------------------------------


@attrs.define(eq=False)
class Worker:
    """One process the parent started, and what it said."""

    index: int
    process: trio.Process
    link: trio.SocketStream
    settled: trio.Event = attrs.field(factory=trio.Event)
    """Set once it said ready, or its link closed (it exited)."""
    ready_at: float | None = None
    node: str | None = None
    said: str | None = None
    """The line it gave when it stopped (``failed``), without ``vrt serve:``."""

    @property
    def name(self) -> str:
        return f"worker {self.index} ({self.node or f'pid {self.process.pid}'})"

    async def listen(self) -> None:
        """Read what the worker says until its end of the link closes."""
        buffer = b""
        try:
            while chunk := await self.link.receive_some(4096):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    self._heard(line.decode(errors="replace"))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.settled.set()
            self.link.socket.close()

    def _heard(self, line: str) -> None:
        word, _, rest = line.partition(" ")
        if word == "ready" and self.ready_at is None:
            self.ready_at = trio.current_time()
            self.node = rest or None
            self.settled.set()
        elif word == "failed":
            self.said = rest.removeprefix(PREFIX)

    def why(self) -> str:
        """How it ended (it has exited), with the line it gave if any."""
        code = self.process.returncode
        assert code is not None
        if code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with status {code}"
        return f"{how}: {self.said}" if self.said else how


class Supervisor:
    """The parent of ``vrt serve --workers N`` (the module's docstring says how)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.listeners: list[trio.SocketListener] = []
        self.workers: dict[int, Worker] = {}
        self.stopping = False
        self.status = 0
        self._nursery: trio.Nursery | None = None

    @property
    def nursery(self) -> trio.Nursery:
        assert self._nursery is not None
        return self._nursery

    async def run(self) -> int:
        """Listen, start the workers, keep them until a signal or a crash loop: the exit
        status."""
        host, port = self.args.host, self.args.port
        try:
            self.listeners = await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:  # a busy port, an address that is not this machine's
            print(f"{PREFIX}cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        try:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._serve)
                    async for signum in signals:
                        if signum == signal.SIGTERM and not self.stopping:
                            self._drain("SIGTERM")
                            continue
                        if self.status == 0:
                            self.status = 130
                        name = signal.Signals(signum).name
                        log.info("%s: stopping every worker at once", name)
                        self._stop_now()
                        break
        finally:
            for listener in self.listeners:
                listener.socket.close()
        return self.status

    @property
    def port(self) -> int:
        port: int = self.listeners[0].socket.getsockname()[1]
        return port

    async def _serve(self) -> None:
        failed: list[str] = []
        async with trio.open_nursery() as starting:
            for index in range(self.args.workers):
                starting.start_soon(self._first_start, index, failed, starting.cancel_scope)
        if self.stopping:
            return
        if failed:
            print(failed[0], file=sys.stderr, flush=True)
            self.status = 2
            self._stop_now()
            return
        self._banner()
        for index in range(self.args.workers):
            self.nursery.start_soon(self._keep, index)

    async def _first_start(self, index: int, failed: list[str], scope: trio.CancelScope) -> None:
        try:
            await self._start(index)
        except CannotStart as exc:
            failed.append(exc.line)
            scope.cancel()  # one line is enough: the others are stopped

    def _banner(self) -> None:
        args = self.args
        host = f"[{args.host}]" if ":" in args.host else args.host
        s = "s" if args.certfile else ""  # TLS: wss:// and https://
        count = args.workers
        print(f"{PREFIX}{args.target} on ws{s}://{host}:{self.port}/ ({count} workers)", flush=True)
        if args.web_demo:
            from vrt._cli.commands import DEMO_AGENT

            page = f"http{s}://{host}:{self.port}/"
            print(f"{PREFIX}the demo page is {page}", flush=True)
            if args.target == DEMO_AGENT:  # the page's story needs its agent
                print(f"{PREFIX}{page}?autorun plays the demo by itself", flush=True)

    async def _spawn(self, index: int) -> Worker:
        ours, theirs = socket.socketpair()
        try:
            listen = [listener.socket.fileno() for listener in self.listeners]
            command = worker_command(self.args, self.port, index, listen, theirs.fileno())
            # A session of its own: a terminal's signals (Ctrl-C, hang-up, job control)
            # reach the workers only through the parent.
            process = await trio.lowlevel.open_process(
                command,
                pass_fds=[*listen, theirs.fileno()],
                start_new_session=True,
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        link = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
        worker = self.workers[index] = Worker(index, process, link)
        self.nursery.start_soon(worker.listen)
        if self.stopping:  # stopped while it was being started
            process.kill()
        return worker

    async def _start(self, index: int) -> Worker:
        """Start worker ``index`` and wait until it is ready; CannotStart if it is not."""
        worker = await self._spawn(index)
        with trio.move_on_after(START_TIMEOUT):
            await worker.settled.wait()
        if worker.ready_at is not None:
            return worker
        late = not worker.settled.is_set()
        if late:
            worker.process.kill()
        with trio.move_on_after(STOP_TIMEOUT):
            await worker.process.wait()
        if worker.process.returncode is None:
            worker.process.kill()
        if late:
            raise CannotStart(f"{PREFIX}worker {index} was not ready within {START_TIMEOUT:g} s")
        if worker.said:
            raise CannotStart(PREFIX + worker.said)
        await worker.process.wait()  # its link closed: it has exited, or is just exiting
        raise CannotStart(f"{PREFIX}worker {index} {worker.why()} before it was ready")

    async def _keep(self, index: int) -> None:
        """Start worker ``index`` again each time it exits, until stopping or the limit."""
        restarts = Restarts()
        worker: Worker | None = self.workers[index]
        name = why = ""
        while True:
            if worker is not None:
                await worker.process.wait()
                if self.stopping:
                    return
                assert worker.ready_at is not None
                ran = trio.current_time() - worker.ready_at
                if worker.process.returncode == 0:  # it drained: a SIGTERM of its own
                    log.info("%s drained and exited: starting it again", worker.name)
                    pause: float | None = 0.0
                else:
                    name = worker.name
                    why = f"{worker.why()} after {ran:.1f} s"
                    pause = restarts.crashed(ran)
            else:
                pause = restarts.crashed(None)
            if pause is None:
                self._give_up(
                    f"worker {index} crashed {LIMIT} times in a row, giving up; the last time "
                    f"it {why}"
                )
                return
            if pause:
                log.warning("%s %s: starting it again in %g s", name, why, pause)
                await trio.sleep(pause)
            if self.stopping:
                return
            try:
                worker = await self._start(index)
            except CannotStart as exc:
                if self.stopping:
                    return
                worker = None
                name = f"worker {index}"
                why = f"could not start: {exc.line.removeprefix(PREFIX)}"
                continue
            log.info("%s is ready again", worker.name)

    def _give_up(self, why: str) -> None:
        if self.stopping:
            return
        print(PREFIX + why, file=sys.stderr, flush=True)
        self.status = 1
        self._drain("giving up")

    def _drain(self, why: str) -> None:
        """Drain every worker (their sessions are handed over), then stop."""
        self.stopping = True
        log.info("%s: draining every worker", why)
        for listener in self.listeners:  # the port closes once the workers close theirs
            listener.socket.close()
        self._signal_all(signal.SIGTERM)
        self.nursery.start_soon(self._reap, self.args.drain_timeout + DRAIN_MARGIN)

    def _stop_now(self) -> None:
        """Stop every worker at once (their sessions are closed)."""
        self.stopping = True
        self._signal_all(signal.SIGINT)
        self.nursery.start_soon(self._reap, STOP_TIMEOUT)

    def _signal_all(self, signum: int) -> None:
        for worker in self.workers.values():
            if worker.process.returncode is not None:
                continue
            if worker.ready_at is None:  # not serving yet: nothing to lose
                worker.process.kill()
            else:
                worker.process.send_signal(signum)

    async def _reap(self, seconds: float) -> None:
        """Wait up to ``seconds`` for every worker to exit (killing those left), then
        end the run."""
        with trio.move_on_after(seconds):
            while running := [w for w in self.workers.values() if w.process.returncode is None]:
                await running[0].process.wait()
        for worker in self.workers.values():
            if worker.process.returncode is None:
                log.warning("%s did not stop within %g s: killed", worker.name, seconds)
                worker.process.kill()
                with trio.move_on_after(STOP_TIMEOUT):
                    await worker.process.wait()
        self.nursery.cancel_scope.cancel()


def supervise(args: argparse.Namespace) -> int:
    """Run ``args.workers`` workers (the module's docstring): the exit status."""
    return trio.run(Supervisor(args).run)
