"""``vrt demo``: a scripted conversation over a real WebSocket, printed as a live timeline.

The demo serves an agent (a :class:`~vrt.ScriptedModel`, a few server tools, the built-in
confirmation hook) with :func:`vrt.serve` on a loopback port, connects to it with
:func:`vrt.connect` as an app hosting a few app tools, and prints every event the CLIENT
receives the moment ``client.subscribe()`` delivers it, with what the app's tools and its
user do. Five turns show, in order:

1. a server call whose arguments stream in several fragments, then reports progress and
   succeeds;
2. two high-risk calls that wait for the user's confirmation (``confirm.request``): the
   user approves the first (it runs) and denies the second with a reason (REJECTED);
3. a call whose arguments fail the tool's JSON Schema (INVALID, the tool never runs);
4. three app tools called in one model step: the client runs them one at a time, in
   arrival order, each ``run()`` starting only after the previous one returned; while the
   second runs, the connection drops (the client connects through a
   :class:`~vrt.testing.LoopbackProxy`, which cuts it): the client shows ``Reconnecting``,
   resumes the same session (``Resumed``), the app tool's result goes through and the
   turn goes on as if nothing happened;
5. the user interrupts (``client.interrupt()``) while an app tool runs, a server tool runs
   and a third call is still streaming its arguments: the three ``cancelled`` events
   appear at once, locally, before any reply from the server; the app tool's run is
   aborted (its ``ctx.signal`` and its task's cancellation); then the server's
   ``turn.ended`` arrives, ``interrupted``, with the client's new epoch.

It ends with a summary per turn as the client saw it and the lifecycle check
(:func:`vrt.testing.assert_stream_valid`) on the client's event log.

Every delay is multiplied by ``scale``, so tests can run the same story fast or on an
autojump clock; the interrupt is triggered by what the timeline showed, never by a timer.
``vrt.ToolPreview`` events are counted, not shown: they repeat the stream phases in the
legacy shape.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import Any, Final, TextIO

import attrs
import trio

import vrt
from vrt.models import CallDelta, ModelEvent, ModelRequest
from vrt.testing import assert_stream_valid
from vrt.testing._proxy import LoopbackProxy

#: The scale ``vrt demo --fast`` uses: the same story at a tenth of the delays.
FAST: Final = 0.1

#: Seconds after which a stalled story is cut short (it takes about 4.5 s at full scale).
PATIENCE: Final = 30.0

#: What each turn should end with, as the client sees it: its status and its calls' codes
#: (None for ok; a ``cancelled`` call counts as INTERRUPTED, a ``failed`` one as FAILED).
EXPECTED: Final[tuple[tuple[str | None, tuple[str | None, ...]], ...]] = (
    ("finished", (None,)),
    ("finished", (None, "REJECTED")),
    ("finished", ("INVALID",)),
    ("finished", (None, None, None)),
    ("interrupted", ("INTERRUPTED", "INTERRUPTED", "INTERRUPTED")),
)

_USER: Final = (
    "Find me a flight from Lisbon to Oslo on Friday.",
    "Book the cheapest one.",
    "And get me a window seat.",
    "Show me my booking.",
    "Email me the itinerary and show me the route.",
)
_BARGE_IN: Final = "Wait, stop, not yet!"

#: How the user answers each confirmation, by tool name: None approves, a str denies.
_ANSWERS: Final[Mapping[str, str | None]] = {
    "book_flight": None,
    "add_insurance": "No insurance, thanks.",
}


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


@attrs.frozen(kw_only=True)
class AppRun:
    """One ``run()`` of an app tool in the client, timed from inside it."""

    call_id: str
    name: str
    started: float
    ended: float
    outcome: str
    """``"returned"``, ``"aborted (<reason>)"`` or ``"raised"``."""


@attrs.frozen(kw_only=True)
class Outcome:
    """What a demo run produced: every turn as the client saw it, the app tools' runs, event
    counts, and whether the run told the expected story with a valid event stream."""

    turns: tuple[SeenTurn, ...]
    app_runs: tuple[AppRun, ...]
    events: int
    """Events the client received, tool previews included."""
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

    ``scale`` multiplies every delay (1.0 takes about four and a half seconds). ``color``
    adds ANSI colours; the caller decides (a TTY, ``NO_COLOR`` unset). A story that stalls
    for :data:`PATIENCE` seconds is cut short and reported as a problem. If cancelled, the
    client's connection and the server close and the run stops where it was.
    """
    timeline = Timeline(out, color=color)
    app = _App(timeline, scale)
    agent = vrt.define_agent(
        model=_PacedModel(_script(scale), delta_delay=0.04 * scale),
        tools=_server_tools(scale),
        client_tools="accept",  # offer the client's app tools to the model
        before_tool_call=vrt.require_confirmation(min_risk="high"),
        instructions="You are a travel assistant.",
    )
    timeline.header(
        "vrt demo: a scripted conversation over a loopback WebSocket "
        "(vrt.serve and vrt.connect, one process)"
    )
    async with trio.open_nursery() as nursery:
        server = await nursery.start(vrt.serve, agent, "127.0.0.1", 0)
        timeline.note("server", f"vrt.serve listening on {server.url}")
        # The client connects through a loopback proxy, so the demo can drop its connection.
        proxy = LoopbackProxy(server.port)
        url = f"ws://127.0.0.1:{await nursery.start(proxy.run)}/"
        # The app's tasks live outside the client block so that they outlive it: leaving
        # it closes the session, and the follower drains every event up to Closed.
        async with trio.open_nursery() as app_tasks:
            async with vrt.connect(url, tools=app.tools) as client:
                timeline.note(
                    "client",
                    f"vrt.connect: {', '.join(client.capabilities) or 'no capabilities'}, "
                    f"epoch {client.epoch}, app tools {', '.join(t.name for t in app.tools)}",
                )
                await app_tasks.start(timeline.follow, client)
                await app_tasks.start(app.confirm, client)
                with trio.move_on_after(PATIENCE) as patience:
                    await _play(client, app, timeline, scale, proxy)
        nursery.cancel_scope.cancel()  # stop serving
    turns = seen_turns(timeline.events)
    problems = _check(turns, timeline, app)
    if patience.cancelled_caught:
        problems = (f"the story stalled: cut short after {PATIENCE:g} s", *problems)
    timeline.summary(turns, problems)
    return Outcome(
        turns=turns,
        app_runs=tuple(app.runs),
        events=len(timeline.events),
        previews=timeline.previews,
        problems=problems,
    )


