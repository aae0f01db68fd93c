"""``vrt check``: an explicit-state model checker for the machines and the engine around them.

**Each machine** (:func:`check_machines`): for every compiled table, every (state, event)
pair is compared with a real python-statemachine instance of its class (the compiled table
equals the class); every state is reachable and can reach a final state; no event is dead;
final states accept nothing.

**The composed model** (:func:`explore`): one turn with up to ``calls`` tool calls, explored
breadth first over every interleaving with a visited set. Its transition relation is the
real machine classes through their compiled tables (ToolCall per call, Turn and Session on
the server; Connection, a CallView per call and an AppCall per app call on the client) and
a small model of the engine's and the network's rules around them (``vrt/_check_*.py``):

- *The model's stream*: in ``generating`` the model may begin the next call (an app or a
  server tool), complete a call's arguments, or end the step: calls not complete are
  abandoned (``failed``); a step without calls finishes the turn, otherwise the turn awaits
  its calls and then runs the next step, or finishes at ``max_steps``. Each ToolCall move
  sends its one stream phase to the client.
- *A call's task* starts at ``arguments-complete``: the hook allows or declines; a server
  tool returns; an app call is sent (``tool.call``) once every earlier app call has ended,
  then waits for ``tool.result`` or times out (``tool.abort``, ``settled`` TIMEOUT).
- *Interrupts*: the server's (barge-in): Turn ``interrupt``, epoch + 1, every open call
  ``cancelled`` at once, the scope cancelled: a task in the hook or a server tool just ends,
  an app call with ``tool.call`` unanswered sends ``tool.abort`` as it unwinds, and
  ``unwound`` ends the turn (``turn.ended``) once no task is left. The user's: the client
  raises its epoch, cancels every open CallView locally, drops queued app calls, aborts the
  running one and sends ``interrupt``; the server adopts ``max(epoch, its own + 1)`` and
  interrupts the turn if it is still live.
- *The client*: ``start`` of a call of an older epoch, or of a call it already cancelled, is
  ignored; other phases move the CallView, and a phase for a view already final is dropped;
  the epoch gate answers a stale ``tool.call`` INTERRUPTED at once (it never runs) and
  queues a current one; the runner begins queued app calls one at a time in arrival order;
  a tool returns at any moment and is answered unless it was aborted (``tool.abort`` or the
  user); ``turn.ended`` raises the epoch to the server's; ``closed`` closes the Connection
  and aborts the queued app calls.
- *The network*: two FIFO channels. The socket dies: the client notices (Connection
  ``lost``), the server later (Session ``drop``); what was in flight is lost. A resume
  (``resume``/``resumed``) replays, both ways, every message above the peer's last
  processed seq (``lastSeq``): in a FIFO channel a seq-deduplicated replay of messages
  already processed is the same as none, so the model replays from there. Or the detached
  session expires, and the client's resume fails (Connection ``close``). The server may
  close the session at any moment (``closed``).

**Abstracted away**: message contents, arguments and results (ok, REJECTED, INVALID, FAILED
look alike on the wire: a result is "there"), ``tool.preview``, ``text.delta``,
``turn.started``, confirmation (the hook's await), model errors and engine bugs (the Turn's
``error``), acks (they only trim the replay buffer; its overflow is not modelled), the
handshake, and time (a timeout may fire whenever a call waits for its result). One turn, in
epoch 0: a barge-in is its server interrupt; the turn it starts is not modelled. An app call
whose arguments fail the schema looks on the wire like a declined one. ``arguments-delta``
and ``progress`` are left out unless ``phases`` (then at most one of each per call): they
are non-terminal phases that the client treats as it treats ``arguments-complete``, which
is modelled. The answer of an app tool that returns after ``closed`` is not modelled (the engine
aborts it). The engine's resume is the protocol's (PROTOCOL.md) as modelled here;
tests/test_resume.py checks the real one by cutting a session at every message.

**Invariants** (:data:`INVARIANTS`): each call's app-facing stream starts with ``start`` and
has exactly one terminal unless the session closed; each call gets exactly one result on the
server; no app tool runs under a stale epoch; at most one app tool runs at a time, in
arrival (call) order; after an interrupt no call of that turn starts (the server sends no
``tool.call`` for it; the client begins no app call it showed cancelled); a turn ends only
when all its calls are final; no machine refuses a move the engine makes unconditionally;
and at rest (nothing can happen but the session closing or the connection dropping) the
turn has ended.

**Broken rules** (:data:`BREAKABLE`) break one rule of the model on purpose, to see the
checker find it. Three of them are engine defects this checker found (and the engine has
since fixed): ``late-dispatch``, ``overtake`` and ``run-after-cancel``.

**Reduction.** Exploring every interleaving as is does not fit in a minute for three calls,
so the search expands each state with an *ample set* instead of every enabled action, a
partial-order reduction that keeps every reachable violation and every state at rest:

- the client's actions touch only its own fields, the head of the server-to-client channel
  and the tail of the other, so they commute with every server action: while a message
  waits for the client, only the client's actions are explored (the server's follow,
  reordered); symmetrically the server's while a message waits for it and the socket can
  no longer die unnoticed by the server. Each side has its own interrupt budget for this, so
  ``interrupts=n`` runs one search per split between the user and the server;
- while the connection is down only the drop's own moves are explored (the server noticing,
  resume, expire, close, the client giving up): anything else done meanwhile commutes with
  the drop, so it is the same as doing it just before; and a resumed state is the state
  before the drop with the drop spent, which the state before the drop stands for (so one
  drop covers any number that resume);
- fields no action reads again are reset (a closed session's server side, a dead channel),
  and once both sides are closed every state is one.

The tests check the reduction at small bounds: reduced and full explorations find the same
violations and the same states at rest. Breadth first, a violation's path is a shortest one
in the reduced graph; it is then shortened by dropping every step it does not need.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import TextIO

import attrs

from vrt._core.tables import TABLES
from vrt.check._machines import check_machines, count_pairs
from vrt.check._model import Model
from vrt.check._search import search, shorten
from vrt.check._state import BREAKABLE, INVARIANTS

__all__ = [
    "BREAKABLE",
    "INVARIANTS",
    "Report",
    "Violation",
    "check_machines",
    "explore",
    "format_report",
    "main",
]


@attrs.frozen(kw_only=True)
class Violation:
    """An invariant the model broke, with a short event sequence that breaks it."""

    invariant: str
    """A key of :data:`INVARIANTS`."""
    detail: str
    """What went wrong."""
    trace: tuple[str, ...]
    """The steps from the initial state; the last one breaks the invariant, or leads to a
    state at rest that breaks it."""

    def format(self) -> str:
        """The violation as readable text, one step a line."""
        lines = [f"violation [{self.invariant}] {INVARIANTS[self.invariant]}", f"  {self.detail}"]
        lines += [f"  {n:2}. {step}" for n, step in enumerate(self.trace, 1)]
        return "\n".join(lines)


@attrs.frozen(kw_only=True)
class Report:
    """What one exploration did and found."""

    calls: int
    interrupts: int
    drops: int
    phases: bool
    broken: str | None
    states: int
    """Distinct states reached (summed over the interrupt splits)."""
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


def explore(
    calls: int = 3,
    interrupts: int = 1,
    drops: int = 1,
    *,
    phases: bool = False,
    broken: str | None = None,
    reduce: bool = True,
    stop_at_first: bool = False,
) -> Report:
    """Explore the composed model breadth first over every interleaving within the bounds.

    ``calls`` tool calls (each an app or a server tool), ``interrupts`` in all (user or
    server), ``drops`` connection drops. ``phases`` adds one ``arguments-delta`` and one
    ``progress`` per call. ``broken`` breaks one rule of :data:`BREAKABLE` on purpose.
    ``reduce=False`` explores without the reduction (slow:
    for tests that compare both). ``stop_at_first`` stops at the first violation.
    """
    started = time.perf_counter()
    states = transitions = 0
    found: dict[str, Violation] = {}
    complete = True
    for user in range(interrupts, -1, -1):  # one search per user/server split
        model = Model(calls, user, interrupts - user, drops, phases=phases, broken=broken)
        outcome = search(model, reduce=reduce, stop_at_first=stop_at_first)
        states, transitions = states + outcome.states, transitions + outcome.transitions
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
        phases=phases,
        broken=broken,
        states=states,
        transitions=transitions,
        seconds=time.perf_counter() - started,
        complete=complete,
        violations=tuple(sorted(found.values(), key=lambda v: len(v.trace))),
    )


def format_report(report: Report) -> str:
    """The figures and the violations, as ``vrt check`` prints them."""
    bounds = f"calls={report.calls} interrupts={report.interrupts} drops={report.drops}"
    if report.phases:
        bounds += " phases"
    if report.broken:
        bounds += f"; broken on purpose: {report.broken}"
    lines = [
        f"model: {bounds}",
        f"  states {report.states}",
        f"  transitions {report.transitions}",
        f"  seconds {report.seconds:.1f}",
        f"  violations {len(report.violations)}" + ("" if report.complete else " (stopped)"),
    ]
    lines += [v.format() for v in report.violations]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``vrt check`` to ``parser``."""
    parser.add_argument("--calls", type=int, default=3, help="tool calls (default: %(default)s)")
    parser.add_argument(
        "--interrupts",
        type=int,
        default=1,
        help="interrupts, user or server, in all (default: %(default)s)",
    )
    parser.add_argument(
        "--drops", type=int, default=1, help="connection drops (default: %(default)s)"
    )
    parser.add_argument(
        "--phases",
        action="store_true",
        help="also stream one arguments-delta and one progress per call (slower)",
    )
    parser.add_argument(
        "--break",
        dest="broken",
        choices=list(BREAKABLE),
        help="break one rule of the model on purpose, to see the checker find it",
    )


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """``vrt check`` for parsed ``args``: print to ``out`` (default: stdout); 0 if all holds."""
    out = out or sys.stdout
    problems = check_machines()
    verdict = (
        "every table equals its class; every state is reachable and can finish; "
        "no event is dead; final states accept nothing"
        if not problems
        else f"{len(problems)} problems"
    )
    print(f"machines: {len(TABLES)}, {count_pairs()} (state, event) pairs: {verdict}", file=out)
    for problem in problems:
        print(f"  {problem}", file=out)
    report = explore(
        args.calls,
        args.interrupts,
        args.drops,
        phases=args.phases,
        broken=args.broken,
    )
    print(format_report(report), file=out, flush=True)
    return 1 if problems or report.violations else 0


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """``vrt check`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="vrt check", description="Model-check the machines and the engine's rules."
    )
    add_arguments(parser)
    return run(parser.parse_args(argv), out)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
