"""``vrt check``, part two: the composed model.

:mod:`vrt.check` documents what is modelled and what is abstracted. The model is split in
parts: the vocabulary (:mod:`vrt.check._state`: invariants, state layout, messages, the
table helpers), the server's actions (:mod:`vrt.check._server`) and the client's
(:mod:`vrt.check._client`). :class:`Model` puts them together: the initial state, the list
of named actions, the reduction's predicates, and the check of states at rest. An action is
a named function ``(state) -> state | None`` (None: not enabled); an invariant broken by a
step raises :class:`~vrt.check._state.Broken` from inside it.
"""

from __future__ import annotations

import functools

from vrt._core.tables import CONNECTION, MOVEMENT, SESSION, TURN, Table
from vrt.check._client import ClientRules
from vrt.check._server import ServerRules
from vrt.check._state import (
    BREAKABLE,
    C_RESULTS,
    CLIENT,
    ENV,
    F_C2S,
    F_CALLS,
    F_CEPOCH,
    F_CLIENT,
    F_CONN,
    F_CRASHES,
    F_DEAD,
    F_DROPS,
    F_FIRST,
    F_HANDOVERS,
    F_LAST_BEGUN,
    F_MOVEMENT,
    F_QUEUE,
    F_RUNNING,
    F_S2C,
    F_SAVED,
    F_SAVED_S2C,
    F_SEPOCH,
    F_SERVER_INTERRUPTS,
    F_SESSION,
    F_SINCE,
    F_TURN,
    F_TURN_SEEN,
    F_USER_INTERRUPTS,
    LIVE,
    SERVER,
    SHOWN_NOTHING,
    SHOWN_OPEN,
    START_SAVED,
    TURN_EPOCH,
    V_SHOWN,
    WINDOW,
    Action,
    Broken,
    State,
    describe,
    must,
    name,
)


