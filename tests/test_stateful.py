"""A ``hypothesis.stateful`` test of the real engine, in process and over the in-memory wire.

Each example opens an in-process session (``vrt.open_session``), or a client and a server
session over the in-memory connection (``vrt.testing.open_pair``, the client hosting the
app tool), of ``vrt.testing.scripted_agent`` (with or without confirmations), and applies
rules: start a turn with a generated script; barge in (new input while a turn is open);
let virtual time pass; interrupt (the session or the turn in process, the client over the
wire); answer a confirmation, or answer one again, too late; let the open turn run to its
end, answering every confirmation; close, and go on with a new session. Actions race the
engine: each happens at a generated instant (:func:`vrt.testing.interrupt_times`) plus 0-3
scheduler passes. After every step the invariants read the app's event log so far:
:func:`~vrt.testing.assert_stream_valid` (``complete=False``); exactly one terminal phase
per call of every ended turn; every settled call has the result its arguments dictate
(:func:`~vrt.testing.expected_result`), every failed one was truncated; one turn open at a
time, every input starts a turn, no turn ends ``failed``; right after an interrupt every
started call (of the turn) is already terminal; and the history (the session's in
process, the model's last request over the wire) and every ``TurnResult`` hold exactly one
result per call, in call order, agreeing with the stream, interrupted turns marked.

How the synchronous state machine drives Trio: guest mode. Each session is one Trio run,
started with ``trio.lowlevel.start_guest_run`` on a host loop that is only a queue of
callbacks, pumped by the test. Its clock is ``MockClock(autojump_threshold=0)``, so its I/O
wait is always zero and it never leaves this thread (the in-memory pair works under it:
memory channels, no sockets). A rule queues its async part (an op) for the program's
serving task and pumps until the op has returned and every task is blocked again
(``wait_all_tasks_blocked``). Between rules nothing is pumped: no task runs, no virtual
time passes while Hypothesis picks the next rule, and the invariants see a quiescent
engine. (The serving task polls for ops, so the run is never idle between rules: an idle
run would autojump to the next deadline the moment pumping resumed, before the op.) The
alternatives: ``trio.run`` per rule cannot keep a session open across rules; one
``trio.run`` per example, the operations generated as data first, could check the
invariants only at the end, and a failure would not point at a step. Trio's scheduler
randomness is registered with Hypothesis by Trio's own Hypothesis plugin, and the
initialize rule draws ``st.random_module()``: each example runs a schedule of its own,
reproducibly.
"""

from __future__ import annotations

import collections
import contextlib
import json
import queue
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import hypothesis
import outcome
import trio
import trio.testing
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import vrt
from vrt import models
from vrt.testing import (
    TurnScripts,
    assert_stream_valid,
    expected_result,
    interrupt_times,
    open_pair,
    scripted_agent,
    scripted_app_tools,
    scripts,
    truncated,
)

P = vrt.Phase
TERMINAL = frozenset({P.SETTLED, P.CANCELLED, P.FAILED})
OP_LIMIT = 600.0
"""Virtual seconds any one rule's async part may take."""
FINISH_LIMIT = 100.0
"""Virtual seconds in which an open turn must end once every confirmation is answered (the
longest generated turn takes about 40)."""
TICK_LIMIT = 200_000
"""Guest ticks a rule may take before the test calls it a hang."""
TICKS = st.integers(0, 3)
SECONDS = st.one_of(
    st.sampled_from((0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0)),
    st.floats(0, 5, allow_nan=False),
)

IN_PROCESS_SCRIPTS = scripts(("lookup", "charge", "nope"))  # no app tool in process
WIRE_SCRIPTS = scripts()  # lookup, charge, edit (the client's), nope
SCRIPTS = st.runner().flatmap(lambda machine: WIRE_SCRIPTS if machine.wire else IN_PROCESS_SCRIPTS)

Op = Callable[[], Awaitable[bool | None]]
"""A rule's async part; returning True ends the program (after a close)."""


def _not_json(token: str) -> Any:
    raise ValueError(token)


def parsed(arguments: Any) -> Any:
    """Scripted arguments as the engine parses them (raw text when not strict JSON)."""
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments, parse_constant=_not_json)
    except ValueError:
        return arguments


