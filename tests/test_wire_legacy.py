"""Without batch-v1 and local-preview-v1 the wire is byte for byte what it was before them.

One scripted session (text, a server tool with progress, an app tool whose arguments
stream in fragments, a second turn) between a client offering only ``tool-stream-v1`` and a
server offering everything: every frame in both directions but acks (their timing varies
with the scheduling), the session id and resume token replaced by placeholders, equals
``data/legacy_session.txt``, recorded at 7cb94c8, the commit before the capabilities.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
import trio.testing

import vrt
from tests.conftest import Log, until
from vrt.testing import open_pair

GOLDEN = Path(__file__).parent / "data" / "legacy_session.txt"
OBJ = {"type": "object"}
SCRIPT = [
    [vrt.say("Looking that up."), vrt.call("lookup", {"q": "a" * 150}, chunks=5)],
    [vrt.call("edit", {"text": "hello " * 40}, chunks=8), vrt.say("Editing.")],
    [vrt.say("Done.")],
    [vrt.call("edit", {"text": "bye"})],
    [vrt.say("Bye.")],
]


class Recording:
    """A client connection that writes down every frame but an ack alone, both ways."""

    def __init__(self, ws: Any, frames: list[str]) -> None:
        self.ws = ws
        self.frames = frames

    def _note(self, direction: str, frame: str) -> None:
        data = json.loads(frame)
        if not (isinstance(data, dict) and data["type"] == "ack"):  # batches kept whole
            self.frames.append(f"{direction} {frame}")

    async def send_message(self, message: str) -> None:
        self._note(">", message)
        await self.ws.send_message(message)

    async def get_message(self) -> str:
        message: str = await self.ws.get_message()
        self._note("<", message)
        return message

    async def aclose(self) -> None:
        await self.ws.aclose()


def session_parts() -> tuple[vrt.Agent, list[vrt.AppTool]]:
    """The session's agent (a fresh script cursor each time) and its app tool."""

    @vrt.server_tool(risk="low", parameters=OBJ)
    async def lookup(args: Any, ctx: vrt.ToolContext) -> dict[str, Any]:
        ctx.emit({"looking": len(args["q"])})
        await trio.sleep(0.01)
        return {"found": 1}

    @vrt.app_tool(parameters=OBJ)
    async def edit(args: Any, ctx: vrt.ToolContext) -> str:
        await trio.sleep(0.01)
        return f"edited {len(args['text'])}"

    agent = vrt.define_agent(
        model=vrt.ScriptedModel(SCRIPT), tools=[lookup], client_tools="accept", max_steps=3
    )
    return agent, [edit]


async def legacy_session() -> list[str]:
    agent, tools = session_parts()
    frames: list[str] = []
    with trio.fail_after(60):
        async with open_pair(
            agent,
            tools,
            capabilities=("tool-stream-v1",),
            transport=lambda ws: Recording(ws, frames),
        ) as client:
            async with client.subscribe() as channel:
                events = Log(channel)
                for text in ("first", "second"):
                    await client.send_text(text)
                    await until(events, lambda e: isinstance(e, vrt.TurnEnded))
            session_id, token = client.session_id, client.proto.resume_token
    assert session_id and token
    return [f.replace(session_id, "SESSION").replace(token, "TOKEN") for f in frames]


async def test_a_legacy_session_is_byte_for_byte_what_it_was(
    autojump_clock: trio.testing.MockClock,
) -> None:
    frames = await legacy_session()
    assert frames == GOLDEN.read_text(encoding="utf-8").splitlines()
