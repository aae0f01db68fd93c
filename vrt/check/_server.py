"""``vrt check``: the server's side of the composed model (vrt/_engine/turn.py,
vrt/_engine/call.py, vrt/_server/actor.py, vrt/_cluster/keeper.py): the model's stream, each
call's task, interrupts, the session's life, and ``handover-v1``: the saves at turn
boundaries, the planned handover, the crash and the settling of the lost turn by the process
that adopts the session. Where the session runs, and whether it may be saved or moved, is the
Movement machine's, composed through its table (:attr:`Rules.movement`) as the keeper and
the actor drive it."""

from __future__ import annotations

from typing import Any

from vrt._core.events import Phase
from vrt._core.tables import CALL_VIEW, CONNECTION, SESSION, TOOL_CALL, TURN
from vrt.check._state import (
    C_KIND,
    C_RESULTS,
    C_STREAMED,
    C_TASK,
    C_TC,
    DELTA_SENT,
    EXEC,
    F_C2S,
    F_CALLS,
    F_CLIENT,
    F_CONN,
    F_CRASHES,
    F_DEAD,
    F_FIRST,
    F_HANDOVERS,
    F_MOVEMENT,
    F_S2C,
    F_SAVED,
    F_SAVED_S2C,
    F_SEPOCH,
    F_SERVER_INTERRUPTS,
    F_SESSION,
    F_SINCE,
    F_TURN,
    HOOK,
    LATE,
    LIVE,
    LIVE_TURN,
    NONE,
    PENDING,
    PROGRESS_SENT,
    UNWIND,
    WAIT,
    Broken,
    Rules,
    State,
    all_final,
    end_call,
    move,
    must,
    name,
    put,
    turn_ends,
)