class Stepper:
    """One Trio run in guest mode, on a host loop that runs only while a rule pumps it."""

    def __init__(self, program: Callable[[Stepper], Awaitable[None]]) -> None:
        self._callbacks: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
        self._ops: collections.deque[Op] = collections.deque()
        self._scope: trio.CancelScope | None = None
        self.outcome: outcome.Outcome[None] | None = None
        trio.lowlevel.start_guest_run(
            self._main,
            program,
            run_sync_soon_threadsafe=self._callbacks.put,
            done_callback=self._done,
            clock=trio.testing.MockClock(autojump_threshold=0),
        )
        self._token = trio.lowlevel.current_trio_token()

    def _done(self, result: outcome.Outcome[None]) -> None:
        self.outcome = result

    async def _main(self, program: Callable[[Stepper], Awaitable[None]]) -> None:
        with trio.CancelScope() as self._scope:
            await program(self)

    async def serve(self) -> None:
        """Run the rules' ops, one at a time, until one ends the program.

        Between ops this task polls (a checkpoint each time the host pumps), so the run
        is never idle there: an idle run with an autojump clock would jump to the next
        deadline as soon as the host pumped again, before the next op could start.
        """
        while True:
            while not self._ops:
                await trio.lowlevel.checkpoint()
            if await self._ops.popleft()():
                return

    def run(self, op: Op) -> None:
        """Run ``op`` in the program, then let every task run until all are blocked;
        raise what ``op`` raised."""
        box: list[BaseException | None] = []

        async def step() -> bool:
            stop = False
            try:
                with trio.fail_after(OP_LIMIT):
                    stop = bool(await op())
                    if not stop:
                        await trio.testing.wait_all_tasks_blocked()
            except Exception as exc:
                box.append(exc)
                return False
            box.append(None)
            return stop

        self._ops.append(step)
        self._pump(lambda: bool(box))
        if not box:
            self.finish()
            raise AssertionError("the Trio run ended before the rule's op did")
        if box[0] is not None:
            raise box[0]

    def finish(self, *, cancel: bool = False) -> None:
        """Pump until the run has ended (cancelling it if it hangs, or at once with
        ``cancel``); raise its error."""
        if self.outcome is None:
            if cancel:
                self._token.run_sync_soon(self._cancel)
            try:
                self._pump(lambda: False)
            finally:
                if self.outcome is None:
                    self._token.run_sync_soon(self._cancel)
                    self._pump(lambda: False)
        assert self.outcome is not None
        self.outcome.unwrap()

    def _cancel(self) -> None:
        if self._scope is not None:
            self._scope.cancel()

    def _pump(self, until: Callable[[], bool]) -> None:
        for _ in range(TICK_LIMIT):
            if until() or self.outcome is not None:
                return
            try:
                callback = self._callbacks.get(timeout=30)
            except queue.Empty:
                raise AssertionError("Trio asked for no callback for 30 s") from None
            callback()
        raise AssertionError(f"a hang: nothing done after {TICK_LIMIT} scheduler ticks")


