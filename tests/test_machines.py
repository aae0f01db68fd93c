"""The machines and their compiled tables."""

from __future__ import annotations

import itertools

import pytest

import machines
import vrt
from vrt._core import tables as _tables
from vrt._core.tables import Machine, StrictMachine, Table

PAIRS = [
    (table, state, event)
    for table in _tables.TABLES
    for state, event in itertools.product(table.states, table.events)
]


def test_every_machine_is_compiled() -> None:
    assert [t.chart for t in _tables.TABLES] == list(machines.ALL)


@pytest.mark.parametrize(
    ("table", "state", "event"), PAIRS, ids=[f"{t.name}-{s}-{e}" for t, s, e in PAIRS]
)
def test_table_agrees_with_library(table: Table, state: str, event: str) -> None:
    """For every (state, event) pair the compiled table and the library do the same thing."""
    # Reach ``state`` in a real library instance by a path the class itself allows.
    path = _path_to(table, state)
    lib = table.chart()
    for step in path:
        lib.send(step)
    assert set(lib.configuration_values) == {state}
    compiled = Machine(table)
    compiled.state = state
    try:
        lib.send(event)
    except lib.TransitionNotAllowed:
        with pytest.raises(vrt.InvalidTransition):
            compiled.send(event)
        assert compiled.state == state
    else:
        (target,) = lib.configuration_values
        assert compiled.send(event) == target


def _path_to(table: Table, goal: str) -> list[str]:
    """The shortest event sequence from the initial state to ``goal``."""
    frontier: list[tuple[str, list[str]]] = [(table.initial, [])]
    seen = {table.initial}
    while frontier:
        state, path = frontier.pop(0)
        if state == goal:
            return path
        for (source, event), target in table.transitions.items():
            if source == state and target not in seen:
                seen.add(target)
                frontier.append((target, [*path, event]))
    raise AssertionError(f"{table.name}: {goal} is unreachable")


@pytest.mark.parametrize("table", _tables.TABLES, ids=lambda t: t.name)
def test_every_state_reachable_and_can_finish(table: Table) -> None:
    for state in table.states:
        _path_to(table, state)
        # from every state some final state is reachable
        reach, todo = {state}, [state]
        while todo:
            s = todo.pop()
            for (source, _), target in table.transitions.items():
                if source == s and target not in reach:
                    reach.add(target)
                    todo.append(target)
        assert reach & table.finals, f"{table.name}: {state} cannot reach a final state"


@pytest.mark.parametrize("table", _tables.TABLES, ids=lambda t: t.name)
def test_final_states_accept_nothing(table: Table) -> None:
    for state in table.finals:
        assert not [e for (s, e) in table.transitions if s == state]


def test_design_table_states_and_events() -> None:
    """States and events exactly as DESIGN.md's table."""
    expected = {
        "ToolCall": (
            "started streaming issued running settled cancelled failed",
            "delta complete abandon allow decline progress finish interrupt",
            "settled cancelled failed",
        ),
        "Turn": (
            "generating awaiting interrupting finished interrupted failed",
            "step_done next_step finish interrupt unwound error",
            "finished interrupted failed",
        ),
        # DESIGN.md's table, plus what handover-v1 (the production-serving issue) adds: a
        # session saved and let go at a turn boundary (hand_over, handed_over) and one
        # restored from the store (adopt).
        "Session": (
            "handshaking open detached closed handed_over",
            "accept adopt drop resume expire close hand_over",
            "closed handed_over",
        ),
        "Connection": (
            "connecting open reconnecting closed",
            "welcome lost resumed close",
            "closed",
        ),
        "AppCall": (
            "received queued running answered aborted",
            "admit stale begin answer abort",
            "answered aborted",
        ),
        "CallView": (
            "started streaming issued settled cancelled failed",
            "delta complete progress settle cancel fail",
            "settled cancelled failed",
        ),
        # DESIGN.md: "Movement, a session's place in the cluster: owned, saving, handing
        # over, handed over, adopted (names yours)": owned is idle, busy or moving; a save
        # is an event of an owned session; adopted from a handover or, after a crash,
        # recovering; let go unsaved at the end of a drain, abandoned.
        "Movement": (
            "new adopted recovering idle busy moving handing_over handed_over taken_over "
            "abandoned closed",
            "open adopt adopt_lost resume start rest save move hand_over let_go stay taken "
            "abandon close",
            "handed_over taken_over abandoned closed",
        ),
        # DESIGN.md, "Realtime voice models" (the realtime issue): a session's connection
        # to a realtime model and its one open response.
        "Upstream": (
            "connecting idle requested responding unwanted cancelling lost closed",
            "ready create started done interrupt speech forget drop reconnect close",
            "closed",
        ),
        # The voice issue: one turn's audio span on the wire, on either side.
        "AudioSpan": ("quiet speaking ended unheard", "speak end", "ended unheard"),
        # The realtime issue: whether Gemini may still cancel calls of the turn it cut.
        "Settling": ("settled unsettled closed", "heard settle close", "closed"),
    }
    for table in _tables.TABLES:
        states, events, finals = expected[table.name]
        assert set(table.states) == set(states.split()), table.name
        assert set(table.events) == set(events.split()), table.name
        assert table.finals == frozenset(finals.split()), table.name


def test_illegal_event_raises_in_both_modes() -> None:
    for machine in (Machine(_tables.TOOL_CALL), StrictMachine(_tables.TOOL_CALL)):
        machine.send("complete")
        with pytest.raises(vrt.InvalidTransition, match="'delta' is not allowed in state"):
            machine.send("delta")
        assert machine.state == "issued"
        machine.send("interrupt")
        assert machine.final
        with pytest.raises(vrt.InvalidTransition):
            machine.send("finish")


def test_can_is_what_send_would_do_in_both_modes() -> None:
    """``can`` answers from the table (compiled) or the library (strict), alike for every
    (state, event) pair of every machine."""
    for table in _tables.TABLES:
        for state in table.states:
            for event in table.events:
                compiled = Machine(table)
                compiled.state = state
                strict = StrictMachine(table)
                strict.chart = table.chart(start_value=state)
                strict.state = state
                assert compiled.can(event) == ((state, event) in table.transitions)
                assert strict.can(event) == compiled.can(event), (table.name, state, event)


def test_strict_machine_runs_the_library() -> None:
    machine = StrictMachine(_tables.TURN)
    machine.send("step_done")
    assert machine.state == "awaiting"
    assert set(machine.chart.configuration_values) == {"awaiting"}


def test_library_defaults_are_overridden() -> None:
    for chart in machines.ALL:
        assert chart.allow_event_without_transition is False
        assert chart.catch_errors_as_events is False
