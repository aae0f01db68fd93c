"""``vrt demo``: a scripted conversation, printed as a live timeline of its events.

The demo runs an in-process session (no network) with a :class:`~vrt.ScriptedModel` and a
few server tools, and prints every event the moment ``session.subscribe()`` delivers it.
Four turns show, in order:

1. a call whose arguments stream in several fragments, then reports progress and succeeds;
2. a high-risk call the ``before_tool_call`` hook rejects (REJECTED, the tool never runs);
3. a call whose arguments fail the tool's JSON Schema (INVALID, the tool never runs);
4. a turn the user interrupts while one tool runs and a second call is still streaming its
   arguments: both calls are ``cancelled`` and the turn ends ``interrupted``.

Every delay is multiplied by ``scale``, so tests can run the same story fast or on an
autojump clock. ``vrt.ToolPreview`` events are counted, not shown: they repeat the stream
phases in the legacy shape.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any, Final, TextIO

import attrs
import trio

import vrt
from vrt.models import CallDelta, ModelEvent, ModelRequest
from vrt.testing import assert_stream_valid

#: The scale ``vrt demo --fast`` uses: the same story at a tenth of the delays.
FAST: Final = 0.1

#: What each turn should end with: its status and its calls' codes (None for ok).
EXPECTED: Final[tuple[tuple[str, tuple[str | None, ...]], ...]] = (
    ("finished", (None,)),
    ("finished", ("REJECTED",)),
    ("finished", ("INVALID",)),
    ("interrupted", ("INTERRUPTED", "INTERRUPTED")),
)

_USER: Final = (
    "Find me a flight from Lisbon to Oslo on Friday.",
    "Book the cheapest one.",
    "And get me a window seat.",
    "Export the itinerary and email it to me.",
)
_BARGE_IN: Final = "Wait, stop, not yet!"


@attrs.frozen(kw_only=True)
class Outcome:
    """What a demo run produced: every turn's result, event counts, and whether the run told
    the expected story with a valid event stream."""

    results: tuple[vrt.TurnResult, ...]
    events: int
    """Events received, tool previews included."""
    previews: int
    """``vrt.ToolPreview`` events received (not shown)."""
    problems: tuple[str, ...]
    """Deviations from the expected story or the stream lifecycle; empty when all is well."""

    @property
    def ok(self) -> bool:
        """True when the run told the expected story and its stream was valid."""
        return not self.problems


async def run_demo(out: TextIO, *, scale: float = 1.0, color: bool = False) -> Outcome:
    """Play the demo conversation, printing its timeline to ``out`` as events arrive.

    ``scale`` multiplies every delay (1.0 takes about four seconds). ``color`` adds ANSI
    colours; the caller decides (a TTY, ``NO_COLOR`` unset). If cancelled, the session closes
    and the run stops where it was.
    """
    timeline = Timeline(out, color=color)
    agent = vrt.define_agent(
        model=_PacedModel(_script(scale), delta_delay=0.04 * scale),
        tools=_tools(scale),
        before_tool_call=reject_high_risk,
        instructions="You are a travel assistant.",
    )
    timeline.header("vrt demo: a scripted conversation, in process (no network)")
    # The follower lives outside the session so that it outlives it: leaving the session
    # block emits Closed, and the follower drains every event up to it before ending.
    async with trio.open_nursery() as nursery:
        async with vrt.open_session(agent) as session:
            await nursery.start(timeline.follow, session)
            results = await _play(session, timeline, scale)
    problems = _check(results, timeline.events)
    timeline.summary(results, problems)
    return Outcome(
        results=tuple(results),
        events=len(timeline.events),
        previews=timeline.previews,
        problems=problems,
    )


async def _play(session: vrt.Session, timeline: Timeline, scale: float) -> list[vrt.TurnResult]:
    """The user's side: three turns played to their end, then one interrupted."""
    results = []
    for text in _USER[:-1]:
        await timeline.caught_up()
        timeline.note("user", json.dumps(text))
        turn = await session.start_turn(text)
        results.append(await turn.wait())
        await trio.sleep(0.2 * scale)  # the user takes a breath between turns
    # Barge in while the export runs and the email's arguments are half streamed. Waiting
    # for what the timeline showed, not for a timer, tells the same story on a loaded machine.
    halfway = timeline.when_shown("email_itinerary", vrt.Phase.ARGUMENTS_DELTA, count=4)
    await timeline.caught_up()
    timeline.note("user", json.dumps(_USER[-1]))
    turn = await session.start_turn(_USER[-1])
    await halfway.wait()
    await timeline.caught_up()
    timeline.note("user", f"{json.dumps(_BARGE_IN)}  -> turn.interrupt()")
    turn.interrupt()
    results.append(await turn.wait())
    return results


