"""The ``vrt`` command line: ``vrt demo`` (a real server and client over a loopback
WebSocket) in process, on a virtual clock, and as installed."""

from __future__ import annotations

import io
import itertools
import os
import re
import socket
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

import vrt
from vrt._cli import main
from vrt._cli.demo import EXPECTED, run_demo
from vrt._cli.timeline import SeenCall, SeenTurn, Timeline, seen_turns

P = vrt.Phase
LINE = re.compile(r"^ *\+\d+\.\d{3}s  ")  # every timeline line starts with the elapsed time
APP_CALLS = ("call_5", "call_6", "call_7", "call_9")


def phases(events: list[vrt.Event], call_id: str) -> list[vrt.Phase]:
    return [e.phase for e in events if isinstance(e, vrt.ToolStream) and e.call_id == call_id]


def check_story(output: str) -> None:
    """The five scenes appear in order, each with its phases, codes and app tool runs."""
    lines = output.splitlines()
    timeline = [line for line in lines if LINE.match(line)]
    assert len(timeline) > 60

    def first(*parts: str) -> int:
        return next(i for i, line in enumerate(lines) if all(p in line for p in parts))

    marks = [
        first("server", "vrt.serve listening on ws://127.0.0.1:"),
        first("client", "vrt.connect", "tool-stream-v1", "epoch 0"),
        first("t_1", "turn", "started (epoch 0)"),
        first("call_1", "search_flights", "arguments-delta"),
        first("call_1", "search_flights", "arguments-complete"),
        first("call_1", "search_flights", "progress", '"done": 1'),
        first("call_1", "search_flights", "progress", '"done": 3'),
        first("call_1", "search_flights", "settled", "ok"),
        first("t_1", "turn", "ended finished"),
        # a confirmation approved: the call runs
        first("call_2", "book_flight", "arguments-complete"),
        first("call_2", "book_flight", "confirm.request", "Allow book_flight (high risk) with"),
        first("t_2", "user", "request.approve()"),
        first("call_2", "book_flight", "progress"),
        first("call_2", "book_flight", "settled", "ok"),
        # a confirmation denied: REJECTED with the user's reason
        first("call_3", "add_insurance", "confirm.request", "Allow add_insurance (high risk)"),
        first("t_2", "user", "No insurance, thanks.", "request.deny(reason)"),
        first("call_3", "add_insurance", "settled", "REJECTED", "No insurance, thanks."),
        first("call_4", "choose_seat", "settled", "INVALID", "does not match"),
        # app tools, one at a time in call order, each started after its arguments-complete
        first("call_5", "open_panel", "arguments-complete"),
        first("call_5", "open_panel", "app run() starts", "epoch 0"),
        first("call_5", "open_panel", "app run() returned"),
        first("call_6", "highlight", "app run() starts"),
        # the connection drops while highlight runs; the client resumes the session
        first("t_4", "network", "the connection drops while highlight runs"),
        first("t_4", "client", "connection lost: reconnecting"),
        first("t_4", "client", "resumed the same session"),  # highlight returns before or after
        first("call_6", "highlight", "settled", "ok"),
        first("call_7", "scroll_to", "app run() starts"),
        first("call_7", "scroll_to", "app run() returned"),
        first("call_7", "scroll_to", "settled", "ok"),
        first("t_4", "turn", "ended finished"),
        # the client-side interrupt
        first("call_8", "export_itinerary", "progress"),
        first("call_9", "show_map", "arguments-complete"),
        first("call_9", "show_map", "app run() starts"),
        first("call_10", "email_itinerary", "arguments-delta"),
        first("user", "client.interrupt()"),
        first("client", "epoch 0 -> 1", "3 cancelled events emitted locally"),
        first("call_8", "export_itinerary", "cancelled", "local"),
        first("call_9", "show_map", "cancelled", "local"),
        first("call_10", "email_itinerary", "cancelled", "local"),
        first("call_9", "show_map", "app run() aborted", "reason 'interrupted'"),
        first("t_5", "turn", "ended interrupted (epoch now 1)"),
        first("session", "closed (client)"),
        first("summary"),
    ]
    assert marks == sorted(marks)
    for call_id in APP_CALLS:  # an app tool's run never shows before its arguments-complete
        assert first(call_id, "arguments-complete") < first(call_id, "app run() starts")
    summary = "\n".join(lines[marks[-1] :])
    assert re.search(r"t_1 +finished +epoch 0 +call_1 search_flights ok", summary)
    assert re.search(
        r"t_2 +finished +epoch 0 +call_2 book_flight ok, call_3 add_insurance REJECTED", summary
    )
    assert re.search(r"t_3 +finished +epoch 0 +call_4 choose_seat INVALID", summary)
    assert re.search(
        r"t_4 +finished +epoch 0 +call_5 open_panel \(app\) ok, "
        r"call_6 highlight \(app\) ok, call_7 scroll_to \(app\) ok",
        summary,
    )
    assert re.search(
        r"t_5 +interrupted +epoch 0->1 +call_8 export_itinerary INTERRUPTED, "
        r"call_9 show_map \(app\) INTERRUPTED, call_10 email_itinerary INTERRUPTED",
        summary,
    )
    assert "assert_stream_valid" in summary
    assert "problem" not in output
    assert "ToolPreview" not in output