async def _play(
    client: vrt.Client, app: _App, timeline: Timeline, scale: float, proxy: LoopbackProxy
) -> None:
    """The user's side: four turns played to their end (the connection drops in the
    fourth), then one interrupted."""
    for number, text in enumerate(_USER[:-1], 1):
        ended = timeline.when(_is(vrt.TurnEnded))
        highlighting = app.when_running("highlight")
        await timeline.caught_up()
        timeline.note("user", json.dumps(text))
        await client.send_text(text)
        if number == 4:  # the network fails while an app tool runs: vrt resumes
            await highlighting.wait()
            proxy.cut()
            timeline.note(
                "network",
                "the connection drops while highlight runs in the app",
                turn_id=timeline.last_turn,
            )
        await ended.wait()
        await trio.sleep(0.15 * scale)  # the user takes a breath between turns
    # Barge in while the map is drawing in the app, the export runs on the server and the
    # email's arguments are half streamed. Waiting for what happened, not for a timer,
    # tells the same story on a loaded machine.
    ended = timeline.when(_is(vrt.TurnEnded))
    drawing = app.when_running("show_map")
    halfway = timeline.when(_phase("email_itinerary", vrt.Phase.ARGUMENTS_DELTA), count=4)
    await timeline.caught_up()
    timeline.note("user", json.dumps(_USER[-1]))
    await client.send_text(_USER[-1])
    await drawing.wait()
    await halfway.wait()
    await timeline.caught_up()
    async with client.subscribe() as mine:
        # This subscription sees exactly what interrupt() emits: it is synchronous, and no
        # other task runs between the two drains.
        _drain(mine)
        timeline.note("user", f"{json.dumps(_BARGE_IN)}  -> client.interrupt()")
        before = client.epoch
        client.interrupt()
        local = _drain(mine)
        timeline.mark_local(local)
        timeline.note(
            "client",
            f"epoch {before} -> {client.epoch} at once; {len(local)} cancelled events "
            "emitted locally, before any reply from the server",
            now=True,
        )
    await ended.wait()


