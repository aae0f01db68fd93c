"""What ``vrt check`` reports and the searches behind them: :func:`explore` runs the composed
model of a turn (:mod:`vrt.check._model`) once per split of its interrupts between the user
and the server, :func:`explore_realtime` the model of a realtime model's connection
(:mod:`vrt.check._realtime`); each returns a frozen report with every violation and a short
event sequence that breaks it. :mod:`vrt.check` re-exports them; its docstring says what the
models hold.
"""

from __future__ import annotations

import time

import attrs

from vrt._core.tables import MOVEMENT, UPSTREAM, Table
from vrt.check._model import Model
from vrt.check._realtime import RealtimeModel
from vrt.check._realtime_state import REALTIME_INVARIANTS
from vrt.check._search import search, shorten
from vrt.check._state import INVARIANTS

__all__ = [
    "RealtimeReport",
    "Report",
    "Violation",
    "explore",
    "explore_realtime",
    "format_realtime_report",
    "format_report",
]


@attrs.frozen(kw_only=True)
class Violation:
    """An invariant the model broke, with a short event sequence that breaks it."""

    invariant: str
    """A key of :data:`INVARIANTS` (of :data:`REALTIME_INVARIANTS` if ``realtime``)."""
    detail: str
    """What went wrong."""
    trace: tuple[str, ...]
    """The steps from the initial state; the last one breaks the invariant, or leads to a
    state at rest that breaks it."""
    realtime: bool = False
    """Whether the realtime model found it (:func:`explore_realtime`)."""

    def format(self) -> str:
        """The violation as readable text, one step a line."""
        described = (REALTIME_INVARIANTS if self.realtime else INVARIANTS)[self.invariant]
        lines = [f"violation [{self.invariant}] {described}", f"  {self.detail}"]
        lines += [f"  {n:2}. {step}" for n, step in enumerate(self.trace, 1)]
        return "\n".join(lines)


@attrs.frozen(kw_only=True)
class Report:
    """What one exploration did and found."""

    calls: int
    interrupts: int
    drops: int
    handovers: int
    crashes: int
    phases: bool
    broken: str | None
    states: int
    """Distinct states reached (summed over the interrupt splits)."""
    transitions: int
    """Transitions taken, including those to states already seen."""
    after_handover: int
    """Of the states, those during a planned handover: from the handover to the resume,
    after which the state before the handover stands for it (see the reduction; with
    ``handover-mid-turn``, every state after it)."""
    after_crash: int
    """Of the states, those after a crash that lost work (before the turn's end was saved),
    while the session is not closed."""
    seconds: float
    complete: bool
    """Whether every reachable state was explored (False: stopped at the first violation)."""
    violations: tuple[Violation, ...]
    """The first violation found of each invariant, shortest trace first."""

    @property
    def ok(self) -> bool:
        """No violation was found."""
        return not self.violations


def explore(
    calls: int = 3,
    interrupts: int = 1,
    drops: int = 1,
    *,
    handovers: int = 1,
    crashes: int = 1,
    phases: bool = False,
    broken: str | None = None,
    reduce: bool = True,
    stop_at_first: bool = False,
    movement: Table = MOVEMENT,
) -> Report:
    """Explore the composed model breadth first over every interleaving within the bounds.

    ``calls`` tool calls (each an app or a server tool), ``interrupts`` in all (user or
    server), ``drops`` connection drops, ``handovers`` planned handovers (at a turn
    boundary), ``crashes`` server process crashes. ``phases`` adds one ``arguments-delta``
    and one ``progress`` per call. ``broken`` breaks one rule of :data:`BREAKABLE` on
    purpose. ``reduce=False`` explores without the reduction (slow: for tests that compare
    both). ``stop_at_first`` stops at the first violation. ``movement`` is the Movement
    machine composed (the table of ``machines/movement.py`` by default; a table of another
    class to see what the model makes of it).
    """
    started = time.perf_counter()
    states = transitions = handed = crashed = 0
    found: dict[str, Violation] = {}
    complete = True
    for user in range(interrupts, -1, -1):  # one search per user/server split
        model = Model(
            calls,
            user,
            interrupts - user,
            drops,
            handovers=handovers,
            crashes=crashes,
            phases=phases,
            broken=broken,
            movement=movement,
        )
        outcome = search(model, reduce=reduce, stop_at_first=stop_at_first)
        states, transitions = states + outcome.states, transitions + outcome.transitions
        handed, crashed = handed + outcome.after_handover, crashed + outcome.after_crash
        for hit in outcome.found:
            trace, detail = shorten(model, hit, reduce)
            known = found.get(hit.invariant)
            if known is None or len(trace) < len(known.trace):
                found[hit.invariant] = Violation(
                    invariant=hit.invariant, detail=detail, trace=trace
                )
        if not outcome.complete:
            complete = False
            break
    return Report(
        calls=calls,
        interrupts=interrupts,
        drops=drops,
        handovers=handovers,
        crashes=crashes,
        phases=phases,
        broken=broken,
        states=states,
        transitions=transitions,
        after_handover=handed,
        after_crash=crashed,
        seconds=time.perf_counter() - started,
        complete=complete,
        violations=tuple(sorted(found.values(), key=lambda v: len(v.trace))),
    )


