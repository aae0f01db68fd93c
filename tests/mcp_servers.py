"""MCP servers written with the SDK's ``MCPServer``, for what the reference servers cannot
show: a tool that never returns, a server that exits mid-call, a slow tool list, a tool
list that changes, elicitation. Run as ``python tests/mcp_servers.py LOG``: what the
server sees of cancellation goes to the file LOG, one line each (its own record that
``notifications/cancelled`` arrived)."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import anyio
from mcp.server.mcpserver import (
    AcceptedElicitation,
    Context,
    Elicit,
    ElicitationResult,
    MCPServer,
    Resolve,
)
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import BaseModel

server = MCPServer("vrt-test")
LOG = sys.argv[1] if len(sys.argv) > 1 else os.devnull


def record(line: str) -> None:
    with open(LOG, "a") as log:
        print(line, file=log, flush=True)


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def count(steps: int, pause: float, ctx: Context) -> str:
    """Count to steps, a progress notification a step."""
    try:
        for i in range(steps):
            await ctx.report_progress(i + 1, steps, f"step {i + 1}")
            await anyio.sleep(pause)
    except anyio.get_cancelled_exc_class():
        record(f"cancelled count at {i + 1}")
        raise
    return f"counted to {steps}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False))
async def never(ctx: Context) -> str:
    """Never return."""
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        record("cancelled never")
        raise
    return "unreachable"  # pragma: no cover


@server.tool()
async def die() -> str:
    """Exit the server's process mid-call."""
    await anyio.sleep(0.05)
    record(f"dying {os.getpid()}")
    os._exit(3)


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def pid() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def fail(size: int = 10) -> str:
    """Raise: the result is isError with the text."""
    raise ToolError("no " * size)


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def echo(text: str) -> str:
    """Echo text back."""
    return text


class Name(BaseModel):
    name: str


async def a_name() -> Elicit[Name]:
    """The question ``ask`` needs answered: the SDK asks it mid-call (2025-11-25) or
    returns it to the client to answer and retry (2026-07-28, ``InputRequiredResult``)."""
    record("asking")
    return Elicit("What is your name?", Name)


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def ask(answer: Annotated[ElicitationResult[Name], Resolve(a_name)]) -> str:
    """Ask the user for a name (elicitation)."""
    if isinstance(answer, AcceptedElicitation):
        return f"hello {answer.data.name}"
    return f"no name ({answer.action})"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def grow(ctx: Context) -> str:
    """Add the tool ``extra`` and say the list changed (both protocol generations)."""

    async def extra() -> str:
        return "extra!"

    server.add_tool(extra, name="extra", description="A tool added by grow")
    await ctx.notify_tools_changed()  # subscriptions/listen (2026-07-28)
    await ctx.request_context.session.send_tool_list_changed()  # earlier versions
    return "grown"


if __name__ == "__main__":
    delay = float(os.environ.get("VRT_TEST_MCP_LIST_DELAY", "0"))
    if delay:  # a slow tools/list: every listing waits
        original = server.list_tools

        async def slow_list(*args: object, **kwargs: object) -> object:
            await anyio.sleep(delay)
            return await original(*args, **kwargs)

        server.list_tools = slow_list  # type: ignore[method-assign]
    server.run("stdio")