class ServerRules(Rules):
    """The server's actions: each ``(state) -> state | None``, bound to a call by index."""

    def _alive(self, s: State) -> bool:
        """Whether the server's turn still acts: its session is not closed (then it is
        frozen), and its process owns it with the turn's tasks (Movement ``busy`` in a
        turn, ``idle`` once it ended): not one that adopted it and waits for its client
        (it restores no task; after a crash it settles the lost turn at the resume), nor
        one that took it over mid-turn from a machine that let it move then (``idle`` with
        the turn open: the turn's tasks died with the old process)."""
        movement = s[F_MOVEMENT]
        return s[F_SESSION] != "closed" and (
            movement == "busy" or (movement == "idle" and s[F_TURN] in TURN.finals)
        )

    def _rest(self, w: list[Any]) -> None:
        """The turn has ended: the actor's turn task is done (Movement ``rest``)."""
        w[F_MOVEMENT] = must(self.movement, w[F_MOVEMENT], "rest", "its turn ended")

    def start_call(self, i: int, kind: str, s: State) -> State | None:
        """The model begins call ``i`` (CallStart): ToolCall created, phase ``start``."""
        if s[F_TURN] != "generating" or len(s[F_CALLS]) != i or not self._alive(s):
            return None
        w = list(s)
        w[F_CALLS] = (*s[F_CALLS], (kind, TOOL_CALL.initial, 0, NONE, 0))
        w[F_S2C] = (*s[F_S2C], ("stream", i, Phase.START.value))
        return tuple(w)

    def delta(self, i: int, s: State) -> State | None:
        """CallDelta (at most one per call): ``arguments-delta``."""
        if s[F_TURN] != "generating" or i < s[F_FIRST] or i >= len(s[F_CALLS]):
            return None
        kind, tc, streamed, task, results = s[F_CALLS][i]
        target = move(TOOL_CALL, tc, "delta")
        if target is None or streamed & DELTA_SENT or not self._alive(s):
            return None
        w = list(s)
        w[F_CALLS] = put(s[F_CALLS], i, (kind, target, streamed | DELTA_SENT, task, results))
        w[F_S2C] = (*s[F_S2C], ("stream", i, Phase.ARGUMENTS_DELTA.value))
        return tuple(w)

    def complete(self, i: int, s: State) -> State | None:
        """CallEnd: ``arguments-complete``, and the call's task starts (its hook first)."""
        if s[F_TURN] != "generating" or i < s[F_FIRST] or i >= len(s[F_CALLS]):
            return None
        kind, tc, streamed, _, results = s[F_CALLS][i]
        target = move(TOOL_CALL, tc, "complete")
        if target is None or not self._alive(s):
            return None
        w = list(s)
        w[F_CALLS] = put(s[F_CALLS], i, (kind, target, streamed, HOOK, results))
        w[F_S2C] = (*s[F_S2C], ("stream", i, Phase.ARGUMENTS_COMPLETE.value))
        return tuple(w)

    def end_step(self, s: State) -> State | None:
        """The model's stream ends: incomplete calls fail; no calls: finish, else await."""
        if s[F_TURN] != "generating" or not self._alive(s):
            return None
        w = list(s)
        calls, s2c = list(s[F_CALLS]), list(s[F_S2C])
        for i in range(s[F_FIRST], len(calls)):
            if calls[i][C_TC] in ("started", "streaming"):
                end_call(calls, s2c, i, "abandon", Phase.FAILED.value, NONE)
        if len(calls) == s[F_FIRST]:
            w[F_TURN] = turn_ends(s[F_TURN], "finish", calls)
            s2c.append(("ended", s[F_SEPOCH], "finished"))
            self._rest(w)
        else:
            w[F_TURN] = must(TURN, s[F_TURN], "step_done", "the step's stream ended")
        w[F_CALLS], w[F_S2C] = tuple(calls), tuple(s2c)
        return tuple(w)

    def next_step(self, s: State) -> State | None:
        """Every call of the step is final: feed the results back, stream the next step."""
        if not self._alive(s) or (not all_final(s[F_CALLS]) and self.broken != "turn-wait"):
            return None
        target = move(TURN, s[F_TURN], "next_step")
        if target is None:
            return None
        w = list(s)
        w[F_TURN], w[F_FIRST] = target, len(s[F_CALLS])
        return tuple(w)

    def max_steps(self, s: State) -> State | None:
        """Every call of the step is final and ``max_steps`` is reached: the turn finishes."""
        if s[F_TURN] != "awaiting" or not all_final(s[F_CALLS]) or not self._alive(s):
            return None
        w = list(s)
        w[F_TURN] = turn_ends(s[F_TURN], "finish", s[F_CALLS])
        w[F_S2C] = (*s[F_S2C], ("ended", s[F_SEPOCH], "finished"))
        self._rest(w)
        return tuple(w)

    def _task(self, i: int, task: str, s: State) -> tuple[Any, ...] | None:
        """Call ``i``'s record if its task is ``task`` and the server runs."""
        if i >= len(s[F_CALLS]) or not self._alive(s):
            return None
        record: tuple[Any, ...] = s[F_CALLS][i]
        return record if record[C_TASK] == task else None

    def allow(self, i: int, s: State) -> State | None:
        """before_tool_call allows: ``allow`` (no phase); a server tool runs, an app call
        waits for the app call before it to end."""
        record = self._task(i, HOOK, s)
        if record is None:
            return None
        kind, tc, streamed, _, results = record
        target = must(TOOL_CALL, tc, "allow", "the hook allowed it")
        w = list(s)
        task = EXEC
        if kind == "app":  # no checkpoint before tool.call unless the previous one is open
            if not self._waits(s[F_CALLS], i):
                task = PENDING
                w[F_S2C] = (*s[F_S2C], ("call", i))
            else:
                task = WAIT
        w[F_CALLS] = put(s[F_CALLS], i, (kind, target, streamed, task, results))
        return tuple(w)

    def decline(self, i: int, s: State) -> State | None:
        """before_tool_call rejects (or nobody hosts the tool): ``settled``, not run."""
        if self._task(i, HOOK, s) is None:
            return None
        return self._settle(i, "decline", s)

    def progress(self, i: int, s: State) -> State | None:
        """A running server tool calls ``ctx.emit`` (at most once per call): ``progress``."""
        record = self._task(i, EXEC, s)
        if record is None or record[C_STREAMED] & PROGRESS_SENT:
            return None
        kind, tc, streamed, task, results = record
        target = must(TOOL_CALL, tc, "progress", "a running tool emitted progress")
        w = list(s)
        w[F_CALLS] = put(s[F_CALLS], i, (kind, target, streamed | PROGRESS_SENT, task, results))
        w[F_S2C] = (*s[F_S2C], ("stream", i, Phase.PROGRESS.value))
        return tuple(w)

    def finish(self, i: int, s: State) -> State | None:
        """A server tool returns (ok, INVALID, FAILED or TIMEOUT alike): ``settled``."""
        if self._task(i, EXEC, s) is None:
            return None
        return self._settle(i, "finish", s)

    def _settle(self, i: int, event: str, s: State) -> State:
        w = list(s)
        calls, s2c = list(s[F_CALLS]), list(s[F_S2C])
        end_call(calls, s2c, i, event, Phase.SETTLED.value, NONE)
        w[F_CALLS], w[F_S2C] = tuple(calls), tuple(s2c)
        return tuple(w)

    def _waits(self, calls: tuple[Any, ...], i: int) -> bool:
        """Whether app call ``i`` must still wait before it is sent: every earlier app call
        must have ended (broken "overtake": only the one created just before it)."""
        for j in range(i - 1, -1, -1):
            if calls[j][C_KIND] == "app":
                if calls[j][C_TC] not in TOOL_CALL.finals:
                    return True
                if self.overtake:
                    return False
        return False

    def dispatch(self, i: int, s: State) -> State | None:
        """A waiting app call sends ``tool.call`` once the calls it waits for have ended.

        The server's own check of "after an interrupt no call of that turn starts": with
        the broken rule "late-dispatch", a call cancelled while it waited still gets here.
        """
        if i >= len(s[F_CALLS]) or not self._alive(s):
            return None
        kind, tc, streamed, task, results = s[F_CALLS][i]
        if task not in (WAIT, LATE):
            return None
        if self._waits(s[F_CALLS], i):
            return None
        if s[F_TURN] not in LIVE_TURN or tc != "running":
            raise Broken(
                "interrupt",
                f"the server sends tool.call for {name(i)} although the turn is "
                f"{s[F_TURN]} and the call {tc}",
            )
        w = list(s)
        w[F_CALLS] = put(s[F_CALLS], i, (kind, tc, streamed, PENDING, results))
        w[F_S2C] = (*s[F_S2C], ("call", i))
        return tuple(w)

    def timeout(self, i: int, s: State) -> State | None:
        """``client_tool_timeout`` runs out: ``tool.abort``, then ``settled`` TIMEOUT."""
        if self._task(i, PENDING, s) is None:
            return None
        w = list(s)
        calls, s2c = list(s[F_CALLS]), [*s[F_S2C], ("abort", i)]
        end_call(calls, s2c, i, "finish", Phase.SETTLED.value, NONE)
        w[F_CALLS], w[F_S2C] = tuple(calls), tuple(s2c)
        return tuple(w)

    def unwind(self, i: int, s: State) -> State | None:
        """A cancelled app call's task runs its finally: unanswered, it sends ``tool.abort``."""
        record = self._task(i, UNWIND, s)
        if record is None:
            return None
        w = list(s)
        w[F_CALLS] = put(s[F_CALLS], i, (*record[:C_TASK], NONE, record[C_RESULTS]))
        w[F_S2C] = (*s[F_S2C], ("abort", i))
        return tuple(w)

    def server_interrupt(self, s: State) -> State | None:
        """The server interrupts its own turn (barge-in ``input``, or the app): epoch + 1."""
        if s[F_SERVER_INTERRUPTS] >= self.server_interrupts or not self._alive(s):
            return None
        w = list(s)
        if not self._interrupt_turn(w, s[F_SEPOCH] + 1):
            return None
        w[F_SERVER_INTERRUPTS] += 1
        return tuple(w)

    def _interrupt_turn(self, w: list[Any], epoch: int) -> bool:
        """Turn.interrupt: every open call ``cancelled`` at once, then the scope cancelled."""
        target = move(TURN, w[F_TURN], "interrupt")
        if target is None:
            return False  # already interrupting or ended: nothing to do
        w[F_TURN], w[F_SEPOCH] = target, epoch
        calls, s2c = list(w[F_CALLS]), list(w[F_S2C])
        for i, record in enumerate(calls):
            if record[C_TC] not in TOOL_CALL.finals:
                task = record[C_TASK]
                if task in (HOOK, EXEC):
                    task = NONE  # cancelled at its next checkpoint, nothing to send
                elif task == WAIT:
                    task = LATE if self.late_dispatch else NONE
                elif task == PENDING:
                    task = UNWIND
                end_call(calls, s2c, i, "interrupt", Phase.CANCELLED.value, task)
        w[F_CALLS], w[F_S2C] = tuple(calls), tuple(s2c)
        return True

    def unwound(self, s: State) -> State | None:
        """Every task of the interrupted turn has exited: ``interrupted``, ``turn.ended``."""
        if s[F_TURN] != "interrupting" or not self._alive(s):
            return None
        if any(record[C_TASK] != NONE for record in s[F_CALLS]):
            return None
        w = list(s)
        w[F_TURN] = turn_ends(s[F_TURN], "unwound", s[F_CALLS])
        w[F_S2C] = (*s[F_S2C], ("ended", s[F_SEPOCH], "interrupted"))
        self._rest(w)
        return tuple(w)

    def close(self, s: State) -> State | None:
        """The session closes for good (shutdown): ``closed`` if a connection is up."""
        target = move(SESSION, s[F_SESSION], "close")
        if target is None:
            return None
        w = list(s)
        w[F_SESSION] = target
        w[F_MOVEMENT] = must(self.movement, s[F_MOVEMENT], "close", "the session closed")
        if s[F_SESSION] == "open":
            w[F_S2C] = (*s[F_S2C], ("closed",))
        return tuple(w)

    def expire(self, s: State) -> State | None:
        """The resume window of a detached session runs out: closed, nobody told."""
        target = move(SESSION, s[F_SESSION], "expire")
        if target is None:
            return None
        w = list(s)
        w[F_SESSION] = target
        w[F_MOVEMENT] = must(self.movement, s[F_MOVEMENT], "close", "the session expired")
        return tuple(w)

    def server_receives(self, s: State) -> State | None:
        """The server processes the next client message (``tool.result`` or ``interrupt``)."""
        if not s[F_C2S] or s[F_SESSION] != "open":
            return None
        message = s[F_C2S][0]
        w = list(s)
        w[F_C2S] = s[F_C2S][1:]
        if message[0] == "interrupt":  # the client's epoch, or above the server's own
            epoch = max(message[1], s[F_SEPOCH] + 1)
            self._interrupt_turn(w, epoch)
            w[F_SEPOCH] = epoch
            if s[F_CRASHES] < self.crashes and s[F_SAVED] != LIVE:
                w[F_SINCE] = (*s[F_SINCE], message)  # not saved: the client still holds it
            return tuple(w)
        i = message[1]  # tool.result: only an open app call with its epoch takes it
        if i >= len(s[F_CALLS]):
            return tuple(w)  # a call lost in a crash: this process never knew it, dropped
        task = s[F_CALLS][i][C_TASK]
        if task == PENDING:
            calls, s2c = list(s[F_CALLS]), list(s[F_S2C])
            end_call(calls, s2c, i, "finish", Phase.SETTLED.value, NONE)
            w[F_CALLS], w[F_S2C] = tuple(calls), tuple(s2c)
        elif task == UNWIND:  # the result is taken, the cancelled task sends no tool.abort
            record = s[F_CALLS][i]
            w[F_CALLS] = put(s[F_CALLS], i, (*record[:C_TASK], NONE, record[C_RESULTS]))
        return tuple(w)  # otherwise answered error (UNKNOWN_CALL, STALE_EPOCH...): no change

    def detach(self, s: State) -> State | None:
        """The server notices the dead socket (Session ``drop``): it stops receiving; turns
        and tools go on, what it sends is kept for replay."""
        if not s[F_DEAD] or s[F_SESSION] != "open":
            return None
        w = list(s)
        w[F_SESSION] = must(SESSION, s[F_SESSION], "drop", "the socket closed")
        return tuple(w)

    def resume(self, s: State) -> State | None:
        """A new connection resumes the session (``resume``/``resumed``): each side replays
        every message the other has not processed (seq above its lastSeq), in order. At a
        process that adopted the session after a crash, the lost turn is then settled."""
        if s[F_SESSION] != "detached" or s[F_CONN] != "reconnecting":
            return None
        w = list(s)
        w[F_DEAD] = False
        w[F_SESSION] = must(SESSION, s[F_SESSION], "resume", "a valid resume")
        w[F_CONN] = must(CONNECTION, s[F_CONN], "resumed", "welcome (resumed)")
        if s[F_MOVEMENT] in ("adopted", "recovering"):  # the process that took it over
            w[F_MOVEMENT] = must(self.movement, s[F_MOVEMENT], "resume", "its client resumed")
            if s[F_MOVEMENT] == "recovering":
                self._settle_lost_turn(w)
        return tuple(w)

    # -- handover-v1: saves, handovers, crashes -------------------------------------------------

    def _saved(self, w: list[Any]) -> None:
        """Save the session, exactly as it is now (a turn boundary with no turn open): the
        engine's state and the protocol's (what the client has not processed stays in the
        replay buffer; the client's messages processed so far need no replay).

        The saved state is then the live one (LIVE): afterwards the turn and its calls no
        longer change and nothing more is sent before the session closes; only the epoch
        may rise, by interrupts, which the client replays to an adopting process if this
        one dies (their acks are held back until saved), so that process, having taken
        them, is where this one was. Broken "ack-unsaved" keeps a copy instead: the
        interrupts are lost."""
        if self.broken == "ack-unsaved" or w[F_TURN] not in TURN.finals:
            w[F_SAVED] = (w[F_TURN], w[F_FIRST], w[F_SEPOCH], w[F_CALLS])
            w[F_SAVED_S2C] = len(w[F_S2C])
        else:
            w[F_SAVED], w[F_SAVED_S2C] = LIVE, 0
        w[F_SINCE] = ()

    def save(self, s: State) -> State | None:
        """The turn has ended (``turn.ended`` sent, every call final): the server saves the
        session to the store. Only the saved state outlives a crash (so the save is tracked
        only while a crash may still come)."""
        if s[F_CRASHES] >= self.crashes or not self._alive(s) or s[F_TURN] not in TURN.finals:
            return None
        if s[F_SAVED] == LIVE or s[F_SAVED][0] in TURN.finals:
            return None  # saved already
        saving = move(self.movement, s[F_MOVEMENT], "save")
        if saving is None:
            return None  # the machine lets no save be written now
        w = list(s)
        w[F_MOVEMENT] = saving
        self._saved(w)
        return tuple(w)

    def hand_over(self, s: State) -> State | None:
        """A planned handover (a drain, or the session moving to the process its client's
        resume reached), when the Movement machine allows it (``hand_over``: between turns
        only): the server saves the session exactly, lets it go (``let_go``; Session
        ``hand_over``) and closes the connection with 1012, no ``closed``; the client takes
        1012 as a lost connection and resumes at once; the process its resume reaches
        restores the saved state (Session ``adopt``, Movement ``adopt``) and resumes it as
        any other. (The two processes' Session and Movement machines are one field each:
        the old one's final move, then the new one's first.)"""
        if s[F_HANDOVERS] >= self.handovers or not self._alive(s):
            return None
        handing = move(self.movement, s[F_MOVEMENT], "hand_over")
        if handing is None or move(SESSION, s[F_SESSION], "hand_over") is None:
            return None
        must(self.movement, handing, "let_go", "its last save is written")
        w = list(s)
        w[F_SESSION] = must(SESSION, SESSION.initial, "adopt", "restored from the store")
        w[F_MOVEMENT] = must(self.movement, self.movement.initial, "adopt", "handed over")
        self._saved(w)
        if s[F_CONN] == "open":
            w[F_CONN] = must(CONNECTION, s[F_CONN], "lost", "closed with 1012")
        w[F_DEAD] = True
        w[F_HANDOVERS] += 1
        if s[F_TURN] not in TURN.finals:  # a machine that let it move mid-turn: the tasks
            # did not move, nobody streams, runs or waits any more
            w[F_CALLS] = tuple((*r[:C_TASK], NONE, r[C_RESULTS]) for r in s[F_CALLS])
        return tuple(w)

    def crash(self, s: State) -> State | None:
        """The server process dies: what it did since its last save is gone, and the
        connection with it (what was in flight is lost; the client notices, ``lost``).
        After the lease, another process restores the saved state (Session ``adopt``) and
        waits for the client's resume, replaying then what the saved replay buffer holds
        that the client has not processed; the client replays every message above the
        saved received seq: the interrupts processed since the save (their acks held back
        until saved) and what was in flight. Its tool.results concern calls that are final
        or unknown at any boundary: the adopting process drops them.

        Once the turn's end is saved (LIVE) the adopting process is where the dead one was,
        and the crash is a drop: it does not count against ``crashes`` (like a drop, one
        stands for any number).

        A drain that could not write its handover (the store failing) lets the session go
        unsaved at its end (Movement ``abandon``: 1012, no ``closed``, the record as last
        saved): for the client and the process that adopts it, that is this very crash,
        so it is no transition of its own."""
        if s[F_CRASHES] >= self.crashes or s[F_SESSION] not in ("open", "detached"):
            return None
        w = list(s)
        w[F_SESSION] = must(SESSION, SESSION.initial, "adopt", "restored after a crash")
        w[F_MOVEMENT] = must(self.movement, self.movement.initial, "adopt_lost", "its node died")
        if s[F_CONN] == "open":
            w[F_CONN] = must(CONNECTION, s[F_CONN], "lost", "the server process died")
        w[F_DEAD] = True
        if s[F_SAVED] == LIVE:
            return tuple(w)
        w[F_TURN], w[F_FIRST], w[F_SEPOCH], w[F_CALLS] = s[F_SAVED]
        w[F_S2C] = s[F_S2C][: s[F_SAVED_S2C]]
        since = () if self.broken == "ack-unsaved" else s[F_SINCE]
        w[F_C2S], w[F_SINCE] = (*since, *s[F_C2S]), ()
        w[F_CRASHES] += 1
        return tuple(w)

    def _settle_lost_turn(self, w: list[Any]) -> None:
        """At the resume of a session adopted after a crash, after the replay: ``cancelled``
        for each call the client reports open (``hello.open``: its CallView is not final)
        that the saved state does not have final, then, if the saved state had the turn
        open, ``turn.ended`` interrupted with the epoch raised by one (the history marks the
        turn interrupted). A reported call or turn the saved state has final gets nothing
        more: its terminal phase, or its ``turn.ended``, is in the saved replay buffer (the
        client has not processed it, so it had not acked it when the state was saved), and
        the replay brings it. The process gives the calls no result of its own: a lost
        call's result died with the old process."""
        cancel, end_turn = self.lost_work(w)
        s2c = list(w[F_S2C])
        for i in cancel:
            if self.broken == "crash-result":
                raise Broken(
                    "one-result",
                    f"{name(i)}, lost with the dead process, gets a result from the one "
                    "that adopted the session",
                )
            if self.broken != "crash-no-cancel":
                s2c.append(("stream", i, Phase.CANCELLED.value))
        if end_turn:
            interrupting = must(TURN, w[F_TURN], "interrupt", "the lost turn is settled")
            w[F_TURN] = turn_ends(interrupting, "unwound", w[F_CALLS])
            w[F_SEPOCH] += 1
            s2c.append(("ended", w[F_SEPOCH], "interrupted"))
        w[F_S2C] = tuple(s2c)

    @staticmethod
    def lost_work(s: State | list[Any]) -> tuple[list[int], bool]:
        """What an adopting process settles at the client's resume: the calls the client
        reports open that the saved state does not have final, and whether the saved state
        had the turn open."""
        calls = s[F_CALLS]
        cancel = [
            i
            for i, (view, *_) in enumerate(s[F_CLIENT])
            if view is not None
            and view not in CALL_VIEW.finals
            and (i >= len(calls) or calls[i][C_TC] not in TOOL_CALL.finals)
        ]
        return cancel, s[F_TURN] not in TURN.finals
