"""An agent for the ``vrt serve`` command-line test."""

import vrt


@vrt.server_tool(risk="low")
async def ping(args: object, ctx: vrt.ToolContext) -> str:
    return "pong"


agent = vrt.define_agent(
    model=vrt.ScriptedModel([[vrt.call("ping", {})], [vrt.say("pong")]]), tools=[ping]
)
