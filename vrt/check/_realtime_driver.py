"""``vrt check``: the engine's side of the realtime model, the rules of the driver
(vrt/_engine/realtime.py) and of the turns it feeds (vrt/_engine/turn.py), which the
invariants judge.

:class:`Driver` holds what the rules read besides the state: the Upstream table it composes
and the rule broken on purpose. Its methods are the driver's and the turns' own, written as
the engine implements them (their names appear in the docstrings): the Upstream's moves,
what it sends (``response.create``, ``response.cancel``, the calls' answers: each checked
against the model's truth as it goes), its reader (what the model says, fed to the turn's
step channel), a turn's interrupt and end. They are not actions: the model's server, the
app and the network (:mod:`vrt.check._realtime`) call the reader, the interrupt and the
Upstream's moves; the engine's tasks (:mod:`vrt.check._realtime_tasks`) the rest.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vrt._core.tables import TOOL_CALL, TURN, Table
from vrt.check._realtime_state import (
    AFTER,
    BY_DRIVER,
    C_ANSWERS,
    C_MODEL,
    C_RAN,
    C_RECORDED,
    C_TC,
    C_TURN,
    COMPLETED,
    CONSUME,
    DOWN,
    ENDED,
    ENDED_TURN,
    FAILING,
    LIVE_TURN,
    NO_TASK,
    R_CANCELLED,
    S_ACTIVE,
    S_AWAITING,
    S_BROKEN,
    S_CALLS,
    S_COMPLETED,
    S_CURRENT,
    S_FEED,
    S_IDS,
    S_LIVE,
    S_OVER,
    S_OWED,
    S_RESPONSES,
    S_SERVER,
    S_TURNS,
    S_UP,
    T_AFTER,
    T_MACHINE,
    T_PC,
    T_QUEUE,
    T_RX,
    T_STEP,
    WAIT_IDLE,
    WOKEN,
    call_name,
    calls_of,
    set_call,
    set_response,
    set_turn,
    stale,
    turn_name,
    unwanted,
)
from vrt.check._state import Broken, move, must


class Driver:
    """The driver's and the turns' rules, for one Upstream table and broken rule."""

    def __init__(self, upstream: Table, broken: str | None) -> None:
        self.upstream = upstream
        self.broken = broken

    def up(self, w: list[Any], event: str) -> bool:
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

    # -- what the driver sends ------------------------------------------------------------------

    def _send_cancel(self, w: list[Any], r: int) -> None:
        """``response.cancel``: the check of the cancel rule, against the model's truth."""
        if w[S_SERVER] != r:
            raise Broken("cancel", f"response.cancel for resp_{r}, which the model has ended")
        if not w[S_RESPONSES][r - 1][R_CANCELLED]:
            set_response(w, r, cancelled=BY_DRIVER)

    def _send_create(self, w: list[Any], t: int, why: str) -> None:
        """``response.create`` for turn ``t``, then ``_move("create")``."""
        if w[S_UP] != "idle":
            raise Broken("create", f"response.create ({why}) while the Upstream is {w[S_UP]}")
        machine = w[S_TURNS][t][T_MACHINE]
        if machine not in LIVE_TURN:
            raise Broken("create", f"response.create ({why}) for {turn_name(t)}, {machine}")
        self.up(w, "create")
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
        set_call(w, c, answers=record[C_ANSWERS] + 1)

    # -- the turns ------------------------------------------------------------------------------

    def interrupt(self, w: list[Any], t: int, *, by_model: bool) -> bool:
        """Turn.interrupt: the Turn ``interrupt`` (nothing if it refuses), the model told
        unless it interrupted itself (Upstream.interrupted), every open call cancelled."""
        target = move(TURN, w[S_TURNS][t][T_MACHINE], "interrupt")
        if target is None:
            return False
        unread = w[S_TURNS][t][T_QUEUE]
        set_turn(w, t, machine=target, queue=())  # its channel is never read again
        for item in unread:  # a call it never took is answered at its end (the cut rule)
            self._undelivered(w, item)
        if not by_model:
            unwanted(w)  # the model's truth: what was asked for before is unwanted
            self._interrupted(w)
        for c in calls_of(w, t):
            record = w[S_CALLS][c]
            if record[C_TC] in TOOL_CALL.finals:
                continue
            tc = must(TOOL_CALL, record[C_TC], "interrupt", f"{call_name(c)} is interrupted")
            set_call(w, c, tc=tc, task=NO_TASK, stale="", ran=False)  # not read again
            if self.broken == "answer-twice" and c in w[S_COMPLETED]:
                self._answered(w, c)  # answered now, and kept to answer with the turn's
        return True

    def _interrupted(self, w: list[Any]) -> None:
        """Upstream.interrupted: cancel the active response, or make a requested one
        unwanted; the rest of the response is dropped (_stop_feed)."""
        if w[S_UP] == "responding":
            self.up(w, "interrupt")
            self._send_cancel(w, w[S_ACTIVE])
        else:
            self.up(w, "interrupt")
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
            self.interrupt(w, previous, by_model=True)
        t = len(w[S_TURNS])
        if previous < 0 or w[S_TURNS][previous][T_PC] == ENDED:
            # the turn's task starts and takes its events: before it takes one, an event
            # may come or the turn be interrupted, as while it waits for the turn it cut
            w[S_TURNS] = (*w[S_TURNS], ("generating", CONSUME, (), -1, True, False, 1))
        else:
            w[S_TURNS] = (*w[S_TURNS], ("generating", AFTER, (), previous, True, False, 1))
        w[S_CURRENT] = t
        return t

    def abandon(self, w: list[Any], t: int) -> None:
        """Turn._abandon: every call of the turn whose arguments never completed fails."""
        for c in calls_of(w, t):
            tc = w[S_CALLS][c][C_TC]
            if tc in ("started", "streaming"):
                set_call(w, c, tc=must(TOOL_CALL, tc, "abandon", "its step ended"))

    def fail_step(self, w: list[Any], t: int) -> None:
        """The step raised ModelError: incomplete calls fail; the turn waits for the rest."""
        self.abandon(w, t)
        set_turn(w, t, pc=FAILING, queue=(), rx=False)

    def finish(self, w: list[Any], t: int, event: str) -> None:
        """Turn._finish and Upstream.turn_ended: the turn's final move, its records in the
        history, and the answers of its calls the model completed and nobody answered."""
        for c in calls_of(w, t):
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
        set_turn(w, t, machine=ENDED_TURN, pc=ENDED, queue=(), after=-1, rx=rx, made=False, step=0)
        self.flush(w, t)
        if w[S_CURRENT] == t:
            w[S_CURRENT] = -1
        for u, other in enumerate(w[S_TURNS]):
            if other[T_PC] == AFTER and other[T_AFTER] == t:  # the turn it cut has ended
                set_turn(w, u, pc=CONSUME, after=-1)
        if w[S_BROKEN] == t:
            w[S_BROKEN] = -1
        pending = [c for c in calls_of(w, t) if c in w[S_COMPLETED]]
        respond = self.broken == "create-after-interrupt" and machine == "interrupted"
        for c in never_taken:  # fed to it, cut before it took them
            self._orphan(w, c)
        if pending:
            self._answer(w, pending, respond=respond, t=t)

    def step(self, w: list[Any], t: int) -> None:
        """Upstream.step for a step that asks (a text turn's first, or a next step): a turn
        whose connection was lost between its steps fails; otherwise _request."""
        if w[S_BROKEN] == t:
            w[S_BROKEN] = -1
            self.fail_step(w, t)
            return
        self.request(w, t)

    def request(self, w: list[Any], t: int) -> None:
        """Upstream._request: wait until the machine allows ``create``, then send the text
        or the answers of the calls so far, and the request."""
        if move(self.upstream, w[S_UP], "create") is None:
            set_turn(w, t, pc=WAIT_IDLE)
            return
        if w[S_TURNS][t][T_STEP] == 1:
            self._send_create(w, t, "with the user's text")
        else:
            history = [c for c, record in enumerate(w[S_CALLS]) if record[C_RECORDED]]
            self._answer(w, [c for c in history if c in w[S_COMPLETED]], respond=True, t=t)
        w[S_AWAITING] = t
        set_turn(w, t, pc=CONSUME, queue=(), rx=True)

    def flush(self, w: list[Any], t: int) -> None:
        """Turn._flush_step: the records of the turn's calls so far go in the history."""
        for c in calls_of(w, t):
            set_call(w, c, recorded=True)

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
            set_turn(w, t, queue=(*record[T_QUEUE], item))
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

    def on_started(self, w: list[Any], r: int) -> None:
        """Upstream._on_started."""
        if r in w[S_OVER]:
            return
        state = w[S_UP]
        if state == "unwanted":
            self.up(w, "started")  # cancelling: cancelled as soon as it exists
            w[S_OVER] = w[S_OVER] | {r}
            w[S_ACTIVE] = r
            self._send_cancel(w, r)
            return
        if not self.up(w, "started"):
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
        self.on_started(w, r)
        return bool(w[S_ACTIVE] == r)  # responding, or cancelling (unwanted): its calls counted

    def on_output(self, w: list[Any], r: int, kind: str, c: int) -> None:
        """Upstream._on for ResponseOutput and AudioOut, then _filter_call and _feed_item."""
        if r != w[S_ACTIVE] and not self._implicit_start(w, r) and self.broken != "keep-late":
            return  # not the current response: dropped
        if kind == "audio":
            return
        why = stale(w, c, r)
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
        self._feed_item(w, (kind, c, why))

    def on_done(self, w: list[Any], r: int) -> None:
        """Upstream._on_done."""
        if r != w[S_ACTIVE]:
            if r in w[S_OVER]:
                return
            if w[S_UP] == "unwanted":  # it ended before we saw it start: nothing to cancel
                self.up(w, "done")
                w[S_OVER] = w[S_OVER] | {r}
                return
            if not self._implicit_start(w, r):
                return
        w[S_OVER] = w[S_OVER] | {r}
        w[S_ACTIVE] = 0
        self._forget_live(w)
        self.up(w, "done")
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

    def on_speech(self, w: list[Any]) -> None:
        """Upstream._on_speech: barge-in from the model (OpenAI: it cancels its response)."""
        t = w[S_CURRENT]
        if t >= 0 and w[S_TURNS][t][T_PC] != ENDED:
            self.interrupt(w, t, by_model=True)
        self.up(w, "speech")
        self._drop_awaiting(w)
        self._stop_feed(w)

    def lost(self, w: list[Any]) -> None:
        """Upstream.lost (told by its Link): fail the step waiting on the connection."""
        self.up(w, "drop")
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
