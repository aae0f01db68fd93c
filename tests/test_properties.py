"""Properties over generated scripts: every call one result, every stream valid."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import vrt
from tests.conftest import drain
from vrt.testing import assert_stream_valid

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


@vrt.server_tool(risk="low", parameters=SCHEMA)
async def work(args: dict[str, Any], ctx: vrt.ToolContext) -> int:
    n = args["n"]
    for _ in range(n % 3):
        ctx.emit(n)
        await trio.sleep(0.5)
    if n % 7 == 6:
        raise RuntimeError("unlucky")
    return n


@vrt.server_tool(risk="high", parameters=SCHEMA, timeout=1)
async def risky(args: dict[str, Any], ctx: vrt.ToolContext) -> int:
    await trio.sleep(args["n"] % 3)
    return int(args["n"])


async def hook(info: vrt.CallInfo) -> Any:
    await trio.sleep(0.1)
    return vrt.Reject("too risky") if info.risk == "high" and info.call_id.endswith("3") else None


calls = st.builds(
    vrt.call,
    st.sampled_from(["work", "risky", "nope"]),
    st.one_of(st.builds(dict, n=st.integers(0, 20)), st.just({"n": "x"}), st.just('{"n": ')),
    chunks=st.integers(1, 5),
    stream=st.booleans(),
    truncate=st.booleans(),
)
items = st.one_of(
    calls,
    st.builds(vrt.say, st.text(max_size=5)),
    st.builds(vrt.pause, st.sampled_from([0, 0.2, 1.0])),
)
scripts = st.lists(st.lists(items, max_size=5), max_size=4)


async def play(script: list[list[Any]], interrupt_at: float | None) -> None:
    agent = vrt.define_agent(
        model=vrt.ScriptedModel(script), tools=[work, risky], before_tool_call=hook, max_steps=4
    )
    async with vrt.open_session(agent) as session, session.subscribe() as events:
        turn = await session.start_turn("go")
        if interrupt_at is not None:
            await trio.sleep(interrupt_at)
            turn.interrupt()
        with trio.fail_after(1000):
            result = await turn.wait()
        log = drain(events)
    assert_stream_valid(log)
    started = [e.call_id for e in log if isinstance(e, vrt.ToolStream) and e.phase == "start"]
    assert [c.call_id for c in result.calls] == started  # one result per call, in call order
    terminals = [
        e.call_id
        for e in log
        if isinstance(e, vrt.ToolStream) and e.phase in ("settled", "cancelled", "failed")
    ]
    assert sorted(terminals) == sorted(started)
    if result.status == "interrupted":
        assert any(isinstance(h, vrt.models.TurnInterrupted) for h in session.history)
        for record in result.calls:
            phases = [
                e.phase
                for e in log
                if isinstance(e, vrt.ToolStream) and e.call_id == record.call_id
            ]
            if phases[-1] == "cancelled":
                assert record.result.code == vrt.ResultCode.INTERRUPTED
    else:
        assert result.status == "finished"


@settings(max_examples=150, deadline=None)
@given(script=scripts, interrupt_at=st.one_of(st.none(), st.floats(0, 3)))
def test_every_call_gets_one_result(script: list[list[Any]], interrupt_at: float | None) -> None:
    trio.run(play, script, interrupt_at, clock=trio.testing.MockClock(autojump_threshold=0))
