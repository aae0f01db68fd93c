"""``vrt check``: the realtime model (vrt/check/_realtime*.py), a session's connection to a
realtime voice model, the turns its responses make and the calls in them."""

from __future__ import annotations

import io

import pytest
import statemachine

from machines.base import VrtChart
from vrt import check
from vrt._core.tables import TOOL_CALL, UPSTREAM, Table
from vrt.check._realtime import RealtimeModel
from vrt.check._realtime_state import S_TURNS, S_UP
from vrt.check._realtime_tasks import unwound
from vrt.check._search import search
from vrt.check._state import Broken

# The checker reads the machine classes and their tables itself, whatever
# VRT_STRICT_MACHINES says: one pass runs it (the second, conftest).
pytestmark = pytest.mark.once


@pytest.mark.parametrize("calls", [1, 2])
def test_the_realtime_model_holds_every_invariant(calls: int) -> None:
    """Model responses (asked for or the model's own, with or without response.created),
    calls started, completed or cut, speech-starts and the app's interrupts at any moment,
    late and duplicate events, a lost connection that comes back."""
    report = check.explore_realtime(calls=calls)
    assert report.ok and report.complete, check.format_realtime_report(report)
    assert report.states > 1_000 * calls and report.transitions > report.states


def test_the_realtime_model_with_text_turns_holds_every_invariant() -> None:
    """The app's text turns too (session.start_turn): a request that waits for the model."""
    report = check.explore_realtime(calls=1, texts=1)
    assert report.ok and report.complete, check.format_realtime_report(report)
    assert report.states > check.explore_realtime(calls=1).states


@pytest.mark.parametrize(
    ("rule", "invariant", "detail", "last"),
    [
        (
            "create-after-interrupt",
            "create",
            "response.create (with the answers) while the Upstream is cancelling",
            "t_1: has unwound (interrupted)",
        ),
        (
            "item-done",
            "stale",
            "call_1 runs, but the model cut it mid-arguments",
            "tool: call_1 starts running",
        ),
        ("keep-late", "stale", "call_1 runs, but resp_1 had ended", "tool: call_1 starts running"),
        (
            "answer-twice",
            "one-answer",
            "call_1 is answered a second time",
            "t_1: has unwound (interrupted)",
        ),
    ],
)
def test_a_realtime_rule_broken_on_purpose_is_found_with_a_short_trace(
    rule: str, invariant: str, detail: str, last: str
) -> None:
    kept = {v.invariant for v in check.explore_realtime(calls=1, drops=0).violations}
    report = check.explore_realtime(calls=1, drops=0, broken=rule)
    assert invariant not in kept
    (violation,) = [v for v in report.violations if v.invariant == invariant]
    assert violation.detail == detail, violation.format()
    assert 0 < len(violation.trace) <= 12 and violation.trace[-1] == last
    text = violation.format()
    assert text.startswith(f"violation [{invariant}] {check.REALTIME_INVARIANTS[invariant]}")


def test_the_late_call_reads_as_a_story() -> None:
    """keep-late: a call the model sends after its response's done runs in the next turn."""
    report = check.explore_realtime(calls=1, drops=0, broken="keep-late")
    (violation,) = [v for v in report.violations if v.invariant == "stale"]
    steps = violation.trace
    assert "model: starts call_1 in resp_1, after its done (late)" in steps
    assert steps.index("model: resp_1 done") < steps.index(
        "model: starts call_1 in resp_1, after its done (late)"
    )


def _upstream(*, create_while_active: bool = False) -> Table:
    """The table of a copy of machines/upstream.py's class; ``create_while_active``: it
    also allows ``create`` while a response is active or being cancelled."""

    class Upstream(VrtChart):
        connecting = statemachine.State(initial=True)
        idle = statemachine.State()
        requested = statemachine.State()
        responding = statemachine.State()
        unwanted = statemachine.State()
        cancelling = statemachine.State()
        lost = statemachine.State()
        closed = statemachine.State(final=True)

        ready = connecting.to(idle)
        create = idle.to(requested)
        if create_while_active:
            create |= responding.to(requested) | cancelling.to(requested)
        started = idle.to(responding) | requested.to(responding) | unwanted.to(cancelling)
        done = responding.to(idle) | requested.to(idle) | unwanted.to(idle) | cancelling.to(idle)
        interrupt = (
            responding.to(cancelling)
            | requested.to(unwanted)
            | unwanted.to.itself()
            | cancelling.to.itself()
        )
        speech = (
            idle.to.itself()
            | responding.to(cancelling)
            | requested.to(unwanted)
            | unwanted.to.itself()
            | cancelling.to.itself()
        )
        forget = requested.to(idle) | unwanted.to(idle)
        drop = (
            connecting.to(lost)
            | idle.to(lost)
            | requested.to(lost)
            | responding.to(lost)
            | unwanted.to(lost)
            | cancelling.to(lost)
        )
        reconnect = lost.to(connecting)
        close = (
            connecting.to(closed)
            | idle.to(closed)
            | requested.to(closed)
            | responding.to(closed)
            | unwanted.to(closed)
            | cancelling.to(closed)
            | lost.to(closed)
        )

    return Table(Upstream)