def test_demo_fast(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--fast"]) == 0
    output = capsys.readouterr().out
    check_story(output)
    assert "\x1b[" not in output  # not a TTY: no colour


async def test_demo_on_a_virtual_clock(autojump_clock: trio.abc.Clock) -> None:
    """At full scale the story stays under five seconds, and tells the serial queue."""
    out = io.StringIO()
    start = trio.current_time()
    outcome = await run_demo(out)
    assert trio.current_time() - start < 5
    assert outcome.ok, outcome.problems
    output = out.getvalue()
    check_story(output)
    got = tuple((t.status, tuple(c.code for c in t.calls)) for t in outcome.turns)
    assert got == EXPECTED
    assert [t.epoch for t in outcome.turns] == [0, 0, 0, 0, 0]
    assert [t.ended_epoch for t in outcome.turns] == [0, 0, 0, 0, 1]
    assert outcome.previews > 0
    runs = outcome.app_runs
    assert [(r.call_id, r.name) for r in runs] == [
        ("call_5", "open_panel"),
        ("call_6", "highlight"),
        ("call_7", "scroll_to"),
        ("call_9", "show_map"),
    ]
    assert [r.outcome for r in runs] == ["returned"] * 3 + ["aborted (interrupted)"]
    assert all(a.ended <= b.started for a, b in itertools.pairwise(runs))
    # The queue was real: the model had issued all three app calls while the first ran.
    lines = output.splitlines()

    def first(*parts: str) -> int:
        return next(i for i, line in enumerate(lines) if all(p in line for p in parts))

    assert first("call_7", "scroll_to", "arguments-complete") < first(
        "call_5", "open_panel", "app run() returned"
    )


async def test_demo_events(autojump_clock: trio.abc.Clock) -> None:
    """The client's events: each scene's calls go through exactly the phases the demo is
    meant to show, and the interrupt's cancelled events are the client's own."""
    events: list[vrt.Event] = []
    timelines: list[Timeline] = []
    original = Timeline.show

    def record(self: Timeline, event: vrt.Event) -> None:
        if not timelines:
            timelines.append(self)
        events.append(event)
        original(self, event)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Timeline, "show", record)
        await run_demo(io.StringIO())
    vrt.testing.assert_stream_valid(events)
    delta, complete = P.ARGUMENTS_DELTA, P.ARGUMENTS_COMPLETE
    assert phases(events, "call_1") == [
        P.START,
        *[delta] * 6,
        complete,
        P.PROGRESS,
        P.PROGRESS,
        P.PROGRESS,
        P.SETTLED,
    ]
    assert phases(events, "call_2") == [
        P.START,
        delta,
        delta,
        delta,
        complete,
        P.PROGRESS,
        P.SETTLED,
    ]
    assert phases(events, "call_3") == [P.START, delta, delta, complete, P.SETTLED]
    assert phases(events, "call_4") == [P.START, delta, delta, delta, complete, P.SETTLED]
    for call_id in ("call_5", "call_6"):
        assert phases(events, call_id) == [P.START, delta, delta, complete, P.SETTLED]
    assert phases(events, "call_7") == [P.START, delta, complete, P.SETTLED]
    kinds = {e.call_id: e.kind for e in events if isinstance(e, vrt.ToolStream)}
    assert [c for c, kind in kinds.items() if kind == "app"] == list(APP_CALLS)
    # confirmations: one per high-risk call, after its arguments-complete, with a prompt
    confirms = [e for e in events if isinstance(e, vrt.ConfirmRequest)]
    assert [(c.call_id, c.name, c.risk) for c in confirms] == [
        ("call_2", "book_flight", "high"),
        ("call_3", "add_insurance", "high"),
    ]
    assert confirms[0].prompt.startswith("Allow book_flight (high risk) with {")
    for confirm in confirms:
        issued = next(
            i
            for i, e in enumerate(events)
            if isinstance(e, vrt.ToolStream)
            and e.call_id == confirm.call_id
            and e.phase == complete
        )
        assert issued < events.index(confirm)
    # the interrupt: a running server tool, a running app tool, a call still streaming
    call_8 = phases(events, "call_8")
    assert call_8[:4] == [P.START, delta, delta, complete]
    assert P.PROGRESS in call_8
    assert call_8[-1] == P.CANCELLED
    assert phases(events, "call_9") == [P.START, delta, delta, complete, P.CANCELLED]
    call_10 = phases(events, "call_10")
    assert call_10[0] == P.START
    assert call_10.count(delta) >= 4
    assert complete not in call_10
    assert call_10[-1] == P.CANCELLED
    (timeline,) = timelines
    cancelled = [e for e in events if isinstance(e, vrt.ToolStream) and e.phase == P.CANCELLED]
    assert len(timeline.local) == 3
    assert all(a is b for a, b in zip(cancelled, timeline.local, strict=True))
    ended = [e for e in events if isinstance(e, vrt.TurnEnded)]
    assert [(e.reason, e.epoch) for e in ended] == [("finished", 0)] * 4 + [("interrupted", 1)]
    assert events.index(cancelled[-1]) < events.index(ended[-1])
    assert isinstance(events[-1], vrt.Closed)


