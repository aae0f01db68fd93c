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
    Callable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import Any, Final, TextIO

import attrs
import trio

import vrt
from vrt._cli import demo_agent
from vrt._cli.timeline import SeenTurn, Timeline, seen_turns, show_json
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
    agent = demo_agent.agent(scale)
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


# -- the story's checks ----------------------------------------------


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
        self._note(ctx, "app run() starts", f"epoch {ctx.epoch}, {show_json(args)}")
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
