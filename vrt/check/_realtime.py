"""``vrt check``: the realtime model, a session's connection to a realtime speech-to-speech
model (vrt/_engine/realtime.py) and the turns its responses make.

:mod:`vrt.check` documents what is modelled and what is abstracted. The transition
relation is the real machine classes through their compiled tables (the Upstream, a Turn
per turn, a ToolCall per call) and a model of the driver's rules around them, written as
``vrt/_engine/realtime.py`` implements them, and of a realtime model's server: permissive
(anything it may send, in any order, within the bounds), with the quirks real servers have,
and truthful about what it did (which response is open, which call it completed or cut), so
the invariants judge the driver against what really happened, not against what the driver
believed.

The model is split in parts: the vocabulary (:mod:`vrt.check._realtime_state`: invariants,
state layout, record helpers, the model's truth), the driver's and the turns' rules
(:mod:`vrt.check._realtime_driver`, the thing judged) and the engine's tasks that act on
them (:mod:`vrt.check._realtime_tasks`). :class:`RealtimeModel` is the rest: the model's
server, the app and the network as actions, the list of named actions, the search's
interface and the check of states at rest.

The state is one flat tuple of the ``S_*`` fields; a turn is a ``T_*`` record, a call a
``C_*`` record, a response an ``R_*`` record. Messages from the model reach the driver at
once, in order (the driver's reader handles each to its end before the next): a message in
flight is one the model sends later, which the permissive model covers (it may go on
with a response it was told to cancel, until its ``done``).
"""

from __future__ import annotations

import functools
from typing import Any

from vrt._core.tables import UPSTREAM, Table
from vrt.check._realtime_driver import Driver
from vrt.check._realtime_state import (
    BY_MODEL,
    C_ANSWERS,
    C_MODEL,
    C_RESPONSE,
    CALLS,
    COMPLETED,
    CONSUME,
    CUT,
    DEAD,
    DOWN,
    ENDED,
    ENDED_RESPONSE,
    FAILING,
    GONE,
    LATE,
    NO_TASK,
    NOT_CANCELLED,
    OPEN,
    OVER,
    R_CANCELLED,
    R_CONTENT,
    R_STATE,
    REALTIME_BREAKABLE,
    REQ,
    S_AWAITING,
    S_CALLS,
    S_CURRENT,
    S_DROPS,
    S_FEED,
    S_LATE,
    S_OWED,
    S_RESPONSES,
    S_SERVER,
    S_TEXTS,
    S_TURNS,
    S_UP,
    STARTED,
    T_MACHINE,
    T_PC,
    T_QUEUE,
    T_RX,
    UNBORN,
    WAIT_IDLE,
    WOKEN,
    call_name,
    describe,
    set_call,
    set_response,
    turn_name,
    unwanted,
)
from vrt.check._realtime_tasks import reconnect, tool_returns, tool_starts, turn_acts
from vrt.check._state import Action, Broken, State, must


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
        self.driver = Driver(upstream, broken)
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
                Action(engine, f"tool: {n} starts running", p(tool_starts, c)),
                Action(engine, f"tool: {n} returns", p(tool_returns, c)),
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
            Action(engine, p(self._label_turn, t), p(turn_acts, self.driver, t))
            for t in range(self._max_turns())
        ]
        out += [
            Action(app, "app: interrupts (session.interrupt)", self.app_interrupt, env=True),
            Action(app, "app: sends a text (session.start_turn)", self.app_text, env=True),
            Action(engine, "network: the model's connection drops", self.drop, env=True),
            Action(engine, "engine: connects again (reconnect)", p(reconnect, self.driver)),
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
            return f"{n}: takes {describe(record[T_QUEUE][0])}"
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
            following = turn_acts(self.driver, t, s)
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
            self.driver.on_started(w, r)
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
        set_call(w, c, model=STARTED, response=r)
        self.driver.on_output(w, r, "start", c)
        return tuple(w)

    def call_end(self, c: int, s: State) -> State | None:
        """The model completes a call's arguments in its open response (CallEnd)."""
        record = s[S_CALLS][c]
        if record[C_MODEL] != STARTED or record[C_RESPONSE] != s[S_SERVER]:
            return None
        if not self._speaks(s, record[C_RESPONSE]):
            return None
        w = list(s)
        set_call(w, c, model=COMPLETED)
        self.driver.on_output(w, record[C_RESPONSE], "end", c)
        return tuple(w)

    def audio(self, s: State) -> State | None:
        """A piece of the model's voice in its open response (AudioOut)."""
        if not s[S_SERVER] or not self._speaks(s, s[S_SERVER]):
            return None
        w = list(s)
        self.driver.on_output(w, s[S_SERVER], "audio", -1)
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
            set_call(w, c, model=CUT)
            if self.broken == "item-done":
                self.driver.on_output(w, r, "end", c)
        set_response(w, r, state=OVER, cancelled=NOT_CANCELLED, unwanted=False, for_create=False)
        w[S_SERVER] = 0
        self.driver.on_done(w, r)
        return tuple(w)

    def speech(self, s: State) -> State | None:
        """The model's voice detector hears the user start speaking; it cancels its own
        open response (``interrupt_response``)."""
        if not self._connected(s):
            return None
        w = list(s)
        unwanted(w)
        if s[S_SERVER]:
            set_response(w, s[S_SERVER], cancelled=BY_MODEL)
        self.driver.on_speech(w)
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
            set_call(w, c, model=LATE, response=r)
        else:
            r = record[C_RESPONSE]
            if record[C_MODEL] == GONE or s[S_RESPONSES][r - 1][R_STATE] == DEAD:
                return None
            w = self._late(s)
            if w is None:
                return None
        self.driver.on_output(w, r, "start", c)
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
        self.driver.on_output(w, r, "end", c)  # a cut or late call stays so: too late to count
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
        self.driver.on_done(w, r)
        return tuple(w)

    def late_audio(self, s: State) -> State | None:
        """Audio of the last ended response, delivered after its done."""
        r = self._last_over(s)
        w = self._late(s) if r else None
        if w is None:
            return None
        self.driver.on_output(w, r, "audio", -1)
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
        w[S_RESPONSES] = tuple((DEAD, *ENDED_RESPONSE, r[R_CONTENT]) for r in s[S_RESPONSES])
        w[S_CALLS] = tuple(
            r if r[C_MODEL] == UNBORN else (*r[:C_ANSWERS], 0, GONE, r[C_RESPONSE])
            for r in s[S_CALLS]
        )
        self.driver.lost(w)
        return tuple(w)

    def ready(self, s: State) -> State | None:
        """The new model session is set up (_on_ready): ``ready``, seeded with the history."""
        if s[S_UP] != "connecting":
            return None
        w = list(s)
        self.driver.up(w, "ready")
        return tuple(w)

    # -- the app --------------------------------------------------------------------------------

    def app_interrupt(self, s: State) -> State | None:
        """session.interrupt(): the open turn, if any, is interrupted (the model is told)."""
        t = s[S_CURRENT]
        if t < 0:
            return None
        w = list(s)
        if not self.driver.interrupt(w, t, by_model=False):
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
