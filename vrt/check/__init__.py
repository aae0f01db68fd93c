"""``vrt check``: an explicit-state model checker for the machines and the engine around them.

**Each machine** (:func:`check_machines`): for every compiled table, every (state, event)
pair is compared with a real python-statemachine instance of its class (the compiled table
equals the class); every state is reachable and can reach a final state; no event is dead;
final states accept nothing.

**The composed model** (:func:`explore`): one turn with up to ``calls`` tool calls, explored
breadth first over every interleaving with a visited set. Its transition relation is the
real machine classes through their compiled tables (ToolCall per call, Turn and Session on
the server; Connection, a CallView per call and an AppCall per app call on the client) and
a small model of the engine's and the network's rules around them (``vrt/check/_*.py``).
Where the session runs, and whether it may be saved or moved, is the Movement machine's
(``machines/movement.py``), composed the same way: the model moves it as the session's actor
and keeper do (``start`` and ``rest`` around the turn, ``save``, ``hand_over`` and
``let_go``, ``adopt`` or ``adopt_lost`` and ``resume`` at the process that takes it over,
``close``), so a change to the class changes the model (``explore(movement=...)``):

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
  user); ``turn.ended`` raises the epoch to the server's, and one for a turn the app
  already saw end is dropped; ``closed`` closes the Connection and aborts the queued app
  calls.
- *The network*: two FIFO channels. The socket dies: the client notices (Connection
  ``lost``), the server later (Session ``drop``); what was in flight is lost. A resume
  (``resume``/``resumed``) replays, both ways, every message above the peer's last
  processed seq (``lastSeq``): in a FIFO channel a seq-deduplicated replay of messages
  already processed is the same as none, so the model replays from there. Or the detached
  session expires, and the client's resume fails (Connection ``close``). The server may
  close the session at any moment (``closed``).
- *Saves* (``handover-v1``, a store): the server saves the session at turn boundaries only:
  when the turn starts (the model's initial state: input recorded, ``turn.started`` sent
  and seen, no call yet) and when it ends (a step of its own, after ``turn.ended`` is
  sent, every call final). What is saved is everything: the engine's state (turn, epoch,
  calls) and the protocol's (the replay buffer: what the client has not processed; what
  the server has received). The server acks no client message beyond what it has saved,
  so the client still holds every message above the saved received seq.
- *A planned handover* (``handovers`` of them: a drain, or the session moving to the process
  its client's resume reached) when the Movement machine allows it, i.e. between turns,
  once the turn has ended: the server saves the session exactly, Session ``hand_over``,
  and closes the connection with 1012, no ``closed``; the client takes 1012 as a lost connection
  (Connection ``lost``) and resumes at once; the process it reaches restores the saved
  state (the new Session ``adopt``, then ``resume``): welcome resumed, both sides replay as
  after any drop. The two processes' Session machines share one field: the old one's final
  move, then the new one's first.
- *A crash* (``crashes`` of them) at any moment: the server process dies with everything not
  saved; the connection dies with it (what was in flight is lost; the client notices,
  ``lost``). After the lease another process adopts the last save (Session ``adopt``) and
  does nothing until the client's resume reaches it. The client's resume carries ``open``:
  each call whose CallView is not final, and the turn it holds open. The adopting process
  replays what its saved replay buffer holds above the client's ``lastSeq``; the client
  replays every message above the saved received seq (the interrupts the dead process had
  taken since its save, and what was in flight); the adopting process drops those that
  concern the lost turn's calls (``tool.result``: at a boundary every call is final or
  unknown). Right after its replay, before it takes anything the client replays (an
  ``interrupt`` would end the turn before the calls), it sends ``cancelled`` for each call
  the client reports open that its saved state does not have final, and, if the saved
  state had the turn open, ``turn.ended`` interrupted with the epoch raised by one (the
  history marks the turn interrupted). A reported call or turn that
  the saved state has final gets nothing more: its terminal phase, or its ``turn.ended``,
  was unacked when the state was saved, so it is in the saved replay buffer and the
  replay brings it. The adopting process gives no call a result of its own; the calls
  the dead one ran may have had effects, their results are gone. A ``cancelled`` moves an
  open CallView as usual and aborts its app call, queued or running.

**Abstracted away**: message contents, arguments and results (ok, REJECTED, INVALID, FAILED
look alike on the wire: a result is "there"), ``tool.preview``, ``text.delta``,
``turn.started``, confirmation (the hook's await), model errors and engine bugs (the Turn's
``error``), acks (they only trim the replay buffer; its overflow is not modelled; for a
crash, what matters of them is the rule above: none beyond the last save), seq numbers
(the adopting process numbers above both the saved sent seq and the client's ``lastSeq``,
so the client takes what it sends; a resume replays from ``lastSeq``), the handshake and
the store's own failures (a save that fails, a record that expires), the lease, and time
(a timeout may fire whenever a call waits for its result). One turn, in epoch 0: a
barge-in is its server interrupt; the turn it starts is not modelled, so neither is a
crash between an input and the save of its turn's start (the input is lost), nor a turn
the client holds open that the saved state does not know. A handover before the turn
starts is one after the previous turn ended, which the model has at its turn's end. An
app call whose arguments fail the schema looks on the wire like a declined one.
``arguments-delta`` and ``progress`` are left out unless ``phases`` (then at most one of
each per call): they are non-terminal phases that the client treats as it treats
``arguments-complete``, which is modelled. The answer of an app tool that returns after
``closed`` is not modelled (the engine aborts it). The engine's resume is the protocol's
(PROTOCOL.md) as modelled here; tests/test_resume.py checks the real one by cutting a
session at every message.

**Invariants** (:data:`INVARIANTS`): each call's app-facing stream starts with ``start`` and
has exactly one terminal unless the session closed, across handovers and crashes; each call
gets at most one result on the server side, exactly one on the server that keeps the
session for the calls it knows, and none from a process that adopted the session after a
crash for a call lost with the dead one; no app tool runs under a stale epoch; at most one
app tool runs at a time, in arrival (call) order; after an interrupt no call of that turn
starts (the server sends no ``tool.call`` for it; the client begins no app call it showed
cancelled, nor one of a turn whose end the app saw, a crash's interrupted end included); a
turn ends only when all its calls are final; exactly one ``turn.ended`` reaches the app;
at rest the server's epoch is not below the client's (else the client would refuse every
call of the next turn as stale); no machine refuses a move the engine makes
unconditionally; and at rest (nothing can happen but the session closing, the connection
dropping, a handover or a crash) the turn has ended.

**Broken rules** (:data:`BREAKABLE`) break one rule of the model on purpose, to see the
checker find it. Three of them are engine defects this checker found (and the engine has
since fixed): ``late-dispatch``, ``overtake`` and ``run-after-cancel``. Five break the
handover and crash rules: a handover mid-turn, an adopting process that sends no
``cancelled`` or gives a lost call a result, a client that does not deduplicate
``turn.ended``, and a server that acks what it has not saved (``ack-unsaved``: an
interrupt taken after the turn's end is lost with the dead process, the client stays in
an epoch above the server's).

**Reduction.** Exploring every interleaving as is does not fit in a minute for three calls,
so the search expands each state with an *ample set* instead of every enabled action, a
partial-order reduction that keeps every reachable violation and every state at rest:

- the client's actions touch only its own fields, the head of the server-to-client channel
  and the tail of the other, so they commute with every server action: while a message
  waits for the client, only the client's actions are explored (the server's follow,
  reordered), and the crash, which they do not commute with (it kills the connection);
  any server action but the save is the same before a crash as not at all, and a save
  with the client behind is the save with the client caught up, since the replay brings
  it what it has not processed. Symmetrically the server's actions alone while a message
  waits for it and the socket can no longer die unnoticed by the server. Each side has its
  own interrupt budget for this, so ``interrupts=n`` runs one search per split between the
  user and the server;
- while the connection is down only the drop's own moves are explored (the server noticing,
  resume, expire, close, the client giving up): anything else done meanwhile, a handover or
  a crash included, commutes with the drop, so it is the same as doing it just before; and
  a resumed state is the state before the drop with the drop spent, which the state before
  the drop stands for (so one drop covers any number that resume);
- once the turn's end is saved, the saved state is the live one (LIVE): only the epoch may
  still rise, by interrupts the client would replay to an adopting process. So a crash
  then is a drop (it spends no ``crashes``: like a drop, one stands for any number), and
  a handover, always made then, is one too: once resumed, the state before the handover
  stands for it (so one handover covers any number);
- fields no action reads again are reset (a closed session's server side, a dead channel,
  the saved state once no crash can come), and once both sides are closed every state is
  one.

The tests check the reduction at small bounds: reduced and full explorations find the same
violations and the same states at rest. Breadth first, a violation's path is a shortest one
in the reduced graph; it is then shortened by dropping every step it does not need.

**The realtime model** (:func:`explore_realtime`, ``vrt/check/_realtime*.py``): one session
with a realtime voice model (``vrt/_engine/realtime.py``), up to ``calls`` tool calls and
``responses`` responses with content, explored breadth first over every interleaving with a
visited set, without the reduction. Its transition relation is the Upstream machine
(``machines/upstream.py``), a Turn per turn and a ToolCall per call, through their compiled
tables, and the driver's rules as ``vrt/_engine/realtime.py`` implements them (a change to
the Upstream class changes the model: ``explore_realtime(upstream=...)``); and a model of
the realtime model's server, permissive (any event it may send, in any order) but truthful
(which response it has open, which call it completed or cut, which response was cancelled
or is unwanted), so the invariants judge the driver by what happened, not by what it
believed:

- *The model*: it starts a response, the one asked for (each ``response.create`` it did
  not refuse: a create while it has a response active is refused) or its own (its voice
  detector heard the user: the driver opens a turn, interrupting the open one by the
  model, nothing sent), announced by ``response.created`` or not (the driver then takes
  its first event, or its ``done``, as its start); in its open response it starts calls,
  completes their arguments (CallEnd) and sends audio; ``done`` cuts the calls it did not
  complete (no CallEnd). It may go on with a response it was told to cancel until its
  ``done`` (what it sent before it read the cancel, in flight), but not with one its own
  voice detector stopped. Late and duplicate events at any moment: a call's start or end
  again, the end of a cut call, a call first started after its response's done
  (``late`` of them), a done or audio of an ended response.
- *The user and the app*: a speech-start at any moment (barge-in from the model: the open
  turn interrupted by the model, the Upstream ``speech``); ``session.interrupt()`` at any
  moment (barge-in from the app: ``response.cancel`` only from ``responding``, a requested
  response made ``unwanted``, then cancelled when it starts); ``texts`` turns the app
  opens with a text when no turn is open (``start_turn`` with one open is the app's
  interrupt first, which the model has at any moment).
- *The turns and the driver*: a turn's task takes its step's events from its channel one
  at a time (a CallStart makes a ToolCall, a CallEnd issues it, the end of the response
  ends the step: incomplete calls fail), and nothing once interrupted; a model's own turn
  takes them once the turn it cut has ended. A step that asks for a response waits until
  the Upstream allows ``create``; woken by any move, it checks again without a checkpoint,
  so an interrupt that lands between the wake and its run does not stop it. A tool starts,
  then returns. A step with calls waits for them, then sends their answers with a request
  for the next response; a turn's end answers, with no request, its calls the model
  completed and nobody answered. The connection drops (``drops`` times) and comes back
  (``reconnect``, ``ready``): the step waiting on it fails, and what the model completed
  in the lost session is owed nothing more (the next is seeded with the history).

Abstracted away: message contents, arguments and results but for what the invariants read
(whether a tool ran; settled, INTERRUPTED and FAILED look alike), the hook (every call is
allowed), app tools (server tools only), argument deltas, text and transcripts, audio's
timing and ``conversation.item.truncate``, the seed's contents, the history's order, time
(the step's own timeout, ``max_steps``, the backoff; a request waiting for the Upstream may
time out whenever it waits), model errors (a failed response, an ``error`` event), the
session's close, and Gemini (its protocol neither cancels nor asks: ``forget``,
``toolCallCancellation``, answers held for ``turnComplete``): the model speaks OpenAI's.

**Realtime invariants** (:data:`REALTIME_INVARIANTS`): a ``response.create`` only while the
Upstream is idle and never for a turn after its interrupt; a ``response.cancel`` only for a
response the model still has open; a call gets at most one answer upstream, none unless the
model completed it (none for a call cut mid-arguments), and none claiming success for a call
that did not run; at rest, every call the model completed has its answer; no call runs
unless the model completed it in time (none of a response already ended, unwanted or
cancelled); a turn ends only when all its calls are final; no machine refuses a move the
driver makes unconditionally; at rest (nothing left but the model's, the user's and the
app's own moves and connection loss) every turn has ended and the Upstream is idle.
:data:`REALTIME_BREAKABLE` breaks one of the driver's rules on purpose: a request at the end
of an interrupted turn, a cut call run at its item's done (LiveKit's bug), late events not
dropped, a cancelled call answered twice.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from vrt._core.tables import TABLES
from vrt.check._explore import (
    RealtimeReport,
    Report,
    Violation,
    explore,
    explore_realtime,
    format_realtime_report,
    format_report,
)
from vrt.check._machines import check_machines, count_pairs
from vrt.check._realtime_state import REALTIME_BREAKABLE, REALTIME_INVARIANTS
from vrt.check._state import BREAKABLE, INVARIANTS

__all__ = [
    "BREAKABLE",
    "INVARIANTS",
    "REALTIME_BREAKABLE",
    "REALTIME_INVARIANTS",
    "RealtimeReport",
    "Report",
    "Violation",
    "check_machines",
    "explore",
    "explore_realtime",
    "format_realtime_report",
    "format_report",
    "main",
]


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
        "--handovers",
        type=int,
        default=1,
        help="planned handovers to another process, at a turn boundary (default: %(default)s)",
    )
    parser.add_argument(
        "--crashes",
        type=int,
        default=1,
        help="server process crashes, the session adopted from its last save "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--phases",
        action="store_true",
        help="also stream one arguments-delta and one progress per call (slower)",
    )
    parser.add_argument(
        "--realtime-calls",
        type=int,
        default=2,
        help="the realtime model's tool calls (default: %(default)s)",
    )
    parser.add_argument(
        "--realtime-responses",
        type=int,
        default=2,
        help="the realtime model's responses with content (default: %(default)s)",
    )
    parser.add_argument(
        "--realtime-late",
        type=int,
        default=1,
        help="calls the realtime model first sends after their response's done "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--realtime-drops",
        type=int,
        default=1,
        help="lost connections to the realtime model (default: %(default)s)",
    )
    parser.add_argument(
        "--realtime-texts",
        type=int,
        default=0,
        help="turns the app opens with a text in the realtime model (default: %(default)s; "
        "1 takes some seconds more)",
    )
    parser.add_argument(
        "--break",
        dest="broken",
        choices=[*BREAKABLE, *REALTIME_BREAKABLE],
        help="break one rule of a model on purpose, to see the checker find it (only that "
        "model runs)",
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
    failed = bool(problems)
    if args.broken not in REALTIME_BREAKABLE:
        report = explore(
            args.calls,
            args.interrupts,
            args.drops,
            handovers=args.handovers,
            crashes=args.crashes,
            phases=args.phases,
            broken=args.broken,
        )
        print(format_report(report), file=out, flush=True)
        failed = failed or not report.ok
    if args.broken is None or args.broken in REALTIME_BREAKABLE:
        realtime = explore_realtime(
            args.realtime_calls,
            args.realtime_responses,
            late=args.realtime_late,
            drops=args.realtime_drops,
            texts=args.realtime_texts,
            broken=args.broken,
        )
        print(format_realtime_report(realtime), file=out, flush=True)
        failed = failed or not realtime.ok
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """``vrt check`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="vrt check", description="Model-check the machines and the engine's rules."
    )
    add_arguments(parser)
    return run(parser.parse_args(argv), out)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
