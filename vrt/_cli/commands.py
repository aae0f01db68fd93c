"""The ``vrt`` command line (also ``python -m vrt``)."""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import inspect
import logging
import os
import signal
import ssl
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import trio

import vrt
from vrt import check as vrt_check
from vrt._cli import demo_agent, voice_agent
from vrt._cli.demo import FAST, run_demo
from vrt._cli.flags import add_flags, option_values, reading
from vrt._cli.telemetry import install_prometheus
from vrt._cli.workers import Parent, supervise
from vrt._cluster.node import default_name
from vrt._engine.groups import single_unwrapped
from vrt._net.options import read_count
from vrt._net.tls import load_server_context

Handler = Callable[[argparse.Namespace], int]

DEMO_AGENT = "vrt._cli.demo_agent:at_full_pace"
"""What ``vrt serve --web`` serves without MODULE:AGENT: the demo's travel assistant."""
VOICE_LABEL = "the voice demo agent"
"""How ``vrt demo --web --voice`` names its agent."""
DEMO_LABEL = "the demo agent"
"""How ``vrt demo --web`` names it in the line that gives its URL."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``vrt`` command line with ``argv`` (default: ``sys.argv[1:]``).

    Returns the exit status; argparse exits with status 2 on a usage error.
    """
    args = _parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except* KeyboardInterrupt:
        # Ctrl-C: Trio's nurseries deliver it inside an exception group; the session has
        # closed on the way out, so exit quietly.
        pass
    return 130  # the shell's convention for SIGINT


