"""``vrt check``: the realtime model, a session's connection to a realtime speech-to-speech
model (vrt/_engine/realtime.py) and the turns its responses make.

:mod:`vrt.check` documents what is modelled and what is abstracted. The transition
relation is the real machine classes through their compiled tables (the Upstream, a Turn
per turn, a ToolCall per call) and a model of the driver's rules around them, written as
``vrt/_engine/realtime.py`` implements them (its method names appear in the docstrings
below), and of a realtime model's server: permissive (anything it may send, in any
order, within the bounds), with the quirks real servers have, and truthful about what it
did (which response is open, which call it completed or cut), so the invariants judge
the driver against what really happened, not against what the driver believed.

The state is one flat tuple of the ``S_*`` fields; a turn is a ``T_*`` record, a call a
``C_*`` record, a response an ``R_*`` record. Messages from the model reach the driver at
once, in order (the driver's reader handles each to its end before the next): a message in
flight is one the model sends later, which the permissive model covers (it may go on
with a response it was told to cancel, until its ``done``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any, Final

from vrt._core.tables import TOOL_CALL, TURN, UPSTREAM, Table
from vrt.check._state import Action, Broken, State, move, must, put

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
_ENDED: Final = (NOT_CANCELLED, False, False)  # R_CANCELLED..R_FOR_CREATE, once not open
OPEN, OVER, DEAD = "open", "over", "dead"  # DEAD: lost with its connection, nothing more comes

LIVE_TURN: Final = frozenset({"generating", "awaiting"})
DOWN: Final = frozenset({"connecting", "lost", "closed"})


def call_name(c: int) -> str:
    """The model's id for call ``c`` (0-based): ``call_1``, ``call_2``..."""
    return f"call_{c + 1}"


def turn_name(t: int) -> str:
    """The engine's id for turn ``t`` (0-based): ``t_1``, ``t_2``..."""
    return f"t_{t + 1}"


def _describe(item: tuple[Any, ...]) -> str:
    if item[0] == "start":
        return f"CallStart {call_name(item[1])}"
    if item[0] == "end":
        return f"CallEnd {call_name(item[1])}"
    if item[0] == "done":
        return "the response's end"
    if item[0] == "closed":
        return "the end of its closed channel"
    return "the connection's loss (ModelError)"