def _check(results: Sequence[vrt.TurnResult], events: Sequence[vrt.Event]) -> tuple[str, ...]:
    problems = []
    got = tuple(
        (r.status, tuple(None if c.result.ok else str(c.result.code) for c in r.calls))
        for r in results
    )
    if got != EXPECTED:
        problems.append(f"unexpected outcome: {got!r}, expected {EXPECTED!r}")
    try:
        assert_stream_valid(events)
    except AssertionError as exc:
        problems.append(f"stream lifecycle: {exc}")
    return tuple(problems)


# -- the agent: its tools, its policy, its script ------------------------------------------


async def reject_high_risk(info: vrt.CallInfo) -> vrt.Reject | None:
    """The demo's ``before_tool_call`` hook: there is nobody to confirm a high-risk call,
    so reject it; let everything else run."""
    if info.risk == "high":
        return vrt.Reject(f"{info.name} is high risk and needs the user's confirmation")
    return None


def _tools(scale: float) -> list[vrt.ServerTool]:
    @vrt.server_tool(
        risk="low",
        description="Search flights for a day",
        parameters={
            "type": "object",
            "properties": {
                "origin": {"type": "string"},
                "destination": {"type": "string"},
                "date": {"type": "string"},
            },
            "required": ["origin", "destination", "date"],
        },
    )
    async def search_flights(args: dict[str, Any], ctx: vrt.ToolContext) -> Any:
        airlines = ("TAP", "SAS", "Norwegian")
        for done, airline in enumerate(airlines, 1):
            await trio.sleep(0.25 * scale)
            ctx.emit({"checked": airline, "done": done, "of": len(airlines)})
        return {"flights": 3, "cheapest": {"airline": "SAS", "price_eur": 189}}

    @vrt.server_tool(
        risk="high",
        description="Book and pay for a flight",
        parameters={
            "type": "object",
            "properties": {"flight": {"type": "string"}, "price_eur": {"type": "number"}},
            "required": ["flight", "price_eur"],
        },
    )
    async def book_flight(args: dict[str, Any], ctx: vrt.ToolContext) -> Any:
        return {"booking": "never made: the hook rejects this call"}

    @vrt.server_tool(
        risk="medium",
        description="Choose a seat, as row and letter (12A)",
        parameters={
            "type": "object",
            "properties": {"seat": {"type": "string", "pattern": "^[1-9][0-9]?[A-F]$"}},
            "required": ["seat"],
        },
    )
    async def choose_seat(args: dict[str, Any], ctx: vrt.ToolContext) -> Any:
        return {"seat": args["seat"]}

    @vrt.server_tool(
        risk="low",
        description="Render the itinerary as a PDF",
        parameters={"type": "object", "properties": {"format": {"enum": ["pdf"]}}},
    )
    async def export_itinerary(args: dict[str, Any], ctx: vrt.ToolContext) -> Any:
        pages = 8
        for page in range(1, pages + 1):
            ctx.emit({"page": page, "of": pages})
            await trio.sleep(0.3 * scale)  # interrupted here: Trio cancels at this checkpoint
        return {"file": "itinerary.pdf"}

    @vrt.server_tool(
        risk="medium",
        description="Email a file to the user",
        parameters={
            "type": "object",
            "properties": {
                "to": {"type": "string"},
                "subject": {"type": "string"},
                "attachment": {"type": "string"},
            },
            "required": ["to", "subject"],
        },
    )
    async def email_itinerary(args: dict[str, Any], ctx: vrt.ToolContext) -> Any:
        return {"sent": True}

    return [search_flights, book_flight, choose_seat, export_itinerary, email_itinerary]


