"""``vrt check``: the realtime model's vocabulary, shared by its parts.

The invariants and the rules the model can break on purpose; the layout of a state (one
flat tuple of the ``S_*`` fields; a turn is a ``T_*`` record, a call a ``C_*`` record, a
response an ``R_*`` record); the names a trace gives calls, turns and channel items; the
helpers that change a record; and what the model's server knows (:func:`stale`,
:func:`unwanted`), against which the invariants judge the driver.
"""

from __future__ import annotations

from typing import Any, Final

from vrt.check._state import State, put

REALTIME_INVARIANTS: Final = {
    "create": "a response.create only while no response is active, requested or being "
    "cancelled (Upstream idle, the one state its class allows create from), and never for "
    "a turn after its interrupt",
    "cancel": "a response.cancel only while a response is active (Upstream responding, or "
    "an unwanted one that has just started), never for one the model has ended",
    "one-answer": "a call gets at most one answer upstream, none unless the model completed "
    "it (none for a call cut mid-arguments), and no answer claims success for a call that did "
    "not run",
    "answered": "at rest, every call the model completed has its answer upstream (INTERRUPTED "
    "ones included): with one-answer, exactly one",
    "stale": "no call runs unless the model completed it in time: none of a response "
    "already ended, unwanted or cancelled, none cut mid-arguments; a call id runs at most "
    "once per session",
    "turn-end": "a turn ends only when all its calls are final",
    "engine": "a machine never refuses a move the engine makes unconditionally",
    "stuck": "at rest (nothing can happen but the model's and the app's own moves and "
    "connection loss), every turn has ended and the Upstream is idle",
}
"""The realtime model's invariants, as :data:`vrt.check.INVARIANTS` names the turn's."""

#: Rules the realtime model can break on purpose (``explore_realtime(broken=...)``).
REALTIME_BREAKABLE: Final = {
    "create-after-interrupt": "the end of an interrupted turn answers its calls with a "
    "request for the next response (response.create), as a step's end does",
    "item-done": "a call cut mid-arguments runs: its item's done is taken as its completion "
    "without checking the item completed (LiveKit's bug)",
    "keep-late": "events of a response already ended or no longer wanted are not dropped: "
    "a late call feeds the current step and runs",
    "answer-twice": "a call cancelled by an interrupt is answered at once (INTERRUPTED), "
    "and again with its turn's results",
}

# -- the state -----------------------------------------------------------------------------------

# the driver (vrt/_engine/realtime.py, Upstream)
S_UP = 0  # the Upstream machine's state
S_ACTIVE = 1  # _active: the response the machine holds open (0: none)
S_FEED = 2  # _feed: the turn whose step channel the active response feeds (-1: none)
S_AWAITING = 3  # _awaiting: the turn whose request waits for its response (-1: none)
S_OVER = 4  # _over: responses ended or unwanted (a frozenset of ids)
S_LIVE = 5  # _live_calls: calls of the active response started (a frozenset)
S_COMPLETED = 6  # _completed: calls the model completed, not answered (a frozenset)
S_IDS = 7  # _call_ids: calls seen this session (a frozenset)
S_BROKEN = 8  # _broken: a turn whose connection was lost between two steps (-1: none)
# the session
S_CURRENT = 9  # session.turn (-1: none)
S_TURNS = 10  # a T_* record per turn, in the order they opened
S_CALLS = 11  # a C_* record per call id (call_1 first)
# the model's server
S_SERVER = 12  # its open response (0: none)
S_RESPONSES = 13  # an R_* record per response it began (response i + 1 at index i)
S_OWED = 14  # the creates it has not yet answered with a response: whether each is unwanted
# bounds spent
S_TEXTS = 15
S_LATE = 16  # calls the model started after their response's done
S_DROPS = 17

# a turn record: its machine, where its task is, its step's channel (what waits in it;
# whether its receiving end is open), the turn it waits for, calls made this step, its step
T_MACHINE, T_PC, T_QUEUE, T_AFTER, T_RX, T_MADE, T_STEP = range(7)
# where a turn's task is (T_PC)
AFTER = "after"  # a model's own turn waits for the turn it cut to end (_after.wait)
REQ = "req"  # a text turn whose task has not yet run its first step
WAIT_IDLE = "wait-idle"  # _request waits for the machine to allow create (_changed.wait)
WOKEN = "woken"  # ... woken by a move, rescheduled: it checks the state again, no checkpoint
CONSUME = "consume"  # the step takes its response's events from its channel
CALLS = "calls"  # step_done: waits for every call of the step to be final
FAILING = "failing"  # the step failed (ModelError): waits for the calls, then error
ENDED = "ended"
ENDED_TURN: Final = "ended"  # T_MACHINE of an ended turn: which final state is not read again
# items in a step's channel: ("start", call, stale), ("end", call, stale), ("done",) (_END),
# ("fail",) (_Failed: the connection was lost), ("closed",) (the sender closed it: EndOfChannel)