def _parser() -> argparse.ArgumentParser:
    # prog is fixed so that "python -m vrt" reads the same as the console script.
    parser = argparse.ArgumentParser(
        prog="vrt", description="trio-vrt: the tool-calling engine of a realtime voice agent."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {vrt.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="play a scripted conversation over a WebSocket and print its events as they happen",
        description="Serve a scripted agent on a loopback WebSocket (vrt.serve), connect to "
        "it as an app (vrt.connect) in the same process, and print a timeline of the events "
        "the client receives as they arrive: a streamed call with progress, a confirmation "
        "approved and one denied, an invalid call, app tools run one at a time, and a "
        "client-side interrupt. Exits 1 if the run did not tell that story with a valid "
        "event stream.",
    )
    demo.add_argument(
        "--fast", action="store_true", help=f"scale every delay by {FAST:g} (for tests)"
    )
    demo.add_argument(
        "--web",
        action="store_true",
        help="serve the demo page instead: open http://127.0.0.1:PORT/ in a browser, where "
        "the page hosts the app tools (until interrupted), or http://127.0.0.1:PORT/?autorun "
        "to watch it play the story by itself; GET /metrics shows the calls by result code "
        "(with trio-vrt[metrics])",
    )
    demo.add_argument(
        "--voice",
        action="store_true",
        help="with --web: serve the voice demo as well, http://127.0.0.1:PORT/voice, where you "
        "talk to a weather assistant (the microphone and the speaker through vrt.js); its "
        "model is vrt.testing.FakeRealtime, which answers any speech with a tone for a voice",
    )
    demo.add_argument(
        "--realtime",
        choices=("openai", "gemini"),
        help="with --voice: the real model instead of the fake ($OPENAI_API_KEY or "
        "$GEMINI_API_KEY)",
    )
    demo.add_argument(
        "--port", type=_port, default=8765, help="with --web: the port (default: %(default)s)"
    )
    _tls_arguments(demo, "with --web: ")
    demo.set_defaults(handler=_demo)

    serve = commands.add_parser(
        "serve",
        usage="vrt serve MODULE:AGENT [--host HOST] [--port PORT] [options]",
        help="serve an agent over vrt/1 WebSockets",
        description="Import AGENT from MODULE (a vrt.Agent, or a function that returns one) "
        "and serve it with vrt.serve until interrupted. The current directory is importable.",
    )
    serve.add_argument(
        "target",
        metavar="MODULE:AGENT",
        nargs="?",
        help="e.g. myapp.agents:agent (with --web it may be left out: the demo's agent)",
    )
    serve.add_argument(
        "--host", default=_default("host"), help="address to bind (default: %(default)s)"
    )
    serve.add_argument(
        "--port",
        type=_port,
        default=_default("port"),
        help="0 picks a free port (default: %(default)s)",
    )
    production = serve.add_argument_group(
        "serving in production (docs/deploy.md)",
        "With a store, sessions survive deploys and crashes: SIGTERM drains (GET /healthz "
        "answers 503, every session is handed over at its next turn boundary, then the "
        "process exits 0); a second SIGTERM or SIGINT stops at once.",
    )
    # Every option of vrt.serve that is a flag, from its declaration (vrt._cli.flags).
    add_flags(serve, {"production": production})
    serve.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="what the server logs to stderr: connections, sessions and their ends at info "
        "(default: %(default)s)",
    )
    _tls_arguments(serve)
    production.add_argument(
        "--workers",
        type=reading(read_count),
        default=1,
        help="processes on one port (the parent's socket, theirs alone); more than 1 needs "
        "--store (default: %(default)s)",
    )
    # A worker's own (vrt._cli.workers): its index, its link to the parent, the parent's
    # listening sockets.
    serve.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--supervisor-fd", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--listen-fd", type=int, action="append", help=argparse.SUPPRESS)
    serve.set_defaults(handler=_serve)

    diagrams = commands.add_parser(
        "diagrams",
        help="write the machines' diagrams (Mermaid and SVG) and the other generated files, "
        "or check they are current",
        description="Write diagrams/<machine>.mmd (Mermaid), diagrams/<machine>.svg "
        "(Graphviz), diagrams/README.md and vrt/web/machines.js (the browser client's "
        "tables) from the classes in machines/, and vrt/_server/option_types.py (the "
        "TypedDicts of vrt.serve's and vrt.asgi.app's options) from the options' "
        "declarations. With --check, write nothing: exit 1 and name every stale or missing "
        "file.",
    )
    diagrams.add_argument("--check", action="store_true", help="only check, exit 1 if stale")
    diagrams.add_argument("--dir", default="diagrams", help="folder (default: %(default)s)")
    diagrams.add_argument(
        "--web-dir",
        default=str(Path(__file__).resolve().parent.parent / "web"),
        help="the browser client's folder, for machines.js (default: the package's vrt/web)",
    )
    diagrams.set_defaults(handler=_diagrams)

    check = commands.add_parser(
        "check",
        help="model-check the machines and the engine's rules around them",
        description="Check each machine's compiled table against its class (every (state, "
        "event) pair, reachability, no dead event), then explore the composed model (tool "
        "calls, the turn, the client's call views and app calls, an ordered network that "
        "drops and resumes, user and server interrupts, a session handed over to another "
        "process at a turn boundary and one adopted after its process crashed) breadth "
        "first over every "
        "interleaving within the bounds, then the realtime model (a session's connection to "
        "a realtime voice model: its responses as turns, calls completed or cut, speech-starts "
        "and the app's interrupts, late and duplicate events, a lost connection), and print "
        "states, transitions, seconds and violations of each, with a short trace. --break "
        "breaks one rule of a model on purpose, to see the checker find it. Exits 1 on any "
        "violation or machine problem.",
    )
    vrt_check.add_arguments(check)
    check.set_defaults(handler=_check)
    return parser


def _diagrams(args: argparse.Namespace) -> int:
    from vrt._cli import diagrams as _diagrams
    from vrt._cli import optiontypes, webtables

    folder = Path(args.dir)
    web = Path(args.web_dir)
    if args.check:
        problems = _diagrams.check(folder) + webtables.check(web) + optiontypes.check()
        for problem in problems:
            print(f"vrt diagrams --check: {problem}", file=sys.stderr)
        if problems:
            print("regenerate them with 'vrt diagrams' and commit them", file=sys.stderr)
        return 1 if problems else 0
    try:
        written = _diagrams.write(folder)
    except _diagrams.DiagramError as exc:
        print(f"vrt diagrams: {exc}", file=sys.stderr)
        return 1
    machines_js = webtables.write(web)
    option_types = optiontypes.write()
    print(
        f"vrt diagrams: wrote {len(written)} files in {folder}/, {machines_js} and {option_types}"
    )
    return 0


def _check(args: argparse.Namespace) -> int:
    return vrt_check.run(args)


