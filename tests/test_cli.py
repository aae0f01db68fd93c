"""The ``vrt`` command line: ``vrt demo`` in process, on a virtual clock, and as installed."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import trio

import vrt
from vrt._cli import main
from vrt._demo import EXPECTED, Timeline, run_demo

P = vrt.Phase
LINE = re.compile(r"^ *\+\d+\.\d{3}s  ")  # every timeline line starts with the elapsed time


def phases(events: list[vrt.Event], call_id: str) -> list[vrt.Phase]:
    return [e.phase for e in events if isinstance(e, vrt.ToolStream) and e.call_id == call_id]


def check_story(output: str) -> None:
    """The four scenes appear in order, each with its phases and codes."""
    lines = output.splitlines()
    timeline = [line for line in lines if LINE.match(line)]
    assert len(timeline) > 40

    def first(*parts: str) -> int:
        return next(i for i, line in enumerate(lines) if all(p in line for p in parts))

    marks = [
        first("t_1", "turn", "started"),
        first("call_1", "search_flights", "arguments-delta"),
        first("call_1", "search_flights", "arguments-complete"),
        first("call_1", "search_flights", "progress", '"done": 1'),
        first("call_1", "search_flights", "progress", '"done": 3'),
        first("call_1", "search_flights", "settled", "ok"),
        first("t_1", "turn", "ended finished"),
        first("call_2", "book_flight", "settled", "REJECTED", "high risk"),
        first("call_3", "choose_seat", "settled", "INVALID", "does not match"),
        first("call_4", "export_itinerary", "progress"),
        first("user", "turn.interrupt()"),
        first("call_4", "export_itinerary", "cancelled"),
        first("call_5", "email_itinerary", "cancelled"),
        first("t_4", "turn", "ended interrupted"),
        first("session", "closed"),
        first("summary"),
    ]
    assert marks == sorted(marks)
    summary = "\n".join(lines[marks[-1] :])
    assert re.search(r"t_1 +finished +call_1 search_flights ok", summary)
    assert re.search(r"t_2 +finished +call_2 book_flight REJECTED", summary)
    assert re.search(r"t_3 +finished +call_3 choose_seat INVALID", summary)
    assert re.search(
        r"t_4 +interrupted +call_4 export_itinerary INTERRUPTED, "
        r"call_5 email_itinerary INTERRUPTED",
        summary,
    )
    assert "problem" not in output
    assert "ToolPreview" not in output


def test_demo_fast(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--fast"]) == 0
    output = capsys.readouterr().out
    check_story(output)
    assert "\x1b[" not in output  # not a TTY: no colour


async def test_demo_on_a_virtual_clock(autojump_clock: trio.abc.Clock) -> None:
    """At full scale the story is deterministic and stays under five seconds."""
    out = io.StringIO()
    start = trio.current_time()
    outcome = await run_demo(out)
    assert trio.current_time() - start < 5
    assert outcome.ok, outcome.problems
    check_story(out.getvalue())
    got = tuple(
        (r.status, tuple(None if c.result.ok else c.result.code for c in r.calls))
        for r in outcome.results
    )
    assert got == EXPECTED
    assert outcome.previews > 0


async def test_demo_phases(autojump_clock: trio.abc.Clock) -> None:
    """Each scene's calls go through exactly the phases the demo is meant to show."""
    events: list[vrt.Event] = []
    original = Timeline.show

    def record(self: Timeline, event: vrt.Event) -> None:
        events.append(event)
        original(self, event)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Timeline, "show", record)
        await run_demo(io.StringIO())
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
    assert phases(events, "call_2") == [P.START, delta, delta, delta, complete, P.SETTLED]
    assert phases(events, "call_3") == [P.START, delta, delta, delta, complete, P.SETTLED]
    # interrupted while running, and while its arguments were still streaming
    call_4 = phases(events, "call_4")
    assert call_4[:5] == [P.START, delta, delta, delta, complete]
    assert P.PROGRESS in call_4
    assert call_4[-1] == P.CANCELLED
    call_5 = phases(events, "call_5")
    assert call_5[0] == P.START
    assert delta in call_5
    assert complete not in call_5
    assert call_5[-1] == P.CANCELLED
    ended = [e for e in events if isinstance(e, vrt.TurnEnded)]
    assert [e.reason for e in ended] == ["finished", "finished", "finished", "interrupted"]


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

    monkeypatch.setattr("vrt._cli.run_demo", interrupted)
    assert main(["demo", "--fast"]) == 130
