"""The demo's agent: its server tools (flights, bookings, an export that reports progress),
the model's script for the five turns, and a model paced like a real one."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import trio

import vrt
from vrt.models import CallDelta, ModelEvent, ModelRequest


def at_full_pace() -> vrt.Agent:
    """The demo's agent at its real pace (``vrt serve --web`` without MODULE:AGENT)."""
    return agent(1.0)


def fast() -> vrt.Agent:
    """The demo's agent with every delay a tenth (``vrt demo --fast``), for tests."""
    return agent(0.1)


def agent(scale: float) -> vrt.Agent:
    """The travel assistant the demo serves: the script, the server tools, the client's app
    tools accepted, and a confirmation before every high-risk call."""
    return vrt.define_agent(
        model=PacedModel(script(scale), delta_delay=0.04 * scale),
        tools=server_tools(scale),
        client_tools="accept",  # offer the client's app tools to the model
        before_tool_call=vrt.require_confirmation(min_risk="high"),
        instructions="You are a travel assistant.",
    )


def server_tools(scale: float) -> list[vrt.ServerTool]:
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


def script(scale: float) -> vrt.ScriptedModel:
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


class PacedModel:
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

    def session_state(self, session_id: str) -> list[int] | None:
        """The script's place, which moves with the session to another server process."""
        return self.inner.session_state(session_id)

    def restore_session(self, session_id: str, state: object) -> None:
        """Go on from another process's place in the script."""
        self.inner.restore_session(session_id, state)
