"""``vrt check``: the per-machine checks, the composed model, its reduction, the command."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest

import machines
from vrt import check
from vrt._cli import main as vrt_main
from vrt._core.tables import TABLES, TOOL_CALL, Table
from vrt.check._model import Model
from vrt.check._search import search
from vrt.check._state import Broken

# -- each machine ---------------------------------------------------------------------------------


def test_the_real_machines_pass() -> None:
    assert check.check_machines() == []
    assert check.check_machines(TABLES) == []


def test_a_table_missing_a_transition_has_a_dead_event_and_differs_from_its_class() -> None:
    table = Table(machines.ToolCall)
    del table.transitions["running", "progress"]
    problems = check.check_machines([table])
    assert "ToolCall: event 'progress' is dead (no transition can take it)" in problems
    assert (
        "ToolCall: (running, progress) -> refused in the table, -> running in the class" in problems
    )


def test_a_table_with_a_trap_state_and_a_live_final_state_is_caught() -> None:
    table = Table(machines.CallView)
    for event in ("settle", "cancel"):  # issued can no longer end
        table.transitions["issued", event] = "issued"
    table.transitions["settled", "progress"] = "issued"  # and a final state accepts an event
    problems = check.check_machines([table])
    assert "CallView: state 'issued' cannot reach a final state" in problems
    assert "CallView: final state 'settled' accepts 'progress'" in problems
    assert any("(issued, settle) -> issued in the table, -> settled" in p for p in problems)


def test_a_table_whose_states_differ_from_its_class_is_caught() -> None:
    table = Table(machines.Turn)
    table.finals = frozenset({"finished"})
    problems = check.check_machines([table])
    assert problems[0] == (
        "Turn: final states ['finished'] in the table, "
        "['failed', 'finished', 'interrupted'] in the class"
    )
    assert "Turn: state 'interrupting' cannot reach a final state" in problems


# -- the composed model --------------------------------------------------------------------------


def test_the_model_holds_every_invariant() -> None:
    report = check.explore(calls=2, interrupts=1, drops=1)
    assert report.ok and report.complete, check.format_report(report)
    assert report.states > 10_000 and report.transitions > report.states


@pytest.mark.parametrize(
    ("rule", "invariant", "last"),
    [
        ("epoch-gate", "epoch", "client: begins call_"),
        ("serial-queue", "serial", "client: begins call_"),
        ("view-gate", "stream", "client <- tool.stream call_"),
        ("turn-wait", "turn-end", "model: ends the step"),
    ],
)
def test_a_rule_broken_on_purpose_is_found_with_a_short_trace(
    rule: str, invariant: str, last: str
) -> None:
    report = check.explore(calls=2, interrupts=1, drops=1, broken=rule)
    assert [v.invariant for v in report.violations] == [invariant], check.format_report(report)
    (violation,) = report.violations
    assert 0 < len(violation.trace) <= 20
    assert violation.trace[-1].startswith(last)
    text = violation.format()
    assert text.startswith(f"violation [{invariant}] {check.INVARIANTS[invariant]}")
    assert f"{len(violation.trace):2}. {violation.trace[-1]}" in text


def test_the_epoch_gate_broken_reads_as_a_story() -> None:
    report = check.explore(calls=1, interrupts=1, drops=0, broken="epoch-gate")
    (violation,) = report.violations
    assert violation.detail == "call_1 of epoch 0 begins in client epoch 1"
    steps = violation.trace
    assert "client: the user interrupts" in steps
    assert steps.index("client: the user interrupts") < steps.index(
        "client <- tool.call call_1 (epoch 0)"
    )
    assert steps[-1] == "client: begins call_1"


@pytest.mark.parametrize(
    ("rule", "calls", "invariant", "detail"),
    [
        ("late-dispatch", 2, "interrupt", "the server sends tool.call for call_2 although"),
        ("overtake", 3, "serial", "call_1 begins after call_3"),
        ("run-after-cancel", 1, "interrupt", "call_1 begins after the app was shown it"),
    ],
)
def test_each_engine_defect_found_and_fixed_is_found_again(
    rule: str, calls: int, invariant: str, detail: str
) -> None:
    """The engine defects this checker found, modelled as the engine used to do them."""
    report = check.explore(calls=calls, interrupts=int(rule != "overtake"), broken=rule)
    assert [v.invariant for v in report.violations] == [invariant], check.format_report(report)
    assert report.violations[0].detail.startswith(detail)
    assert len(report.violations[0].trace) <= 20


def test_stop_at_first() -> None:
    report = check.explore(calls=2, broken="epoch-gate", stop_at_first=True)
    assert not report.complete and len(report.violations) == 1


def test_the_model_moves_machines_only_through_the_compiled_tables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Take a transition away from the real ToolCall table: the model hits the refusal."""
    transitions = dict(TOOL_CALL.transitions)
    del transitions["running", "finish"]
    monkeypatch.setattr(TOOL_CALL, "transitions", transitions)
    report = check.explore(calls=1, interrupts=0, drops=0)
    (violation,) = report.violations
    assert violation.invariant == "engine"
    assert violation.detail.startswith("ToolCall refuses 'finish' in 'running'")