def _script(scale: float) -> vrt.ScriptedModel:
    """The model's side. Each turn with a call takes two model steps: the call, then the
    answer once its result is in the history."""

    def pause(seconds: float) -> Any:
        return vrt.pause(seconds * scale)

    return vrt.ScriptedModel(
        [
            # turn 1: streamed arguments, progress, ok
            [
                vrt.say("Let me look for flights."),
                pause(0.3),
                vrt.call(
                    "search_flights",
                    {"origin": "LIS", "destination": "OSL", "date": "Friday"},
                    chunks=6,
                ),
            ],
            [pause(0.25), vrt.say("I found 3 flights; the cheapest is SAS at 189 EUR.")],
            # turn 2: high risk, rejected by the hook
            [
                vrt.say("Booking the SAS flight."),
                pause(0.2),
                vrt.call("book_flight", {"flight": "SK1822", "price_eur": 189}, chunks=3),
            ],
            [pause(0.2), vrt.say("I can't book it without your confirmation. Shall I?")],
            # turn 3: arguments that fail the schema
            [
                vrt.say("Choosing your seat."),
                pause(0.2),
                vrt.call("choose_seat", {"seat": "by the window"}, chunks=3),
            ],
            [pause(0.2), vrt.say("Which seat exactly? Give me a row and a letter, like 12A.")],
            # turn 4: a slow tool runs while a second call streams; the user interrupts
            [
                vrt.say("Exporting your itinerary, then I'll email it."),
                pause(0.2),
                vrt.call("export_itinerary", {"format": "pdf"}, chunks=3),
                pause(0.25),
                vrt.call(
                    "email_itinerary",
                    {
                        "to": "you@example.com",
                        "subject": "Your trip to Oslo",
                        "attachment": "itinerary.pdf",
                    },
                    chunks=8,
                ),
            ],
            [vrt.say("Done: the itinerary is in your inbox.")],  # never reached
        ]
    )


class _PacedModel:
    """Wraps a ScriptedModel and sleeps before each argument fragment, so the fragments
    arrive over time as a real model's would (``vrt.call`` sends its chunks back to back)."""

    def __init__(self, inner: vrt.ScriptedModel, *, delta_delay: float) -> None:
        self.inner = inner
        self.delta_delay = delta_delay

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Stream the inner model's step, pacing ``CallDelta`` events."""
        events = self.inner.stream(request)
        # Close the inner generator with us (on interrupt), not at garbage collection; its
        # annotation only promises an AsyncIterator.
        assert isinstance(events, AsyncGenerator)
        async with contextlib.aclosing(events):
            async for event in events:
                if isinstance(event, CallDelta):
                    await trio.sleep(self.delta_delay)
                yield event


# -- the timeline ------------------------------------------------------------------------


_STYLES: Final = {
    "dim": "2",
    "bold": "1",
    "green": "32",
    "red": "31",
    "yellow": "33",
    "cyan": "36",
}


@attrs.define(kw_only=True)
class _Watch:
    name: str
    phase: vrt.Phase
    left: int
    done: trio.Event