# a call record: its turn (-1: no turn took its start), ToolCall, task, whether its tool ran,
# whether its record is in the history, why its CallEnd came too late to run it ("": it did
# not), its answers upstream (this connection), what the model did with it, in which response
C_TURN, C_TC, C_TASK, C_RAN, C_RECORDED, C_STALE, C_ANSWERS, C_MODEL, C_RESPONSE = range(9)
NO_TASK, ISSUED, RUNNING = "-", "issued", "running"
# what the model did with the call (C_MODEL), in the response C_RESPONSE
UNBORN = "unborn"
STARTED = "started"  # started, arguments streaming
COMPLETED = "completed"  # its arguments completed before its response's done
CUT = "cut"  # its response ended first: the item is incomplete
LATE = "late"  # started after its response's done (late delivery)
GONE = "gone"  # its connection was lost (the next model session is seeded from the history)

# a response record (the model's truth): open, over or dead; who cancelled it (NOT_CANCELLED,
# BY_DRIVER: it may still send what it made before it read the cancel, BY_MODEL: its own voice
# detector stopped it, nothing more comes but its done); whether it is unwanted (asked for, and
# the app or the user interrupted since); whether it answers a create; whether it may carry
# content (past the bound, an asked-for response is empty)
R_STATE, R_CANCELLED, R_UNWANTED, R_FOR_CREATE, R_CONTENT = range(5)
NOT_CANCELLED, BY_DRIVER, BY_MODEL = "", "driver", "model"
ENDED_RESPONSE: Final = (NOT_CANCELLED, False, False)  # R_CANCELLED..R_FOR_CREATE, once not open
OPEN, OVER, DEAD = "open", "over", "dead"  # DEAD: lost with its connection, nothing more comes

LIVE_TURN: Final = frozenset({"generating", "awaiting"})
DOWN: Final = frozenset({"connecting", "lost", "closed"})


def call_name(c: int) -> str:
    """The model's id for call ``c`` (0-based): ``call_1``, ``call_2``..."""
    return f"call_{c + 1}"


def turn_name(t: int) -> str:
    """The engine's id for turn ``t`` (0-based): ``t_1``, ``t_2``..."""
    return f"t_{t + 1}"


def describe(item: tuple[Any, ...]) -> str:
    """An item of a step's channel, as a turn's label names it."""
    if item[0] == "start":
        return f"CallStart {call_name(item[1])}"
    if item[0] == "end":
        return f"CallEnd {call_name(item[1])}"
    if item[0] == "done":
        return "the response's end"
    if item[0] == "closed":
        return "the end of its closed channel"
    return "the connection's loss (ModelError)"


def _set(w: list[Any], slot: int, i: int, index: dict[str, int], fields: dict[str, Any]) -> None:
    """Record ``i`` of the tuple at ``w[slot]`` with ``fields`` changed (``index``: each
    field's position)."""
    record = list(w[slot][i])
    for key, value in fields.items():
        record[index[key]] = value
    w[slot] = put(w[slot], i, tuple(record))


def set_turn(w: list[Any], t: int, **fields: Any) -> None:
    """Turn ``t`` with ``fields`` changed."""
    _set(w, S_TURNS, t, _T_INDEX, fields)


def set_call(w: list[Any], c: int, **fields: Any) -> None:
    """Call ``c`` with ``fields`` changed."""
    _set(w, S_CALLS, c, _C_INDEX, fields)


def set_response(w: list[Any], r: int, **fields: Any) -> None:
    """Response ``r`` (1-based) with ``fields`` changed."""
    _set(w, S_RESPONSES, r - 1, _R_INDEX, fields)


def calls_of(w: list[Any] | State, t: int) -> list[int]:
    """The calls turn ``t`` took."""
    return [c for c, record in enumerate(w[S_CALLS]) if record[C_TURN] == t]


def stale(w: list[Any], c: int, r: int) -> str:
    """Why an event of call ``c`` from response ``r`` comes too late to run it ("" if
    it does not): the model's truth, not the driver's belief."""
    if w[S_CALLS][c][C_MODEL] == CUT:
        return "the model cut it mid-arguments"
    response = w[S_RESPONSES][r - 1]
    if response[R_STATE] != OPEN:
        return f"resp_{r} had ended"
    if response[R_CANCELLED]:
        return f"resp_{r} was cancelled"
    if response[R_UNWANTED]:
        return f"resp_{r} was unwanted (asked for before an interrupt)"
    return ""


def unwanted(w: list[Any]) -> None:
    """The app or the user interrupted: what was asked for before is unwanted, the
    responses not begun yet and the open one if it answers a create."""
    w[S_OWED] = (True,) * len(w[S_OWED])
    r = w[S_SERVER]
    if r and w[S_RESPONSES][r - 1][R_FOR_CREATE]:
        set_response(w, r, unwanted=True)


_T_INDEX: Final = {
    "machine": T_MACHINE,
    "pc": T_PC,
    "queue": T_QUEUE,
    "after": T_AFTER,
    "rx": T_RX,
    "made": T_MADE,
    "step": T_STEP,
}
_C_INDEX: Final = {
    "turn": C_TURN,
    "tc": C_TC,
    "task": C_TASK,
    "ran": C_RAN,
    "recorded": C_RECORDED,
    "stale": C_STALE,
    "answers": C_ANSWERS,
    "model": C_MODEL,
    "response": C_RESPONSE,
}
_R_INDEX: Final = {
    "state": R_STATE,
    "cancelled": R_CANCELLED,
    "unwanted": R_UNWANTED,
    "for_create": R_FOR_CREATE,
    "content": R_CONTENT,
}
