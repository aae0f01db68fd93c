"""The demo's timeline: every event a client receives, one line each as it arrives, and the
story as the client saw it (:func:`seen_turns`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, TextIO

import attrs
import trio

import vrt


@attrs.frozen(kw_only=True)
class SeenCall:
    """One call as the client saw it: how its stream ended."""

    call_id: str
    name: str
    kind: str
    code: str | None
    """None when it settled ok; the code when it settled with a failure; INTERRUPTED when
    it was ``cancelled``; FAILED when it ``failed``; ``"open"`` if it never ended."""


@attrs.frozen(kw_only=True)
class SeenTurn:
    """One turn as the client saw it."""

    turn_id: str
    epoch: int
    """The epoch the turn started in."""
    status: str | None
    """``turn.ended``'s reason; None if the turn never ended."""
    ended_epoch: int | None
    """The session's epoch after the turn ended (raised by an interrupt)."""
    calls: tuple[SeenCall, ...]


def seen_turns(events: Iterable[vrt.Event]) -> tuple[SeenTurn, ...]:
    """Each turn of a client's event log: its epochs, its status and its calls' codes."""
    turns: dict[str, dict[str, Any]] = {}
    calls: dict[str, dict[str, Any]] = {}
    for event in events:
        if isinstance(event, vrt.TurnStarted):
            turns[event.turn_id] = {"epoch": event.epoch, "ended": None, "calls": []}
        elif isinstance(event, vrt.TurnEnded) and event.turn_id in turns:
            turns[event.turn_id]["ended"] = event
        elif isinstance(event, vrt.ToolStream):
            phase = vrt.Phase(event.phase)
            if phase is vrt.Phase.START:
                calls[event.call_id] = {"name": event.name, "kind": event.kind, "code": "open"}
                if event.turn_id in turns:
                    turns[event.turn_id]["calls"].append(event.call_id)
            elif event.call_id in calls:
                call = calls[event.call_id]
                if phase is vrt.Phase.SETTLED:
                    call["code"] = None if event.ok else str(event.code)
                elif phase is vrt.Phase.CANCELLED:
                    call["code"] = str(vrt.ResultCode.INTERRUPTED)
                elif phase is vrt.Phase.FAILED:
                    call["code"] = str(vrt.ResultCode.FAILED)
    return tuple(
        SeenTurn(
            turn_id=turn_id,
            epoch=turn["epoch"],
            status=turn["ended"].reason if turn["ended"] else None,
            ended_epoch=turn["ended"].epoch if turn["ended"] else None,
            calls=tuple(SeenCall(call_id=c, **calls[c]) for c in turn["calls"]),
        )
        for turn_id, turn in turns.items()
    )


_STYLES: Final = {
    "dim": "2",
    "bold": "1",
    "green": "32",
    "red": "31",
    "yellow": "33",
    "magenta": "35",
    "cyan": "36",
}


@attrs.define(kw_only=True)
class _Watch:
    matches: Callable[[vrt.Event], bool]
    left: int
    done: trio.Event


@attrs.frozen(kw_only=True)
class _Note:
    turn_id: str
    who: str
    text: str
    after: str | None


