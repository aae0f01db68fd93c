"""The voice demo's agent (``vrt demo --web --voice``): a weather assistant that talks.

By default its model is :class:`vrt.testing.FakeRealtime` speaking OpenAI's Realtime events
on a loopback port, with a tone as its voice: the user speaks (the fake's voice detector
hears the microphone), the model looks the weather up with a server tool, says it, and puts
it on a card in the page with an app tool that takes its time (long enough to barge in on).
With ``--realtime openai`` or ``--realtime gemini`` and the vendor's key in the environment
(``$OPENAI_API_KEY``, ``$GEMINI_API_KEY``), the same agent runs on the real model.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import vrt

INSTRUCTIONS = (
    "You are a weather assistant in a web page. Look the weather up with the weather tool, "
    "say it in one short sentence, then show it on a card with show_card."
)

REPEATS = 50
"""The fake plays its script this many times over (one cursor for every session it
serves: a page opened again goes on where the last one was)."""


def steps() -> list[list[Any]]:
    """What the fake model says and calls, one list per response."""
    once: list[list[Any]] = [
        [vrt.say("Let me check the weather in Paris."), vrt.call("weather", {"city": "Paris"})],
        [
            vrt.say(
                "It is twenty one degrees and sunny in Paris, a lovely day for a walk along "
                "the river, and I am putting it on a card for you right now."
            ),
            vrt.call("show_card", {"title": "Paris", "text": "21 °C, sunny"}),
        ],
        [vrt.say("There it is.")],
    ]
    return once * REPEATS


@vrt.server_tool(
    risk="low",
    description="The weather now in a city",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
)
async def weather(args: Any, ctx: vrt.ToolContext) -> Any:
    return {"city": args["city"], "temp_c": 21, "sky": "sunny"}


def agent_on(model: Any) -> vrt.Agent:
    """The voice demo's agent on ``model``: the weather tool, the page's app tools."""
    return vrt.define_agent(
        model=model, tools=[weather], client_tools="accept", instructions=INSTRUCTIONS
    )


@asynccontextmanager
async def voice_agent(realtime: str | None = None) -> AsyncIterator[vrt.Agent]:
    """The agent, on the fake model (``realtime`` None) or on the real one named."""
    if realtime == "openai":
        yield agent_on(vrt.models.OpenAIRealtime())
        return
    if realtime == "gemini":
        yield agent_on(vrt.models.GeminiLive("gemini-live-2.5-flash-preview"))
        return
    from vrt.testing import FakeRealtime

    async with FakeRealtime(steps(), api="openai") as fake:
        yield agent_on(vrt.models.OpenAIRealtime(url=fake.url, api_key="demo"))