def _drain(subscription: vrt.Subscription[vrt.Event]) -> list[vrt.Event]:
    events = []
    while True:
        try:
            events.append(subscription.receive_nowait())
        except trio.WouldBlock:
            return events


# -- the story as the client saw it, and its checks ----------------------------------------------


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


def _check(turns: Sequence[SeenTurn], timeline: Timeline, app: _App) -> tuple[str, ...]:
    problems = []
    got = tuple((t.status, tuple(c.code for c in t.calls)) for t in turns)
    if got != EXPECTED:
        problems.append(f"unexpected outcome: {got!r}, expected {EXPECTED!r}")
    try:
        assert_stream_valid(timeline.events)
    except AssertionError as exc:
        problems.append(f"stream lifecycle: {exc}")
    # The connection drop in turn 4: lost once, resumed once, nothing run twice.
    kinds = [type(e).__name__ for e in timeline.events]
    if (kinds.count("Reconnecting"), kinds.count("Resumed")) != (1, 1):
        problems.append("the connection drop was not seen lost once and resumed once")
    # The serial queue: app tools run one at a time, in the model's call order.
    app_calls = [c.call_id for t in turns for c in t.calls if c.kind == "app"]
    ran = [run.call_id for run in app.runs]
    if ran != app_calls[: len(ran)]:
        problems.append(f"app tools ran in the order {ran}, not in call order {app_calls}")
    for before, after in itertools.pairwise(app.runs):
        if after.started < before.ended:
            problems.append(f"app tool {after.call_id} started before {before.call_id} ended")
    if app.runs and app.runs[-1].outcome != "aborted (interrupted)":
        problems.append(f"the last app tool was not aborted: {app.runs[-1].outcome}")
    # The interrupt: cancelled locally, at once, for every open call; then the server's end.
    if turns and turns[-1].status == "interrupted":
        last = turns[-1]
        local = [e for e in timeline.events if any(e is x for x in timeline.local)]
        cancelled = {
            e.call_id
            for e in local
            if isinstance(e, vrt.ToolStream) and e.phase == vrt.Phase.CANCELLED
        }
        if cancelled != {c.call_id for c in last.calls} or len(local) != len(cancelled):
            problems.append(f"interrupt() emitted {local!r}, not one cancelled per open call")
        if last.ended_epoch != last.epoch + 1:
            problems.append(f"turn {last.turn_id} ended in epoch {last.ended_epoch}")
    return tuple(problems)


def _is(kind: type) -> Callable[[vrt.Event], bool]:
    return lambda event: isinstance(event, kind)


def _phase(name: str, phase: vrt.Phase) -> Callable[[vrt.Event], bool]:
    return lambda e: isinstance(e, vrt.ToolStream) and e.name == name and e.phase == phase


# -- the server's side: its tools and its script -------------------------------------------------


def _server_tools(scale: float) -> list[vrt.ServerTool]:
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
            await trio.sleep(0.15 * scale)
            ctx.emit({"checked": airline, "done": done, "of": len(airlines)})
        return {"flights": 3, "cheapest": {"flight": "SK1822", "price_eur": 189}}

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
        ctx.emit({"paying_eur": args["price_eur"]})
        await trio.sleep(0.15 * scale)
        async with ctx.committing():  # never half booked
            return {"booking": "ABC123"}

    @vrt.server_tool(
        risk="high",
        description="Buy travel insurance for a booking",
        parameters={
            "type": "object",
            "properties": {"booking": {"type": "string"}, "price_eur": {"type": "number"}},
            "required": ["booking"],
        },
    )
    async def add_insurance(args: dict[str, Any], ctx: vrt.ToolContext) -> Any:
        return {"policy": "never bought: the user denies it"}

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
            await trio.sleep(0.2 * scale)  # interrupted here: Trio cancels at this checkpoint
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

    return [
        search_flights,
        book_flight,
        add_insurance,
        choose_seat,
        export_itinerary,
        email_itinerary,
    ]


