"""Machines compiled to ``(state, event) -> target`` tables, and their runtime objects.

Why compile: python-statemachine's step algorithm costs tens of microseconds and tens of
kilobytes per instance, while one tool call needs half a dozen transitions and thousands of
calls may be open. The classes in :mod:`machines` stay the single source of truth; this
module reads each class once, at import, into a dict, and :class:`Machine` is a two-slot
object that looks the next state up and raises :class:`~vrt.InvalidTransition` on anything
the class does not allow.

Strict mode (``VRT_STRICT_MACHINES=1`` in the environment at import) makes :meth:`Table.new`
return :class:`StrictMachine`, which runs a real library instance instead, so the whole test
suite can run against the library itself. A test proves both agree on every pair.
"""

from __future__ import annotations

import os
from typing import Any, Final

import machines
from machines.base import VrtChart
from vrt._errors import InvalidTransition

STRICT: Final = os.environ.get("VRT_STRICT_MACHINES", "") not in ("", "0")


class Table:
    """The transition table of one machine class."""

    __slots__ = ("chart", "events", "finals", "initial", "name", "states", "transitions")

    def __init__(self, chart: type[VrtChart]) -> None:
        self.chart = chart
        spec: Any = chart  # the library's class-level attributes are not typed
        self.name: str = chart.__name__
        self.states: tuple[str, ...] = tuple(s.id for s in spec.states)
        self.events: tuple[str, ...] = tuple(e.id for e in spec.events)
        self.initial: str = next(s.id for s in spec.states if s.initial)
        self.finals: frozenset[str] = frozenset(s.id for s in spec.states if s.final)
        self.transitions: dict[tuple[str, str], str] = {}
        for state in spec.states:
            for transition in state.transitions:
                for event in transition.events:
                    key = (state.id, event.id)
                    if key in self.transitions:
                        raise ValueError(f"{self.name}: two transitions for {key}")
                    self.transitions[key] = transition.target.id

    def new(self) -> Machine | StrictMachine:
        """A fresh runtime machine in the initial state (a library instance in strict mode)."""
        return StrictMachine(self) if STRICT else Machine(self)

    def __repr__(self) -> str:
        return f"<Table {self.name}: {len(self.transitions)} transitions>"


class Machine:
    """A compiled machine: one slot for the state, one for the table."""

    __slots__ = ("state", "table")

    def __init__(self, table: Table) -> None:
        self.table = table
        self.state: str = table.initial

    def send(self, event: str) -> str:
        """Take the transition for ``event`` and return the new state, or raise."""
        try:
            self.state = self.table.transitions[self.state, event]
        except KeyError:
            raise InvalidTransition(self.table.name, self.state, event) from None
        return self.state

    def can(self, event: str) -> bool:
        """Whether the machine takes ``event`` in its state (what :meth:`send` would do)."""
        return (self.state, event) in self.table.transitions

    @property
    def final(self) -> bool:
        """Whether the machine is in a final state."""
        return self.state in self.table.finals

    def __repr__(self) -> str:
        return f"<{self.table.name} {self.state}>"


class StrictMachine:
    """The same interface as :class:`Machine`, backed by a real python-statemachine instance."""

    __slots__ = ("chart", "state", "table")

    def __init__(self, table: Table) -> None:
        self.table = table
        self.chart: Any = table.chart()
        self.state: str = table.initial

    def send(self, event: str) -> str:
        """Send ``event`` to the library instance; translate its refusal to ours."""
        try:
            self.chart.send(event)
        except self.chart.TransitionNotAllowed:
            raise InvalidTransition(self.table.name, self.state, event) from None
        (self.state,) = self.chart.configuration_values
        return self.state

    def can(self, event: str) -> bool:
        """Whether the library instance takes ``event`` now."""
        return any(e.id == event for e in self.chart.allowed_events)

    @property
    def final(self) -> bool:
        """Whether the machine is in a final state."""
        return self.state in self.table.finals

    def __repr__(self) -> str:
        return f"<{self.table.name} {self.state} (strict)>"


TOOL_CALL: Final = Table(machines.ToolCall)
TURN: Final = Table(machines.Turn)
SESSION: Final = Table(machines.Session)
CONNECTION: Final = Table(machines.Connection)
APP_CALL: Final = Table(machines.AppCall)
CALL_VIEW: Final = Table(machines.CallView)
MOVEMENT: Final = Table(machines.Movement)
UPSTREAM: Final = Table(machines.Upstream)
AUDIO_SPAN: Final = Table(machines.AudioSpan)
SETTLING: Final = Table(machines.Settling)

#: Every compiled table, in the order of :data:`machines.ALL`.
TABLES: Final = (
    TOOL_CALL,
    TURN,
    SESSION,
    CONNECTION,
    APP_CALL,
    CALL_VIEW,
    MOVEMENT,
    UPSTREAM,
    AUDIO_SPAN,
    SETTLING,
)