class Model(ServerRules, ClientRules):
    """The composed model for one set of bounds and rules."""

    def __init__(
        self,
        calls: int = 3,
        user_interrupts: int = 1,
        server_interrupts: int = 0,
        drops: int = 1,
        *,
        handovers: int = 1,
        crashes: int = 1,
        phases: bool = False,
        broken: str | None = None,
        movement: Table = MOVEMENT,
    ) -> None:
        if min(calls, user_interrupts, server_interrupts, drops, handovers, crashes) < 0:
            raise ValueError("bounds must not be negative")
        if broken is not None and broken not in BREAKABLE:
            raise ValueError(f"unknown rule {broken!r}; breakable: {', '.join(BREAKABLE)}")
        self.calls, self.drops, self.phases = calls, drops, phases
        self.handovers, self.crashes = handovers, crashes
        self.user_interrupts, self.server_interrupts = user_interrupts, server_interrupts
        self.broken = broken
        self.movement = movement if broken != "handover-mid-turn" else _mid_turn(movement)
        self.late_dispatch = broken == "late-dispatch"
        self.run_after_cancel = broken == "run-after-cancel"
        self.overtake = broken == "overtake"
        self.actions = self._actions()

    def initial(self) -> State:
        """The turn has just started in epoch 0 (its start saved, ``turn.started`` seen by
        the client); session and connection are open."""
        session = must(SESSION, SESSION.initial, "accept", "hello")
        connection = must(CONNECTION, CONNECTION.initial, "welcome", "welcome")
        movement = self.movement.initial
        for event in ("open", "start"):  # opened here, its turn started
            movement = must(self.movement, movement, event, "the session's first turn")
        blank = (None, False, None, SHOWN_NOTHING)
        return (
            TURN.initial, 0, TURN_EPOCH, session, (), (), (), False,
            connection, TURN_EPOCH, (blank,) * self.calls, (), (), -1, 0, 0, 0,
            START_SAVED if self.crashes else LIVE, 0, (), movement, 0, 0, 0,
        )  # fmt: skip

    def _actions(self) -> list[Action]:
        p = functools.partial
        out = [
            Action(SERVER, f"model: starts {name(i)} ({kind} tool)", p(self.start_call, i, kind))
            for i in range(self.calls)
            for kind in ("app", "server")
        ]
        for i in range(self.calls):
            c = name(i)
            if self.phases:
                out += [
                    Action(SERVER, f"model: streams a delta of {c}", p(self.delta, i)),
                    Action(SERVER, f"server tool: {c} reports progress", p(self.progress, i)),
                ]
            out += [
                Action(SERVER, f"model: completes {c}'s arguments", p(self.complete, i)),
                Action(SERVER, f"hook: allows {c}", p(self.allow, i)),
                Action(SERVER, f"hook: declines {c}", p(self.decline, i)),
                Action(SERVER, f"server tool: {c} returns", p(self.finish, i)),
                Action(SERVER, f"server: sends {c} to the app (tool.call)", p(self.dispatch, i)),
                Action(SERVER, f"server: {c} times out (tool.abort, TIMEOUT)", p(self.timeout, i)),
                Action(SERVER, f"server: {c}'s task unwinds (tool.abort)", p(self.unwind, i)),
                Action(CLIENT, f"app: the tool of {c} returns", p(self.app_returns, i)),
            ]
        out += [
            Action(SERVER, "model: ends the step", self.end_step),
            Action(SERVER, "server: next model step", self.next_step),
            Action(SERVER, "server: finishes the turn at max_steps", self.max_steps),
            Action(SERVER, "server: interrupts the turn (barge-in)", self.server_interrupt),
            Action(SERVER, "server: the turn has unwound", self.unwound),
            Action(SERVER, "server: closes the session", self.close, WINDOW, ENV),
            Action(SERVER, "server: notices the drop (detached)", self.detach, WINDOW),
            Action(SERVER, "server: the detached session expires", self.expire, WINDOW),
            Action(SERVER, lambda s: f"server <- {describe(s[F_C2S][0])}", self.server_receives),
            Action(CLIENT, lambda s: f"client <- {describe(s[F_S2C][0])}", self.client_receives),
            Action(CLIENT, "client: the user interrupts", self.user_interrupt),
            Action(CLIENT, lambda s: f"client: begins {name(s[F_QUEUE][0])}", self.begin),
            Action(CLIENT, "network: the connection drops (client: lost)", self.lost, env=ENV),
            Action(SERVER, self._resume_label, self.resume, WINDOW),
            Action(CLIENT, "client: resuming fails, the session is gone", self.give_up, WINDOW),
            Action(SERVER, "server: saves the session (the turn has ended)", self.save),
            Action(
                SERVER,
                "server: hands the session over (saved, closed 1012, client: lost); "
                "another process adopts it",
                self.hand_over,
                env=ENV,
            ),
            Action(
                SERVER,
                "server: the process dies (client: lost); another adopts the last save",
                self.crash,
                env=ENV,
                ample=True,
            ),
        ]
        return out

    def _resume_label(self, s: State) -> str:
        if s[F_MOVEMENT] != "recovering":
            return "server: the client resumes the session (replay)"
        cancel, end_turn = self.lost_work(s)
        if cancel or end_turn:
            return "server: the client resumes the session (replay), the lost turn is settled"
        return "server: the client resumes the session at the adopting process (replay)"

    def down(self, s: State) -> bool:
        """Whether the connection is down: then only the drop's own moves are explored.

        With exact replay, anything else done while the connection is down (server steps,
        the user's actions) commutes with the drop: it is the same, action for action, as
        doing it just before the drop, which the exploration covers.
        """
        return bool(s[F_DEAD])

    def subsume(self, s: State) -> State:
        """A resumed state is the state before the drop with the drop spent; that state
        (drop unspent) can do all it can and more, so it stands for it. The same holds
        for a handover once the saved state is the live one (LIVE, the only case without
        a broken rule): the process that resumed the session is where the old one was."""
        if s[F_CONN] != "open" or s[F_SESSION] != "open" or not self._alive(s):
            return s
        handed = s[F_HANDOVERS] and s[F_SAVED] == LIVE
        if not s[F_DROPS] and not handed:
            return s
        w = list(s)
        w[F_DROPS] = 0
        if handed:
            w[F_HANDOVERS] = 0
        return tuple(w)

    def client_first(self, s: State) -> bool:
        """Whether the client's enabled actions alone are an ample set at ``s``.

        Partial-order reduction (see :mod:`vrt.check`): the client's actions touch only the
        client's fields, the head of the server-to-client channel and the tail of the other
        one, so they commute with every server action. When the client can receive (its
        connection is open and a message waits), no server action can enable or disable a
        client action, and the client's enabled actions may be explored alone, with the
        crash (``Action.ample``), which disables them: every other server action is, before
        a crash, the same as not taken, but for the save, and a save made with the client
        behind is one made with it caught up (the replay brings it the rest).
        """
        return bool(s[F_S2C]) and s[F_CONN] == "open"

    def server_first(self, s: State) -> bool:
        """Whether the server's enabled actions alone are an ample set at ``s`` (the mirror
        of :meth:`client_first`): the server can receive, and no client action can enable a
        server action (the socket can no longer die unnoticed by the server)."""
        lost_possible = s[F_CONN] == "open" and s[F_DROPS] < self.drops
        return bool(s[F_C2S]) and s[F_SESSION] == "open" and not lost_possible

    def canonical(self, s: State) -> State:
        """``s`` with the fields no action will read again reset, so that states that differ
        only there are one state. Once the session is closed the server's fields and the
        client-to-server channel are dead, and so is the server-to-client channel unless the
        client is still connected to drain it; once the client is closed too, nothing is
        left to check and every such state is one (the answer of a tool that returns after
        ``closed`` is not modelled)."""
        if s[F_SESSION] != "closed":
            if s[F_CRASHES] < self.crashes or s[F_SAVED] == LIVE:
                return s
            w = list(s)  # no crash can come: what was saved is never read again
            w[F_SAVED], w[F_SAVED_S2C], w[F_SINCE] = LIVE, 0, ()
            return tuple(w)
        w = list(s)
        w[F_SAVED], w[F_SAVED_S2C], w[F_SINCE] = LIVE, 0, ()
        w[F_HANDOVERS], w[F_CRASHES] = 0, 0
        w[F_TURN], w[F_FIRST], w[F_SEPOCH], w[F_CALLS] = "", 0, 0, ()
        w[F_C2S], w[F_DEAD], w[F_SERVER_INTERRUPTS] = (), False, 0
        if s[F_CONN] != "open":
            w[F_S2C] = ()
        if not s[F_QUEUE] and all(message[0] != "ended" for message in w[F_S2C]):
            w[F_TURN_SEEN] = 0  # no turn.ended can come, no app call begin: never read
        if s[F_CONN] == "closed":
            blank = (None, False, None, SHOWN_NOTHING)
            w[F_CEPOCH], w[F_CLIENT], w[F_QUEUE], w[F_RUNNING] = 0, (blank,) * self.calls, (), ()
            w[F_LAST_BEGUN], w[F_USER_INTERRUPTS], w[F_DROPS] = -1, 0, 0
            w[F_TURN_SEEN] = 0
        return tuple(w)

    # -- at rest ----------------------------------------------------------------------------------

    def check_at_rest(self, s: State) -> None:
        """Raise :class:`Broken` if a state at rest breaks an end-state rule.

        At rest: nothing can happen but the environment's actions (the session may always
        close, the connection may drop), i.e. the engine and the app have nothing left to do.
        """
        if s[F_SESSION] == "closed":
            return  # calls may stay without results or terminals: the reference says so
        for i, record in enumerate(s[F_CALLS]):
            if record[C_RESULTS] != 1:
                raise Broken("one-result", f"{name(i)} ends with {record[C_RESULTS]} results")
        for i, record in enumerate(s[F_CLIENT]):
            if record[V_SHOWN] == SHOWN_OPEN:
                raise Broken("stream", f"the app never sees a terminal phase for {name(i)}")
        if s[F_TURN] not in TURN.finals:
            raise Broken("stuck", f"at rest, but the turn is {s[F_TURN]}")
        if s[F_QUEUE] or s[F_RUNNING]:
            raise Broken("stuck", "at rest, but an app call is queued or running")
        if s[F_TURN_SEEN] != 1:
            raise Broken("turn-ended", "at rest, but the app never saw turn.ended")
        if s[F_CEPOCH] > s[F_SEPOCH]:
            raise Broken(
                "epochs",
                f"at rest, the client is in epoch {s[F_CEPOCH]}, the server in "
                f"{s[F_SEPOCH]}: the client would refuse the next turn's calls as stale",
            )

    def marks(self, s: State) -> tuple[bool, bool]:
        """Whether ``s`` comes after a handover, and after a crash (for the figures)."""
        return bool(s[F_HANDOVERS]), bool(s[F_CRASHES])


def _mid_turn(movement: Table) -> Table:
    """``movement`` as a machine that would let a session move in the middle of a turn
    (``hand_over`` from ``busy``): the broken rule ``handover-mid-turn``."""
    broken = Table(movement.chart)
    broken.transitions[("busy", "hand_over")] = "handing_over"
    return broken