class Timeline:
    """Prints events as one line each: elapsed time, turn, who, what.

    The demo's own lines (what the user says, what the app tools do) are notes; a note
    never overtakes an event already delivered to the timeline.
    """

    def __init__(self, out: TextIO, *, color: bool) -> None:
        self.out = out
        self.color = color
        self.start = trio.current_time()
        self.events: list[vrt.Event] = []
        self.previews = 0
        self.local: list[vrt.Event] = []
        """The events ``client.interrupt()`` emitted itself (see :meth:`mark_local`)."""
        self._channel: vrt.Subscription[vrt.Event] | None = None
        self._following = False
        self._watches: list[_Watch] = []
        self._notes: list[_Note] = []
        self._issued: set[str] = set()  # calls whose arguments-complete was shown
        self._turns: dict[str, str] = {}  # call id -> turn id
        self.last_turn = ""
        """The turn the timeline showed starting last."""

    async def follow(
        self, client: vrt.Client, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Print every event ``client`` receives as it arrives, until its session closes.

        Use with ``nursery.start``: it reports started once subscribed, so no event of a
        turn started afterwards is missed. Cancelling it stops the printing.
        """
        async with client.subscribe() as events:
            self._channel = events
            self._following = True
            task_status.started()
            async for event in events:
                self.events.append(event)
                self.show(event)
                if events.statistics().current_buffer_used == 0:
                    self._flush_notes()
        self._flush_notes(force=True)
        self._following = False

    def _caught_up(self) -> bool:
        # Caught up: nothing buffered, and the follower parked in receive (a task handed
        # an event is no longer counted as waiting); or no follower any more.
        if self._channel is None or not self._following:
            return True
        stats = self._channel.statistics()
        return stats.current_buffer_used == 0 and stats.tasks_waiting_receive > 0

    async def caught_up(self) -> None:
        """Return once every event delivered so far has been printed.

        The demo's own lines must not overtake events still queued for the follower.
        Cancellable (it polls with a checkpoint).
        """
        while not self._caught_up():
            await trio.lowlevel.checkpoint()

    def when(self, matches: Callable[[vrt.Event], bool], *, count: int = 1) -> trio.Event:
        """An event set once ``count`` events for which ``matches`` is true were printed."""
        watch = _Watch(matches=matches, left=count, done=trio.Event())
        self._watches.append(watch)
        return watch.done

    def turn_of(self, call_id: str) -> str:
        """The turn of a call the timeline has shown."""
        return self._turns.get(call_id, "")

    def mark_local(self, events: Sequence[vrt.Event]) -> None:
        """Tag ``events`` (emitted by the client itself, not received) when shown."""
        self.local.extend(events)

    def note(
        self,
        who: str,
        text: str,
        *,
        turn_id: str = "",
        after: str | None = None,
        now: bool = False,
    ) -> None:
        """Print a line of the demo's own, once every event delivered so far is shown.

        ``after``: hold the line until the call with this id showed ``arguments-complete``.
        ``now``: print at once, ahead of events still queued.
        """
        note = _Note(turn_id=turn_id, who=who, text=text, after=after)
        if now:
            self._line(note.turn_id, note.who, note.text)
            return
        self._notes.append(note)
        if self._caught_up():
            self._flush_notes()

    def _flush_notes(self, *, force: bool = False) -> None:
        force = force or (self._channel is not None and not self._following)
        while self._notes:
            note = self._notes[0]
            if not force and note.after is not None and note.after not in self._issued:
                return  # the notes keep their order: later ones wait too
            del self._notes[0]
            self._line(note.turn_id, note.who, note.text)

    def show(self, event: vrt.Event) -> None:
        """Print one event (tool previews are only counted)."""
        if isinstance(event, vrt.ToolPreview):
            self.previews += 1
        elif isinstance(event, vrt.ToolStream):
            if event.phase == vrt.Phase.START:
                self._turns[event.call_id] = event.turn_id
            elif event.phase == vrt.Phase.ARGUMENTS_COMPLETE:
                self._issued.add(event.call_id)
            self._line(event.turn_id, event.call_id, self._call(event))
        elif isinstance(event, vrt.ConfirmRequest):
            head = f"{event.name:<17} {'confirm.request':<19}"
            self._line(
                self.turn_of(event.call_id),
                event.call_id,
                f"{head} {self.paint(event.prompt, 'yellow')}",
            )
        elif isinstance(event, vrt.TextDelta):
            self._line(event.turn_id, "agent", self.paint(json.dumps(event.text), "cyan"))
        elif isinstance(event, vrt.TurnStarted):
            self.last_turn = event.turn_id
            self._line(event.turn_id, "turn", self.paint(f"started (epoch {event.epoch})", "bold"))
        elif isinstance(event, vrt.TurnEnded):
            style = "bold" if event.reason == "finished" else "yellow"
            self._line(
                event.turn_id,
                "turn",
                self.paint(f"ended {event.reason} (epoch now {event.epoch})", style),
            )
        elif isinstance(event, vrt.Reconnecting):
            text = "connection lost: reconnecting with backoff (the server keeps the session)"
            self._line(self.last_turn, "client", self.paint(text, "yellow"))
        elif isinstance(event, vrt.Resumed):
            text = "resumed the same session: what was missed is replayed, in order"
            self._line(self.last_turn, "client", self.paint(text, "yellow"))
        elif isinstance(event, vrt.Closed):
            self._line("", "session", f"closed ({event.reason})")
        else:  # a new event type: still show it rather than drop it silently
            self._line("", "event", repr(event))
        for watch in self._watches:
            if watch.left and watch.matches(event):
                watch.left -= 1
                if watch.left == 0:
                    watch.done.set()

    def _call(self, event: vrt.ToolStream) -> str:
        phase = vrt.Phase(event.phase)
        head = f"{event.name:<17} {phase.value:<19}"
        if phase is vrt.Phase.ARGUMENTS_DELTA:
            return f"{head} {self.paint(repr(event.delta), 'dim')}"
        if phase is vrt.Phase.ARGUMENTS_COMPLETE:
            return f"{head} {_short(show_json(event.arguments))}"
        if phase is vrt.Phase.PROGRESS:
            return f"{head} {_short(show_json(event.progress))}"
        if phase is vrt.Phase.SETTLED:
            if event.ok:
                return f"{head} {self.paint('ok', 'green')}"
            return f"{head} {self.paint(f'{event.code}', 'red')}  {event.message or ''}"
        if phase is vrt.Phase.CANCELLED:
            if any(event is local for local in self.local):
                return f"{self.paint(head, 'yellow')} local, by client.interrupt()"
            return self.paint(head.rstrip(), "yellow")
        if phase is vrt.Phase.FAILED:
            return f"{self.paint(head, 'red')} {event.message or ''}"
        return head.rstrip()

    def header(self, text: str) -> None:
        """Print a title line."""
        self._write(self.paint(text, "bold"))

    def summary(self, turns: Sequence[SeenTurn], problems: Sequence[str]) -> None:
        """Print one line per turn as the client saw it (status, epochs, each call's code),
        the counts and any problem."""
        self._write("")
        self._write(self.paint("summary (the client's view)", "bold"))
        for turn in turns:
            calls = ", ".join(
                f"{c.call_id} {c.name}{' (app)' if c.kind == 'app' else ''} "
                + (self.paint("ok", "green") if c.code is None else self.paint(c.code, "red"))
                for c in turn.calls
            )
            epochs = f"epoch {turn.epoch}"
            if turn.ended_epoch is not None and turn.ended_epoch != turn.epoch:
                epochs += f"->{turn.ended_epoch}"
            self._write(f"  {turn.turn_id:<4} {turn.status or 'open':<12} {epochs:<11} {calls}")
        shown = len(self.events) - self.previews
        self._write(
            f"  {shown} events shown, {self.previews} tool previews not shown, "
            f"{trio.current_time() - self.start:.3f}s"
        )
        for problem in problems:
            self._write(self.paint(f"  problem: {problem}", "red"))
        if not problems:
            self._write(
                "  assert_stream_valid: every call has exactly one terminal phase; "
                "app tools ran one at a time, in call order"
            )

    def _line(self, turn_id: str, who: str, text: str) -> None:
        elapsed = f"+{trio.current_time() - self.start:.3f}s"
        self._write(f"{self.paint(f'{elapsed:>8}', 'dim')}  {turn_id:<4} {who:<8} {text}")

    def _write(self, line: str) -> None:
        # Flush each line: the point is to watch the events arrive, even through a pipe.
        self.out.write(line.rstrip() + "\n")
        self.out.flush()

    def paint(self, text: str, style: str) -> str:
        """``text`` in ``style`` when colours are on."""
        if not self.color:
            return text
        return f"\x1b[{_STYLES[style]}m{text}\x1b[0m"


def show_json(value: Any) -> str:
    # Progress is application data: show what is not JSON rather than fail the timeline.
    return json.dumps(value, default=repr)


def _short(text: str, limit: int = 72) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
