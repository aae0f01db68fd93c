"""``vrt check``: the composed model's vocabulary, shared by its parts.

The invariants, the rules the model can break on purpose;
the layout of a state (one flat tuple, its fields named by the ``F_*`` indices); the wire
messages; :class:`Action`; and the helpers through which every machine move goes, the
compiled tables (:func:`move`, :func:`must`): a move a table refuses either means the
action is not enabled, or, where the engine would raise :class:`~vrt.InvalidTransition`,
is reported as a violation.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, Final

from vrt._core.events import Phase
from vrt._core.tables import TOOL_CALL, TURN, Table

State = tuple[Any, ...]
"""One state of the composed model: a flat tuple of the ``F_*`` fields."""

# -- the invariants -------------------------------------------------------------------------------

INVARIANTS: Final = {
    "stream": "each call's app-facing stream starts with start and has exactly one terminal "
    "(by its turn's end) unless the session closed, across handovers and crashes",
    "one-result": "each call gets at most one result on the server side: exactly one on the "
    "server that keeps the session, for the calls it knows; none from a process that adopted "
    "the session after a crash, for a call lost with the dead one",
    "epoch": "no app tool runs under a stale epoch",
    "serial": "at most one app tool runs at a time, in arrival order",
    "interrupt": "after an interrupt no call of that turn starts, nor after the app saw the "
    "turn end (a crash's interrupted end included)",
    "turn-end": "a turn ends only when all its calls are final",
    "turn-ended": "exactly one turn.ended reaches the app for the turn (by the time it is at "
    "rest) unless the session closed",
    "epochs": "at rest the server's epoch is not below the client's (else the client would "
    "refuse every call of the next turn as stale)",
    "engine": "a machine never refuses a move the engine makes unconditionally",
    "stuck": "at rest (nothing can happen but the session closing, the connection dropping, "
    "a handover or a crash), the turn has ended and no app call is queued or running",
}

#: Rules the model can break on purpose (``explore(broken=...)``), to show the checker finds it.
#: ``late-dispatch``, ``overtake`` and ``run-after-cancel`` are engine defects this checker
#: found and the engine has since fixed (each with a regression test in tests/test_races.py
#: or tests/test_wire_races.py): the model can still make them, to show it would find them
#: again. The last five break the handover and crash rules (``handover-v1``).
BREAKABLE: Final = {
    "epoch-gate": "the client admits a stale tool.call instead of answering it INTERRUPTED",
    "serial-queue": "the client begins a queued app call while another one runs",
    "view-gate": "the client shows a call's late server phases after cancelling it locally",
    "turn-wait": "the turn starts its next step before every call of the step is final",
    "late-dispatch": "an app call waiting for the app call before it, woken by that call's "
    "end inside an interrupt, still sends tool.call for itself, already cancelled (the fix: "
    "Call._run_app checks after the wait)",
    "overtake": "an app call waits only for the app call created just before it, so when "
    "that one ends unsent (abandoned, declined) it can overtake an earlier call still in its "
    "hook (the fix: the session's app_line, every earlier app call first)",
    "run-after-cancel": "the client keeps a queued app call whose terminal phase it already "
    "showed and runs it if the running call ends before tool.abort arrives (the fix: a "
    "terminal phase drops the queued call as tool.abort would)",
    "handover-mid-turn": "the server hands the session over while its turn is open: the new "
    "process restores the state exactly, but the turn's tasks (the model's stream, the "
    "running tools) died with the old one, so nothing ends the turn or its calls",
    "crash-no-cancel": "after a crash, the adopting server sends no cancelled for the calls "
    "the client reports open",
    "crash-result": "after a crash, the adopting server records a result (INTERRUPTED) of its "
    "own for each call the client reports open that it does not know",
    "no-dedupe": "the client hands the app a turn.ended for a turn it already saw end",
    "ack-unsaved": "the server acks what it has processed but not yet saved, so after its "
    "crash the client no longer holds those messages to replay to the adopting server",
}


class Broken(Exception):
    """An invariant failed; raised from inside an action or by the check at rest."""

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"{invariant}: {detail}")
        self.invariant = invariant
        self.detail = detail


# -- the state -----------------------------------------------------------------------------------

# server
F_TURN = 0  # Turn machine state
F_FIRST = 1  # index of the current model step's first call
F_SEPOCH = 2  # the server's epoch
F_SESSION = 3  # Session machine state
F_CALLS = 4  # per call, in call order: (kind, ToolCall state, streamed, task, results)
# network
F_S2C = 5  # messages server -> client not yet processed (in flight or awaiting replay)
F_C2S = 6  # messages client -> server, the same
F_DEAD = 7  # the socket died (the client noticed); the server has yet to notice it
# client
F_CONN = 8  # Connection machine state
F_CEPOCH = 9  # the client's epoch
F_CLIENT = 10  # per call: (CallView state | None, ignored, AppCall state | None, shown)
F_QUEUE = 11  # app calls admitted, in arrival order
F_RUNNING = 12  # app calls whose tool runs in the app (at most one unless broken)
F_LAST_BEGUN = 13  # the last app call the client began (-1: none)
# bounds spent
F_USER_INTERRUPTS = 14
F_SERVER_INTERRUPTS = 15
F_DROPS = 16
# handover-v1: the store, and what a crash or a handover changes
F_SAVED = 17  # the server's state as last saved, at a turn boundary: START_SAVED, LIVE, or
# (turn, first, epoch, calls) when a broken rule needs the copy
F_SAVED_S2C = 18  # how many of F_S2C's first messages the saved replay buffer holds
F_SINCE = 19  # the interrupts the server processed since its last save (the client keeps them)
F_MOVEMENT = 20  # the Movement machine's state of the process that runs the session (the
# old process's final move, then the new one's first: like F_SESSION)
F_TURN_SEEN = 21  # client: how many turn.ended the app saw
F_HANDOVERS = 22  # bounds spent
F_CRASHES = 23

# a server call record
C_KIND, C_TC, C_STREAMED, C_TASK, C_RESULTS = range(5)
DELTA_SENT, PROGRESS_SENT = 1, 2  # bits of C_STREAMED: at most one of each per call

# the server task of a call (Call.run in the turn's nursery)
NONE = "-"  # no task (arguments still streaming, or the call's task has ended)
HOOK = "hook"  # started at arguments-complete: before_tool_call decides
EXEC = "exec"  # a server tool runs
WAIT = "wait"  # an app call waits for the app call before it to end
PENDING = "pending"  # tool.call sent, waiting for tool.result (or the timeout)
LATE = "late"  # cancelled by an interrupt but already woken: sends tool.call (late-dispatch)
UNWIND = "unwind"  # cancelled with tool.call unanswered: its finally sends tool.abort


# a client call record
V_VIEW, V_IGNORED, V_APP, V_SHOWN = range(4)
SHOWN_NOTHING, SHOWN_OPEN, SHOWN_ENDED = 0, 1, 2  # the app-facing stream, compressed

TURN_EPOCH: Final = 0  # the single modelled turn runs in epoch 0
LIVE_TURN: Final = frozenset({"generating", "awaiting"})
TERMINAL: Final = frozenset({Phase.SETTLED.value, Phase.CANCELLED.value, Phase.FAILED.value})
VIEW_EVENT: Final = {
    Phase.ARGUMENTS_DELTA.value: "delta",
    Phase.ARGUMENTS_COMPLETE.value: "complete",
    Phase.PROGRESS.value: "progress",
    Phase.SETTLED.value: "settle",
    Phase.CANCELLED.value: "cancel",
    Phase.FAILED.value: "fail",
}

START_SAVED: Final = (TURN.initial, 0, TURN_EPOCH, ())
"""F_SAVED when the modelled turn started (input recorded, ``turn.started`` sent, no call
yet): the first boundary."""
LIVE: Final = "live"
"""F_SAVED once the turn's end is saved (or no crash can come any more): the saved state is
the live one, up to what the client replays (see ``ServerRules._saved``)."""

Message = tuple[Any, ...]
"""``("stream", i, phase)``, ``("call", i)``, ``("abort", i)``, ``("ended", epoch, reason)``,
``("closed",)`` from the server; ``("result", i)``, ``("interrupt", epoch)`` from the client."""


def move(table: Table, state: str, event: str) -> str | None:
    """The table's target for ``event`` in ``state``, or None if the machine refuses."""
    return table.transitions.get((state, event))