def format_report(report: Report) -> str:
    """The figures and the violations, as ``vrt check`` prints them."""
    bounds = (
        f"calls={report.calls} interrupts={report.interrupts} drops={report.drops} "
        f"handovers={report.handovers} crashes={report.crashes}"
    )
    if report.phases:
        bounds += " phases"
    if report.broken:
        bounds += f"; broken on purpose: {report.broken}"
    lines = [
        f"model: {bounds}",
        f"  states {report.states} ({report.after_handover} during a handover, "
        f"{report.after_crash} after a crash)",
        f"  transitions {report.transitions}",
        f"  seconds {report.seconds:.1f}",
        f"  violations {len(report.violations)}" + ("" if report.complete else " (stopped)"),
    ]
    lines += [v.format() for v in report.violations]
    return "\n".join(lines)


@attrs.frozen(kw_only=True)
class RealtimeReport:
    """What one exploration of the realtime model did and found."""

    calls: int
    responses: int
    late: int
    drops: int
    texts: int
    broken: str | None
    states: int
    """Distinct states reached."""
    transitions: int
    """Transitions taken, including those to states already seen."""
    seconds: float
    complete: bool
    """Whether every reachable state was explored (False: stopped at the first violation)."""
    violations: tuple[Violation, ...]
    """The first violation found of each invariant, shortest trace first."""

    @property
    def ok(self) -> bool:
        """No violation was found."""
        return not self.violations


def explore_realtime(
    calls: int = 2,
    responses: int = 2,
    *,
    late: int = 1,
    drops: int = 1,
    texts: int = 0,
    broken: str | None = None,
    stop_at_first: bool = False,
    upstream: Table = UPSTREAM,
) -> RealtimeReport:
    """Explore the realtime model breadth first over every interleaving within the bounds.

    ``calls`` tool calls (server tools), ``responses`` responses of the model with
    content (its own or asked for; past them, a response asked for is empty), ``late``
    calls the model first sends after their response's done (other late and duplicate
    events are unbounded), ``drops`` lost connections, ``texts`` turns the app opens with
    a text (``start_turn``). ``broken`` breaks one rule of :data:`REALTIME_BREAKABLE` on
    purpose. ``stop_at_first`` stops at the first violation. ``upstream`` is the Upstream
    machine composed (the table of ``machines/upstream.py`` by default; a table of
    another class to see what the model makes of it).
    """
    started = time.perf_counter()
    model = RealtimeModel(
        calls, responses, late=late, drops=drops, texts=texts, broken=broken, upstream=upstream
    )
    outcome = search(model, reduce=False, stop_at_first=stop_at_first)
    found = []
    for hit in outcome.found:
        trace, detail = shorten(model, hit, False)
        found.append(Violation(invariant=hit.invariant, detail=detail, trace=trace, realtime=True))
    return RealtimeReport(
        calls=calls,
        responses=responses,
        late=late,
        drops=drops,
        texts=texts,
        broken=broken,
        states=outcome.states,
        transitions=outcome.transitions,
        seconds=time.perf_counter() - started,
        complete=outcome.complete,
        violations=tuple(sorted(found, key=lambda v: len(v.trace))),
    )


def format_realtime_report(report: RealtimeReport) -> str:
    """The realtime model's figures and violations, as ``vrt check`` prints them."""
    bounds = (
        f"calls={report.calls} responses={report.responses} late={report.late} "
        f"drops={report.drops} texts={report.texts}"
    )
    if report.broken:
        bounds += f"; broken on purpose: {report.broken}"
    lines = [
        f"realtime model: {bounds}",
        f"  states {report.states}",
        f"  transitions {report.transitions}",
        f"  seconds {report.seconds:.1f}",
        f"  violations {len(report.violations)}" + ("" if report.complete else " (stopped)"),
    ]
    lines += [v.format() for v in report.violations]
    return "\n".join(lines)
