"""The model adapters' own cost per streamed event, against the engine's, in one run.

Run it as ``python -m bench.models`` (``--quick`` for a smoke run). For each API it builds
the Server-Sent Events body of one step (some text, then a call whose arguments stream in
``--deltas`` fragments), exactly as FakeProvider sends it, and times what the adapter does
with it without HTTP: the SSE decoding (fed in 4 KiB chunks, as a socket gives them), the
JSON parse and the mapping to ``vrt.models`` events. Then it times the engine on the same
events (a model that yields them ready-made): the turn, the call's machine, the events it
builds for a listener (what ``vrt.serve``'s session actor is). Both are per model event,
best of ``--repeat``; the target is the adapter adding at most 20 % to a streamed call.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import AsyncIterator
from typing import Any

import trio

import vrt
from bench.harness import version, vrt_from
from vrt.models._adapters import AnthropicMessages, CallIds, OpenAIChat, OpenAIResponses
from vrt.models._sse import SSEDecoder
from vrt.testing import FakeProvider, open_pair

ADAPTERS = {
    "openai-chat": OpenAIChat("m", base_url="http://localhost"),
    "openai-responses": OpenAIResponses("m", base_url="http://localhost"),
    "anthropic": AnthropicMessages("m", base_url="http://localhost"),
}
REQUEST = vrt.ModelRequest(
    instructions="", tools=(), history=(), session_id="s", turn_id="t_1", step=1
)


def body_of(api: str, deltas: int) -> bytes:
    """The SSE body FakeProvider sends for one step of ``deltas`` argument fragments."""
    arguments = {"text": "lorem ipsum " * deltas}
    step = [vrt.say("Let me write that down."), vrt.call("note", arguments, chunks=deltas)]
    provider = FakeProvider([step], api=api)
    return b"".join(item for item in provider._events(step) if isinstance(item, bytes))


def adapter_events(api: str, body: bytes) -> list[Any]:
    feed = ADAPTERS[api]._mapper(CallIds().maker(REQUEST))
    decoder = SSEDecoder()
    events: list[Any] = []
    for start in range(0, len(body), 4096):
        for event in decoder.feed(body[start : start + 4096]):
            events.extend(feed(event))
    events.extend(feed(None))
    return events


def time_adapter(api: str, body: bytes, repeat: int) -> tuple[float, int]:
    best = float("inf")
    count = 0
    for _ in range(repeat):
        start = time.perf_counter()
        events = adapter_events(api, body)
        best = min(best, time.perf_counter() - start)
        count = len(events)
    return best / count, count


class Replay:
    """A model that yields ready-made events (the first step), then nothing."""

    def __init__(self, events: list[Any]) -> None:
        self.events = events

    async def stream(self, request: vrt.ModelRequest) -> AsyncIterator[Any]:
        if request.step == 1:
            for event in self.events:
                yield event


@vrt.server_tool(risk="low", description="Note", parameters={"type": "object"})
async def note(args: Any, ctx: vrt.ToolContext) -> Any:
    return None


async def engine_turn(events: list[Any]) -> float:
    agent = vrt.define_agent(model=Replay(events), tools=[note])
    async with vrt.open_session(agent) as session:
        session.listen(lambda event: None)  # a listener: the events are built, as in serve
        start = time.perf_counter()
        result = await (await session.start_turn("go")).wait()
        elapsed = time.perf_counter() - start
    assert result.status == "finished", result
    assert result.calls[0].result.ok, result
    return elapsed


async def wire_turn(events: list[Any]) -> float:
    """The same step through vrt/1, in memory: the engine, the server's session actor
    (frames, the codec), the client's core and its events, which the app reads."""
    agent = vrt.define_agent(model=Replay(events), tools=[note])
    async with open_pair(agent) as client, client.subscribe() as stream:
        start = time.perf_counter()
        await client.send_text("go")
        async for event in stream:
            if isinstance(event, vrt.TurnEnded):
                break
        return time.perf_counter() - start


def time_engine(events: list[Any], repeat: int, turn: Any = engine_turn) -> float:
    best = min(trio.run(turn, events) for _ in range(repeat))
    return best / len(events)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deltas", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="200 deltas, 2 repeats")
    args = parser.parse_args(argv)
    if args.quick:
        args.deltas, args.repeat = 200, 2
    print(
        f"bench/models.py: vrt {vrt.__version__}, httpx2 {version('httpx2')}, trio "
        f"{version('trio')}; one step: some text and a call in {args.deltas} argument "
        f"fragments; best of {args.repeat}\n{vrt_from()}"
    )
    print(
        f"{'api':<18} {'events':>7} {'adapter':>10} {'engine':>10} {'adds':>6}"
        f" {'engine+wire':>12} {'adds':>6}   (per model event)"
    )
    worst = worst_engine = 0.0
    for api in ADAPTERS:
        body = body_of(api, args.deltas)
        per_event, count = time_adapter(api, body, args.repeat)
        events = adapter_events(api, body)
        engine = time_engine(events, args.repeat)
        wire = time_engine(events, args.repeat, wire_turn)
        worst, worst_engine = max(worst, per_event / wire), max(worst_engine, per_event / engine)
        print(
            f"{api:<18} {count:>7} {per_event * 1e6:>7.2f} us {engine * 1e6:>7.2f} us "
            f"{per_event / engine:>6.0%} {wire * 1e6:>9.2f} us {per_event / wire:>6.0%}"
        )
    verdict = "PASS" if worst <= 0.20 else "MISS"
    print(
        f"target: the adapter adds at most 20 % to a streamed call (engine + wire): worst "
        f"{worst:.0%}  {verdict}; to the in-process engine alone: worst {worst_engine:.0%}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