def test_a_state_not_at_rest_fails_the_check_at_rest() -> None:
    model = Model(calls=1)
    with pytest.raises(Broken, match="stuck: at rest, but the turn is generating"):
        model.check_at_rest(model.initial())


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown rule"):
        check.explore(calls=1, broken="nope")
    with pytest.raises(ValueError, match="negative"):
        check.explore(calls=-1)


# -- the reduction keeps every violation and every state at rest ---------------------------------


def _configs() -> Iterator[tuple[int, int, int, int, str | None]]:
    """Every broken rule with one call; the engine defects found and fixed, and none, with
    two."""
    for user, server in ((1, 0), (0, 1)):
        for broken in (None, *check.BREAKABLE):
            yield 1, user, server, 1, broken
        for broken in (None, "late-dispatch", "overtake", "run-after-cancel"):
            yield 2, user, server, 0, broken


@pytest.mark.parametrize(("calls", "user", "server", "drops", "broken"), [*_configs()])
def test_the_reduction_keeps_violations_and_states_at_rest(
    calls: int, user: int, server: int, drops: int, broken: str | None
) -> None:
    model = Model(calls, user, server, drops, broken=broken)
    full: set[tuple[object, ...]] = set()
    reduced: set[tuple[object, ...]] = set()
    everything = search(model, reduce=False, at_rest=full)
    ample = search(model, reduce=True, at_rest=reduced)
    assert {f.invariant for f in ample.found} == {f.invariant for f in everything.found}
    assert {model.subsume(s) for s in full} == reduced
    assert ample.states < everything.states


def test_the_phases_option_adds_deltas_and_progress() -> None:
    plain = check.explore(calls=1, interrupts=1, drops=0)
    phases = check.explore(calls=1, interrupts=1, drops=0, phases=True)
    assert plain.ok and phases.ok and phases.phases
    assert phases.states > plain.states


# -- the command ---------------------------------------------------------------------------------


def test_vrt_check_prints_the_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert vrt_main(["check", "--calls", "2"]) == 0
    out = capsys.readouterr().out
    assert "machines: 6, 204 (state, event) pairs: every table equals its class" in out
    assert "model: calls=2 interrupts=1 drops=1\n" in out
    for figure in ("states ", "transitions ", "seconds ", "violations 0"):
        assert f"\n  {figure}" in out


def test_vrt_check_with_a_broken_rule_fails_with_a_trace() -> None:
    out = io.StringIO()
    status = check.main(["--calls", "1", "--drops", "0", "--break", "epoch-gate"], out)
    text = out.getvalue()
    assert status == 1
    assert "broken on purpose: epoch-gate" in text
    assert "violations 1" in text
    assert "violation [epoch] no app tool runs under a stale epoch" in text
    assert "client: begins call_1" in text
