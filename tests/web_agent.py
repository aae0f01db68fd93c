"""The agent the browser tests serve with ``vrt serve tests.web_agent:agent``."""

import trio

import vrt


@vrt.server_tool(risk="low", parameters={"type": "object"})
async def lookup(args: dict[str, object], ctx: vrt.ToolContext) -> str:
    ctx.emit({"looking": args.get("q")})
    # A checkpoint, not a delay: a server tool that took as long as the page's app tools
    # (10 ms) raced them, and the order of their settled events changed from run to run.
    await trio.lowlevel.checkpoint()
    return "found"


SCRIPT = [
    [
        vrt.say("Editing."),
        vrt.call("edit", {"text": "hello " * 30, "n": 1}, chunks=6),
        vrt.call("lookup", {"q": "x"}, chunks=2),
        vrt.call("edit", {"text": "second", "n": 2}),
        vrt.call("edit", {"text": "third", "n": 3}, stream=False),
    ],
    [vrt.say("Done.")],
]

agent = vrt.define_agent(
    model=vrt.ScriptedModel(SCRIPT), tools=[lookup], client_tools="accept", max_steps=4
)


@vrt.server_tool(risk="high", parameters={"type": "object"})
async def delete(args: dict[str, object], ctx: vrt.ToolContext) -> str:
    return "deleted"


slow = vrt.define_agent(
    model=vrt.ScriptedModel([[vrt.call("edit", {"n": 1}), vrt.call("edit", {"n": 2})]]),
    client_tools="accept",
)
"""Two app calls: the page interrupts while the first runs."""

confirming = vrt.define_agent(
    model=vrt.ScriptedModel([[vrt.call("delete", {"what": "all"})], [vrt.say("ok")]]),
    tools=[delete],
    before_tool_call=vrt.require_confirmation(min_risk="high"),
)
"""A high-risk server call that asks the page first."""

timing_out = vrt.define_agent(
    model=vrt.ScriptedModel([[vrt.call("edit", {"n": 9})], [vrt.say("late")]]),
    client_tools="accept",
    client_tool_timeout=0.3,
)
"""An app call the page answers too late."""

slow_with_lookup = vrt.define_agent(
    model=vrt.ScriptedModel([[vrt.call("edit", {"n": 1}), vrt.call("edit", {"n": 2})]]),
    tools=[lookup],
    client_tools="accept",
)
"""Two app calls, and a server tool a page may not also host."""
