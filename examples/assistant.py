"""An assistant on a real model: a server tool and app tools, on ``vrt.models.OpenAIChat``.

The same file runs against OpenAI, a local vLLM, Ollama, llama.cpp or LM Studio; the
environment says which:

    VRT_MODEL      the model name (default: gpt-4o-mini)
    VRT_BASE_URL   the Chat Completions root (default: https://api.openai.com/v1)
    OPENAI_API_KEY the key, for OpenAI (a local server needs none)

    vLLM:      VRT_BASE_URL=http://localhost:8000/v1  VRT_MODEL=Qwen/Qwen2.5-7B-Instruct
    Ollama:    VRT_BASE_URL=http://localhost:11434/v1 VRT_MODEL=qwen2.5
    llama.cpp: VRT_BASE_URL=http://localhost:8080/v1  VRT_MODEL=local  (llama-server --jinja)

Run ``python examples/assistant.py "What is the weather in Paris? Note it down."``: it
serves the agent on a loopback WebSocket (``vrt.serve``), connects to it as the app
(``vrt.connect``) hosting a notepad (the app tools), sends each argument as one user turn,
and prints what happens: the agent's words, every call's lifecycle, the notes.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import trio

import vrt

NOTES: list[str] = []


@vrt.server_tool(
    risk="low",
    description="The weather now in a city",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city's name"}},
        "required": ["city"],
    },
)
async def weather(args: dict[str, Any], ctx: vrt.ToolContext) -> Any:
    ctx.emit({"looking up": args["city"]})
    await trio.sleep(0.1)  # a real tool would call a weather API here
    return {"city": args["city"], "temp_c": 21, "sky": "clear"}


NOTE = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


@vrt.app_tool(description="Add a note to the user's notepad", parameters=NOTE)
async def add_note(args: Any, ctx: Any) -> Any:
    args = vrt.validate_arguments(args, NOTE)
    if ctx.signal.aborted:  # interrupted before it could write: change nothing
        return None
    NOTES.append(args["text"])
    return {"notes": len(NOTES)}


@vrt.app_tool(description="Read the user's notepad", parameters={"type": "object"})
async def read_notes(args: Any, ctx: Any) -> Any:
    return {"notes": NOTES}


def model() -> vrt.models.OpenAIChat:
    return vrt.models.OpenAIChat(
        os.environ.get("VRT_MODEL", "gpt-4o-mini"),
        base_url=os.environ.get("VRT_BASE_URL", "https://api.openai.com/v1"),
    )


def show(event: vrt.Event) -> bool:
    """Print one event; True at the turn's end."""
    if isinstance(event, vrt.TextDelta):
        print(event.text, end="", flush=True)
    elif isinstance(event, vrt.ToolStream) and event.phase in SHOWN:
        detail = event.arguments if event.phase == vrt.Phase.ARGUMENTS_COMPLETE else ""
        outcome = "" if event.ok in (None, True) else f" {event.code}"
        print(f"\n  [{event.kind} {event.name} {event.phase}{outcome}] {detail}")
    elif isinstance(event, vrt.TurnEnded):
        print(f"\n(turn {event.reason})")
        return True
    return False


SHOWN = {vrt.Phase.ARGUMENTS_COMPLETE, vrt.Phase.SETTLED, vrt.Phase.CANCELLED, vrt.Phase.FAILED}


async def main(inputs: list[str]) -> None:
    async with model() as llm:
        agent = vrt.define_agent(
            model=llm,
            tools=[weather],
            client_tools="accept",  # offer the app's notepad to the model
            instructions="You are a brief, helpful assistant. Use the tools you are given.",
        )
        async with trio.open_nursery() as nursery:
            server = await nursery.start(vrt.serve, agent, "127.0.0.1", 0)
            async with vrt.connect(server.url, tools=[add_note, read_notes]) as client:
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
    trio.run(main, sys.argv[1:] or ["What is the weather in Paris? Note it down."])