async def test_a_stalled_story_is_cut_short(
    autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A story that stops moving is reported, not waited for forever."""
    monkeypatch.setattr("vrt._cli.demo.PATIENCE", 0.5)  # in the middle of the first turn
    out = io.StringIO()
    outcome = await run_demo(out)
    assert not outcome.ok
    assert outcome.problems[0] == "the story stalled: cut short after 0.5 s"
    assert "session  closed (client)" in out.getvalue()
    assert "problem: the story stalled" in out.getvalue()
    assert [t.status for t in outcome.turns] == [None]


def test_seen_turns() -> None:
    """The client's view of a log: the terminal phase of each call, the turn's epochs."""

    def stream(call_id: str, phase: vrt.Phase, **fields: object) -> vrt.ToolStream:
        return vrt.ToolStream(
            call_id=call_id,
            turn_id="t_1",
            epoch=2,
            name="x",
            kind="server",
            phase=phase,
            **fields,  # type: ignore[arg-type]
        )

    log: list[vrt.Event] = [
        vrt.TurnStarted(turn_id="t_1", epoch=2),
        stream("a", P.START),
        stream("b", P.START),
        stream("c", P.START),
        stream("d", P.START),
        stream("a", P.ARGUMENTS_COMPLETE, arguments={}),
        stream("a", P.SETTLED, ok=True),
        stream("b", P.FAILED, message="stopped"),
        stream("c", P.CANCELLED),
        vrt.TurnEnded(turn_id="t_1", epoch=3, reason="interrupted"),
        vrt.TurnStarted(turn_id="t_2", epoch=3),
    ]
    first, second = seen_turns(log)
    assert first == SeenTurn(
        turn_id="t_1",
        epoch=2,
        status="interrupted",
        ended_epoch=3,
        calls=(
            SeenCall(call_id="a", name="x", kind="server", code=None),
            SeenCall(call_id="b", name="x", kind="server", code="FAILED"),
            SeenCall(call_id="c", name="x", kind="server", code="INTERRUPTED"),
            SeenCall(call_id="d", name="x", kind="server", code="open"),
        ),
    )
    assert second == SeenTurn(turn_id="t_2", epoch=3, status=None, ended_epoch=None, calls=())


def test_colour_only_on_a_tty_without_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setattr(sys, "stdout", tty := Tty())
    assert main(["demo", "--fast"]) == 0
    assert "\x1b[" in tty.getvalue()

    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setattr(sys, "stdout", tty := Tty())
    assert main(["demo", "--fast"]) == 0
    assert "\x1b[" not in tty.getvalue()


def test_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([])
    assert exit_.value.code == 2
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"vrt {vrt.__version__}"
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    assert "--fast" in capsys.readouterr().out


def _commands() -> list[object]:
    commands: list[object] = [pytest.param([sys.executable, "-m", "vrt"], id="python -m vrt")]
    script = Path(sys.executable).parent / ("vrt.exe" if os.name == "nt" else "vrt")
    if script.exists():  # the console script of the installed distribution
        commands.append(pytest.param([str(script)], id="console script"))
    return commands


@pytest.mark.parametrize("command", _commands())
def test_demo_as_installed(command: list[str]) -> None:
    env = {**os.environ, "NO_COLOR": "1"}
    done = subprocess.run(
        [*command, "demo", "--fast"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    check_story(done.stdout)


def test_ctrl_c_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C reaches main inside Trio's exception group; it exits quietly with 130."""

    async def interrupted(*args: object, **kwargs: object) -> None:
        async with trio.open_nursery():
            raise KeyboardInterrupt

    monkeypatch.setattr("vrt._cli.commands.run_demo", interrupted)
    assert main(["demo", "--fast"]) == 130


@asynccontextmanager
async def vrt_serve_process(*flags: str) -> AsyncIterator[tuple[str, trio.Process]]:
    """``vrt serve tests.serve_agent:agent --port 0 FLAGS`` in a subprocess: its URL, and
    the process, stopped with SIGINT on the way out (killed if it does not stop)."""
    import signal

    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "vrt", "serve", "tests.serve_agent:agent", "--port", "0", *flags],
        cwd=Path(__file__).parent.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = b""
        with trio.fail_after(20):
            while not line.endswith(b"\n"):
                line += await process.stdout.receive_some(1)
        yield line.decode().split(" on ")[1].strip(), process
    finally:
        process.send_signal(signal.SIGINT)
        with trio.move_on_after(10):
            await process.wait()
        if process.returncode is None:  # never leave it behind, even when failing
            process.kill()
            await process.wait()


