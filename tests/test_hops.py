"""Fewer hops on the app-tool path (the engine's side of it).

With an eager host (``batch-v1`` on the wire) an app call is sent from the turn's own task,
in the same step as its ``arguments-complete``; without one, from the call's task as
before. A result the host receives settles the call in the receiving task at once.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing

import vrt
from tests.test_capabilities import session
from vrt._engine.call import Call
from vrt._wire import messages as m
from vrt.models import ToolSpec

SPEC = ToolSpec(name="edit", description="", parameters={"type": "object"})


class Host:
    """An app host that records who sent each call and never answers by itself."""

    def __init__(self, eager: bool) -> None:
        self.eager = eager
        self.sent: list[tuple[Call, str, list[str]]] = []
        self.seen: list[str] = []
        self.done = trio.Event()

    def send_app(self, call: Call) -> Any:
        task = trio.lowlevel.current_task().name
        self.sent.append((call, task, list(self.seen)))
        return self

    async def wait(self) -> vrt.ToolResult:
        await self.done.wait()  # the reader woke it, having answered the call already
        return vrt.ToolResult.success("ignored")


@pytest.mark.parametrize("eager", [True, False])
async def test_an_eager_host_gets_the_call_from_the_turns_task(eager: bool) -> None:
    host = Host(eager)
    agent = vrt.define_agent(
        model=vrt.ScriptedModel([[vrt.call("edit", {"i": 1}), vrt.say("after")]]),
        client_tools="accept",
    )
    async with vrt.open_session(agent, app_tools=[SPEC], app_host=host) as s:
        s.listen(lambda e: host.seen.append(getattr(e, "phase", type(e).__name__)), previews=False)
        turn = await s.start_turn("go")
        await trio.testing.wait_all_tasks_blocked()
        ((call, task, seen),) = host.sent
        if eager:  # in the turn's task, right behind arguments-complete, before the text
            assert task.endswith("Turn.run"), task
            assert seen[-1] == "arguments-complete"
        else:
            assert task.endswith("Call.run"), task
            assert "TextDelta" in seen
        call.answered(vrt.ToolResult.success("done"))
        assert host.seen[-1] == "settled"  # at once, in this task
        call.answered(vrt.ToolResult.success("again"))  # a second answer changes nothing
        host.done.set()
        result = await turn.wait()
    assert [r.result.output for r in result.calls] == ["done"]


async def test_a_hook_keeps_the_call_in_its_task() -> None:
    host = Host(eager=True)

    async def hook(info: vrt.CallInfo) -> None:
        await trio.lowlevel.checkpoint()

    agent = vrt.define_agent(
        model=vrt.ScriptedModel([[vrt.call("edit", {})]]),
        client_tools="accept",
        before_tool_call=hook,
    )
    async with vrt.open_session(agent, app_tools=[SPEC], app_host=host) as s:
        await s.start_turn("go")
        await trio.testing.wait_all_tasks_blocked()
        ((_call, task, _seen),) = host.sent
        assert task.endswith("Call.run"), task


async def test_with_batches_arguments_complete_and_tool_call_share_a_frame(
    autojump_clock: trio.testing.MockClock,
) -> None:
    _events, frames = await session(m.CAPABILITIES)
    together = 0
    for frame in frames:
        if not frame.startswith("<"):
            continue
        data = json.loads(frame[2:])
        items = data if isinstance(data, list) else [data]
        for k, item in enumerate(items):
            if item["type"] == "tool.call":
                before = items[k - 1] if k else {}
                assert before.get("phase") == "arguments-complete", frame
                assert before.get("callId") == item["callId"], frame
                together += 1
    assert together == 2  # both app calls of the session
