"""``vrt check``: the per-machine checks, the composed model, its reduction, the command."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator

import pytest
import statemachine

import machines
from machines.base import VrtChart
from vrt import check
from vrt._cli import main as vrt_main
from vrt._core.tables import TABLES, TOOL_CALL, Table
from vrt.check._model import Model
from vrt.check._search import search
from vrt.check._state import (
    C_RESULTS,
    F_CALLS,
    F_CEPOCH,
    F_CLIENT,
    F_CRASHES,
    F_HANDOVERS,
    F_QUEUE,
    F_S2C,
    F_SEPOCH,
    F_TURN,
    F_TURN_SEEN,
    SHOWN_ENDED,
    V_VIEW,
    Broken,
    State,
)

# The checker reads the machine classes and their tables itself, whatever
# VRT_STRICT_MACHINES says: one pass runs it (the second, conftest).
pytestmark = pytest.mark.once

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
    assert (report.handovers, report.crashes) == (1, 1)  # the defaults cover both
    assert report.after_handover > 1_000 and report.after_crash > 1_000


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
    """The engine defects this checker found, modelled as the engine used to do them (with
    no store: run-after-cancel also breaks "epoch" after a crash's cancelled)."""
    report = check.explore(
        calls=calls, interrupts=int(rule != "overtake"), broken=rule, handovers=0, crashes=0
    )
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


def test_the_checks_no_broken_rule_reaches_first_can_fail() -> None:
    """The app never saw turn.ended at rest; an app call queued past the turn's end."""
    model = Model(calls=1)
    ended = _walk(model, "model: ends the step")
    with pytest.raises(Broken, match=r"turn-ended: at rest, but the app never saw turn\.ended"):
        model.check_at_rest((*ended[:F_S2C], (), *ended[F_S2C + 1 :]))
    late = list(_walk(model, "model: ends the step", "client <- turn.ended finished"))
    late[F_QUEUE], late[F_CLIENT] = (0,), (("settled", False, "queued", SHOWN_ENDED),)
    with pytest.raises(Broken, match="interrupt: call_1 begins after the app saw its turn end"):
        model.begin(tuple(late))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown rule"):
        check.explore(calls=1, broken="nope")
    with pytest.raises(ValueError, match="negative"):
        check.explore(calls=-1)
    with pytest.raises(ValueError, match="negative"):
        check.explore(calls=1, crashes=-1)


# -- handover-v1: handovers and crashes ----------------------------------------------------------


def _at_rest(model: Model, *, reduce: bool = True) -> set[State]:
    states: set[State] = set()
    outcome = search(model, reduce=reduce, at_rest=states)
    assert outcome.complete and not outcome.found, outcome.found
    return states


def _walk(model: Model, *steps: str, start: State | None = None) -> State:
    """Take, from ``start`` (the initial state), the actions whose trace labels start with
    ``steps``, one after the other (each must name exactly one enabled action)."""
    state = model.initial() if start is None else start
    for label in steps:
        (action,) = [
            a for a in model.actions if a.run(state) and a.describe(state).startswith(label)
        ]
        following = action.run(state)
        assert following is not None
        state = model.canonical(following)
    return state


def test_a_handover_ends_where_a_cut_and_resume_does() -> None:
    """Nothing is lost: with every interleaving (no reduction), the states at rest with a
    handover are exactly those without, and a handover reaches only states a drop does."""
    for calls, user, server in ((1, 1, 0), (2, 0, 1)):
        with_handover = Model(calls, user, server, 1, handovers=1, crashes=0)
        without = Model(calls, user, server, 1, handovers=0, crashes=0)
        full = _at_rest(with_handover, reduce=False)
        assert any(s[F_HANDOVERS] for s in full)  # reached, and at rest afterwards
        assert {with_handover.subsume(s) for s in full} == {
            without.subsume(s) for s in _at_rest(without, reduce=False)
        }


def test_a_handover_replays_what_the_client_had_not_processed() -> None:
    model = Model(1, 0, 0, 0, handovers=1, crashes=0)
    state = _walk(
        model,
        "model: starts call_1 (server tool)",
        "model: completes call_1's arguments",
        "hook: allows call_1",
        "server tool: call_1 returns",
        "model: ends the step",
        "server: next model step",
        "model: ends the step",  # the turn finishes; the client has seen nothing of it
        "server: hands the session over",
    )
    assert state[F_HANDOVERS] == 1
    state = _walk(
        model,
        "server: the client resumes the session (replay)",
        "client <- tool.stream call_1 start",
        "client <- tool.stream call_1 arguments-complete",
        "client <- tool.stream call_1 settled",
        "client <- turn.ended finished (epoch 0)",
        start=state,
    )
    model.check_at_rest(state)
    assert state[F_TURN_SEEN] == 1 and state[F_CLIENT][0][V_VIEW] == "settled"


def test_a_crash_settles_the_calls_the_client_holds_open() -> None:
    """The turn's end never saved: the adopting process restores the turn's start, cancels
    the calls the client reports open and ends the turn interrupted in epoch 1, with no
    result of its own (it never knew the calls)."""
    model = Model(2, 0, 0, 0, handovers=0, crashes=1)
    state = _walk(
        model,
        "model: starts call_1 (app tool)",
        "client <- tool.stream call_1 start",
        "model: completes call_1's arguments",
        "client <- tool.stream call_1 arguments-complete",
        "hook: allows call_1",
        "client <- tool.call call_1",
        "client: begins call_1",  # the app tool runs when the server dies
        "model: starts call_2 (server tool)",  # its start dies in flight
        "server: the process dies",
        "server: the client resumes the session (replay), the lost turn is settled",
        "client <- tool.stream call_1 cancelled",
        "client <- turn.ended interrupted (epoch 1)",
        "app: the tool of call_1 returns",  # aborted: not answered
    )
    model.check_at_rest(state)
    assert state[F_TURN] == "interrupted" and state[F_CALLS] == ()
    assert state[F_SEPOCH] == state[F_CEPOCH] == 1
    assert [view for view, *_ in state[F_CLIENT]] == ["cancelled", None]


def test_the_crash_paths_are_reached() -> None:
    """At rest after a crash with no interrupt but its own: calls the adopting process ended
    with cancelled, and turns the app saw finish, every call settled, that the adopting
    process has interrupted with no call (the crash came between turn.ended and its save:
    the second turn.ended was dropped), the calls' results gone with the dead process."""
    model = Model(2, 0, 0, 1, handovers=1, crashes=1)
    rest = [s for s in _at_rest(model) if s[F_CRASHES]]
    cancelled = [s for s in rest if any(r[V_VIEW] == "cancelled" for r in s[F_CLIENT])]
    assert cancelled and all(s[F_TURN] == "interrupted" for s in cancelled)
    finished = [s for s in rest if all(r[V_VIEW] in ("settled", "failed") for r in s[F_CLIENT])]
    assert finished and all(s[F_TURN] == "interrupted" and s[F_CALLS] == () for s in finished)
    assert all(r[C_RESULTS] == 1 for s in rest for r in s[F_CALLS])
    assert all(s[F_TURN_SEEN] == 1 and s[F_SEPOCH] == 1 for s in rest)
    # the dropped turn.ended (epoch 1) after a finished one leaves the client in epoch 0;
    # the next turn.started brings it the server's
    assert {s[F_CEPOCH] for s in finished} == {0, 1}


@pytest.mark.parametrize(
    ("rule", "invariant", "last"),
    [
        ("crash-no-cancel", "stream", "client <- turn.ended interrupted (epoch 1)"),
        ("crash-result", "one-result", "server: the client resumes the session (replay), the"),
        ("no-dedupe", "turn-ended", "client <- turn.ended interrupted (epoch 1)"),
        ("ack-unsaved", "epochs", "server: the client resumes the session at the adopting"),
    ],
)
def test_a_crash_rule_broken_on_purpose_is_found(rule: str, invariant: str, last: str) -> None:
    report = check.explore(calls=2, broken=rule)
    assert [v.invariant for v in report.violations] == [invariant], check.format_report(report)
    (violation,) = report.violations
    assert len(violation.trace) <= 8
    assert any(step.startswith("server: the process dies") for step in violation.trace)
    assert violation.trace[-1].startswith(last)


def test_the_interrupt_the_dead_process_acked_is_lost_with_it() -> None:
    report = check.explore(calls=1, broken="ack-unsaved")
    (violation,) = report.violations
    assert violation.detail.startswith("at rest, the client is in epoch 1, the server in 0")
    steps = violation.trace
    assert steps.index("server: saves the session (the turn has ended)") < steps.index(
        "server <- interrupt (epoch 1)"
    )
    assert steps.index("server <- interrupt (epoch 1)") < steps.index(
        "server: the process dies (client: lost); another adopts the last save"
    )


def _movement(*, mid_turn: bool = False, save_idle: bool = True) -> Table:
    """The table of a copy of machines/movement.py's class, changed: ``mid_turn`` lets a
    busy session be handed over; ``save_idle=False`` writes no save between turns."""

    class Movement(VrtChart):
        new = statemachine.State(initial=True)
        adopted = statemachine.State()
        recovering = statemachine.State()
        idle = statemachine.State()
        busy = statemachine.State()
        moving = statemachine.State()
        handing_over = statemachine.State()
        handed_over = statemachine.State(final=True)
        taken_over = statemachine.State(final=True)
        closed = statemachine.State(final=True)

        open = new.to(idle)
        adopt = new.to(adopted)
        adopt_lost = new.to(recovering)
        resume = adopted.to(idle) | recovering.to(idle)
        start = idle.to(busy)
        rest = busy.to(idle) | moving.to(handing_over)
        save = busy.to.itself() | moving.to.itself()
        if save_idle:
            save |= idle.to.itself()
        move = busy.to(moving)
        hand_over = idle.to(handing_over)
        if mid_turn:
            hand_over |= busy.to(handing_over)
        let_go = handing_over.to(handed_over)
        stay = handing_over.to(idle)
        taken = (
            idle.to(taken_over)
            | busy.to(taken_over)
            | moving.to(taken_over)
            | handing_over.to(taken_over)
        )
        close = (
            new.to(closed)
            | adopted.to(closed)
            | recovering.to(closed)
            | idle.to(closed)
            | busy.to(closed)
            | moving.to(closed)
            | handing_over.to(closed)
        )

    return Table(Movement)


def test_the_model_composes_the_movement_class() -> None:
    """``vrt check`` moves sessions with the Movement class itself: its copy gives the
    same model, and a change to the class changes the model. One that lets a session move
    mid-turn is caught (its turn is stuck, as the broken rule ``handover-mid-turn``
    shows); one that writes no save between turns gives another model (no save after the
    turn's end), which still breaks no rule: after a crash the adopting process settles
    the turn from its start's save, and the client drops the second ``turn.ended``."""
    same = check.explore(calls=1, movement=_movement())
    assert not same.violations and same.states == check.explore(calls=1).states
    loose = check.explore(calls=2, crashes=0, movement=_movement(mid_turn=True))
    assert {v.invariant for v in loose.violations} == {"stuck", "one-result"}
    assert loose.violations[0].trace[0].startswith("server: hands the session over")
    unsaved = check.explore(calls=1, movement=_movement(save_idle=False))
    assert unsaved.transitions < same.transitions and not unsaved.violations


def test_a_handover_mid_turn_leaves_the_turn_stuck() -> None:
    report = check.explore(calls=2, broken="handover-mid-turn", crashes=0)
    assert {v.invariant for v in report.violations} == {"stuck", "one-result"}
    first = report.violations[0]
    assert first.invariant == "stuck" and first.detail == "at rest, but the turn is generating"
    assert first.trace == (
        "server: hands the session over (saved, closed 1012, client: lost); another process "
        "adopts it",
        "server: the client resumes the session (replay)",
    )
    assert check.explore(calls=2, crashes=0).ok  # the same bounds hold with the rule kept


# -- the reduction keeps every violation and every state at rest ---------------------------------


Config = tuple[int, int, int, int, int, int, str | None]


def _configs() -> Iterator[Config]:
    """(calls, user, server, drops, handovers, crashes, broken): every broken rule with one
    call, with and without handovers and crashes; the engine defects found and fixed, and
    none, with two; none with two and handovers and crashes."""
    for user, server in ((1, 0), (0, 1)):
        for broken in (None, *check.BREAKABLE):
            yield 1, user, server, 1, 0, 0, broken
            yield 1, user, server, 1, 1, 1, broken
        yield 1, user, server, 0, 1, 1, None
        for broken in (None, "late-dispatch", "overtake", "run-after-cancel"):
            yield 2, user, server, 0, 0, 0, broken
        yield 2, user, server, 0, 1, 1, None


@pytest.mark.parametrize(
    ("calls", "user", "server", "drops", "handovers", "crashes", "broken"), [*_configs()]
)
def test_the_reduction_keeps_violations_and_states_at_rest(
    calls: int, user: int, server: int, drops: int, handovers: int, crashes: int, broken: str | None
) -> None:
    model = Model(calls, user, server, drops, handovers=handovers, crashes=crashes, broken=broken)
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
    assert "machines: 10, 455 (state, event) pairs: every table equals its class" in out
    assert "model: calls=2 interrupts=1 drops=1 handovers=1 crashes=1\n" in out
    assert re.search(r"\n  states \d+ \(\d+ during a handover, \d+ after a crash\)\n", out)
    for figure in ("states ", "transitions ", "seconds ", "violations 0"):
        assert f"\n  {figure}" in out


def test_vrt_check_takes_the_handover_and_crash_bounds() -> None:
    out = io.StringIO()
    assert check.main(["--calls", "1", "--handovers", "0", "--crashes", "2"], out) == 0
    assert "model: calls=1 interrupts=1 drops=1 handovers=0 crashes=2\n" in out.getvalue()
    assert "(0 during a handover, " in out.getvalue()


def test_vrt_check_with_a_broken_rule_fails_with_a_trace() -> None:
    out = io.StringIO()
    status = check.main(["--calls", "1", "--drops", "0", "--break", "epoch-gate"], out)
    text = out.getvalue()
    assert status == 1
    assert "broken on purpose: epoch-gate" in text
    assert "violations 1" in text
    assert "violation [epoch] no app tool runs under a stale epoch" in text
    assert "client: begins call_1" in text