async def test_vrt_serve_serves_an_agent_from_module_colon_name() -> None:
    flags = (
        "--max-sessions",
        "1",
        "--resume-window",
        "5",
        "--allowed-origin",
        "https://app.example",
    )
    async with vrt_serve_process(*flags) as (url, process):
        async with vrt.connect(url) as client, client.subscribe() as events:
            await client.send_text("ping?")
            async for event in events:
                if isinstance(event, vrt.TurnEnded):
                    break
            with pytest.raises(vrt.RemoteProtocolError, match="RATE_LIMITED"):  # the flags apply
                async with vrt.connect(url):
                    pass  # pragma: no cover
        assert event.reason == "finished"
        # An HTTP-refused upgrade once kept the process from stopping on SIGINT (3 in 10).
        with pytest.raises(vrt.RemoteProtocolError, match="HTTP_403"):
            async with vrt.connect(url, headers=[("origin", "https://evil.example")]):
                pass  # pragma: no cover
    assert process.returncode == 130


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("nocolon", "expected MODULE:AGENT"),
        ("no.such.module:agent", "cannot import"),
        ("tests.serve_agent:nope", "has no attribute 'nope'"),
        ("tests.serve_agent:ping", "is not a vrt.Agent"),
    ],
)
def test_vrt_serve_bad_target(target: str, message: str) -> None:
    from vrt._cli.commands import load_agent

    with pytest.raises(SystemExit, match=message):
        load_agent(target)


