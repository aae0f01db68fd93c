"""A session's own memory stays bounded: the history the model is sent, the call ids it
remembers, the arguments and progress it accepts (the limits vrt.serve sets)."""

from __future__ import annotations

from typing import Any

import vrt
from tests.conftest import drain
from vrt._engine.session import Session
from vrt.models import UserInput


class Recorder:
    """Answers every step with a call and some text, and keeps the requests."""

    def __init__(self) -> None:
        self.requests: list[vrt.ModelRequest] = []

    async def stream(self, request: vrt.ModelRequest) -> Any:
        self.requests.append(request)
        if request.step == 1:
            call_id = f"{request.turn_id}_c"
            yield vrt.models.CallStart(call_id=call_id, name="noop")
            yield vrt.models.CallEnd(call_id=call_id, arguments={"pad": "p" * 500})
        else:
            yield vrt.models.Text(text="t" * 500)


@vrt.server_tool(risk="low", parameters={"type": "object"})
async def noop(args: Any, ctx: vrt.ToolContext) -> Any:
    return "r" * 500


async def test_the_history_keeps_whole_turns_under_its_limit() -> None:
    model = Recorder()
    agent = vrt.define_agent(model=model, tools=[noop])
    async with vrt.open_session(agent) as session:
        session.max_history_bytes = 20_000
        for i in range(100):
            turn = await session.start_turn(f"turn {i} " + "u" * 500)
            assert (await turn.wait()).status == "finished"
    last = model.requests[-1].history
    assert isinstance(last[0], UserInput)  # it starts at a turn's start
    assert last[0].text.startswith(("turn 8", "turn 9"))  # the oldest turns are gone
    sizes = len(repr(list(last)))
    assert sizes < 30_000, sizes
    # every call the model is shown still has its result right after it
    records = [item for item in last if isinstance(item, vrt.CallRecord)]
    assert records and all(r.result.ok for r in records)
    # the first turns were shown whole while they fitted
    assert len(model.requests[1].history) == 2  # the input, the call with its result


async def test_a_session_remembers_a_bounded_number_of_call_ids() -> None:
    agent = vrt.define_agent(model=vrt.ScriptedModel([]))
    session = Session(agent, "s")
    for i in range(20_000):
        assert not session.seen_call_id(f"c{i}")
    assert session.seen_call_id("c19999")
    assert not session.seen_call_id("c0")  # long forgotten


async def test_arguments_over_the_limit_fail_the_call() -> None:
    big = {"text": "x" * 2000}
    steps = [
        [vrt.call("noop", big, chunks=10), vrt.call("noop", big, stream=False)],
        [vrt.say("ok")],
    ]
    agent = vrt.define_agent(model=vrt.ScriptedModel(steps), tools=[noop])
    async with vrt.open_session(agent) as session, session.subscribe() as events:
        session.max_argument_bytes = 1000
        turn = await session.start_turn("go")
        result = await turn.wait()
        log = drain(events)
    codes = [(c.result.code, c.result.message) for c in result.calls]
    assert all(code == vrt.ResultCode.FAILED for code, _ in codes)
    assert all("over the limit of 1000 bytes" in (message or "") for _, message in codes)
    failed = [e for e in log if isinstance(e, vrt.ToolStream) and e.phase == "failed"]
    assert len(failed) == 2
    vrt.testing.assert_stream_valid(log, complete=False)


async def test_progress_over_the_limit_is_refused() -> None:
    seen: list[str] = []

    @vrt.server_tool(risk="low", parameters={"type": "object"})
    async def chatty(args: Any, ctx: vrt.ToolContext) -> Any:
        ctx.emit("small")
        try:
            ctx.emit("y" * 5000)
        except ValueError as exc:
            seen.append(str(exc))
        return None

    agent = vrt.define_agent(
        model=vrt.ScriptedModel([[vrt.call("chatty", {})], []]), tools=[chatty]
    )
    async with vrt.open_session(agent) as session:
        session.max_progress_bytes = 1000
        result = await (await session.start_turn("go")).wait()
    assert result.calls[0].result.ok
    assert seen and "over the limit of 1000" in seen[0]
