"""``vrt check``: the engine's actions in the realtime model: each turn's task, each call's
task and the driver's reconnect.

Each is one of the model's actions, the state in, the next state out (None: not enabled);
those that move a turn or the Upstream act through the driver's rules
(:class:`~vrt.check._realtime_driver.Driver`), which the model binds. A turn's task takes
its step's events, waits for its calls, asks for the next response, fails or unwinds; a
call's task runs its tool (the check of the stale rule), then returns.
"""

from __future__ import annotations

from vrt._core.tables import TOOL_CALL, TURN
from vrt.check._realtime_driver import Driver
from vrt.check._realtime_state import (
    C_RAN,
    C_STALE,
    C_TASK,
    C_TC,
    C_TURN,
    CALLS,
    CONSUME,
    FAILING,
    ISSUED,
    LIVE_TURN,
    NO_TASK,
    REQ,
    RUNNING,
    S_CALLS,
    S_TURNS,
    S_UP,
    T_MACHINE,
    T_MADE,
    T_PC,
    T_QUEUE,
    T_STEP,
    WAIT_IDLE,
    WOKEN,
    call_name,
    calls_of,
    set_call,
    set_turn,
)
from vrt.check._state import Broken, State, must

# -- the turns' tasks -------------------------------------------------------------------------


def take(driver: Driver, t: int, s: State) -> State | None:
    """The turn's step takes the next event from its channel (Turn._step_events);
    an interrupted turn takes nothing more (its scope is cancelled)."""
    if t >= len(s[S_TURNS]):
        return None
    record = s[S_TURNS][t]
    if record[T_MACHINE] not in LIVE_TURN or record[T_PC] != CONSUME or not record[T_QUEUE]:
        return None
    w = list(s)
    item = record[T_QUEUE][0]
    set_turn(w, t, queue=record[T_QUEUE][1:])
    kind = item[0]
    if kind == "start":
        c = item[1]
        if w[S_CALLS][c][C_TURN] >= 0:  # session.seen_call_id: "already used"
            driver.fail_step(w, t)
        else:
            set_call(w, c, turn=t, tc=TOOL_CALL.initial)
            set_turn(w, t, made=True)
    elif kind == "end":
        c = item[1]
        call = w[S_CALLS][c]
        if call[C_TURN] != t or call[C_TC] in TOOL_CALL.finals:
            driver.fail_step(w, t)  # "end of unknown call"
        else:
            tc = must(TOOL_CALL, call[C_TC], "complete", f"{call_name(c)}'s CallEnd")
            set_call(w, c, tc=tc, task=ISSUED, stale=item[2])
    elif kind in ("done", "closed"):  # the end, or EndOfChannel: the step returns
        driver.abandon(w, t)
        set_turn(w, t, rx=False)
        if not w[S_TURNS][t][T_MADE]:
            driver.finish(w, t, "finish")
        else:
            machine = must(TURN, record[T_MACHINE], "step_done", "the step's stream ended")
            set_turn(w, t, machine=machine, pc=CALLS)
    else:
        driver.fail_step(w, t)
    return tuple(w)


def turn_acts(driver: Driver, t: int, s: State) -> State | None:
    """Turn ``t``'s task takes its next step, the one its place allows (a turn's task
    has at most one thing it can do at a time)."""
    if t >= len(s[S_TURNS]):
        return None
    record = s[S_TURNS][t]
    pc = record[T_PC]
    if pc == WOKEN:
        return woken(driver, t, s)
    if record[T_MACHINE] == "interrupting":
        return unwound(driver, t, s)
    if pc == CONSUME:
        return take(driver, t, s)
    if pc == REQ:
        return text_runs(driver, t, s)
    if pc == CALLS:
        return next_step(driver, t, s)
    if pc == WAIT_IDLE:
        return request_timeout(driver, t, s)
    if pc == FAILING:
        return fail(driver, t, s)
    return None


def text_runs(driver: Driver, t: int, s: State) -> State | None:
    """A text turn's task runs its first step: Upstream.step, _request."""
    if t >= len(s[S_TURNS]):
        return None
    record = s[S_TURNS][t]
    if record[T_PC] != REQ or record[T_MACHINE] not in LIVE_TURN:
        return None
    w = list(s)
    driver.step(w, t)
    return tuple(w)