def _vrt_serve(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vrt", "serve", "tests.serve_agent:agent", *flags],
        cwd=Path(__file__).parent.parent,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--port", "-1"), "a port is a number from 0 to 65535, not '-1'"),
        (("--port", "99999"), "a port is a number from 0 to 65535, not '99999'"),
        (("--max-sessions", "-3"), "expected a whole number of at least 1, not '-3'"),
        (("--max-message-size", "0"), "expected a whole number of at least 1, not '0'"),
        (("--max-message-size", "100"), "max_message_size must be an integer of at least 1024"),
        (("--host", "no.such.host.invalid"), "cannot listen on no.such.host.invalid:0"),
    ],
)
def test_vrt_serve_refuses_bad_settings_in_one_line(flags: tuple[str, ...], message: str) -> None:
    """A bad port, host or limit printed a 40-line ExceptionGroup; --port 99999 served on
    34463; --max-message-size 0 was accepted. Now: one line, exit status 2."""
    done = _vrt_serve(*flags, "--port", "0") if flags[0] == "--host" else _vrt_serve(*flags)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) <= 3


def test_vrt_serve_on_a_busy_port_is_one_line() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = _vrt_serve("--port", str(port))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"vrt serve: cannot listen on 127.0.0.1:{port}: Address already in use"
    ], done.stderr


async def test_vrt_serve_logs_connections_and_sessions() -> None:
    async with vrt_serve_process() as (url, process):
        async with vrt.connect(url) as client, client.subscribe() as events:
            await client.send_text("ping?")
            async for event in events:
                if isinstance(event, vrt.TurnEnded):
                    break
        await trio.sleep(0.3)
    assert process.stderr is not None
    log = (await process.stderr.receive_some(1 << 20)).decode()
    for expected in ("INFO vrt.server: serving on", "connection from 127.0.0.1", "opened for"):
        assert expected in log, log
    assert "ended (client)" in log, log


@pytest.mark.parametrize(
    ("command", "demo"),
    [(("demo", "--web"), True), (("serve", "tests.serve_agent:agent", "--web"), False)],
)
async def test_web_prints_the_page_and_how_to_watch_it_play(
    command: tuple[str, ...], demo: bool
) -> None:
    """``vrt demo --web`` prints the page's address, then the ``?autorun`` one that plays
    the story by itself (the plain page waits for the user, and says what to try); an agent
    of your own gets no autorun line (the story needs the demo's agent)."""
    import signal

    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "vrt", *command, "--port", "0"],
        cwd=Path(__file__).parent.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    out = b""
    try:
        with trio.fail_after(30):
            while out.count(b"\n") < 2 + demo:
                out += await process.stdout.receive_some(1024)
        lines = out.decode().splitlines()
        page = lines[0].split(" on ")[1].replace("ws://", "http://")
        assert lines[1] == f"vrt serve: the demo page is {page}"
        html = await trio.to_thread.run_sync(
            lambda: urllib.request.urlopen(page, timeout=10).read().decode()
        )
        assert 'href="?autorun"' in html and "whatever you type" in html
    finally:
        process.send_signal(signal.SIGINT)
        with trio.move_on_after(10):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()
    out += await process.stdout.receive_some(1 << 16)
    autorun = [line for line in out.decode().splitlines() if "?autorun" in line]
    assert autorun == ([f"vrt serve: {page}?autorun plays the demo by itself"] if demo else [])


def test_a_crashing_worker_is_started_again_after_a_doubling_pause_until_the_limit() -> None:
    """``vrt serve --workers``'s restart rule (vrt/_cli/workers.py): 0.25 s, then twice as
    long at each crash in a row; the fifth in a row gives up; a worker that served a minute
    before it crashed starts the count again."""
    from vrt._cli.workers import STABLE, Restarts

    restarts = Restarts()
    assert [restarts.crashed(None) for _ in range(5)] == [0.25, 0.5, 1.0, 2.0, None]
    restarts = Restarts()
    assert [restarts.crashed(3.0) for _ in range(3)] == [0.25, 0.5, 1.0]
    assert restarts.crashed(STABLE) == 0.25  # it ran long enough: the first in a row again
