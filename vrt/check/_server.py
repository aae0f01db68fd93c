"""``vrt check``: the server's side of the composed model (vrt/_engine/turn.py, vrt/_engine/call.py,
vrt/_net/serve.py): the model's stream, each call's task, interrupts, the session's life."""

from __future__ import annotations

from typing import Any

from vrt._core.events import Phase
from vrt._core.tables import CONNECTION, SESSION, TOOL_CALL, TURN
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
    F_CONN,
    F_DEAD,
    F_FIRST,
    F_S2C,
    F_SEPOCH,
    F_SERVER_INTERRUPTS,
    F_SESSION,
    F_TURN,
    HOOK,
    LATE,
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
        """Whether the server still acts: its session is not closed (then it is frozen)."""
        return bool(s[F_SESSION] != "closed")

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
        return tuple(w)

    def close(self, s: State) -> State | None:
        """The session closes for good (shutdown): ``closed`` if a connection is up."""
        target = move(SESSION, s[F_SESSION], "close")
        if target is None:
            return None
        w = list(s)
        w[F_SESSION] = target
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
            return tuple(w)
        i = message[1]  # tool.result: only an open app call with its epoch takes it
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
        every message the other has not processed (seq above its lastSeq), in order."""
        if s[F_SESSION] != "detached" or s[F_CONN] != "reconnecting":
            return None
        w = list(s)
        w[F_DEAD] = False
        w[F_SESSION] = must(SESSION, s[F_SESSION], "resume", "a valid resume")
        w[F_CONN] = must(CONNECTION, s[F_CONN], "resumed", "welcome (resumed)")
        return tuple(w)