def must(table: Table, state: str, event: str, why: str) -> str:
    """A move the engine makes unconditionally: a refusal is a violation (it would raise)."""
    target = table.transitions.get((state, event))
    if target is None:
        raise Broken("engine", f"{table.name} refuses {event!r} in {state!r} ({why})")
    return target


def name(i: int) -> str:
    """The engine's id for the model's call ``i`` (0-based): ``call_1``, ``call_2``..."""
    return f"call_{i + 1}"


def describe(message: Message) -> str:
    """A wire message, as a trace shows it."""
    kind = message[0]
    if kind == "stream":
        return f"tool.stream {name(message[1])} {message[2]}"
    if kind == "call":
        return f"tool.call {name(message[1])} (epoch {TURN_EPOCH})"
    if kind == "abort":
        return f"tool.abort {name(message[1])}"
    if kind == "ended":
        return f"turn.ended {message[2]} (epoch {message[1]})"
    if kind == "result":
        return f"tool.result {name(message[1])} (epoch {TURN_EPOCH})"
    if kind == "interrupt":
        return f"interrupt (epoch {message[1]})"
    return str(kind)


CLIENT, SERVER = "client", "server"
WINDOW = True  # an action that may happen while the connection is down (see Model.down)
ENV = True  # the environment's: always possible, it is no progress (see Model.check_at_rest)