def test_the_realtime_model_composes_the_upstream_class() -> None:
    """The model asks the Upstream class whether a request may go: its copy gives the same
    model; one that also allows ``create`` while a response is active or being cancelled
    lets a text turn's request go before the cut response has ended (OpenAI refuses it)."""
    same = _upstream()
    assert same.transitions == UPSTREAM.transitions
    kept = check.explore_realtime(calls=1, drops=0, texts=1)
    copied = check.explore_realtime(calls=1, drops=0, texts=1, upstream=same)
    assert (copied.states, copied.transitions) == (kept.states, kept.transitions)
    loose = check.explore_realtime(
        calls=1, drops=0, texts=1, upstream=_upstream(create_while_active=True)
    )
    (create,) = [v for v in loose.violations if v.invariant == "create"]
    assert create.detail.startswith("response.create (with the user's text) while the Upstream is")
    assert all("while the Upstream is" not in v.detail for v in kept.violations)
    assert loose.states != kept.states


def test_the_realtime_model_moves_machines_only_through_the_compiled_tables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Take a transition away from the real ToolCall table: the model hits the refusal."""
    transitions = dict(TOOL_CALL.transitions)
    del transitions["running", "finish"]
    monkeypatch.setattr(TOOL_CALL, "transitions", transitions)
    report = check.explore_realtime(calls=1, drops=0, late=0)
    (violation,) = [v for v in report.violations if v.invariant == "engine"]
    assert violation.detail.startswith("ToolCall refuses 'finish' in 'running'")
    assert violation.trace[-1] == "tool: call_1 returns"


def test_a_state_not_at_rest_fails_the_check_at_rest() -> None:
    model = RealtimeModel(calls=1)
    model.check_at_rest(model.initial())  # no turn, the Upstream idle: nothing owed
    opened = model.begin(False, True, model.initial())
    assert opened is not None and opened[S_TURNS][0][:2] == ("generating", "consume")
    with pytest.raises(Broken, match="stuck: at rest, but t_1 is generating"):
        model.check_at_rest(opened)
    cut = model.speech(opened)
    assert cut is not None and cut[S_UP] == "cancelling"
    ended = unwound(model.driver, 0, cut)
    assert ended is not None
    with pytest.raises(Broken, match="stuck: at rest, but the Upstream is cancelling"):
        model.check_at_rest(ended)


def test_the_search_stops_at_the_first_violation() -> None:
    report = check.explore_realtime(calls=1, drops=0, broken="item-done", stop_at_first=True)
    assert not report.complete and len(report.violations) == 1
    assert report.states < check.explore_realtime(calls=1, drops=0, broken="item-done").states


def test_bad_realtime_arguments() -> None:
    with pytest.raises(ValueError, match="unknown rule"):
        check.explore_realtime(calls=1, broken="epoch-gate")
    with pytest.raises(ValueError, match="negative"):
        check.explore_realtime(calls=-1)
    with pytest.raises(ValueError, match="negative"):
        check.explore_realtime(calls=1, texts=-1)


def test_every_breakable_rule_is_found() -> None:
    """Each rule the realtime model can break, broken, breaks an invariant the model kept."""
    model = RealtimeModel(calls=1, drops=0)
    kept = {f.invariant for f in search(model, reduce=False).found}
    for rule in check.REALTIME_BREAKABLE:
        broken = RealtimeModel(calls=1, drops=0, broken=rule)
        found = {f.invariant for f in search(broken, reduce=False).found}
        assert found - kept, rule


# -- the command ---------------------------------------------------------------------------------


def test_vrt_check_prints_the_realtime_figures() -> None:
    out = io.StringIO()
    status = check.main(["--calls", "1", "--realtime-calls", "1", "--realtime-texts", "1"], out)
    text = out.getvalue()
    assert "\nmodel: calls=1 interrupts=1 drops=1 handovers=1 crashes=1\n" in text
    block = text.split("\nrealtime model: ", 1)[1]
    assert block.startswith("calls=1 responses=2 late=1 drops=1 texts=1\n  states ")
    for figure in ("states ", "transitions ", "seconds ", "violations "):
        assert f"\n  {figure}" in "\n" + block
    assert status == int("violation [" in text)


def test_vrt_check_breaks_a_realtime_rule_alone() -> None:
    """``--break`` with a realtime rule runs the realtime model only."""
    out = io.StringIO()
    status = check.main(
        ["--realtime-calls", "1", "--realtime-drops", "0", "--break", "answer-twice"], out
    )
    text = out.getvalue()
    assert status == 1
    assert "\nmodel: " not in text
    assert "realtime model: calls=1 responses=2 late=1 drops=0 texts=0; broken on purpose: " in text
    assert "violation [one-answer] a call gets at most one answer upstream" in text
