"""A voice assistant whose tools come from MCP servers, beside its own.

Four kinds of tool in one agent (``pip install 'trio-vrt[mcp]' mcp-server-time``):

- ``time_*``: the reference MCP time server (PyPI's ``mcp-server-time``), over stdio;
- ``ev_*``: the MCP "everything" server (npm's ``@modelcontextprotocol/server-everything``,
  started with ``npx``), over stdio: its ``ev_get-sum``, its long-running operation that
  reports progress, ...;
- ``weather``: a server tool written here;
- ``add_note``: an app tool, run by the app (here, the client in this same process).

Every MCP tool is an ordinary server tool: the ``before_tool_call`` hook sees it with the
risk its annotations give (below: anything not read-only waits for a confirmation, which
this demo grants), its arguments are checked against its schema, an interrupt cancels it
at the server (``notifications/cancelled``), its progress streams as ``progress`` phases.

The model is ``vrt.models.OpenAIChat``; the environment says which (as in
examples/assistant.py): ``VRT_MODEL``, ``VRT_BASE_URL``, ``OPENAI_API_KEY``.
``VRT_EVERYTHING`` replaces the command that starts the everything server (default
``npx -y @modelcontextprotocol/server-everything stdio``).

Run ``python examples/mcp_assistant.py "What time is it in Tokyo? Add 2 and 3, and note
both."``: each argument is one user turn.
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Any

import trio

import vrt
import vrt.mcp

NOTES: list[str] = []
EVERYTHING = "npx -y @modelcontextprotocol/server-everything stdio"


@vrt.server_tool(
    risk="low",
    description="The weather now in a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
async def weather(args: dict[str, Any], ctx: vrt.ToolContext) -> Any:
    await trio.sleep(0.1)  # a real tool would call a weather API here
    return {"city": args["city"], "temp_c": 21, "sky": "clear"}


@vrt.app_tool(
    description="Add a note to the user's notepad",
    parameters={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
)
async def add_note(args: Any, ctx: Any) -> Any:
    if ctx.signal.aborted:  # interrupted before it could write: change nothing
        return None
    NOTES.append(args["text"])
    return {"notes": len(NOTES)}


async def confirm_risky(info: vrt.CallInfo) -> Any:
    """The hook: MCP tools that may change something would ask the user first (a voice
    app would say "Shall I ...?"); this demo prints the question and allows them."""
    if info.kind == "server" and info.risk in ("medium", "high"):
        print(f"\n  (would ask the user: may I run {info.name} ({info.risk} risk)? yes)")
    return None


def show(event: vrt.Event) -> bool:
    """Print one event; True at the turn's end."""
    if isinstance(event, vrt.TextDelta):
        print(event.text, end="", flush=True)
    elif isinstance(event, vrt.ToolStream):
        if event.phase == vrt.Phase.PROGRESS:
            print(f"\n  [{event.name} progress] {event.progress}")
        elif event.phase in (vrt.Phase.SETTLED, vrt.Phase.CANCELLED, vrt.Phase.FAILED):
            outcome = "" if event.ok in (None, True) else f" {event.code}"
            print(f"\n  [{event.kind} {event.name} {event.phase}{outcome}]")
    elif isinstance(event, vrt.TurnEnded):
        print(f"\n(turn {event.reason})")
        return True
    return False


async def main(inputs: list[str]) -> None:
    everything = shlex.split(os.environ.get("VRT_EVERYTHING", EVERYTHING))
    llm = vrt.models.OpenAIChat(
        os.environ.get("VRT_MODEL", "gpt-4o-mini"),
        base_url=os.environ.get("VRT_BASE_URL", "https://api.openai.com/v1"),
    )
    async with (
        llm,
        vrt.mcp.connect_stdio(sys.executable, ["-m", "mcp_server_time"], prefix="time_") as clock,
        vrt.mcp.connect_stdio(everything[0], everything[1:], prefix="ev_", timeout=30) as ev,
    ):
        agent = vrt.define_agent(
            model=llm,
            tools=[weather, *clock.tools, *ev.tools],
            client_tools="accept",  # the app's notepad
            before_tool_call=confirm_risky,
            instructions="You are a brief voice assistant. Use the tools you are given.",
        )
        async with trio.open_nursery() as nursery:
            server = await nursery.start(vrt.serve, agent, "127.0.0.1", 0)
            async with vrt.connect(server.url, tools=[add_note]) as client:
                async with client.subscribe() as events:
                    for text in inputs:
                        print(f"user: {text}")
                        await client.send_text(text)
                        async for event in events:
                            if show(event):
                                break
            nursery.cancel_scope.cancel()
    print(f"notes: {NOTES}")


if __name__ == "__main__":
    trio.run(main, sys.argv[1:] or ["What time is it in Tokyo? Add 2 and 3, and note both."])
