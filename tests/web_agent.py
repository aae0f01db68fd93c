"""The agent the browser tests serve with ``vrt serve tests.web_agent:agent``."""

import trio

import vrt


@vrt.server_tool(risk="low", parameters={"type": "object"})
async def lookup(args: dict[str, object], ctx: vrt.ToolContext) -> str:
    ctx.emit({"looking": args.get("q")})
    await trio.sleep(0.01)
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