class Action:
    """One named action of one side: ``run(state)`` is the next state, or None when not
    enabled. ``window``: it may happen while the connection is down; ``env``: it is the
    environment's, no progress; ``ample``: it belongs to the client's ample set too (it
    interferes with the client's actions, see :meth:`Model.client_first`)."""

    __slots__ = ("ample", "env", "label", "run", "side", "window")

    def __init__(
        self,
        side: str,
        label: str | Callable[[State], str],
        run: Callable[[State], State | None],
        window: bool = False,
        env: bool = False,
        ample: bool = False,
    ) -> None:
        self.side = side
        self.label = label
        self.run = run
        self.window = window
        self.env = env
        self.ample = ample

    def describe(self, state: State) -> str:
        """What this action does from ``state``, as a trace step."""
        return self.label if isinstance(self.label, str) else self.label(state)


class Rules:
    """The bounds and rule switches every part of the model reads (set by the Model)."""

    calls: int
    drops: int
    phases: bool
    user_interrupts: int
    server_interrupts: int
    handovers: int
    crashes: int
    broken: str | None
    movement: Table
    """The Movement machine the model composes (its class's table, or a variant)."""
    late_dispatch: bool
    overtake: bool
    run_after_cancel: bool


def put(items: tuple[Any, ...], i: int, value: Any) -> tuple[Any, ...]:
    """``items`` with item ``i`` replaced by ``value``."""
    return (*items[:i], value, *items[i + 1 :])


def end_call(calls: list[Any], s2c: list[Any], i: int, event: str, phase: str, task: str) -> None:
    """Call._end: the ToolCall's final move, its one result, its terminal phase."""
    kind, tc, streamed, _, results = calls[i]
    target = must(TOOL_CALL, tc, event, f"{name(i)} ends")
    if results:
        raise Broken("one-result", f"{name(i)} gets a second result")
    calls[i] = (kind, target, streamed, task, results + 1)
    s2c.append(("stream", i, phase))


def all_final(calls: tuple[Any, ...]) -> bool:
    """Whether every call's ToolCall is in a final state."""
    return all(record[C_TC] in TOOL_CALL.finals for record in calls)


def turn_ends(turn: str, event: str, calls: Collection[Any]) -> str:
    """The turn's final move; the check of "a turn ends only when all its calls are final"."""
    for i, record in enumerate(calls):
        if record[C_TC] not in TOOL_CALL.finals:
            raise Broken("turn-end", f"the turn ends ({event}) while {name(i)} is {record[C_TC]}")
    return must(TURN, turn, event, "the turn ends")


def show(i: int, shown: int, phase: str) -> int:
    """The app sees ``phase`` of call ``i``: the check of the app-facing stream."""
    if phase == Phase.START.value:
        if shown != SHOWN_NOTHING:
            raise Broken("stream", f"the app sees a second start for {name(i)}")
        return SHOWN_OPEN
    if shown == SHOWN_NOTHING:
        raise Broken("stream", f"the app sees {phase} for {name(i)} before its start")
    if shown == SHOWN_ENDED:
        raise Broken("stream", f"the app sees {phase} for {name(i)} after its terminal phase")
    return SHOWN_ENDED if phase in TERMINAL else SHOWN_OPEN
