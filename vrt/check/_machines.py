"""``vrt check``, part one: each machine on its own, against its own class.

For every compiled :class:`~vrt._core.tables.Table`:

- the compiled table equals the class: its states, events, initial and final states are the
  class's, and for every (state, event) pair a real python-statemachine instance, brought to
  that state by a path the class allows, does what the table says (the same target, or a
  refusal);
- every state is reachable and can reach a final state;
- no event is dead (each labels at least one transition out of a reachable state);
- a final state accepts no event.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from vrt._core.tables import TABLES, Table

Pair = tuple[str, str]


def check_machines(tables: Iterable[Table] = TABLES) -> list[str]:
    """Check each table against its class and on its own; return the problems found."""
    problems: list[str] = []
    for table in tables:
        problems.extend(check_table(table))
    return problems


def count_pairs(tables: Iterable[Table] = TABLES) -> int:
    """How many (state, event) pairs :func:`check_machines` compares."""
    return sum(len(t.states) * len(t.events) for t in tables)


def check_table(table: Table) -> list[str]:
    """The problems of one table (an empty list if it is sound and equals its class)."""
    name = table.name
    problems = [f"{name}: {p}" for p in _shape(table)]
    library, unreachable = _library_relation(table)
    for state in unreachable:
        problems.append(f"{name}: state {state!r} is unreachable in the class")
    for state in table.states:
        for event in table.events:
            compiled = table.transitions.get((state, event))
            if state in unreachable:
                continue
            expected = library.get((state, event))
            if compiled != expected:
                problems.append(
                    f"{name}: ({state}, {event}) -> {compiled or 'refused'} in the table, "
                    f"-> {expected or 'refused'} in the class"
                )
    for (state, event), target in sorted(table.transitions.items()):
        if state not in table.states or target not in table.states or event not in table.events:
            problems.append(f"{name}: ({state}, {event}) -> {target} names an unknown state/event")
    reachable = _reach(table, {table.initial})
    for state in table.states:
        if state in reachable and not (_reach(table, {state}) & table.finals):
            problems.append(f"{name}: state {state!r} cannot reach a final state")
        if state in table.finals:
            for event in table.events:
                if (state, event) in table.transitions:
                    problems.append(f"{name}: final state {state!r} accepts {event!r}")
    for event in table.events:
        if not any(e == event and s in reachable for (s, e) in table.transitions):
            problems.append(f"{name}: event {event!r} is dead (no transition can take it)")
    return problems


def _shape(table: Table) -> list[str]:
    """Differences between the table's states, events, initial and finals and the class's."""
    spec: Any = table.chart  # the library's class-level attributes are not typed
    states = tuple(s.id for s in spec.states)
    events = tuple(e.id for e in spec.events)
    initial = next(s.id for s in spec.states if s.initial)
    finals = frozenset(s.id for s in spec.states if s.final)
    out = []
    if set(table.states) != set(states):
        out.append(f"states {sorted(table.states)} in the table, {sorted(states)} in the class")
    if set(table.events) != set(events):
        out.append(f"events {sorted(table.events)} in the table, {sorted(events)} in the class")
    if table.initial != initial:
        out.append(f"initial state {table.initial!r} in the table, {initial!r} in the class")
    if table.finals != finals:
        out.append(
            f"final states {sorted(table.finals)} in the table, {sorted(finals)} in the class"
        )
    return out


def _library_relation(table: Table) -> tuple[dict[Pair, str], list[str]]:
    """Ask real library instances: every reachable (state, event) pair and its target.

    Breadth first from the initial state; each state is reached by replaying the shortest
    event path on a fresh instance, then every event is tried on a fresh copy of that path.
    Returns the relation and the states the class cannot reach.
    """
    chart: Any = table.chart
    relation: dict[Pair, str] = {}
    paths: dict[str, list[str]] = {table.initial: []}
    todo = deque([table.initial])
    while todo:
        state = todo.popleft()
        for event in table.events:
            instance = chart()
            for step in paths[state]:
                instance.send(step)
            try:
                instance.send(event)
            except instance.TransitionNotAllowed:
                continue
            (target,) = instance.configuration_values
            relation[state, event] = target
            if target not in paths:
                paths[target] = [*paths[state], event]
                todo.append(target)
    unreachable = [s for s in table.states if s not in paths]
    return relation, unreachable


def _reach(table: Table, start: set[str]) -> set[str]:
    """Every state the table can reach from ``start`` (inclusive)."""
    seen, todo = set(start), list(start)
    while todo:
        state = todo.pop()
        for (source, _), target in table.transitions.items():
            if source == state and target not in seen:
                seen.add(target)
                todo.append(target)
    return seen