def next_step(driver: Driver, t: int, s: State) -> State | None:
    """Every call of the step is final: the results go in the history, the next step
    asks for the model's next response (a turn with a step without calls finished)."""
    if t >= len(s[S_TURNS]):
        return None
    record = s[S_TURNS][t]
    if record[T_PC] != CALLS or record[T_MACHINE] not in LIVE_TURN:
        return None
    if any(s[S_CALLS][c][C_TC] not in TOOL_CALL.finals for c in calls_of(s, t)):
        return None
    w = list(s)
    driver.flush(w, t)
    machine = must(TURN, record[T_MACHINE], "next_step", "every call is final")
    set_turn(w, t, machine=machine, step=record[T_STEP] + 1, made=False)
    driver.step(w, t)
    return tuple(w)


def woken(driver: Driver, t: int, s: State) -> State | None:
    """A request woken by a move checks for an interrupt since (the checkpoint after
    the wait: Cancelled, the turn unwinds), then the state again: idle, it goes on, else
    it waits."""
    if t >= len(s[S_TURNS]) or s[S_TURNS][t][T_PC] != WOKEN:
        return None
    w = list(s)
    if s[S_TURNS][t][T_MACHINE] not in LIVE_TURN:
        set_turn(w, t, pc=WAIT_IDLE)  # cancelled: nothing more but unwinding
        return tuple(w)
    driver.request(w, t)
    return tuple(w)


def request_timeout(driver: Driver, t: int, s: State) -> State | None:
    """No move lets the request go within the model's timeout: ModelError."""
    if t >= len(s[S_TURNS]):
        return None
    record = s[S_TURNS][t]
    if record[T_PC] != WAIT_IDLE or record[T_MACHINE] not in LIVE_TURN:
        return None
    w = list(s)
    driver.fail_step(w, t)
    return tuple(w)


def fail(driver: Driver, t: int, s: State) -> State | None:
    """The failed step's calls are all final: the Turn ``error``."""
    if t >= len(s[S_TURNS]):
        return None
    record = s[S_TURNS][t]
    if record[T_PC] != FAILING or record[T_MACHINE] not in LIVE_TURN:
        return None
    if any(s[S_CALLS][c][C_TC] not in TOOL_CALL.finals for c in calls_of(s, t)):
        return None
    w = list(s)
    driver.finish(w, t, "error")
    return tuple(w)


def unwound(driver: Driver, t: int, s: State) -> State | None:
    """The interrupted turn's tasks have exited (each at its next checkpoint; a request
    already woken goes on first): ``unwound``."""
    if t >= len(s[S_TURNS]):
        return None
    record = s[S_TURNS][t]
    if record[T_MACHINE] != "interrupting" or record[T_PC] == WOKEN:
        return None
    w = list(s)
    driver.finish(w, t, "unwound")
    return tuple(w)


# -- the calls' tasks -------------------------------------------------------------------------


def tool_starts(c: int, s: State) -> State | None:
    """The call's task runs its tool (``allow``): the check of the stale rule."""
    record = s[S_CALLS][c]
    if record[C_TASK] != ISSUED or record[C_TC] != "issued":
        return None
    if record[C_STALE]:
        raise Broken("stale", f"{call_name(c)} runs, but {record[C_STALE]}")
    if record[C_RAN]:
        raise Broken("stale", f"{call_name(c)} runs a second time")
    w = list(s)
    tc = must(TOOL_CALL, record[C_TC], "allow", "the tool runs")
    set_call(w, c, tc=tc, task=RUNNING, ran=True, stale="")
    return tuple(w)


def tool_returns(c: int, s: State) -> State | None:
    """The tool returns: ``finish``, settled."""
    record = s[S_CALLS][c]
    if record[C_TASK] != RUNNING or record[C_TC] != "running":
        return None
    w = list(s)
    tc = must(TOOL_CALL, record[C_TC], "finish", "the tool returned")
    set_call(w, c, tc=tc, task=NO_TASK)
    return tuple(w)


# -- the connection ---------------------------------------------------------------------------


def reconnect(driver: Driver, s: State) -> State | None:
    """Link.run connects again after its backoff (Upstream.retrying: ``reconnect``)."""
    if s[S_UP] != "lost":
        return None
    w = list(s)
    driver.up(w, "reconnect")
    return tuple(w)