def load_agent(target: str) -> vrt.Agent:
    """``MODULE:AGENT`` to the agent it names; raises SystemExit with a clear message."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise SystemExit(f"vrt serve: expected MODULE:AGENT, got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SystemExit(f"vrt serve: cannot import {module_name!r}: {exc}") from None
    try:
        agent = getattr(module, attribute)
    except AttributeError:
        raise SystemExit(f"vrt serve: {module_name!r} has no attribute {attribute!r}") from None
    if callable(agent) and not isinstance(agent, vrt.Agent):
        agent = agent()
    if not isinstance(agent, vrt.Agent):
        raise SystemExit(f"vrt serve: {target} is not a vrt.Agent (use vrt.define_agent)")
    return agent


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is a number from 0 to 65535, not {text!r}")
    return port


def _tls_arguments(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    parser.add_argument(
        "--certfile",
        metavar="FILE",
        help=f"{prefix}serve TLS (wss://, https://) with this PEM certificate chain "
        "(with --keyfile)",
    )
    parser.add_argument("--keyfile", metavar="FILE", help="the certificate's PEM private key")


def _tls(args: argparse.Namespace) -> ssl.SSLContext | str | None:
    """``--certfile`` and ``--keyfile`` as a server context (None without them), or the
    one-line error to print."""
    if args.certfile is None and args.keyfile is None:
        return None
    if args.certfile is None or args.keyfile is None:
        return "--certfile and --keyfile go together (a PEM certificate chain and its key)"
    try:
        return load_server_context(args.certfile, args.keyfile)
    except ValueError as exc:
        return str(exc)


def _default(parameter: str) -> Any:
    """The default of ``vrt.serve``'s ``parameter`` (``host``, ``port``)."""
    return inspect.signature(vrt.serve).parameters[parameter].default


def _serve(args: argparse.Namespace) -> int:
    if args.workers > 1 and not args.store:
        print(
            "vrt serve: --workers above 1 needs --store (sessions move between them)",
            file=sys.stderr,
        )
        return 2
    ssl_context = _tls(args)  # checked here too with --workers: one error, not one a worker
    if isinstance(ssl_context, str):
        print(f"vrt serve: {ssl_context}", file=sys.stderr)
        return 2
    # With a store, every line names its node: this process, or the worker it comes from.
    node = (args.node or default_name(args.worker_index)) if args.store else None
    logging.basicConfig(level=args.log_level.upper(), format=_log_format(node), stream=sys.stderr)
    if args.target is None:
        if not args.web_demo:
            print("vrt serve: MODULE:AGENT is missing (only --web has a default)", file=sys.stderr)
            return 2
        args.target = DEMO_AGENT
    if args.workers > 1 and args.worker_index is None:
        return supervise(args)
    parent = None
    if args.supervisor_fd is not None:  # a worker of vrt serve --workers
        parent = Parent(args.supervisor_fd, args.listen_fd or [])
    try:
        agent = load_agent(args.target)
    except SystemExit as exc:  # its one line, as the worker's parent prints it too
        return _failed(str(exc.code), parent)
    if args.metrics:
        missing = install_prometheus()
        if missing is not None:
            return _failed(f"vrt serve: --metrics: {missing}", parent)
    options = option_values(args)
    if node is not None:
        options["node"] = node
    if parent is not None:
        options["sockets"] = parent.sockets
    return _serve_until_interrupted(
        agent, args.host, args.port, args.target, ssl_context=ssl_context, parent=parent, **options
    )


def _log_format(node: str | None) -> str:
    where = "" if node is None else f" [{node.replace('%', '%%')}]"
    return f"%(asctime)s %(levelname)s{where} %(name)s: %(message)s"


def _failed(line: str, parent: Parent | None) -> int:
    """Say why ``vrt serve`` stops, in one line: on stderr, or to a worker's parent (which
    prints it, or logs it); exit status 2."""
    if parent is None:
        print(line, file=sys.stderr)
    else:
        parent.failed(line)
    return 2