def _script(scale: float) -> vrt.ScriptedModel:
    """The model's side. Each turn with calls takes a model step per round of calls, then
    one for the answer once the results are in the history."""

    def pause(seconds: float) -> Any:
        return vrt.pause(seconds * scale)

    return vrt.ScriptedModel(
        [
            # turn 1: streamed arguments, progress, ok
            [
                vrt.say("Let me look for flights."),
                pause(0.2),
                vrt.call(
                    "search_flights",
                    {"origin": "LIS", "destination": "OSL", "date": "Friday"},
                    chunks=6,
                ),
            ],
            [pause(0.15), vrt.say("I found 3 flights; the cheapest is SAS at 189 EUR.")],
            # turn 2: two high-risk calls, each waiting for the user: approved, then denied
            [
                vrt.say("Booking SK1822 for 189 EUR."),
                pause(0.1),
                vrt.call("book_flight", {"flight": "SK1822", "price_eur": 189}, chunks=3),
            ],
            [
                vrt.say("Booked. Shall I add travel insurance?"),
                pause(0.1),
                vrt.call("add_insurance", {"booking": "ABC123", "price_eur": 19}, chunks=2),
            ],
            [pause(0.1), vrt.say("No insurance, then. Your booking is ABC123.")],
            # turn 3: arguments that fail the schema
            [
                vrt.say("Choosing your seat."),
                pause(0.1),
                vrt.call("choose_seat", {"seat": "by the window"}, chunks=3),
            ],
            [pause(0.1), vrt.say("Which seat exactly? Give me a row and a letter, like 12A.")],
            # turn 4: three app tools in one step; the client runs them one at a time
            [
                vrt.say("Here it is."),
                vrt.call("open_panel", {"panel": "bookings"}, chunks=2),
                vrt.call("highlight", {"id": "ABC123"}, chunks=2),
                vrt.call("scroll_to", {"id": "ABC123"}),
            ],
            [vrt.say("Your booking is highlighted.")],
            # turn 5: a server tool runs, an app tool runs, a third call streams; the user
            # interrupts
            [
                vrt.say("Exporting your itinerary; here is the route meanwhile."),
                pause(0.1),
                vrt.call("export_itinerary", {"format": "pdf"}, chunks=2),
                vrt.call("show_map", {"route": ["LIS", "OSL"]}, chunks=2),
                pause(0.1),
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

    def forget(self, session_id: str) -> None:
        """Pass the session's end on to the script (it drops its cursor)."""
        self.inner.forget(session_id)


# -- the client's side: the app's tools and its user ---------------------------------------------


_PANEL: Final = {
    "type": "object",
    "properties": {"panel": {"enum": ["bookings", "itinerary"]}},
    "required": ["panel"],
}
_ELEMENT: Final = {
    "type": "object",
    "properties": {"id": {"type": "string"}},
    "required": ["id"],
}
_MAP: Final = {
    "type": "object",
    "properties": {"route": {"type": "array", "items": {"type": "string"}, "minItems": 2}},
    "required": ["route"],
}


class _App:
    """The user's app: the app tools it hosts, and the user answering confirmations.

    Each app tool prints, from inside its ``run``, when it starts and when it ends, so the
    timeline shows the client's serial queue at work.
    """

    def __init__(self, timeline: Timeline, scale: float) -> None:
        self.timeline = timeline
        self.scale = scale
        self.runs: list[AppRun] = []
        self._running: dict[str, trio.Event] = {}
        self.tools = self._tools()

    def when_running(self, name: str) -> trio.Event:
        """An event set once the app tool ``name`` starts its next run."""
        return self._running.setdefault(name, trio.Event())

    def _tools(self) -> list[vrt.AppTool]:
        scale = self.scale

        @vrt.app_tool(description="Open a side panel of the app", parameters=_PANEL)
        async def open_panel(args: Any, ctx: vrt.ToolContext) -> Any:
            args = vrt.validate_arguments(args, _PANEL)  # app tools validate inside run
            with self._running_tool(ctx, args):
                await trio.sleep(0.2 * scale)  # the panel slides in
            return {"open": args["panel"]}

        @vrt.app_tool(description="Highlight an element of the page", parameters=_ELEMENT)
        async def highlight(args: Any, ctx: vrt.ToolContext) -> Any:
            args = vrt.validate_arguments(args, _ELEMENT)
            with self._running_tool(ctx, args):
                await trio.sleep(0.15 * scale)  # the highlight fades in
            return None

        @vrt.app_tool(description="Scroll an element into view", parameters=_ELEMENT)
        async def scroll_to(args: Any, ctx: vrt.ToolContext) -> Any:
            args = vrt.validate_arguments(args, _ELEMENT)
            with self._running_tool(ctx, args):
                await trio.sleep(0.15 * scale)  # smooth scrolling
            return None

        @vrt.app_tool(description="Draw a route on the map", parameters=_MAP)
        async def show_map(args: Any, ctx: vrt.ToolContext) -> Any:
            args = vrt.validate_arguments(args, _MAP)
            with self._running_tool(ctx, args):
                for _tile in range(12):
                    # Interrupted here: the client cancels the run at this await and
                    # aborts ctx.signal (for code between awaits).
                    await trio.sleep(0.1 * scale)
            return {"shown": args["route"]}

        return [open_panel, highlight, scroll_to, show_map]

    @contextlib.contextmanager
    def _running_tool(self, ctx: vrt.ToolContext, args: Any) -> Iterator[None]:
        """Print and record one run, from its start to its end."""
        started = trio.current_time()
        running = self._running.pop(ctx.name, None)
        if running is not None:
            running.set()
        self._note(ctx, "app run() starts", f"epoch {ctx.epoch}, {_json(args)}")
        outcome = "raised"
        try:
            yield
            outcome = "returned"
        finally:
            if ctx.signal.aborted:
                outcome = f"aborted ({ctx.signal.reason})"
                detail = (
                    f"ctx.signal.aborted, reason {ctx.signal.reason!r}: "
                    "cancelled at its await, nothing drawn"
                )
            else:
                detail = ""
            self._note(ctx, f"app run() {outcome.split()[0]}", detail)
            self.runs.append(
                AppRun(
                    call_id=ctx.call_id,
                    name=ctx.name,
                    started=started,
                    ended=trio.current_time(),
                    outcome=outcome,
                )
            )

    def _note(self, ctx: vrt.ToolContext, what: str, detail: str) -> None:
        text = f"{ctx.name:<17} {self.timeline.paint(f'{what:<19}', 'magenta')} {detail}"
        # Held until the timeline showed the call's arguments-complete: the server can send
        # tool.call ahead of the call's own tool.stream events.
        self.timeline.note(ctx.call_id, text.rstrip(), turn_id=ctx.turn_id, after=ctx.call_id)

    async def confirm(
        self, client: vrt.Client, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """The user answers every confirmation request, after reading the prompt.

        Use with ``nursery.start``; ends when the session closes.
        """
        async with client.subscribe() as events:
            task_status.started()
            async for event in events:
                if not isinstance(event, vrt.ConfirmRequest):
                    continue
                await trio.sleep(0.25 * self.scale)  # the user reads the prompt
                await self.timeline.caught_up()
                reason = _ANSWERS.get(event.name, "I don't know what this is.")
                turn_id = self.timeline.turn_of(event.call_id)
                if reason is None:
                    self.timeline.note("user", '"Yes."  -> request.approve()', turn_id=turn_id)
                    await event.approve()
                else:
                    self.timeline.note(
                        "user", f"{json.dumps(reason)}  -> request.deny(reason)", turn_id=turn_id
                    )
                    await event.deny(reason)


# -- the timeline --------------------------------------------------------------------------------


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
            return f"{head} {_short(_json(event.arguments))}"
        if phase is vrt.Phase.PROGRESS:
            return f"{head} {_short(_json(event.progress))}"
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


def _json(value: Any) -> str:
    # Progress is application data: show what is not JSON rather than fail the timeline.
    return json.dumps(value, default=repr)


def _short(text: str, limit: int = 72) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
