"""``vrt check``: the client's side of the composed model (vrt/_wire/client.py,
vrt/_client/client.py): the call views, the epoch gate, the serial app-tool queue, the user's
interrupt, the turn's end (deduplicated), and the connection as the client sees it."""

from __future__ import annotations

from typing import Any

from vrt._core.events import Phase
from vrt._core.tables import APP_CALL, CALL_VIEW, CONNECTION
from vrt.check._state import (
    F_C2S,
    F_CEPOCH,
    F_CLIENT,
    F_CONN,
    F_DEAD,
    F_DROPS,
    F_LAST_BEGUN,
    F_QUEUE,
    F_RUNNING,
    F_S2C,
    F_SAVED_S2C,
    F_SESSION,
    F_TURN_SEEN,
    F_USER_INTERRUPTS,
    SHOWN_OPEN,
    TERMINAL,
    TURN_EPOCH,
    V_SHOWN,
    VIEW_EVENT,
    Broken,
    Rules,
    State,
    move,
    must,
    name,
    put,
    show,
)


class ClientRules(Rules):
    """The client's actions: each ``(state) -> state | None``."""

    def client_receives(self, s: State) -> State | None:
        """The client processes the next server message (vrt/_wire/client.py)."""
        if not s[F_S2C] or s[F_CONN] != "open":
            return None
        message = s[F_S2C][0]
        w = list(s)
        w[F_S2C] = s[F_S2C][1:]
        if s[F_SAVED_S2C]:  # processed: a replay from the saved buffer starts after it
            w[F_SAVED_S2C] = s[F_SAVED_S2C] - 1
        kind = message[0]
        if kind == "stream":
            self._stream(w, message[1], message[2])
        elif kind == "call":
            self._tool_call(w, message[1])
        elif kind == "abort":
            self._tool_abort(w, message[1])
        elif kind == "ended":
            if w[F_TURN_SEEN]:  # a crash's settling of a turn the app already saw end
                if self.broken != "no-dedupe":
                    return tuple(w)  # dropped: the app sees one turn.ended per turn
                raise Broken("turn-ended", "the app sees a second turn.ended for the turn")
            for i, record in enumerate(w[F_CLIENT]):
                if record[V_SHOWN] == SHOWN_OPEN:
                    raise Broken("stream", f"the turn ended while the app shows {name(i)} open")
            w[F_CEPOCH] = max(w[F_CEPOCH], message[1])
            w[F_TURN_SEEN] = 1
        elif kind == "closed":
            w[F_CONN] = must(CONNECTION, w[F_CONN], "close", "the server sent closed")
            self._closed(w)
        return tuple(w)

    def _stream(self, w: list[Any], i: int, phase: str) -> None:
        view, ignored, app, shown = w[F_CLIENT][i]
        if phase == Phase.START.value:
            if ignored:
                return
            if view is not None or TURN_EPOCH < w[F_CEPOCH]:
                ignored = True  # a call of a turn the user already interrupted
            else:
                view, shown = CALL_VIEW.initial, show(i, shown, phase)
            w[F_CLIENT] = put(w[F_CLIENT], i, (view, ignored, app, shown))
            return
        if ignored or view is None or view in CALL_VIEW.finals:
            if self.broken == "view-gate" and phase in TERMINAL:
                shown = show(i, shown, phase)  # the broken gate lets the late phase through
                w[F_CLIENT] = put(w[F_CLIENT], i, (view, ignored, app, shown))
            return  # already final here (cancelled locally): the late phase is dropped
        target = move(CALL_VIEW, view, VIEW_EVENT[phase])
        if target is None:
            raise Broken("stream", f"the server streams {phase} for {name(i)} while it is {view}")
        shown = show(i, shown, phase)
        w[F_CLIENT] = put(w[F_CLIENT], i, (target, ignored, app, shown))
        if phase in TERMINAL and not (self.run_after_cancel and app == "queued"):
            self._tool_abort(w, i)  # as tool.abort: a queued call is dropped, a running one stops

    def _tool_call(self, w: list[Any], i: int) -> None:
        view, ignored, app, shown = w[F_CLIENT][i]
        if app is not None and app not in APP_CALL.finals:
            return  # the same call again: it runs once
        if TURN_EPOCH != w[F_CEPOCH] and self.broken != "epoch-gate":
            app = must(APP_CALL, APP_CALL.initial, "stale", "the epoch gate")
            w[F_C2S] = (*w[F_C2S], ("result", i))  # INTERRUPTED, never runs
        else:
            app = must(APP_CALL, APP_CALL.initial, "admit", "the epoch gate")
            w[F_QUEUE] = (*w[F_QUEUE], i)
        w[F_CLIENT] = put(w[F_CLIENT], i, (view, ignored, app, shown))

    def _tool_abort(self, w: list[Any], i: int) -> None:
        view, ignored, app, shown = w[F_CLIENT][i]
        if app is None or app in APP_CALL.finals:
            return
        app = must(APP_CALL, app, "abort", "tool.abort")
        if i not in w[F_RUNNING]:  # queued: dropped; running: its tool is cancelled
            w[F_QUEUE] = tuple(c for c in w[F_QUEUE] if c != i)
        w[F_CLIENT] = put(w[F_CLIENT], i, (view, ignored, app, shown))

    def _closed(self, w: list[Any]) -> None:
        """The session is over: queued app calls are dropped, the running one aborted."""
        client = list(w[F_CLIENT])
        for i in (*w[F_QUEUE], *w[F_RUNNING]):
            view, ignored, app, shown = client[i]
            if app in ("queued", "running"):
                app = must(APP_CALL, app, "abort", "closed")
            client[i] = (view, ignored, app, shown)
        w[F_CLIENT], w[F_QUEUE] = tuple(client), ()

    def user_interrupt(self, s: State) -> State | None:
        """``client.interrupt()``: epoch + 1, every open view cancelled locally, queued app
        calls dropped, the running one aborted, then ``interrupt`` to the server."""
        if s[F_USER_INTERRUPTS] >= self.user_interrupts or s[F_CONN] == "closed":
            return None
        w = list(s)
        w[F_USER_INTERRUPTS] += 1
        epoch = w[F_CEPOCH] = s[F_CEPOCH] + 1
        client = list(s[F_CLIENT])
        for i, (view, ignored, app, shown) in enumerate(client):
            if view is not None and view not in CALL_VIEW.finals:
                view = must(CALL_VIEW, view, "cancel", "the user interrupted")
                ignored, shown = True, show(i, shown, Phase.CANCELLED.value)
            if app in ("queued", "running"):
                app = must(APP_CALL, app, "abort", "the user interrupted")
            client[i] = (view, ignored, app, shown)
        w[F_CLIENT], w[F_QUEUE] = tuple(client), ()
        w[F_C2S] = (*s[F_C2S], ("interrupt", epoch))
        return tuple(w)

    def begin(self, s: State) -> State | None:
        """The client's runner begins the next queued app call (one at a time).

        The client's checks of "epoch", "serial" and "interrupt".
        """
        if not s[F_QUEUE] or (s[F_RUNNING] and self.broken != "serial-queue"):
            return None
        i = s[F_QUEUE][0]
        view, ignored, app, shown = s[F_CLIENT][i]
        if TURN_EPOCH < s[F_CEPOCH]:
            raise Broken(
                "epoch", f"{name(i)} of epoch {TURN_EPOCH} begins in client epoch {s[F_CEPOCH]}"
            )
        if s[F_RUNNING]:
            running = ", ".join(name(c) for c in s[F_RUNNING])
            raise Broken("serial", f"{name(i)} begins while {running} runs")
        if i <= s[F_LAST_BEGUN]:
            raise Broken("serial", f"{name(i)} begins after {name(s[F_LAST_BEGUN])}")
        if view == "cancelled":
            raise Broken("interrupt", f"{name(i)} begins after the app was shown it cancelled")
        if s[F_TURN_SEEN]:
            raise Broken("interrupt", f"{name(i)} begins after the app saw its turn end")
        w = list(s)
        w[F_QUEUE] = s[F_QUEUE][1:]
        app = must(APP_CALL, app, "begin", "the runner took it from the queue")
        w[F_CLIENT] = put(s[F_CLIENT], i, (view, ignored, app, shown))
        w[F_RUNNING] = (*s[F_RUNNING], i)
        w[F_LAST_BEGUN] = i
        return tuple(w)

    def app_returns(self, i: int, s: State) -> State | None:
        """The app tool of ``i`` returns (or unwinds after an abort): answered if not aborted."""
        if i not in s[F_RUNNING]:
            return None
        w = list(s)
        w[F_RUNNING] = tuple(c for c in s[F_RUNNING] if c != i)
        view, ignored, app, shown = s[F_CLIENT][i]
        if app == "running":
            app = must(APP_CALL, app, "answer", "the tool returned")
            w[F_CLIENT] = put(s[F_CLIENT], i, (view, ignored, app, shown))
            w[F_C2S] = (*s[F_C2S], ("result", i))
        return tuple(w)

    # -- the network, as the client sees it -------------------------------------------------------

    def lost(self, s: State) -> State | None:
        """The socket dies and the client notices (Connection ``lost``): what is in flight to
        it is lost, kept by the server for replay. The server notices on its own time."""
        if s[F_DROPS] >= self.drops or s[F_CONN] != "open":
            return None
        w = list(s)
        w[F_DEAD], w[F_DROPS] = True, s[F_DROPS] + 1
        w[F_CONN] = must(CONNECTION, s[F_CONN], "lost", "the socket closed")
        return tuple(w)

    def give_up(self, s: State) -> State | None:
        """The client cannot resume a closed session: its connection closes for good."""
        if s[F_CONN] != "reconnecting" or s[F_SESSION] != "closed":
            return None
        w = list(s)
        w[F_CONN] = must(CONNECTION, s[F_CONN], "close", "resume failed")
        self._closed(w)
        return tuple(w)