def _serve_until_interrupted(
    agent: vrt.Agent | Callable[[], AbstractAsyncContextManager[vrt.Agent]],
    host: str,
    port: int,
    label: str,
    parent: Parent | None = None,
    **options: Any,
) -> int:
    """``vrt.serve`` until SIGINT/SIGTERM; prints the URL (a worker tells its ``parent``
    instead); exit status 2 for a bad port or option. With a store, the first SIGTERM
    drains (exit 0 once every session moved), as does a worker whose parent is gone.
    ``agent`` may be a function giving an async context manager that holds the agent for
    the server's life (the voice demo's runs its fake model's server)."""
    args = argparse.Namespace(host=host, port=port, target=label)
    drained = False
    make = agent

    async def run() -> None:
        async with contextlib.AsyncExitStack() as stack:
            if isinstance(make, vrt.Agent):
                await served(make)
            else:
                await served(await stack.enter_async_context(make()))

    async def served(agent: vrt.Agent) -> None:
        nonlocal drained
        # SIGINT/SIGTERM as a signal receiver that cancels the server, rather than trio's
        # KeyboardInterrupt delivery, which after an HTTP-refused upgrade sometimes never
        # reached the main task (the process hung).
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                done = trio.Event()

                async def serve(*, task_status: trio.TaskStatus[vrt.Server]) -> None:
                    await vrt.serve(agent, args.host, args.port, task_status=task_status, **options)
                    done.set()  # drained

                server = await nursery.start(serve)
                log = logging.getLogger("vrt.server")

                def drain(why: str) -> None:
                    nonlocal drained
                    drained = True
                    log.info("%s: draining (a second SIGTERM stops at once)", why)
                    server.drain()
                    nursery.start_soon(_stop_when, done, nursery.cancel_scope)

                async def orphaned(parent: Parent) -> None:
                    # A worker whose parent is gone (killed) must not keep the port, nor
                    # sessions that nobody will restart it for.
                    await parent.gone()
                    if server.node is None:
                        nursery.cancel_scope.cancel()
                    elif not drained:
                        drain("the parent process is gone")

                if parent is not None:  # the parent prints the banner once all are ready
                    parent.ready(server.node)
                    nursery.start_soon(orphaned, parent)
                else:
                    _banner(server, args.target, label, options)
                async for signum in signals:
                    if signum == signal.SIGTERM and server.node is not None and not drained:
                        drain("SIGTERM")
                        continue
                    log.info("shutting down")
                    drained = False
                    nursery.cancel_scope.cancel()  # every session gets closed(shutdown)
                    break
        if not drained:
            raise KeyboardInterrupt  # the exit status of an interrupted command: 130

    try:
        with single_unwrapped():
            trio.run(run)
    except OSError as exc:  # a busy port, an address that is not this machine's
        where = f"{args.host}:{args.port}"
        return _failed(f"vrt serve: cannot listen on {where}: {exc.strerror or exc}", parent)
    except ValueError as exc:  # an option vrt.serve refuses
        return _failed(f"vrt serve: {exc}", parent)
    except vrt.VrtError as exc:  # the store does not answer
        return _failed(f"vrt serve: {exc}", parent)
    return 0


def _banner(server: vrt.Server, target: str, label: str, options: dict[str, Any]) -> None:
    print(f"vrt serve: {target} on {server.url}", flush=True)
    page = "http" + server.url[2:]  # ws:// or wss:// to http:// or https://
    if options.get("web_demo") and label == VOICE_LABEL:  # / is the travel demo's page
        print(f"vrt serve: the voice demo is {page}voice (allow the microphone)", flush=True)
    elif options.get("web_demo"):
        print(f"vrt serve: the demo page is {page}", flush=True)
        if label in (DEMO_LABEL, DEMO_AGENT):  # the page's story needs its agent
            print(f"vrt serve: {page}?autorun plays the demo by itself", flush=True)
    if options.get("metrics"):
        print(f"vrt serve: metrics at {page}metrics", flush=True)


async def _stop_when(done: trio.Event, scope: trio.CancelScope) -> None:
    await done.wait()
    scope.cancel()


def _demo(args: argparse.Namespace) -> int:
    out = sys.stdout
    color = out.isatty() and "NO_COLOR" not in os.environ
    scale = FAST if args.fast else 1.0
    if args.web:
        ssl_context = _tls(args)
        if isinstance(ssl_context, str):
            print(f"vrt demo: {ssl_context}", file=sys.stderr)
            return 2
        logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        missing = install_prometheus()
        if missing is not None:
            logging.getLogger("vrt").info("no GET /metrics: %s", missing)
        if args.voice:
            realtime = args.realtime
            return _serve_until_interrupted(
                lambda: voice_agent.voice_agent(realtime),
                "127.0.0.1",
                args.port,
                VOICE_LABEL,
                web_demo=True,
                metrics=missing is None,
                ssl_context=ssl_context,
            )
        return _serve_until_interrupted(
            demo_agent.agent(scale),
            "127.0.0.1",
            args.port,
            DEMO_LABEL,
            web_demo=True,
            metrics=missing is None,
            ssl_context=ssl_context,
        )
    outcome = trio.run(functools.partial(run_demo, out, scale=scale, color=color))
    return 0 if outcome.ok else 1