class RealtimeModel:
    """The realtime model for one set of bounds and rules (see :mod:`vrt.check`)."""

    def __init__(
        self,
        calls: int = 2,
        responses: int = 2,
        *,
        late: int = 1,
        drops: int = 1,
        texts: int = 0,
        broken: str | None = None,
        upstream: Table = UPSTREAM,
    ) -> None:
        if min(calls, responses, late, drops, texts) < 0:
            raise ValueError("bounds must not be negative")
        if broken is not None and broken not in REALTIME_BREAKABLE:
            raise ValueError(f"unknown rule {broken!r}; breakable: {', '.join(REALTIME_BREAKABLE)}")
        self.calls, self.responses, self.late = calls, responses, late
        self.drops, self.texts = drops, texts
        self.broken = broken
        self.upstream = upstream
        self.actions: list[Action] = self._actions()

    # -- the search's interface -------------------------------------------------------------------

    def initial(self) -> State:
        """The session is open, its model session set up (Upstream ``idle``), no turn yet."""
        up = must(self.upstream, self.upstream.initial, "ready", "the model session is set up")
        blank = (-1, None, NO_TASK, False, False, "", 0, UNBORN, 0)
        none: frozenset[int] = frozenset()
        return (
            up, 0, -1, -1, none, none, none, none, -1,
            -1, (), (blank,) * self.calls,
            0, (), (),
            0, 0, 0,
        )  # fmt: skip

    def canonical(self, s: State) -> State:
        """``s`` with what no action reads again reset, so that states that differ only
        there are one. The actions themselves forget most of it (how a turn ended, the
        channel of one that takes nothing more, ``_forget_live``, what a response was once
        it ended, why a call came late once it is final, whether a cancelled call had
        started running); here, whether the channel of an ended turn is open once neither
        the feed nor the awaiting request points to it (nothing can point to it again)."""
        feed, awaiting = s[S_FEED], s[S_AWAITING]
        turns = s[S_TURNS]
        for t, record in enumerate(turns):
            if record[T_RX] and record[T_PC] == ENDED and t != feed and t != awaiting:
                break
        else:
            return s
        w = list(s)
        w[S_TURNS] = tuple(
            (*r[:T_RX], False, *r[T_RX + 1 :])
            if r[T_RX] and r[T_PC] == ENDED and t != feed and t != awaiting
            else r
            for t, r in enumerate(turns)
        )
        return tuple(w)

    def subsume(self, s: State) -> State:
        """No reduction: every state stands for itself."""
        return s

    def down(self, s: State) -> bool:
        """No reduction."""
        return False

    def client_first(self, s: State) -> bool:
        """No reduction."""
        return False

    def server_first(self, s: State) -> bool:
        """No reduction."""
        return False

    def marks(self, s: State) -> tuple[bool, bool]:
        """Whether ``s`` comes after a connection loss, and after a text turn opened."""
        return bool(s[S_DROPS]), bool(s[S_TEXTS])

    def check_at_rest(self, s: State) -> None:
        """Raise :class:`Broken` if a state at rest breaks an end-state rule."""
        for c, record in enumerate(s[S_CALLS]):
            if record[C_MODEL] == COMPLETED and record[C_ANSWERS] != 1:
                raise Broken(
                    "answered",
                    f"the model completed {call_name(c)}, which ends with "
                    f"{record[C_ANSWERS]} answers upstream",
                )
        for t, record in enumerate(s[S_TURNS]):
            if record[T_PC] != ENDED:
                raise Broken("stuck", f"at rest, but {turn_name(t)} is {record[T_MACHINE]}")
        if s[S_UP] != "idle":
            raise Broken("stuck", f"at rest, but the Upstream is {s[S_UP]}")

    # -- the actions ------------------------------------------------------------------------------

    def _actions(self) -> list[Action]:
        p = functools.partial
        model, app, engine = "model", "app", "engine"
        out = [
            Action(model, "model: starts the response asked for", p(self.begin, True, True)),
            Action(
                model,
                "model: starts the response asked for, without response.created",
                p(self.begin, True, False),
            ),
            Action(
                model, "model: starts a response on its own", p(self.begin, False, True), env=True
            ),
            Action(
                model,
                "model: starts a response on its own, without response.created",
                p(self.begin, False, False),
                env=True,
            ),
            Action(model, self._label_call_start, self.call_start, env=True),
        ]
        for c in range(self.calls):
            n = call_name(c)
            out += [
                Action(model, f"model: completes {n}'s arguments", p(self.call_end, c), env=True),
                Action(model, p(self._label_late, c, "start"), p(self.late_start, c), env=True),
                Action(model, p(self._label_late, c, "end"), p(self.late_end, c), env=True),
                Action(engine, f"tool: {n} starts running", p(self.tool_starts, c)),
                Action(engine, f"tool: {n} returns", p(self.tool_returns, c)),
            ]
        out += [
            Action(model, "model: sends audio of its open response", self.audio, env=True),
            Action(model, self._label_done, self.done),
            Action(
                model, "model: hears the user start speaking (speech-start)", self.speech, env=True
            ),
        ]
        out += [
            Action(model, self._label_late_done, self.late_done, env=True),
            Action(model, self._label_late_audio, self.late_audio, env=True),
        ]
        out += [
            Action(engine, p(self._label_turn, t), p(self.turn_acts, t))
            for t in range(self._max_turns())
        ]
        out += [
            Action(app, "app: interrupts (session.interrupt)", self.app_interrupt, env=True),
            Action(app, "app: sends a text (session.start_turn)", self.app_text, env=True),
            Action(engine, "network: the model's connection drops", self.drop, env=True),
            Action(engine, "engine: connects again (reconnect)", self.reconnect),
            Action(model, "model: the new session is set up (ready, seeded)", self.ready),
        ]
        return out

    def _max_responses(self) -> int:
        """Response ids the model may use: ``responses`` with content, and empty ones the
        driver asked for past the bound (each request needs a step or a text turn)."""
        return self.responses + self.calls + self.texts + 1

    def _max_turns(self) -> int:
        """Turns that may open: one per response at most, and the texts."""
        return self._max_responses() + self.texts

    # -- labels ---------------------------------------------------------------------------------

    def _label_call_start(self, s: State) -> str:
        c = self._next_call(s)
        return f"model: starts {call_name(c)} in resp_{s[S_SERVER]}"

    def _label_done(self, s: State) -> str:
        return f"model: resp_{s[S_SERVER]} done"

    def _label_late(self, c: int, what: str, s: State) -> str:
        record = s[S_CALLS][c]
        n = call_name(c)
        if record[C_MODEL] == UNBORN:
            return f"model: starts {n} in resp_{self._last_over(s)}, after its done (late)"
        r = record[C_RESPONSE]
        if what == "end" and record[C_MODEL] in (CUT, LATE):
            return f"model: sends {n}'s end after resp_{r}'s done (late)"
        return f"model: sends {n}'s {what} again (resp_{r})"

    def _label_late_done(self, s: State) -> str:
        return f"model: sends resp_{self._last_over(s)}'s done again (late)"

    def _label_late_audio(self, s: State) -> str:
        return f"model: sends audio of resp_{self._last_over(s)} (late)"

    def _label_turn(self, t: int, s: State) -> str:
        n = turn_name(t)
        record = s[S_TURNS][t]
        pc = record[T_PC]
        if pc == WOKEN:
            return f"{n}: the request goes on (woken){self._request_note(t, s)}"
        if record[T_MACHINE] == "interrupting":
            return f"{n}: has unwound (interrupted)"
        if pc == CONSUME:
            return f"{n}: takes {_describe(record[T_QUEUE][0])}"
        if pc == REQ:
            return f"{n}: runs its first step (asks for a response){self._request_note(t, s)}"
        if pc == CALLS:
            note = self._request_note(t, s)
            return f"{n}: every call final, its next step asks for a response{note}"
        if pc == WAIT_IDLE:
            return f"{n}: the request times out (the model is not ready)"
        return f"{n}: every call final, the failed turn ends"

    def _request_note(self, t: int, s: State) -> str:
        """What becomes of turn ``t``'s request, for its label."""
        try:
            following = self.turn_acts(t, s)
        except Broken:
            return ""
        if following is None:
            return ""
        pc = following[S_TURNS][t][T_PC]
        if pc == WAIT_IDLE:
            return f": it waits, the Upstream is {s[S_UP]}"
        if pc == FAILING:
            return ": it fails, the connection was lost"
        if pc == CONSUME and s[S_SERVER]:
            return f": the model refuses it, resp_{s[S_SERVER]} is active"
        return ""

    # -- helpers --------------------------------------------------------------------------------

    @staticmethod
    def _next_call(s: State) -> int:
        return sum(1 for record in s[S_CALLS] if record[C_MODEL] != UNBORN)

    def _up(self, w: list[Any], event: str) -> bool:
        """Upstream._move: the machine takes ``event`` (False: refused, nothing moves);
        every move wakes a request waiting for one (``_changed``)."""
        target = move(self.upstream, w[S_UP], event)
        if target is None:
            return False
        w[S_UP] = target
        turns = w[S_TURNS]
        if any(r[T_PC] == WAIT_IDLE and r[T_MACHINE] in LIVE_TURN for r in turns):
            w[S_TURNS] = tuple(
                (*r[:T_PC], WOKEN, *r[T_PC + 1 :])
                if r[T_PC] == WAIT_IDLE and r[T_MACHINE] in LIVE_TURN
                else r
                for r in turns
            )
        return True

    @staticmethod
    def _turn(w: list[Any], t: int, **fields: Any) -> None:
        record = list(w[S_TURNS][t])
        for key, value in fields.items():
            record[_T_INDEX[key]] = value
        w[S_TURNS] = put(w[S_TURNS], t, tuple(record))

    @staticmethod
    def _call(w: list[Any], c: int, **fields: Any) -> None:
        record = list(w[S_CALLS][c])
        for key, value in fields.items():
            record[_C_INDEX[key]] = value
        w[S_CALLS] = put(w[S_CALLS], c, tuple(record))

    @staticmethod
    def _response(w: list[Any], r: int, **fields: Any) -> None:
        """Response ``r`` (1-based) with ``fields`` changed."""
        record = list(w[S_RESPONSES][r - 1])
        for key, value in fields.items():
            record[_R_INDEX[key]] = value
        w[S_RESPONSES] = put(w[S_RESPONSES], r - 1, tuple(record))

    @staticmethod
    def _calls_of(w: list[Any] | State, t: int) -> list[int]:
        return [c for c, record in enumerate(w[S_CALLS]) if record[C_TURN] == t]

    def _stale(self, w: list[Any], c: int, r: int) -> str:
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

    def _unwanted(self, w: list[Any]) -> None:
        """The app or the user interrupted: what was asked for before is unwanted, the
        responses not begun yet and the open one if it answers a create."""
        w[S_OWED] = (True,) * len(w[S_OWED])
        r = w[S_SERVER]
        if r and w[S_RESPONSES][r - 1][R_FOR_CREATE]:
            self._response(w, r, unwanted=True)

    # -- what the driver sends ------------------------------------------------------------------

    def _send_cancel(self, w: list[Any], r: int) -> None:
        """``response.cancel``: the check of the cancel rule, against the model's truth."""
        if w[S_SERVER] != r:
            raise Broken("cancel", f"response.cancel for resp_{r}, which the model has ended")
        if not w[S_RESPONSES][r - 1][R_CANCELLED]:
            self._response(w, r, cancelled=BY_DRIVER)

    def _send_create(self, w: list[Any], t: int, why: str) -> None:
        """``response.create`` for turn ``t``, then ``_move("create")``."""
        if w[S_UP] != "idle":
            raise Broken("create", f"response.create ({why}) while the Upstream is {w[S_UP]}")
        machine = w[S_TURNS][t][T_MACHINE]
        if machine not in LIVE_TURN:
            raise Broken("create", f"response.create ({why}) for {turn_name(t)}, {machine}")
        self._up(w, "create")
        if not w[S_SERVER]:  # else the model refuses it: it has a response active
            w[S_OWED] = (*w[S_OWED], False)

    def _answer(self, w: list[Any], calls: Iterable[int], *, respond: bool, t: int) -> None:
        """Upstream._answer: one answer per call (its record's result), then, if
        ``respond``, a request for a response. Nothing while the connection is down."""
        if w[S_UP] in DOWN:
            return
        completed = w[S_COMPLETED]
        for c in calls:
            completed = completed - {c}
            self._answered(w, c)
        w[S_COMPLETED] = completed
        if respond:
            self._send_create(w, t, "with the answers")

    def _answered(self, w: list[Any], c: int) -> None:
        """One answer for call ``c`` goes upstream: the check of the one-answer rule."""
        record = w[S_CALLS][c]
        n = call_name(c)
        if record[C_MODEL] != COMPLETED:
            raise Broken(
                "one-answer", f"{n} is answered, but the model's call is {record[C_MODEL]}"
            )
        if record[C_ANSWERS]:
            raise Broken("one-answer", f"{n} is answered a second time")
        if record[C_TURN] >= 0 and record[C_TC] not in TOOL_CALL.finals:
            raise Broken("engine", f"{n} is answered while its ToolCall is {record[C_TC]}")
        if record[C_TC] == "settled" and not record[C_RAN]:
            raise Broken("one-answer", f"{n}'s answer says it settled, but it never ran")
        self._call(w, c, answers=record[C_ANSWERS] + 1)

    # -- the turns ------------------------------------------------------------------------------

    def _interrupt(self, w: list[Any], t: int, *, by_model: bool) -> bool:
        """Turn.interrupt: the Turn ``interrupt`` (nothing if it refuses), the model told
        unless it interrupted itself (Upstream.interrupted), every open call cancelled."""
        target = move(TURN, w[S_TURNS][t][T_MACHINE], "interrupt")
        if target is None:
            return False
        unread = w[S_TURNS][t][T_QUEUE]
        self._turn(w, t, machine=target, queue=())  # its channel is never read again
        for item in unread:  # a call it never took is answered at its end (the cut rule)
            self._undelivered(w, item)
        if not by_model:
            self._unwanted(w)  # the model's truth: what was asked for before is unwanted
            self._interrupted(w)
        for c in self._calls_of(w, t):
            record = w[S_CALLS][c]
            if record[C_TC] in TOOL_CALL.finals:
                continue
            tc = must(TOOL_CALL, record[C_TC], "interrupt", f"{call_name(c)} is interrupted")
            self._call(w, c, tc=tc, task=NO_TASK, stale="", ran=False)  # not read again
            if self.broken == "answer-twice" and c in w[S_COMPLETED]:
                self._answered(w, c)  # answered now, and kept to answer with the turn's
        return True

    def _interrupted(self, w: list[Any]) -> None:
        """Upstream.interrupted: cancel the active response, or make a requested one
        unwanted; the rest of the response is dropped (_stop_feed)."""
        if w[S_UP] == "responding":
            self._up(w, "interrupt")
            self._send_cancel(w, w[S_ACTIVE])
        else:
            self._up(w, "interrupt")
        self._drop_awaiting(w)
        self._stop_feed(w)

    def _stop_feed(self, w: list[Any]) -> None:
        """Upstream._stop_feed: the fed channel is closed (its turn, if it still takes
        events, sees its end after what is queued) and the rest of the response dropped."""
        if w[S_FEED] >= 0:
            self._feed_item(w, ("closed",))
        w[S_FEED] = -1

    def _drop_awaiting(self, w: list[Any]) -> None:
        """Upstream._drop_awaiting: the awaiting turn's channel is closed, forgotten."""
        if w[S_AWAITING] >= 0:
            feed, w[S_FEED] = w[S_FEED], w[S_AWAITING]
            self._feed_item(w, ("closed",))
            w[S_FEED], w[S_AWAITING] = feed, -1

    def _open_turn(self, w: list[Any], r: int) -> int:
        """Session.open_model_turn: the model's own response opens a turn, interrupting
        the open one (by the model: nothing sent); the new one runs after it."""
        previous = w[S_CURRENT]
        if previous >= 0:
            self._interrupt(w, previous, by_model=True)
        t = len(w[S_TURNS])
        if previous < 0 or w[S_TURNS][previous][T_PC] == ENDED:
            # the turn's task starts and takes its events: before it takes one, an event
            # may come or the turn be interrupted, as while it waits for the turn it cut
            w[S_TURNS] = (*w[S_TURNS], ("generating", CONSUME, (), -1, True, False, 1))
        else:
            w[S_TURNS] = (*w[S_TURNS], ("generating", AFTER, (), previous, True, False, 1))
        w[S_CURRENT] = t
        return t

    def _abandon(self, w: list[Any], t: int) -> None:
        """Turn._abandon: every call of the turn whose arguments never completed fails."""
        for c in self._calls_of(w, t):
            tc = w[S_CALLS][c][C_TC]
            if tc in ("started", "streaming"):
                self._call(w, c, tc=must(TOOL_CALL, tc, "abandon", "its step ended"))

    def _fail_step(self, w: list[Any], t: int) -> None:
        """The step raised ModelError: incomplete calls fail; the turn waits for the rest."""
        self._abandon(w, t)
        self._turn(w, t, pc=FAILING, queue=(), rx=False)

    def _finish(self, w: list[Any], t: int, event: str) -> None:
        """Turn._finish and Upstream.turn_ended: the turn's final move, its records in the
        history, and the answers of its calls the model completed and nobody answered."""
        for c in self._calls_of(w, t):
            tc = w[S_CALLS][c][C_TC]
            if tc not in TOOL_CALL.finals:
                raise Broken(
                    "turn-end", f"{turn_name(t)} ends ({event}) while {call_name(c)} is {tc}"
                )
        record = w[S_TURNS][t]
        never_taken = [
            item[1]
            for item in record[T_QUEUE]
            if item[0] == "end" and w[S_CALLS][item[1]][C_TURN] != t
        ]
        machine = must(TURN, record[T_MACHINE], event, "the turn ends")
        rx = record[T_RX] and record[T_PC] != CONSUME  # its step's channel closes as it exits
        # how it ended is not read again (ENDED_TURN), nor anything else of it but its rx
        self._turn(
            w, t, machine=ENDED_TURN, pc=ENDED, queue=(), after=-1, rx=rx, made=False, step=0
        )
        self._flush(w, t)
        if w[S_CURRENT] == t:
            w[S_CURRENT] = -1
        for u, other in enumerate(w[S_TURNS]):
            if other[T_PC] == AFTER and other[T_AFTER] == t:  # the turn it cut has ended
                self._turn(w, u, pc=CONSUME, after=-1)
        if w[S_BROKEN] == t:
            w[S_BROKEN] = -1
        pending = [c for c in self._calls_of(w, t) if c in w[S_COMPLETED]]
        respond = self.broken == "create-after-interrupt" and machine == "interrupted"
        for c in never_taken:  # fed to it, cut before it took them
            self._orphan(w, c)
        if pending:
            self._answer(w, pending, respond=respond, t=t)

    def _step(self, w: list[Any], t: int) -> None:
        """Upstream.step for a step that asks (a text turn's first, or a next step): a turn
        whose connection was lost between its steps fails; otherwise _request."""
        if w[S_BROKEN] == t:
            w[S_BROKEN] = -1
            self._fail_step(w, t)
            return
        self._request(w, t)

    def _request(self, w: list[Any], t: int) -> None:
        """Upstream._request: wait until the machine allows ``create``, then send the text
        or the answers of the calls so far, and the request."""
        if move(self.upstream, w[S_UP], "create") is None:
            self._turn(w, t, pc=WAIT_IDLE)
            return
        if w[S_TURNS][t][T_STEP] == 1:
            self._send_create(w, t, "with the user's text")
        else:
            history = [c for c, record in enumerate(w[S_CALLS]) if record[C_RECORDED]]
            self._answer(w, [c for c in history if c in w[S_COMPLETED]], respond=True, t=t)
        w[S_AWAITING] = t
        self._turn(w, t, pc=CONSUME, queue=(), rx=True)

    def _flush(self, w: list[Any], t: int) -> None:
        """Turn._flush_step: the records of the turn's calls so far go in the history."""
        for c in self._calls_of(w, t):
            self._call(w, c, recorded=True)

    # -- the driver's reader: what the model says -----------------------------------------------

    def _feed_item(self, w: list[Any], item: tuple[Any, ...]) -> None:
        """Upstream._feed_item: into the fed turn's channel (a closed one: the feed is gone);
        a turn that takes nothing more never reads it."""
        t = w[S_FEED]
        if t < 0:
            self._undelivered(w, item)
            return
        record = w[S_TURNS][t]
        if not record[T_RX]:
            w[S_FEED] = -1
            self._undelivered(w, item)
            return
        if record[T_MACHINE] in LIVE_TURN and record[T_PC] in (AFTER, CONSUME):
            self._turn(w, t, queue=(*record[T_QUEUE], item))
        else:  # queued in a channel its cancelled turn never reads: answered at its end
            self._undelivered(w, item)

    def _undelivered(self, w: list[Any], item: tuple[Any, ...]) -> None:
        """A CallEnd no live turn takes: a call no turn took, or whose turn has ended, is
        answered INTERRUPTED now (Upstream._orphans); one its still unwinding turn took is
        answered with that turn's record when it ends (Upstream.turn_ended)."""
        if item[0] != "end":
            return
        c = item[1]
        owner = w[S_CALLS][c][C_TURN]
        if owner < 0 or w[S_TURNS][owner][T_PC] == ENDED:
            self._orphan(w, c)

    def _orphan(self, w: list[Any], c: int) -> None:
        """Upstream._orphans: the model completed ``c`` and no turn will answer it."""
        if c not in w[S_COMPLETED] or w[S_UP] in DOWN:
            return
        w[S_COMPLETED] = w[S_COMPLETED] - {c}
        self._answered(w, c)

    def _on_started(self, w: list[Any], r: int) -> None:
        """Upstream._on_started."""
        if r in w[S_OVER]:
            return
        state = w[S_UP]
        if state == "unwanted":
            self._up(w, "started")  # cancelling: cancelled as soon as it exists
            w[S_OVER] = w[S_OVER] | {r}
            w[S_ACTIVE] = r
            self._send_cancel(w, r)
            return
        if not self._up(w, "started"):
            w[S_OVER] = w[S_OVER] | {r}
            return
        w[S_ACTIVE] = r
        w[S_LIVE] = frozenset()
        if state == "requested" and w[S_AWAITING] >= 0:
            w[S_FEED], w[S_AWAITING] = w[S_AWAITING], -1
            return
        w[S_FEED] = self._open_turn(w, r)

    def _implicit_start(self, w: list[Any], r: int) -> bool:
        """Upstream._implicit_start: an event of a response never announced is its start."""
        if r in w[S_OVER] or w[S_ACTIVE]:
            return False
        if w[S_UP] not in ("requested", "unwanted", "idle"):
            return False
        self._on_started(w, r)
        return bool(w[S_ACTIVE] == r)  # responding, or cancelling (unwanted): its calls counted

    def _on_output(self, w: list[Any], r: int, kind: str, c: int) -> None:
        """Upstream._on for ResponseOutput and AudioOut, then _filter_call and _feed_item."""
        if r != w[S_ACTIVE] and not self._implicit_start(w, r) and self.broken != "keep-late":
            return  # not the current response: dropped
        if kind == "audio":
            return
        stale = self._stale(w, c, r)
        if kind == "start":
            if c in w[S_IDS]:
                return  # delivered again: dropped
            w[S_IDS] = w[S_IDS] | {c}
            w[S_LIVE] = w[S_LIVE] | {c}
        else:
            if c not in w[S_LIVE]:
                return
            w[S_LIVE] = w[S_LIVE] - {c}
            w[S_COMPLETED] = w[S_COMPLETED] | {c}
        self._feed_item(w, (kind, c, stale))

    def _on_done(self, w: list[Any], r: int) -> None:
        """Upstream._on_done."""
        if r != w[S_ACTIVE]:
            if r in w[S_OVER]:
                return
            if w[S_UP] == "unwanted":  # it ended before we saw it start: nothing to cancel
                self._up(w, "done")
                w[S_OVER] = w[S_OVER] | {r}
                return
            if not self._implicit_start(w, r):
                return
        w[S_OVER] = w[S_OVER] | {r}
        w[S_ACTIVE] = 0
        self._forget_live(w)
        self._up(w, "done")
        feed, w[S_FEED] = w[S_FEED], -1
        if feed >= 0:
            w[S_FEED] = feed
            self._feed_item(w, ("done",))
            w[S_FEED] = -1

    def _forget_live(self, w: list[Any]) -> None:
        """With no response active, _live_calls is not read (only an event of the active
        response reaches it) until the next start clears it: the model clears it now, so
        states that differ only there are one (but with ``keep-late``, which reads it)."""
        if self.broken != "keep-late":
            w[S_LIVE] = frozenset()

    def _on_speech(self, w: list[Any]) -> None:
        """Upstream._on_speech: barge-in from the model (OpenAI: it cancels its response)."""
        t = w[S_CURRENT]
        if t >= 0 and w[S_TURNS][t][T_PC] != ENDED:
            self._interrupt(w, t, by_model=True)
        self._up(w, "speech")
        self._drop_awaiting(w)
        self._stop_feed(w)

    def _lost(self, w: list[Any]) -> None:
        """Upstream.lost (told by its Link): fail the step waiting on the connection."""
        self._up(w, "drop")
        w[S_ACTIVE] = 0
        w[S_LIVE] = w[S_COMPLETED] = w[S_OVER] = frozenset()
        if w[S_FEED] >= 0:
            self._feed_item(w, ("fail",))
        elif w[S_AWAITING] < 0 and w[S_CURRENT] >= 0:
            w[S_BROKEN] = w[S_CURRENT]
        if w[S_AWAITING] >= 0:
            w[S_FEED] = w[S_AWAITING]
            self._feed_item(w, ("fail",))
            w[S_AWAITING] = -1
        w[S_FEED] = -1

    # -- the model's actions ------------------------------------------------------------------

    @staticmethod
    def _speaks(s: State, r: int) -> bool:
        """Whether the model may still send content in response ``r``: not once its own
        voice detector stopped it (a driver's cancel, it reads later: in flight)."""
        return bool(s[S_RESPONSES][r - 1][R_CANCELLED] != BY_MODEL)

    def _connected(self, s: State) -> bool:
        return s[S_UP] not in DOWN

    def begin(self, requested: bool, announced: bool, s: State) -> State | None:
        """The model begins a response: the one asked for (the first create it has not
        answered), or on its own (its voice detector heard the user; none asked for);
        ``announced``: with ``response.created``, else the driver sees it first by one of
        its events (a real server's quirk)."""
        if s[S_SERVER] or not self._connected(s) or bool(s[S_OWED]) != requested:
            return None
        content = sum(1 for r in s[S_RESPONSES] if r[R_CONTENT]) < self.responses
        if not (requested or content):
            return None
        if len(s[S_RESPONSES]) >= self._max_responses():
            return None
        w = list(s)
        unwanted = bool(requested and s[S_OWED][0])
        w[S_OWED] = s[S_OWED][1:]
        record = (OPEN, NOT_CANCELLED, unwanted, requested, content)
        w[S_RESPONSES] = (*s[S_RESPONSES], record)
        r = w[S_SERVER] = len(w[S_RESPONSES])
        if announced:
            self._on_started(w, r)
        return tuple(w)

    def call_start(self, s: State) -> State | None:
        """The model starts the next call in its open response (CallStart)."""
        r = s[S_SERVER]
        if not r or not self._speaks(s, r) or not s[S_RESPONSES][r - 1][R_CONTENT]:
            return None
        c = self._next_call(s)
        if c >= self.calls:
            return None
        w = list(s)
        self._call(w, c, model=STARTED, response=r)
        self._on_output(w, r, "start", c)
        return tuple(w)

    def call_end(self, c: int, s: State) -> State | None:
        """The model completes a call's arguments in its open response (CallEnd)."""
        record = s[S_CALLS][c]
        if record[C_MODEL] != STARTED or record[C_RESPONSE] != s[S_SERVER]:
            return None
        if not self._speaks(s, record[C_RESPONSE]):
            return None
        w = list(s)
        self._call(w, c, model=COMPLETED)
        self._on_output(w, record[C_RESPONSE], "end", c)
        return tuple(w)

    def audio(self, s: State) -> State | None:
        """A piece of the model's voice in its open response (AudioOut)."""
        if not s[S_SERVER] or not self._speaks(s, s[S_SERVER]):
            return None
        w = list(s)
        self._on_output(w, s[S_SERVER], "audio", -1)
        return tuple(w)

    def done(self, s: State) -> State | None:
        """The model ends its open response (ResponseDone): calls whose arguments did not
        complete are cut (their items incomplete: no CallEnd, unless broken ``item-done``)."""
        r = s[S_SERVER]
        if not r:
            return None
        w = list(s)
        cut = [
            c
            for c, record in enumerate(s[S_CALLS])
            if record[C_MODEL] == STARTED and record[C_RESPONSE] == r
        ]
        for c in cut:
            self._call(w, c, model=CUT)
            if self.broken == "item-done":
                self._on_output(w, r, "end", c)
        self._response(w, r, state=OVER, cancelled=NOT_CANCELLED, unwanted=False, for_create=False)
        w[S_SERVER] = 0
        self._on_done(w, r)
        return tuple(w)

    def speech(self, s: State) -> State | None:
        """The model's voice detector hears the user start speaking; it cancels its own
        open response (``interrupt_response``)."""
        if not self._connected(s):
            return None
        w = list(s)
        self._unwanted(w)
        if s[S_SERVER]:
            self._response(w, s[S_SERVER], cancelled=BY_MODEL)
        self._on_speech(w)
        return tuple(w)

    def _late(self, s: State, *, first: bool = False) -> list[Any] | None:
        """A late or duplicate delivery, on a live connection; ``first``: a call's first
        delivery after its response's done, which the ``late`` bound counts (the others
        change nothing a correct driver keeps)."""
        if not self._connected(s) or (first and s[S_LATE] >= self.late):
            return None
        w = list(s)
        w[S_LATE] += first
        return w

    def late_start(self, c: int, s: State) -> State | None:
        """A call's start delivered again (in its own response), or, for the next call
        not yet started, first delivered after the last response's done (a call after the
        end: Gemini's toolCall after the interrupt)."""
        record = s[S_CALLS][c]
        if record[C_MODEL] == UNBORN:
            if c != self._next_call(s):
                return None
            r = self._last_over(s)
            w = self._late(s, first=True) if r else None
            if w is None:
                return None
            self._call(w, c, model=LATE, response=r)
        else:
            r = record[C_RESPONSE]
            if record[C_MODEL] == GONE or s[S_RESPONSES][r - 1][R_STATE] == DEAD:
                return None
            w = self._late(s)
            if w is None:
                return None
        self._on_output(w, r, "start", c)
        return tuple(w)

    def late_end(self, c: int, s: State) -> State | None:
        """A call's end delivered again, or after its response's done (a cut call's last
        events after the done, or the end of one started late): the model does not count
        such a call as completed (no answer is owed for it), the driver must drop it."""
        record = s[S_CALLS][c]
        r = record[C_RESPONSE]
        if record[C_MODEL] in (UNBORN, GONE) or s[S_RESPONSES][r - 1][R_STATE] == DEAD:
            return None
        if record[C_MODEL] == STARTED:
            return None  # its response is open: the in-time end (call_end)
        w = self._late(s)
        if w is None:
            return None
        self._on_output(w, r, "end", c)  # a cut or late call stays so: too late to count
        return tuple(w)

    @staticmethod
    def _last_over(s: State) -> int:
        """The last response the model ended (0: none, or its connection is gone)."""
        over = [i for i, r in enumerate(s[S_RESPONSES]) if r[R_STATE] == OVER]
        return over[-1] + 1 if over else 0

    def late_done(self, s: State) -> State | None:
        """The last ended response's done delivered again."""
        r = self._last_over(s)
        w = self._late(s) if r else None
        if w is None:
            return None
        self._on_done(w, r)
        return tuple(w)

    def late_audio(self, s: State) -> State | None:
        """Audio of the last ended response, delivered after its done."""
        r = self._last_over(s)
        w = self._late(s) if r else None
        if w is None:
            return None
        self._on_output(w, r, "audio", -1)
        return tuple(w)

    # -- the connection -------------------------------------------------------------------------

    def drop(self, s: State) -> State | None:
        """The connection is lost: the model session is gone with everything open in it."""
        if s[S_DROPS] >= self.drops or s[S_UP] in ("lost", "closed"):
            return None
        w = list(s)
        w[S_DROPS] += 1
        w[S_SERVER], w[S_OWED] = 0, ()
        # nothing more comes of them: what they were is not read again, but for content
        w[S_RESPONSES] = tuple((DEAD, *_ENDED, r[R_CONTENT]) for r in s[S_RESPONSES])
        w[S_CALLS] = tuple(
            r if r[C_MODEL] == UNBORN else (*r[:C_ANSWERS], 0, GONE, r[C_RESPONSE])
            for r in s[S_CALLS]
        )
        self._lost(w)
        return tuple(w)

    def reconnect(self, s: State) -> State | None:
        """Link.run connects again after its backoff (Upstream.retrying: ``reconnect``)."""
        if s[S_UP] != "lost":
            return None
        w = list(s)
        self._up(w, "reconnect")
        return tuple(w)

    def ready(self, s: State) -> State | None:
        """The new model session is set up (_on_ready): ``ready``, seeded with the history."""
        if s[S_UP] != "connecting":
            return None
        w = list(s)
        self._up(w, "ready")
        return tuple(w)

    # -- the turns' tasks -------------------------------------------------------------------------

    def take(self, t: int, s: State) -> State | None:
        """The turn's step takes the next event from its channel (Turn._step_events);
        an interrupted turn takes nothing more (its scope is cancelled)."""
        if t >= len(s[S_TURNS]):
            return None
        record = s[S_TURNS][t]
        if record[T_MACHINE] not in LIVE_TURN or record[T_PC] != CONSUME or not record[T_QUEUE]:
            return None
        w = list(s)
        item = record[T_QUEUE][0]
        self._turn(w, t, queue=record[T_QUEUE][1:])
        kind = item[0]
        if kind == "start":
            c = item[1]
            if w[S_CALLS][c][C_TURN] >= 0:  # session.seen_call_id: "already used"
                self._fail_step(w, t)
            else:
                self._call(w, c, turn=t, tc=TOOL_CALL.initial)
                self._turn(w, t, made=True)
        elif kind == "end":
            c = item[1]
            call = w[S_CALLS][c]
            if call[C_TURN] != t or call[C_TC] in TOOL_CALL.finals:
                self._fail_step(w, t)  # "end of unknown call"
            else:
                tc = must(TOOL_CALL, call[C_TC], "complete", f"{call_name(c)}'s CallEnd")
                self._call(w, c, tc=tc, task=ISSUED, stale=item[2])
        elif kind in ("done", "closed"):  # the end, or EndOfChannel: the step returns
            self._abandon(w, t)
            self._turn(w, t, rx=False)
            if not w[S_TURNS][t][T_MADE]:
                self._finish(w, t, "finish")
            else:
                machine = must(TURN, record[T_MACHINE], "step_done", "the step's stream ended")
                self._turn(w, t, machine=machine, pc=CALLS)
        else:
            self._fail_step(w, t)
        return tuple(w)

    def turn_acts(self, t: int, s: State) -> State | None:
        """Turn ``t``'s task takes its next step, the one its place allows (a turn's task
        has at most one thing it can do at a time)."""
        if t >= len(s[S_TURNS]):
            return None
        record = s[S_TURNS][t]
        pc = record[T_PC]
        if pc == WOKEN:
            return self.woken(t, s)
        if record[T_MACHINE] == "interrupting":
            return self.unwound(t, s)
        if pc == CONSUME:
            return self.take(t, s)
        if pc == REQ:
            return self.text_runs(t, s)
        if pc == CALLS:
            return self.next_step(t, s)
        if pc == WAIT_IDLE:
            return self.request_timeout(t, s)
        if pc == FAILING:
            return self.fail(t, s)
        return None

    def text_runs(self, t: int, s: State) -> State | None:
        """A text turn's task runs its first step: Upstream.step, _request."""
        if t >= len(s[S_TURNS]):
            return None
        record = s[S_TURNS][t]
        if record[T_PC] != REQ or record[T_MACHINE] not in LIVE_TURN:
            return None
        w = list(s)
        self._step(w, t)
        return tuple(w)

    def next_step(self, t: int, s: State) -> State | None:
        """Every call of the step is final: the results go in the history, the next step
        asks for the model's next response (a turn with a step without calls finished)."""
        if t >= len(s[S_TURNS]):
            return None
        record = s[S_TURNS][t]
        if record[T_PC] != CALLS or record[T_MACHINE] not in LIVE_TURN:
            return None
        if any(s[S_CALLS][c][C_TC] not in TOOL_CALL.finals for c in self._calls_of(s, t)):
            return None
        w = list(s)
        self._flush(w, t)
        machine = must(TURN, record[T_MACHINE], "next_step", "every call is final")
        self._turn(w, t, machine=machine, step=record[T_STEP] + 1, made=False)
        self._step(w, t)
        return tuple(w)

    def woken(self, t: int, s: State) -> State | None:
        """A request woken by a move checks for an interrupt since (the checkpoint after
        the wait: Cancelled, the turn unwinds), then the state again: idle, it goes on, else
        it waits."""
        if t >= len(s[S_TURNS]) or s[S_TURNS][t][T_PC] != WOKEN:
            return None
        w = list(s)
        if s[S_TURNS][t][T_MACHINE] not in LIVE_TURN:
            self._turn(w, t, pc=WAIT_IDLE)  # cancelled: nothing more but unwinding
            return tuple(w)
        self._request(w, t)
        return tuple(w)

    def request_timeout(self, t: int, s: State) -> State | None:
        """No move lets the request go within the model's timeout: ModelError."""
        if t >= len(s[S_TURNS]):
            return None
        record = s[S_TURNS][t]
        if record[T_PC] != WAIT_IDLE or record[T_MACHINE] not in LIVE_TURN:
            return None
        w = list(s)
        self._fail_step(w, t)
        return tuple(w)

    def fail(self, t: int, s: State) -> State | None:
        """The failed step's calls are all final: the Turn ``error``."""
        if t >= len(s[S_TURNS]):
            return None
        record = s[S_TURNS][t]
        if record[T_PC] != FAILING or record[T_MACHINE] not in LIVE_TURN:
            return None
        if any(s[S_CALLS][c][C_TC] not in TOOL_CALL.finals for c in self._calls_of(s, t)):
            return None
        w = list(s)
        self._finish(w, t, "error")
        return tuple(w)

    def unwound(self, t: int, s: State) -> State | None:
        """The interrupted turn's tasks have exited (each at its next checkpoint; a request
        already woken goes on first): ``unwound``."""
        if t >= len(s[S_TURNS]):
            return None
        record = s[S_TURNS][t]
        if record[T_MACHINE] != "interrupting" or record[T_PC] == WOKEN:
            return None
        w = list(s)
        self._finish(w, t, "unwound")
        return tuple(w)

    def tool_starts(self, c: int, s: State) -> State | None:
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
        self._call(w, c, tc=tc, task=RUNNING, ran=True, stale="")
        return tuple(w)

    def tool_returns(self, c: int, s: State) -> State | None:
        """The tool returns: ``finish``, settled."""
        record = s[S_CALLS][c]
        if record[C_TASK] != RUNNING or record[C_TC] != "running":
            return None
        w = list(s)
        tc = must(TOOL_CALL, record[C_TC], "finish", "the tool returned")
        self._call(w, c, tc=tc, task=NO_TASK)
        return tuple(w)

    # -- the app --------------------------------------------------------------------------------

    def app_interrupt(self, s: State) -> State | None:
        """session.interrupt(): the open turn, if any, is interrupted (the model is told)."""
        t = s[S_CURRENT]
        if t < 0:
            return None
        w = list(s)
        if not self._interrupt(w, t, by_model=False):
            return None
        return tuple(w)

    def app_text(self, s: State) -> State | None:
        """session.start_turn(text), with no turn open: the text turn opens.

        start_turn with a turn open interrupts it (the app's interrupt) and waits for it
        to end, again while a turn is open: that is the app's interrupts (any number, at
        any moment) and then this, which the model explores.
        """
        if s[S_TEXTS] >= self.texts or s[S_CURRENT] >= 0:
            return None
        w = list(s)
        w[S_TEXTS] += 1
        t = len(w[S_TURNS])
        w[S_TURNS] = (*w[S_TURNS], ("generating", REQ, (), -1, False, False, 1))
        w[S_CURRENT] = t
        return tuple(w)


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
