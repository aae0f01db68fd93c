"""The agents the benches serve, importable by ``vrt serve`` from the repository's root
(``vrt serve bench.agents:agent``, or ``bench.agents:relay_agent``).

``agent``: every turn ``VRT_LOAD_STEPS`` model steps (2 by default), each a few words, the
server tool ``lookup`` (``risk="low"``, a two-field JSON Schema, arguments in 2
``arguments-delta`` fragments, answers at once) and then the app tool ``show`` (hosted by
the client, answers at once); an empty step ends the turn. The script holds
``VRT_LOAD_TURNS`` turns (every session plays it from its start; past its end a turn has
no calls, which the bench counts as an error).

``relay_agent``: ``VRT_RELAY_STEPS`` steps a turn (10 by default), each a few words and
the app tool ``show``, no server tool: what bench/relay.py times through a relay.

Both are :class:`vrt.ScriptedModel`, whose place in the script is saved with the session
(``session_state``), so a session that moves to another process goes on where it was.
"""

from __future__ import annotations

import os
from typing import Any

import vrt

LOOKUP_PARAMETERS = {
    "type": "object",
    "properties": {"q": {"type": "string"}, "limit": {"type": "integer"}},
    "required": ["q"],
}
SHOW_PARAMETERS = {
    "type": "object",
    "properties": {"id": {"type": "string"}},
    "required": ["id"],
}


@vrt.server_tool(risk="low", description="Looks something up", parameters=LOOKUP_PARAMETERS)
async def lookup(args: Any, ctx: vrt.ToolContext) -> Any:
    """The server tool: answers at once."""
    return {"hits": 3}


def make_agent(steps: int, turns: int) -> vrt.Agent:
    """``turns`` turns of ``steps`` steps (words, a lookup, a show), each turn then an
    empty step. The model plays the script from its start for every session."""
    script: list[list[Any]] = []
    for turn in range(turns):
        for step in range(steps):
            script.append(
                [
                    vrt.say("Let me look that up. "),
                    vrt.call("lookup", {"q": f"item {turn}.{step}", "limit": 5}, chunks=2),
                    vrt.call("show", {"id": f"item-{turn}-{step}"}),
                ]
            )
        script.append([])
    return vrt.define_agent(
        model=vrt.ScriptedModel(script), tools=[lookup], client_tools="accept", max_steps=steps + 1
    )


def make_relay_agent(steps: int, turns: int) -> vrt.Agent:
    """``turns`` turns of ``steps`` steps, each a few words and an app call ``show``."""
    script: list[list[Any]] = []
    for turn in range(turns):
        for step in range(steps):
            script.append([vrt.say("Showing. "), vrt.call("show", {"id": f"i-{turn}-{step}"})])
        script.append([])
    return vrt.define_agent(
        model=vrt.ScriptedModel(script), client_tools="accept", max_steps=steps + 1
    )


def make_asgi_app() -> Any:
    """``agent`` as an ASGI app with the options bench/harness.py gives ``vrt serve``
    (``SERVE_FLAGS``) that ``vrt.asgi`` takes, for ``hypercorn --worker-class trio
    'bench.agents:make_asgi_app()'`` (bench/asgi.py); vrt's warnings and errors on stderr
    with their level, as ``vrt serve --log-level warning`` shows them."""
    import logging

    import vrt.asgi

    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return vrt.asgi.app(
        __getattr__("agent"),
        max_sessions=100_000,
        max_sessions_per_peer=100_000,
        max_messages_per_second=100_000,
        resume_window=60,
    )


def _env(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def __getattr__(name: str) -> vrt.Agent:
    """``agent`` and ``relay_agent``, made when ``vrt serve`` first asks for them (bench/
    load.py imports this module for :func:`make_agent` only: no script of thousands of
    turns in its memory)."""
    if name == "agent":
        made = make_agent(_env("VRT_LOAD_STEPS", 2), _env("VRT_LOAD_TURNS", 4000))
    elif name == "relay_agent":
        made = make_relay_agent(_env("VRT_RELAY_STEPS", 10), _env("VRT_RELAY_TURNS", 1000))
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = made
    return made