class EngineMachine(RuleBasedStateMachine):
    """The engine under generated turns, interrupts, confirmations and timings."""

    wire = False
    """In process (False) or over the in-memory wire pair (True)."""

    def __init__(self) -> None:
        super().__init__()
        self.stepper: Stepper | None = None
        self.sessions = 0
        self.covered: set[str] = set()
        self._reset(confirm=False)

    def _reset(self, *, confirm: bool) -> None:
        """A new session: its own model, agent, Trio run and event log."""
        self.model = TurnScripts()  # its requests: this session's only
        self.confirm = confirm
        self.agent = scripted_agent(self.model, app_tools=self.wire, confirm=confirm)
        self.session: vrt.Session | None = None
        self.client: vrt.Client | None = None
        self.log: list[Any] = []
        self.changed: trio.Event | None = None
        self.nursery: trio.Nursery | None = None
        self.probe: vrt.Subscription[vrt.Event] | None = None
        """A second subscription no task reads: drained synchronously, it shows what a
        synchronous call (an interrupt) emitted before anything else ran."""
        self.probe_log: list[Any] = []
        self.inputs: list[str] = []
        self.approved: dict[str, bool] = {}
        self.answered: set[str] = set()
        self.turns: dict[str, vrt.Turn] = {}
        self.results: dict[str, vrt.TurnResult] = {}
        self.unended: set[str] = set()
        self.must_interrupt: set[str] = set()
        self.ended_after_close: str | None = None
        self.closed = False

    # -- the program ------------------------------------------------------------------------------

    @initialize(confirm=st.booleans(), schedule=st.random_module())
    def open(self, confirm: bool, schedule: Any) -> None:
        self._open(confirm)

    @precondition(lambda self: self.closed)
    @rule(confirm=st.booleans())
    def reopen(self, confirm: bool) -> None:
        """After a close, go on with a new session (a new Trio run)."""
        self._open(confirm)

    def _open(self, confirm: bool) -> None:
        self._reset(confirm=confirm)
        self.sessions += 1
        self.stepper = Stepper(self._wire if self.wire else self._in_process)
        self.stepper.run(self._noop)  # the session is open and subscribed

    async def _noop(self) -> None:
        await trio.lowlevel.checkpoint()

    async def _in_process(self, stepper: Stepper) -> None:
        async with (
            vrt.open_session(self.agent) as session,
            session.subscribe() as probe,
            trio.open_nursery() as nursery,
        ):
            self.session, self.probe, self.nursery = session, probe, nursery
            await nursery.start(self._collect, session)
            await stepper.serve()

    async def _wire(self, stepper: Stepper) -> None:
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            async with (
                open_pair(self.agent, scripted_app_tools()) as client,
                client.subscribe() as probe,
            ):
                self.client, self.probe = client, probe
                await nursery.start(self._collect, client)
                await stepper.serve()
            # leaving open_pair closed the session: the log ends with Closed

    async def _collect(
        self, source: vrt.Session | vrt.Client, *, task_status: trio.TaskStatus[None]
    ) -> None:
        self.changed = trio.Event()
        async with source.subscribe() as events:
            task_status.started()
            async for event in events:
                self.log.append(event)
                self.changed.set()
                self.changed = trio.Event()

    async def _wait(self, turn: vrt.Turn) -> None:
        try:
            self.results[turn.turn_id] = await turn.wait()
        except vrt.SessionClosed:
            self.unended.add(turn.turn_id)

    async def _at(self, seconds: float, ticks: int) -> None:
        await trio.sleep(seconds)
        for _ in range(ticks):
            await trio.lowlevel.checkpoint()

    def run(self, op: Op) -> None:
        assert self.stepper is not None
        self.stepper.run(op)

    def drain_probe(self) -> list[Any]:
        while self.probe is not None:
            try:
                self.probe_log.append(self.probe.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
        return self.probe_log

    def check_all_cancelled(self, turn_id: str | None = None) -> None:
        """Right after an interrupt, before anything else ran: every call (of the turn) that
        has started has its terminal phase (the interrupt cancels them all at once)."""
        log = self.drain_probe()
        started = {
            e.call_id
            for e in log
            if isinstance(e, vrt.ToolStream) and e.phase == P.START and turn_id in (None, e.turn_id)
        }
        ended = {e.call_id for e in log if isinstance(e, vrt.ToolStream) and e.phase in TERMINAL}
        assert started <= ended, f"open right after the interrupt: {sorted(started - ended)}"

    # -- what the log says so far -----------------------------------------------------------------

    def open_turn(self) -> str | None:
        turn_id = None
        for event in self.log:
            if isinstance(event, vrt.TurnStarted):
                turn_id = event.turn_id
            elif isinstance(event, vrt.TurnEnded):
                turn_id = None
        return turn_id

    def terminal(self) -> set[str]:
        return {
            e.call_id for e in self.log if isinstance(e, vrt.ToolStream) and e.phase in TERMINAL
        }

    def confirmations(self, *, pending: bool) -> list[vrt.ConfirmRequest]:
        done = self.terminal()
        requests = [e for e in self.log if isinstance(e, vrt.ConfirmRequest)]
        if pending:
            return [r for r in requests if r.call_id not in done and r.call_id not in self.answered]
        return [r for r in requests if r.call_id in done or r.call_id in self.answered]

    def turn_over(self, turn_id: str) -> bool:
        return any(isinstance(e, vrt.TurnEnded) and e.turn_id == turn_id for e in self.log)

    # -- rules ------------------------------------------------------------------------------------

    def _start(self, script: list[list[Any]], at: float, ticks: int) -> None:
        key = self.model.add(script)
        self.inputs.append(key)

        async def op() -> None:
            await self._at(at, ticks)
            if self.client is not None:
                await self.client.send_text(key)
                return
            assert self.session is not None
            turn = await self.session.start_turn(key)
            self.turns[turn.turn_id] = turn
            assert self.nursery is not None
            self.nursery.start_soon(self._wait, turn)

        self.run(op)

    @precondition(lambda self: not self.closed and self.open_turn() is None)
    @rule(script=SCRIPTS, at=interrupt_times(), ticks=TICKS)
    def start_turn(self, script: list[list[Any]], at: float, ticks: int) -> None:
        self._start(script, at, ticks)

    @precondition(lambda self: not self.closed and self.open_turn() is not None)
    @rule(script=SCRIPTS, at=interrupt_times(), ticks=TICKS)
    def barge_in(self, script: list[list[Any]], at: float, ticks: int) -> None:
        self._start(script, at, ticks)

    @precondition(lambda self: not self.closed)
    @rule(seconds=SECONDS)
    def advance(self, seconds: float) -> None:
        async def op() -> None:
            await trio.sleep(seconds)

        self.run(op)

    @precondition(lambda self: not self.closed)
    @rule(at=interrupt_times(), ticks=TICKS, whole_session=st.booleans())
    def interrupt(self, at: float, ticks: int, whole_session: bool) -> None:
        async def op() -> None:
            await self._at(at, ticks)
            if self.client is not None:
                self.client.interrupt()
                self.check_all_cancelled()  # every call the client has seen start
                return
            assert self.session is not None
            turn = self.session.turn
            if turn is not None and turn.state in ("generating", "awaiting"):
                self.must_interrupt.add(turn.turn_id)
            if whole_session:
                self.session.interrupt()
            elif turn is not None:
                turn.interrupt()
            elif self.turns:  # an ended turn: interrupting it does nothing
                epoch = self.session.epoch
                list(self.turns.values())[-1].interrupt()
                assert self.session.epoch == epoch, "interrupting an ended turn moved the epoch"
            if turn is not None:
                assert turn.state not in ("generating", "awaiting"), turn
                self.check_all_cancelled(turn.turn_id)

        self.run(op)

    @precondition(lambda self: not self.closed and self.confirmations(pending=True))
    @rule(index=st.integers(0, 3), approve=st.booleans())
    def answer(self, index: int, approve: bool) -> None:
        pending = self.confirmations(pending=True)
        request = pending[index % len(pending)]
        self.answered.add(request.call_id)
        self.approved[request.call_id] = approve

        async def op() -> None:
            if approve:
                await request.approve()
            else:
                await request.deny("not now")

        self.run(op)

    @precondition(lambda self: not self.closed and self.confirmations(pending=False))
    @rule(index=st.integers(0, 3), approve=st.booleans())
    def answer_too_late(self, index: int, approve: bool) -> None:
        """Answer a confirmation that was already answered, or whose call has ended."""
        stale = self.confirmations(pending=False)
        request = stale[index % len(stale)]

        async def op() -> None:
            if approve:
                await request.approve()
            else:
                await request.deny("changed my mind")

        self.run(op)  # ignored: the invariants check the call goes by the first answer

    @precondition(lambda self: not self.closed and self.open_turn() is not None)
    @rule(approve=st.booleans())
    def finish(self, approve: bool) -> None:
        """Let the open turn run to its end, answering every confirmation it asks for."""
        turn_id = self.open_turn()
        assert turn_id is not None

        async def op() -> None:
            with trio.move_on_after(FINISH_LIMIT):
                while not self.turn_over(turn_id):
                    pending = self.confirmations(pending=True)
                    for request in pending:
                        self.answered.add(request.call_id)
                        self.approved[request.call_id] = approve
                        await (request.approve() if approve else request.deny("no"))
                    if not pending:
                        assert self.changed is not None
                        await self.changed.wait()
            assert self.turn_over(turn_id), f"turn {turn_id} still open after {FINISH_LIMIT} s"

        self.run(op)

    @precondition(lambda self: not self.closed and len(self.inputs) >= 2)
    @rule(at=interrupt_times(), ticks=TICKS)
    def close(self, at: float, ticks: int) -> None:
        self._close(at, ticks)

    def _close(self, at: float, ticks: int) -> None:
        async def op() -> bool:
            await self._at(at, ticks)
            if self.session is not None:
                turn = self.session.turn
                state = turn.state if turn is not None else None
                self.session.close()
                if turn is not None:
                    try:
                        result = await turn.wait()
                    except vrt.SessionClosed:
                        pass
                    else:
                        # Trio's cancellation lands at the next checkpoint: a turn whose
                        # machine had already ended (or was unwinding an interrupt) runs its
                        # last synchronous stretch and publishes its result, though the
                        # subscribers, closed, never see its TurnEnded. No other turn may.
                        ending = {"interrupting": "interrupted"}.get(state or "", state)
                        assert result.status == ending, f"{turn} ended after the close ({state})"
                        self.ended_after_close = turn.turn_id
                try:
                    await self.session.start_turn("after close")
                except vrt.SessionClosed:
                    pass
                else:
                    raise AssertionError("a turn started on a closed session")
            return True

        self.closed = True
        self.run(op)
        assert self.stepper is not None
        self.stepper.finish()
        closed = [i for i, e in enumerate(self.log) if isinstance(e, vrt.Closed)]
        assert closed == [len(self.log) - 1], f"Closed at {closed} of {len(self.log)} events"
        assert self.log[-1].reason == "client", self.log[-1]
        assert_stream_valid(self.log)
        if self.client is not None:
            try:
                self.client.interrupt()
            except vrt.SessionClosed:
                pass
            else:
                raise AssertionError("interrupt() on a closed client")
        if self.session is not None:
            assert set(self.turns) == set(self.results) | self.unended
            assert len(self.unended) <= 1
        self.covered |= coverage(self)

    def teardown(self) -> None:
        stepper = self.stepper
        if stepper is None:
            return
        if sys.exc_info()[0] is not None:  # a step failed: end the run, check nothing more
            if stepper.outcome is None:
                with contextlib.suppress(Exception):
                    stepper.finish(cancel=True)
            return
        try:
            if not self.closed:
                self._close(0, 0)
                self.the_log_and_the_results_agree()
        finally:
            if stepper.outcome is None:  # the close failed: end the run regardless
                stepper.finish(cancel=True)
        hypothesis.event(f"sessions: {self.sessions}")
        for label in sorted(self.covered):
            hypothesis.event(label)

    # -- invariants -------------------------------------------------------------------------------

    @invariant()
    def the_log_and_the_results_agree(self) -> None:
        if self.stepper is None:
            return
        log = list(self.log)
        if not self.closed:  # the probe ends before Closed
            assert self.drain_probe() == log, "two subscriptions, two different logs"
        assert_stream_valid(log, complete=False)
        ended, streams = self._check_turns(log)
        for call_id, events in streams.items():
            self._check_call(call_id, events, ended)
        if self.session is not None:
            self._check_results(ended, streams)
            self._check_history(list(self.session.history), ended, streams, partial_last=False)
        elif self.model.requests:
            history = list(self.model.requests[-1].history)
            self._check_history(history, ended, streams, partial_last=True)

    def _check_turns(
        self, log: list[Any]
    ) -> tuple[dict[str, tuple[int, str]], dict[str, list[vrt.ToolStream]]]:
        """One turn open at a time, none failed; calls start and end inside their turn."""
        started: dict[str, int] = {}
        ended: dict[str, tuple[int, str]] = {}
        streams: dict[str, list[vrt.ToolStream]] = {}
        open_turn: str | None = None
        epoch = 0
        for index, event in enumerate(log):
            if isinstance(event, vrt.TurnStarted):
                assert open_turn is None, f"{event.turn_id} started while {open_turn} was open"
                assert event.turn_id not in started, f"{event.turn_id} started twice"
                assert event.epoch >= epoch, f"epoch went down to {event.epoch} from {epoch}"
                started[event.turn_id] = epoch = event.epoch
                open_turn = event.turn_id
            elif isinstance(event, vrt.TurnEnded):
                assert event.turn_id == open_turn, f"{event.turn_id} ended, {open_turn} was open"
                assert event.reason in ("finished", "interrupted"), event
                assert event.epoch >= epoch, f"epoch went down to {event.epoch} from {epoch}"
                epoch = event.epoch
                ended[event.turn_id] = (index, event.reason)
                open_turn = None
            elif isinstance(event, vrt.ToolStream):
                assert event.turn_id == open_turn, f"{event} outside its turn ({open_turn} open)"
                assert event.epoch == started[event.turn_id], f"{event}: not its turn's epoch"
                streams.setdefault(event.call_id, []).append(event)
        if not self.closed:
            assert len(started) == len(self.inputs), (
                f"{len(self.inputs)} inputs sent, {len(started)} turns started"
            )
        for turn_id, (_, reason) in ended.items():
            if turn_id in self.must_interrupt:
                assert reason == "interrupted", f"{turn_id} was interrupted but {reason}"
        for call_id, events in streams.items():
            turn_id = events[0].turn_id
            if turn_id in ended:
                ends = [e for e in events if e.phase in TERMINAL]
                assert len(ends) == 1, f"call {call_id} of ended {turn_id}: {len(ends)} terminals"
        return ended, streams

    def _expected(self, call_id: str) -> vrt.ToolResult | None:
        return expected_result(
            self.model.calls[call_id],
            app_tools=self.wire,
            confirm=self.confirm,
            approved=self.approved.get(call_id),
        )

    def _check_call(
        self, call_id: str, events: list[vrt.ToolStream], ended: dict[str, tuple[int, str]]
    ) -> None:
        """The stream matches the script; a settled call has the result its arguments say."""
        item = self.model.calls[call_id]
        assert call_id.startswith(f"{self.inputs_of(events[0].turn_id)}_"), call_id
        kind = "app" if self.wire and item.name == "edit" else "server"
        assert (events[0].name, events[0].kind) == (item.name, kind), events[0]
        text = item.arguments if isinstance(item.arguments, str) else json.dumps(item.arguments)
        deltas = "".join(e.delta or "" for e in events if e.phase == P.ARGUMENTS_DELTA)
        if item.stream:
            assert text.startswith(deltas), (call_id, text, deltas)
        else:
            assert not deltas, (call_id, deltas)
        for event in events:
            if event.phase == P.ARGUMENTS_COMPLETE:
                assert not truncated(item), f"{call_id} was truncated: {event}"
                assert event.arguments == parsed(item.arguments), (event, item)
            elif event.phase == P.FAILED:
                assert truncated(item), f"{call_id} failed: {event}"
            elif event.phase == P.SETTLED:
                expected = self._expected(call_id)
                assert expected is not None, f"{call_id} settled before the user answered"
                assert (event.ok, event.code) == (expected.ok, expected.code), (event, expected)
            elif event.phase == P.PROGRESS:
                assert kind == "server" and item.name in ("lookup", "charge"), event

    def inputs_of(self, turn_id: str) -> str:
        """The input (script key) that started ``turn_id``: turns start in input order."""
        number = [e.turn_id for e in self.log if isinstance(e, vrt.TurnStarted)].index(turn_id)
        return self.inputs[number]

    def _check_record(
        self, record: vrt.CallRecord, streams: dict[str, list[vrt.ToolStream]]
    ) -> None:
        """A call's one result agrees with its stream and with its arguments."""
        item = self.model.calls[record.call_id]
        assert record.name == item.name, record
        result = record.result
        events = streams.get(record.call_id)
        if events is None:
            assert self.wire, f"{record.call_id} has a result but no stream"
        else:
            end = events[-1]
            assert end.phase in TERMINAL, f"{record.call_id} has a result, its stream is open"
            if end.phase == P.SETTLED:
                assert (result.ok, result.code) == (end.ok, end.code), (record, end)
            elif end.phase == P.FAILED:
                assert result.code == vrt.ResultCode.FAILED, (record, end)
            elif not self.wire:  # over the wire the client cancels locally, first
                assert result.code == vrt.ResultCode.INTERRUPTED, (record, end)
        if result.code == vrt.ResultCode.INTERRUPTED:
            return
        expected = self._expected(record.call_id)
        assert expected is not None, f"{record} without the user's answer"
        assert (result.ok, result.code) == (expected.ok, expected.code), (record, expected)
        if result.ok:
            assert result.output == expected.output, (record, expected)

    def _check_results(
        self, ended: dict[str, tuple[int, str]], streams: dict[str, list[vrt.ToolStream]]
    ) -> None:
        """In process: each ended turn's TurnResult has one record per call, in call order."""
        for turn_id, result in self.results.items():
            if turn_id == self.ended_after_close:
                assert turn_id not in ended, f"{turn_id}: a TurnEnded after Closed"
            else:
                assert turn_id in ended, f"{turn_id} has a result but no TurnEnded"
                assert result.status == ended[turn_id][1], (result.status, ended[turn_id])
            calls = [c for c, events in streams.items() if events[0].turn_id == turn_id]
            assert [r.call_id for r in result.calls] == calls, (result.calls, calls)
            for record in result.calls:
                self._check_record(record, streams)
        for turn_id in ended:
            assert turn_id in self.results, f"{turn_id} ended, turn.wait() did not return"

    def _check_history(
        self,
        history: list[Any],
        ended: dict[str, tuple[int, str]],
        streams: dict[str, list[vrt.ToolStream]],
        *,
        partial_last: bool,
    ) -> None:
        """Every call of a turn recorded once, in call order; interrupted turns marked."""
        segments: list[tuple[models.UserInput, list[Any]]] = []
        for item in history:
            if isinstance(item, models.UserInput):
                segments.append((item, []))
            else:
                assert segments, f"{item} before any input"
                turn_id = getattr(item, "turn_id", None)  # a CallRecord has none
                assert turn_id in (None, segments[-1][0].turn_id), (item, segments[-1][0])
                segments[-1][1].append(item)
        seen: set[str] = set()
        for number, (user, items) in enumerate(segments):
            records = [i for i in items if isinstance(i, vrt.CallRecord)]
            ids = [r.call_id for r in records]
            assert not seen & set(ids), f"a call recorded twice: {seen & set(ids)}"
            seen.update(ids)
            order = [int(c.rsplit("_c", 1)[1]) for c in ids]
            assert all(c.startswith(f"{user.text}_c") for c in ids), (user, ids)
            assert order == sorted(order), f"{user.turn_id}: records out of call order: {ids}"
            marks = [i for i in items if isinstance(i, models.TurnInterrupted)]
            assert len(marks) <= 1 and (not marks or items[-1] is marks[0]), items
            last = number == len(segments) - 1
            if partial_last and last:
                continue  # the turn that asked: still running
            if user.turn_id not in ended:
                assert last and not partial_last, f"{user.turn_id} recorded, never ended"
                continue
            interrupted = ended[user.turn_id][1] == "interrupted"
            assert bool(marks) == interrupted, (user.turn_id, ended[user.turn_id], marks)
            shown = {c for c, events in streams.items() if events[0].turn_id == user.turn_id}
            if self.wire:
                assert shown <= set(ids), f"{user.turn_id}: {shown - set(ids)} not recorded"
            else:
                assert shown == set(ids), (user.turn_id, shown, ids)
                assert tuple(records) == self.results[user.turn_id].calls
            for record in records:
                self._check_record(record, streams)


def coverage(machine: EngineMachine) -> set[str]:
    """What a session covered, for ``--hypothesis-show-statistics``."""
    seen = set()
    for e in machine.log:
        if isinstance(e, vrt.ToolStream) and e.phase in TERMINAL:
            seen.add(f"a call {e.kind} {e.phase} {e.code or ''}".rstrip())
        elif isinstance(e, vrt.TurnEnded):
            seen.add(f"a turn {e.reason}")
        elif isinstance(e, vrt.ConfirmRequest):
            seen.add("a confirmation requested")
    if machine.approved:
        seen.add("a confirmation answered")
    if machine.ended_after_close:
        seen.add("a turn ended after the close")
    return seen


class WireMachine(EngineMachine):
    wire = True


def test_vrt_testing_imports_without_hypothesis() -> None:
    """The strategies import Hypothesis when one is built, not with ``vrt.testing``."""
    code = "import sys, vrt.testing; assert 'hypothesis' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


SETTINGS = settings(
    max_examples=200,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

TestInProcess = EngineMachine.TestCase
TestInProcess.settings = SETTINGS
TestWire = WireMachine.TestCase
TestWire.settings = SETTINGS
