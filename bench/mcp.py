"""What vrt adds to an MCP tool call, against the bare SDK call, in one run.

Run it as ``python -m bench.mcp`` (``--calls N`` per round, 200 by default; ``--rounds R``,
5). Both sides talk to the same kind of server: this file started as an MCP server over
stdio (``--serve``: the SDK's ``MCPServer`` with one ``echo`` tool), one process each.

- **bare**: ``mcp.Client.call_tool("echo", ...)``, one call after another, as a program
  using the SDK alone would.
- **vrt**: the same tool through ``vrt.mcp.connect_stdio`` in an in-process session
  (``vrt.open_session``): each turn is one model step with one call to it (a
  ``ScriptedModel``), then an empty step; the turn's whole cost (hook, schema check,
  the call's machine and task, its result, the turn's end) is counted against the call.

The rounds alternate (bare, vrt, bare, vrt, ...) so the machine's drift touches both;
the table shows each side's median time per call and their ratio (target: at most 1.2x).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import trio

import vrt
import vrt.mcp
from bench.harness import ROOT, vrt_from

SERVER = ["-m", "bench.mcp", "--serve"]
"""This module as the MCP server, run from the repository's root (``bench.mcp``, whose name
does not shadow the SDK's package ``mcp``)."""


def serve() -> None:
    from mcp.server.mcpserver import MCPServer
    from mcp_types import ToolAnnotations

    server = MCPServer("bench-echo")

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    async def echo(text: str) -> str:
        """Echo text back."""
        return text

    server.run("stdio")


async def bare(calls: int) -> float:
    """Seconds per call, the SDK alone."""
    import mcp
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=SERVER, cwd=ROOT)
    async with mcp.Client(params) as client:
        await client.call_tool("echo", {"text": "warm"})
        start = time.perf_counter()
        for i in range(calls):
            result = await client.call_tool("echo", {"text": f"hi {i}"})
            assert not result.is_error
        return (time.perf_counter() - start) / calls


async def through_vrt(calls: int) -> float:
    """Seconds per call, each a turn of an in-process vrt session."""
    async with vrt.mcp.connect_stdio(sys.executable, SERVER, cwd=str(ROOT)) as server:
        steps: list[list[Any]] = []
        for i in range(calls + 1):
            steps += [[vrt.call("echo", {"text": f"hi {i}"})], []]
        agent = vrt.define_agent(model=vrt.ScriptedModel(steps), tools=server.tools)
        async with vrt.open_session(agent) as session:
            await (await session.start_turn("warm")).wait()
            start = time.perf_counter()
            for _ in range(calls):
                result = await (await session.start_turn("go")).wait()
                assert result.calls[0].result.ok, result.calls[0].result
            return (time.perf_counter() - start) / calls


async def run(calls: int, rounds: int) -> tuple[list[float], list[float]]:
    bares: list[float] = []
    vrts: list[float] = []
    for _ in range(rounds):
        bares.append(await bare(calls))
        vrts.append(await through_vrt(calls))
    return bares, vrts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each, alternating")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    bares, vrts = trio.run(run, args.calls, args.rounds)
    b, v = statistics.median(bares), statistics.median(vrts)
    print(
        f"MCP echo over stdio, {args.calls} calls a round, {args.rounds} rounds each; {vrt_from()}"
    )
    print(f"  {'':<34} {'per call':>10} {'rounds (us)':>40}")
    for name, value, values in (
        ("bare SDK (mcp.Client.call_tool)", b, bares),
        ("vrt (a turn with one MCP call)", v, vrts),
    ):
        spread = " ".join(f"{x * 1e6:.0f}" for x in values)
        print(f"  {name:<34} {value * 1e6:>7.0f} us {spread:>40}")
    print(
        f"  vrt / bare: {v / b:.2f}x (target at most 1.2x); vrt adds {(v - b) * 1e6:.0f} us a call"
    )


if __name__ == "__main__":
    main()