class Timeline:
    """Prints events as one line each: elapsed time, turn, who, what."""

    def __init__(self, out: TextIO, *, color: bool) -> None:
        self.out = out
        self.color = color
        self.start = trio.current_time()
        self.events: list[vrt.Event] = []
        self.previews = 0
        self._channel: vrt.Subscription[vrt.Event] | None = None
        self._watches: list[_Watch] = []

    async def follow(
        self, session: vrt.Session, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Print every event of ``session`` as it arrives, until it closes.

        Use with ``nursery.start``: it reports started once subscribed, so no event of a
        turn started afterwards is missed. Cancelling it stops the printing.
        """
        async with session.subscribe() as events:
            self._channel = events
            task_status.started()
            async for event in events:
                self.events.append(event)
                self.show(event)

    async def caught_up(self) -> None:
        """Return once every event delivered so far has been printed.

        The demo's own lines (what the user says) must not overtake events still queued
        for the follower. The follower is caught up when nothing is buffered and it is
        parked in ``receive``: a task handed an event is no longer counted as waiting.
        Cancellable (it polls with a checkpoint).
        """
        assert self._channel is not None, "caught_up() before follow() started"
        while True:
            stats = self._channel.statistics()
            if stats.current_buffer_used == 0 and stats.tasks_waiting_receive > 0:
                return
            await trio.lowlevel.checkpoint()

    def when_shown(self, name: str, phase: vrt.Phase, *, count: int = 1) -> trio.Event:
        """An event set once ``count`` stream events of ``phase`` for calls of the tool
        ``name`` have been printed."""
        watch = _Watch(name=name, phase=phase, left=count, done=trio.Event())
        self._watches.append(watch)
        return watch.done

    def show(self, event: vrt.Event) -> None:
        """Print one event (tool previews are only counted)."""
        if isinstance(event, vrt.ToolPreview):
            self.previews += 1
        elif isinstance(event, vrt.ToolStream):
            self._line(event.turn_id, event.call_id, self._call(event))
            for watch in self._watches:
                if watch.name == event.name and watch.phase == event.phase:
                    watch.left -= 1
                    if watch.left == 0:
                        watch.done.set()
        elif isinstance(event, vrt.TextDelta):
            self._line(event.turn_id, "agent", self._paint(json.dumps(event.text), "cyan"))
        elif isinstance(event, vrt.TurnStarted):
            self._line(event.turn_id, "turn", self._paint(f"started (epoch {event.epoch})", "bold"))
        elif isinstance(event, vrt.TurnEnded):
            style = "bold" if event.reason == "finished" else "yellow"
            self._line(
                event.turn_id,
                "turn",
                self._paint(f"ended {event.reason} (epoch now {event.epoch})", style),
            )
        elif isinstance(event, vrt.Closed):
            self._line("", "session", f"closed ({event.reason})")
        else:  # a new event type: still show it rather than drop it silently
            self._line("", "event", repr(event))

    def _call(self, event: vrt.ToolStream) -> str:
        phase = vrt.Phase(event.phase)
        head = f"{event.name:<17} {phase.value:<19}"
        if phase is vrt.Phase.ARGUMENTS_DELTA:
            return f"{head} {self._paint(repr(event.delta), 'dim')}"
        if phase is vrt.Phase.ARGUMENTS_COMPLETE:
            return f"{head} {_short(_json(event.arguments))}"
        if phase is vrt.Phase.PROGRESS:
            return f"{head} {_short(_json(event.progress))}"
        if phase is vrt.Phase.SETTLED:
            if event.ok:
                return f"{head} {self._paint('ok', 'green')}"
            return f"{head} {self._paint(f'{event.code}', 'red')}  {event.message or ''}"
        if phase is vrt.Phase.CANCELLED:
            return self._paint(head.rstrip(), "yellow")
        if phase is vrt.Phase.FAILED:
            return f"{self._paint(head, 'red')} {event.message or ''}"
        return head.rstrip()

    def header(self, text: str) -> None:
        """Print a title line."""
        self._write(self._paint(text, "bold"))

    def note(self, who: str, text: str) -> None:
        """Print a line of the demo's own (what the user says), stamped now."""
        self._line("", who, text)

    def summary(self, results: Sequence[vrt.TurnResult], problems: Sequence[str]) -> None:
        """Print one line per turn (status, each call's code), the counts and any problem."""
        self._write("")
        self._write(self._paint("summary", "bold"))
        for result in results:
            calls = ", ".join(
                f"{c.call_id} {c.name} "
                + (
                    self._paint("ok", "green")
                    if c.result.ok
                    else self._paint(str(c.result.code), "red")
                )
                for c in result.calls
            )
            self._write(f"  {result.turn_id:<4} {result.status:<12} {calls}")
        shown = len(self.events) - self.previews
        self._write(
            f"  {shown} events shown, {self.previews} tool previews not shown, "
            f"{trio.current_time() - self.start:.3f}s"
        )
        for problem in problems:
            self._write(self._paint(f"  problem: {problem}", "red"))
        if not problems:
            self._write("  every call has exactly one terminal phase and one result")

    def _line(self, turn_id: str, who: str, text: str) -> None:
        elapsed = f"+{trio.current_time() - self.start:.3f}s"
        self._write(f"{self._paint(f'{elapsed:>8}', 'dim')}  {turn_id:<4} {who:<8} {text}")

    def _write(self, line: str) -> None:
        # Flush each line: the point is to watch the events arrive, even through a pipe.
        self.out.write(line + "\n")
        self.out.flush()

    def _paint(self, text: str, style: str) -> str:
        if not self.color:
            return text
        return f"\x1b[{_STYLES[style]}m{text}\x1b[0m"


def _json(value: Any) -> str:
    # Progress is application data: show what is not JSON rather than fail the timeline.
    return json.dumps(value, default=repr)


def _short(text: str, limit: int = 72) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
