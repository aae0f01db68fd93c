"""Every scenario of the reference, in process: phases, results, interrupts, concurrency."""

from __future__ import annotations

import dataclasses
from typing import Any

import attrs
import pytest
import trio
import trio.lowlevel
import trio.testing

import vrt
from tests.conftest import drain, run_turn, stream_of, subscribed, until
from vrt import models
from vrt.testing import assert_stream_valid

P = vrt.Phase
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}


def tool(name: str = "weather", risk: str = "low", **kw: Any) -> Any:
    """A server tool decorator with a small schema."""
    kw.setdefault("parameters", CITY)
    return vrt.server_tool(risk=risk, name=name, description=name, **kw)  # type: ignore[arg-type]


@tool()
async def weather(args: dict[str, Any], ctx: vrt.ToolContext) -> Any:
    ctx.emit({"stage": "lookup"})
    await trio.sleep(0.01)
    return {"city": args["city"], "temp_c": 21}


@tool("nothing")
async def nothing(args: Any, ctx: vrt.ToolContext) -> None:
    return None


@tool("boom")
async def boom(args: Any, ctx: vrt.ToolContext) -> None:
    raise ValueError("the database is down")


@tool("slow")
async def slow(args: Any, ctx: vrt.ToolContext) -> str:
    await trio.sleep(10)
    return "done"


def agent(*steps: list[Any], tools: Any = (weather,), **kw: Any) -> vrt.Agent:
    return vrt.define_agent(model=vrt.ScriptedModel(steps), tools=list(tools), **kw)


def phase(call_id: str, wanted: vrt.Phase) -> Any:
    return lambda e: isinstance(e, vrt.ToolStream) and e.call_id == call_id and e.phase == wanted


# -- results -------------------------------------------------------------------------------------


async def test_ok_streamed_with_progress() -> None:
    result, log, _session = await run_turn(
        agent([vrt.say("Checking."), vrt.call("weather", {"city": "Paris"}, chunks=3)])
    )
    assert result.status == "finished"
    (record,) = result.calls
    assert record.result == vrt.ToolResult(ok=True, output={"city": "Paris", "temp_c": 21})
    assert record.arguments == {"city": "Paris"} and record.kind == "server"
    assert stream_of(log, "call_1") == [
        P.START,
        P.ARGUMENTS_DELTA,
        P.ARGUMENTS_DELTA,
        P.ARGUMENTS_DELTA,
        P.ARGUMENTS_COMPLETE,
        P.PROGRESS,
        P.SETTLED,
    ]
    streams = [e for e in log if isinstance(e, vrt.ToolStream)]
    assert "".join(e.delta for e in streams if e.phase == P.ARGUMENTS_DELTA) == '{"city": "Paris"}'
    assert streams[4].arguments == {"city": "Paris"}
    assert streams[5].progress == {"stage": "lookup"}
    assert streams[6].ok is True and streams[6].code is None
    assert all(not hasattr(e, "output") for e in streams)  # output never in the stream
    assert_stream_valid(log)


async def test_preview_alongside_every_phase() -> None:
    _, log, _ = await run_turn(agent([vrt.call("weather", {"city": "Oslo"}, chunks=2)]))
    previews = [e for e in log if isinstance(e, vrt.ToolPreview)]
    streams = [e for e in log if isinstance(e, vrt.ToolStream)]
    assert len(previews) == len(streams)
    assert [p.arguments for p in previews[:4]] == [
        "",
        '{"city":',
        '{"city": "Oslo"}',
        '{"city": "Oslo"}',
    ]
    assert [p.complete for p in previews] == [False, False, False, True, True, True]
    # every preview directly follows its stream event
    for i, e in enumerate(log):
        if isinstance(e, vrt.ToolStream):
            assert isinstance(log[i + 1], vrt.ToolPreview)


async def test_output_none() -> None:
    result, log, _ = await run_turn(agent([vrt.call("nothing", {"city": "x"})], tools=[nothing]))
    assert result.calls[0].result == vrt.ToolResult(ok=True, output=None)
    assert stream_of(log, "call_1")[-1] == P.SETTLED
    assert_stream_valid(log)


async def test_not_streamed_goes_from_start_to_complete() -> None:
    _, log, _ = await run_turn(agent([vrt.call("weather", {"city": "Rome"}, stream=False)]))
    assert stream_of(log, "call_1") == [P.START, P.ARGUMENTS_COMPLETE, P.PROGRESS, P.SETTLED]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"city": 3}, "arguments.city: 3 is not of type 'string'"),
        ({}, "'city' is a required property"),
        ({"city": "x", "extra": 1}, "Additional properties are not allowed"),
        ('{"city": "Par', "arguments are not a JSON object"),
        ("[1, 2]", "arguments are not a JSON object"),
    ],
)
async def test_invalid_arguments_never_run(arguments: Any, message: str) -> None:
    ran = []

    @tool()
    async def weather(args: Any, ctx: vrt.ToolContext) -> None:
        ran.append(args)

    result, log, _ = await run_turn(
        agent([vrt.call("weather", arguments, chunks=2)], tools=[weather])
    )
    res = result.calls[0].result
    assert (res.ok, res.code) == (False, vrt.ResultCode.INVALID)
    assert message in (res.message or "")
    assert ran == []
    assert stream_of(log, "call_1")[-1] == P.SETTLED
    settled = next(e for e in log if isinstance(e, vrt.ToolStream) and e.phase == P.SETTLED)
    assert (settled.ok, settled.code) == (False, vrt.ResultCode.INVALID)
    assert_stream_valid(log)


@attrs.frozen
class CityA:
    city: str


@dataclasses.dataclass
class CityD:
    city: str


class CityP:
    """pydantic-style: a class with model_validate."""

    def __init__(self, city: str) -> None:
        self.city = city

    @classmethod
    def model_validate(cls, data: Any) -> CityP:
        if not str(data.get("city", "")).istitle():
            raise ValueError("city must be capitalised")
        return cls(data["city"])


def upper(args: dict[str, Any]) -> str:
    if args["city"] == "nowhere":
        raise ValueError("no such city")
    return str(args["city"]).upper()


@pytest.mark.parametrize("validate", [CityA, CityD, CityP, upper])
async def test_validate_kinds(validate: Any) -> None:
    seen = []

    @tool(parameters={"type": "object"}, validate=validate)
    async def weather(args: Any, ctx: vrt.ToolContext) -> None:
        seen.append(args)

    ok_args = {"city": "Paris"}
    bad_args = {"city": "nowhere"} if validate is upper or validate is CityP else {"city": 3}
    result, _, _ = await run_turn(
        agent([vrt.call("weather", ok_args), vrt.call("weather", bad_args)], tools=[weather])
    )
    good, bad = (c.result for c in result.calls)
    assert good.ok
    assert (bad.ok, bad.code) == (False, vrt.ResultCode.INVALID)
    assert len(seen) == 1
    value = seen[0]
    if validate is upper:
        assert value == "PARIS"
    else:
        assert isinstance(value, validate) and value.city == "Paris"


async def test_validate_forbids_extra_keys_with_cattrs() -> None:
    @tool(parameters={"type": "object"}, validate=CityA)
    async def weather(args: Any, ctx: vrt.ToolContext) -> None:
        return None

    result, _, _ = await run_turn(
        agent([vrt.call("weather", {"city": "a", "x": 1})], tools=[weather])
    )
    assert result.calls[0].result.code == vrt.ResultCode.INVALID


async def test_failed_has_message_without_traceback() -> None:
    result, log, _ = await run_turn(agent([vrt.call("boom", {"city": "x"})], tools=[boom]))
    res = result.calls[0].result
    assert (res.ok, res.code) == (False, vrt.ResultCode.FAILED)
    assert res.message == "ValueError: the database is down"
    assert all("Traceback" not in repr(e) for e in log)
    assert_stream_valid(log)


async def test_unknown_tool_fails() -> None:
    result, log, _ = await run_turn(agent([vrt.call("teleport", {})]))
    res = result.calls[0].result
    assert res.code == vrt.ResultCode.FAILED
    assert res.message == "no tool named 'teleport' is available"
    assert stream_of(log, "call_1") == [P.START, P.ARGUMENTS_DELTA, P.ARGUMENTS_COMPLETE, P.SETTLED]


async def test_timeout(autojump_clock: trio.testing.MockClock) -> None:
    aborted = []

    @tool("slow", timeout=2)
    async def slow(args: Any, ctx: vrt.ToolContext) -> None:
        try:
            await trio.sleep(10)
        finally:
            aborted.append(ctx.signal.reason)

    start = trio.current_time()
    result, log, _ = await run_turn(agent([vrt.call("slow", {"city": "x"})], tools=[slow]))
    res = result.calls[0].result
    assert (res.ok, res.code) == (False, vrt.ResultCode.TIMEOUT)
    assert "2 s" in (res.message or "")
    assert trio.current_time() - start == pytest.approx(2)
    assert stream_of(log, "call_1")[-1] == P.SETTLED
    assert aborted == ["timeout"]  # the signal aborts at the deadline itself


async def test_model_stopped_before_completing_arguments() -> None:
    result, log, _ = await run_turn(
        agent([vrt.call("weather", {"city": "Paris"}, chunks=4, truncate=True)])
    )
    assert result.status == "finished"
    res = result.calls[0].result
    assert (res.code, res.message) == (
        vrt.ResultCode.FAILED,
        "the model stopped before completing the arguments",
    )
    assert stream_of(log, "call_1") == [P.START, P.ARGUMENTS_DELTA, P.ARGUMENTS_DELTA, P.FAILED]
    failed = next(e for e in log if isinstance(e, vrt.ToolStream) and e.phase == P.FAILED)
    assert failed.message == res.message
    assert_stream_valid(log)


# -- the hook ------------------------------------------------------------------------------------


async def test_hook_reject_rewrite_allow() -> None:
    seen: list[vrt.CallInfo] = []

    async def hook(info: vrt.CallInfo) -> Any:
        seen.append(info)
        await trio.lowlevel.checkpoint()
        city = info.arguments["city"]
        if city == "Mordor":
            return vrt.Reject("one does not simply")
        if city == "paris":
            return vrt.Rewrite({"city": "Paris"})
        return vrt.Allow() if city == "Oslo" else None

    result, log, _ = await run_turn(
        agent(
            [vrt.call("weather", {"city": c}) for c in ("Mordor", "paris", "Oslo", "Rome")],
            before_tool_call=hook,
        )
    )
    codes = [(c.result.ok, c.result.code, c.result.message) for c in result.calls]
    assert codes[0] == (False, vrt.ResultCode.REJECTED, "one does not simply")
    assert all(ok for ok, _, _ in codes[1:])
    assert result.calls[1].result.output["city"] == "Paris"
    assert result.calls[1].arguments == {"city": "Paris"}
    assert stream_of(log, "call_1") == [P.START, P.ARGUMENTS_DELTA, P.ARGUMENTS_COMPLETE, P.SETTLED]
    info = next(i for i in seen if i.call_id == "call_1")
    assert (info.call_id, info.turn_id, info.epoch, info.name, info.kind, info.risk) == (
        "call_1",
        "t_1",
        0,
        "weather",
        "server",
        "low",
    )
    assert_stream_valid(log)


async def test_hook_runs_before_validation() -> None:
    async def hook(info: vrt.CallInfo) -> Any:
        return vrt.Rewrite({"city": "fixed"})

    result, _, _ = await run_turn(agent([vrt.call("weather", {"city": 3})], before_tool_call=hook))
    assert result.calls[0].result.ok


async def test_hook_that_raises_fails_the_call() -> None:
    async def hook(info: vrt.CallInfo) -> Any:
        raise RuntimeError("policy store offline")

    result, _, _ = await run_turn(
        agent([vrt.call("weather", {"city": "x"})], before_tool_call=hook)
    )
    res = result.calls[0].result
    assert (res.code, res.message) == (
        vrt.ResultCode.FAILED,
        "before_tool_call failed: RuntimeError: policy store offline",
    )


async def test_hook_bad_return_fails_the_call() -> None:
    async def hook(info: vrt.CallInfo) -> Any:
        return True

    result, _, _ = await run_turn(
        agent([vrt.call("weather", {"city": "x"})], before_tool_call=hook)
    )
    assert result.calls[0].result.code == vrt.ResultCode.FAILED


# -- interrupts ----------------------------------------------------------------------------------


async def interrupted_turn(ag: vrt.Agent, trigger: Any) -> tuple[vrt.TurnResult, list[Any]]:
    """Start a turn, interrupt it when ``trigger`` matches an event, return result and log."""
    async with vrt.open_session(ag) as session, subscribed(session) as events:
        turn = await session.start_turn("go")
        await until(events, trigger)
        turn.interrupt()
        result = await turn.wait()
        return result, drain(events)


def assert_interrupted(result: vrt.TurnResult, *call_ids: str) -> None:
    assert result.status == "interrupted"
    by_id = {c.call_id: c.result for c in result.calls}
    for call_id in call_ids:
        res = by_id[call_id]
        assert (res.ok, res.code) == (False, vrt.ResultCode.INTERRUPTED), call_id


async def test_interrupted_while_streaming(autojump_clock: trio.testing.MockClock) -> None:
    model = _StreamingModel()
    ag = vrt.define_agent(model=model, tools=[weather])
    result, log = await interrupted_turn(ag, phase("c1", P.ARGUMENTS_DELTA))
    assert_interrupted(result, "c1")
    assert model.steps == 1
    assert P.CANCELLED in stream_of(log, "c1")
    assert_stream_valid(log)


class _StreamingModel:
    """Streams one delta, then waits forever: the call is interrupted while streaming."""

    def __init__(self) -> None:
        self.steps = 0

    async def stream(self, request: models.ModelRequest) -> Any:
        self.steps += 1
        yield models.CallStart(call_id="c1", name="weather")
        yield models.CallDelta(call_id="c1", delta='{"city": ')
        await trio.sleep_forever()


async def test_interrupted_in_the_hook(autojump_clock: trio.testing.MockClock) -> None:
    cancelled = []
    entered = trio.Event()

    async def hook(info: vrt.CallInfo) -> Any:
        entered.set()
        try:
            await trio.sleep_forever()  # waiting for a confirmation that never comes
        finally:
            cancelled.append(info.call_id)

    ag = agent([vrt.call("weather", {"city": "x"})], before_tool_call=hook)
    async with vrt.open_session(ag) as session, subscribed(session) as events:
        turn = await session.start_turn("go")
        await entered.wait()
        turn.interrupt()
        result = await turn.wait()
        log = drain(events)
    assert_interrupted(result, "call_1")
    assert cancelled == ["call_1"]
    assert stream_of(log, "call_1")[-1] == P.CANCELLED
    assert_stream_valid(log)


async def test_interrupted_while_running(autojump_clock: trio.testing.MockClock) -> None:
    signals: list[vrt.Signal] = []

    @tool("slow")
    async def slow(args: Any, ctx: vrt.ToolContext) -> str:
        signals.append(ctx.signal)
        ctx.emit("working")
        await trio.sleep(10)
        return "done"

    result, log = await interrupted_turn(
        agent([vrt.call("slow", {"city": "x"}), vrt.call("slow", {"city": "y"})], [], tools=[slow]),
        lambda e: len(signals) == 2,  # both running, whichever Trio started first
    )
    assert_interrupted(result, "call_1", "call_2")
    assert [s.aborted for s in signals] == [True, True]
    assert [s.reason for s in signals] == ["interrupted", "interrupted"]
    assert_stream_valid(log)


async def test_interrupted_while_queued() -> None:
    """A call issued but not yet started when the turn is interrupted never reaches its hook."""
    hooked = []
    holder: list[vrt.Session] = []

    async def hook(info: vrt.CallInfo) -> Any:
        hooked.append(info.call_id)
        holder[0].interrupt()  # the first call's hook interrupts: the second is still queued
        await trio.lowlevel.checkpoint()

    ag = agent(
        [vrt.call("weather", {"city": "a"}), vrt.call("weather", {"city": "b"})],
        before_tool_call=hook,
    )
    async with vrt.open_session(ag) as session, subscribed(session) as events:
        holder.append(session)
        turn = await session.start_turn("go")
        result = await turn.wait()
        log = drain(events)
    assert len(hooked) == 1  # Trio picks which task runs first; the other was queued
    (queued,) = {"call_1", "call_2"} - set(hooked)
    assert_interrupted(result, "call_1", "call_2")
    assert stream_of(log, queued) == [P.START, P.ARGUMENTS_DELTA, P.ARGUMENTS_COMPLETE, P.CANCELLED]
    assert_stream_valid(log)


async def test_interrupt_cancels_every_open_call_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Streaming, hooked and running calls all get ``cancelled`` in one burst."""

    async def hook(info: vrt.CallInfo) -> Any:
        if info.arguments["city"] == "hook":
            await trio.sleep_forever()

    class Model:
        async def stream(self, request: models.ModelRequest) -> Any:
            for i, city in enumerate(["run", "hook"]):
                yield models.CallStart(call_id=f"c{i}", name="slow")
                yield models.CallEnd(call_id=f"c{i}", arguments={"city": city})
            yield models.CallStart(call_id="c2", name="slow")
            yield models.CallDelta(call_id="c2", delta="{")
            await trio.sleep_forever()

    ag = vrt.define_agent(model=Model(), tools=[slow], before_tool_call=hook)
    result, log = await interrupted_turn(ag, phase("c2", P.ARGUMENTS_DELTA))
    assert_interrupted(result, "c0", "c1", "c2")
    streams = [e for e in log if isinstance(e, vrt.ToolStream)]
    cancelled = [i for i, e in enumerate(streams) if e.phase == P.CANCELLED]
    assert len(cancelled) == 3
    assert cancelled == list(range(cancelled[0], cancelled[0] + 3))  # nothing in between
    assert isinstance(log[-1], vrt.TurnEnded) and log[-1].reason == "interrupted"
    assert_stream_valid(log)


async def test_turn_ends_only_after_nursery_exit_and_late_result_is_dropped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A tool that shields itself from the interrupt finishes late: no second terminal."""
    returned = []

    @tool("stubborn")
    async def stubborn(args: Any, ctx: vrt.ToolContext) -> str:
        async with ctx.committing():
            await trio.sleep(5)  # shielded: the interrupt waits for the commit
            returned.append(trio.current_time())
        ctx.emit("after the commit")  # late progress: dropped
        return "late result"

    ag = agent([vrt.call("stubborn", {"city": "x"})], [vrt.say("never")], tools=[stubborn])
    async with vrt.open_session(ag) as session, subscribed(session) as events:
        turn = await session.start_turn("go")
        await until(events, phase("call_1", P.ARGUMENTS_COMPLETE))
        await trio.sleep(1)
        turn.interrupt()
        interrupted_at = trio.current_time()
        result = await turn.wait()
        ended_at = trio.current_time()
        log = drain(events)
    assert_interrupted(result, "call_1")
    assert returned and returned[0] > interrupted_at
    assert ended_at >= returned[0]
    phases = stream_of(log, "call_1")
    assert phases.count(P.CANCELLED) == 1
    assert P.SETTLED not in phases and P.PROGRESS not in phases
    assert not [e for e in log if isinstance(e, vrt.TextDelta)]  # the next step never ran
    assert_stream_valid(log)


async def test_committing_refuses_after_abort(autojump_clock: trio.testing.MockClock) -> None:
    outcome = []

    @tool("careful")
    async def careful(args: Any, ctx: vrt.ToolContext) -> None:
        ctx.emit("loading")
        with trio.CancelScope(shield=True):
            await trio.sleep(5)  # e.g. an uncancellable load
        try:
            async with ctx.committing():
                outcome.append("committed")
        except vrt.CallAborted as exc:
            outcome.append(str(exc))

    await interrupted_turn(
        agent([vrt.call("careful", {"city": "x"})], tools=[careful]),
        phase("call_1", P.PROGRESS),
    )
    assert outcome == ["call call_1 was aborted (interrupted)"]


async def test_next_step_never_runs_after_interrupt(autojump_clock: trio.testing.MockClock) -> None:
    model = vrt.ScriptedModel([[vrt.call("slow", {"city": "x"})], [vrt.say("step two")]])
    calls = []
    original = model.stream

    def counting(request: models.ModelRequest) -> Any:
        calls.append(request.step)
        return original(request)

    model.stream = counting  # type: ignore[method-assign]
    ag = vrt.define_agent(model=model, tools=[slow])
    result, _ = await interrupted_turn(ag, phase("call_1", P.ARGUMENTS_COMPLETE))
    await trio.sleep(1)
    assert result.status == "interrupted"
    assert calls == [1]


async def test_interrupt_is_idempotent_and_raises_epoch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ag = agent([vrt.call("slow", {"city": "x"})], tools=[slow])
    async with vrt.open_session(ag) as session, subscribed(session) as events:
        turn = await session.start_turn("go")
        await until(events, phase("call_1", P.ARGUMENTS_COMPLETE))
        turn.interrupt()
        turn.interrupt()
        session.interrupt()
        result = await turn.wait()
        turn.interrupt()
        session.interrupt()
        ended = [e for e in drain(events) if isinstance(e, vrt.TurnEnded)]
        assert session.epoch == 1
        assert ended == [vrt.TurnEnded(turn_id="t_1", epoch=1, reason="interrupted")]
        assert result.status == "interrupted"
        turn2 = await session.start_turn("again")
        assert turn2.epoch == 1


async def test_history_marks_interrupted_turn(autojump_clock: trio.testing.MockClock) -> None:
    requests: list[models.ModelRequest] = []
    model = vrt.ScriptedModel(
        [[vrt.say("Let me"), vrt.call("slow", {"city": "x"})], [vrt.say("ok")]]
    )
    original = model.stream

    def spy(request: models.ModelRequest) -> Any:
        requests.append(request)
        return original(request)

    model.stream = spy  # type: ignore[method-assign]
    ag = vrt.define_agent(model=model, tools=[slow])
    async with vrt.open_session(ag) as session, subscribed(session) as events:
        turn = await session.start_turn("first")
        await until(events, phase("call_1", P.ARGUMENTS_COMPLETE))
        turn.interrupt()
        await turn.wait()
        await (await session.start_turn("second")).wait()
    history = requests[-1].history
    kinds = [type(item).__name__ for item in history]
    assert kinds == ["UserInput", "AgentText", "CallRecord", "TurnInterrupted", "UserInput"]
    assert history[2].result.code == vrt.ResultCode.INTERRUPTED
    assert history[3].turn_id == "t_1" and "interrupted" in history[3].note


async def test_barge_in_interrupts_the_open_turn(autojump_clock: trio.testing.MockClock) -> None:
    ag = agent([vrt.call("slow", {"city": "x"})], [vrt.say("hello")], tools=[slow])
    async with vrt.open_session(ag) as session, subscribed(session) as events:
        first = await session.start_turn("one")
        await until(events, phase("call_1", P.ARGUMENTS_COMPLETE))
        second = await session.start_turn("two")
        assert (await first.wait()).status == "interrupted"
        assert (await second.wait()).status == "finished"
        log = drain(events)
    assert [
        type(e).__name__ for e in log if not isinstance(e, vrt.ToolStream | vrt.ToolPreview)
    ] == ["TurnStarted", "TurnEnded", "TurnStarted", "TextDelta", "TurnEnded"]
    assert_stream_valid(log)


# -- the turn loop -------------------------------------------------------------------------------


async def test_server_tools_of_one_step_run_concurrently(
    autojump_clock: trio.testing.MockClock,
) -> None:
    @tool("nap")
    async def nap(args: Any, ctx: vrt.ToolContext) -> float:
        await trio.sleep(3)
        return trio.current_time()

    start = trio.current_time()
    result, _, _ = await run_turn(
        agent([vrt.call("nap", {"city": c}) for c in "abcd"], tools=[nap])
    )
    assert trio.current_time() - start == pytest.approx(3)  # not 12
    assert [c.result.output for c in result.calls] == [pytest.approx(start + 3)] * 4


async def test_results_fed_back_to_next_step() -> None:
    requests: list[models.ModelRequest] = []
    model = vrt.ScriptedModel([[vrt.call("weather", {"city": "Paris"})], [vrt.say("21")]])
    original = model.stream

    def spy(request: models.ModelRequest) -> Any:
        requests.append(request)
        return original(request)

    model.stream = spy  # type: ignore[method-assign]
    result, _, _ = await run_turn(
        vrt.define_agent(model=model, tools=[weather], instructions="be brief")
    )
    assert [r.step for r in requests] == [1, 2, 3][: len(requests)]
    assert len(requests) == 2
    second = requests[1]
    assert second.instructions == "be brief"
    assert second.tools == (vrt.ToolSpec(name="weather", description="weather", parameters=CITY),)
    assert isinstance(second.history[-1], vrt.CallRecord)
    assert second.history[-1].result.output == {"city": "Paris", "temp_c": 21}
    assert result.status == "finished"


async def test_max_steps() -> None:
    ag = agent(*[[vrt.call("nothing", {"city": "x"})]] * 5, tools=[nothing], max_steps=3)
    result, _, _session = await run_turn(ag)
    assert result.status == "finished"
    assert len(result.calls) == 3


async def test_model_error_fails_turn_with_one_result_per_call() -> None:
    class Broken:
        async def stream(self, request: models.ModelRequest) -> Any:
            yield models.CallStart(call_id="a", name="weather")
            yield models.CallEnd(call_id="a", arguments={"city": "x"})
            yield models.CallStart(call_id="b", name="weather")
            raise ConnectionError("model backend went away")

    result, log, _ = await run_turn(vrt.define_agent(model=Broken(), tools=[weather]))
    assert result.status == "failed"
    assert result.message == "model failed: ConnectionError: model backend went away"
    a, b = result.calls
    assert a.result.ok
    assert b.result.code == vrt.ResultCode.FAILED
    assert log[-1] == vrt.TurnEnded(turn_id="t_1", epoch=0, reason="failed")
    assert_stream_valid(log)


@pytest.mark.parametrize(
    "events",
    [
        [models.CallDelta(call_id="ghost", delta="{")],
        [models.CallEnd(call_id="ghost")],
        [models.CallStart(call_id="a", name="weather"), models.CallStart(call_id="a", name="x")],
        ["not an event"],
    ],
)
async def test_model_breaking_stream_rules_fails_turn(events: list[Any]) -> None:
    class Bad:
        async def stream(self, request: models.ModelRequest) -> Any:
            for event in events:
                yield event

    result, log, _ = await run_turn(vrt.define_agent(model=Bad(), tools=[weather]))
    assert result.status == "failed"
    assert result.message and result.message.startswith("model failed: ModelError")
    assert_stream_valid(log)


async def test_tool_context_fields() -> None:
    seen = []

    @tool("probe")
    async def probe(args: Any, ctx: vrt.ToolContext) -> None:
        seen.append((ctx.call_id, ctx.turn_id, ctx.epoch, ctx.name, ctx.signal.aborted))

    await run_turn(agent([vrt.call("probe", {"city": "x"})], tools=[probe]))
    assert seen == [("call_1", "t_1", 0, "probe", False)]


async def test_session_close_mid_turn(autojump_clock: trio.testing.MockClock) -> None:
    ag = agent([vrt.call("slow", {"city": "x"})], tools=[slow])
    async with vrt.open_session(ag) as session:
        async with subscribed(session) as events:
            turn = await session.start_turn("go")
            await until(events, phase("call_1", P.ARGUMENTS_COMPLETE))
            session.close()
            rest = [e async for e in events]
            assert rest[-1] == vrt.Closed(reason="client")
            log = events.events
        with pytest.raises(vrt.SessionClosed):
            await turn.wait()
        with pytest.raises(vrt.SessionClosed):
            await session.start_turn("again")
    assert log[-1] == vrt.Closed(reason="client")
    assert P.CANCELLED not in stream_of(log, "call_1")  # no synthesized terminal
    assert_stream_valid(log)
    with pytest.raises(AssertionError, match="no terminal"):
        assert_stream_valid(log[:-1])


async def test_start_turn_rejects_non_text() -> None:
    async with vrt.open_session(agent([])) as session:
        with pytest.raises(TypeError):
            await session.start_turn(3)  # type: ignore[arg-type]


async def test_each_session_plays_the_script_from_the_start() -> None:
    ag = agent([vrt.call("nothing", {"city": "x"})], tools=[nothing])
    for _ in range(2):
        result, _, _ = await run_turn(ag)
        assert [c.call_id for c in result.calls] == ["call_1"]


async def test_a_subscriber_that_leaves_does_not_disturb_others() -> None:
    ag = agent([vrt.call("weather", {"city": "x"})])
    async with vrt.open_session(ag) as session:
        async with session.subscribe() as early, session.subscribe() as late:
            await early.aclose()  # the app closed its receiving end without leaving
            result = await (await session.start_turn("go")).wait()
            log = drain(late)
    assert result.status == "finished"
    assert_stream_valid(log)
    assert isinstance(log[-1], vrt.TurnEnded)
    assert session.subscribers == []


async def test_subscription_is_a_cancel_point_and_yields_in_bursts() -> None:
    from vrt._engine import subscription as _subscription

    send, receive = trio.open_memory_channel[int](1000)
    events = vrt.Subscription(receive)
    for i in range(200):
        send.send_nowait(i)
    others = []

    async def other() -> None:
        others.append(len(got))

    got: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        for _ in range(200):
            got.append(await events.receive())
    assert got == list(range(200))
    # the other task ran by the second burst (Trio may order a batch either way)
    assert others and others[0] <= 2 * _subscription.BURST + 1
    with trio.CancelScope() as scope:
        scope.cancel()
        await events.receive()  # a cancel point even with events buffered
    assert scope.cancelled_caught
    send.close()
    with pytest.raises(trio.EndOfChannel):
        await events.receive()
    assert [e async for e in events] == []


async def test_history_snapshot_is_stable() -> None:
    from vrt._engine.history import Snapshot

    items = [1, 2, 3]
    snap = Snapshot(items)
    items.append(4)
    assert list(snap) == [1, 2, 3] and len(snap) == 3
    assert snap[-1] == 3 and snap[1:] == (2, 3) and snap == [1, 2, 3]
    # slices read the snapshot's items only, never what the list gained since
    assert snap[5:] == () and snap[:10] == (1, 2, 3) and snap[-2:] == (2, 3)
    assert snap[1:-1] == (2,) and snap[::2] == (1, 3) and snap[::-1] == (3, 2, 1)
    with pytest.raises(IndexError):
        snap[3]


async def test_an_interrupted_models_stream_is_closed_by_the_engine_not_the_gc() -> None:
    """The engine consumes a model's stream under aclosing: the model's own cleanup (an
    adapter closing its HTTP response) runs at the interrupt, before the turn ends."""
    closed: list[float] = []

    class Slow:
        async def stream(self, request: vrt.ModelRequest) -> Any:
            try:
                yield vrt.models.Text(text="thinking")
                await trio.sleep_forever()
            finally:
                closed.append(trio.current_time())

    async with vrt.open_session(vrt.define_agent(model=Slow())) as session:
        async with session.subscribe() as events:
            turn = await session.start_turn("go")
            async for event in events:
                if isinstance(event, vrt.TextDelta):
                    break
            interrupted_at = trio.current_time()
            turn.interrupt()
            result = await turn.wait()
    assert result.status == "interrupted"
    assert len(closed) == 1 and closed[0] - interrupted_at < 0.1  # at once, in the unwinding


async def test_previews_only_for_those_that_take_them() -> None:
    """subscribe(previews=False) gets every event but the legacy previews; a subscriber
    that wants them gets one after every phase; when nobody wants them none is built."""
    script = agent([vrt.call("weather", {"city": "Oslo"}, chunks=2)], [vrt.say("ok")])
    async with vrt.open_session(script) as session:
        assert not session.previews_watched
        async with session.subscribe(previews=False) as plain:
            assert session.watched and not session.previews_watched
            async with session.subscribe() as full:
                assert session.previews_watched
                turn = await session.start_turn("go")
                await turn.wait()
                session.close()
                with_previews = [e async for e in full]
            without = [e async for e in plain]
    streams = [e for e in with_previews if isinstance(e, vrt.ToolStream)]
    previews = [e for e in with_previews if isinstance(e, vrt.ToolPreview)]
    assert len(previews) == len(streams) == 6
    assert without == [e for e in with_previews if not isinstance(e, vrt.ToolPreview)]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), {"x": -float("inf")}, object()])
async def test_progress_that_is_not_json_is_refused_at_emit(bad: Any) -> None:
    """NaN and Infinity are not JSON: sent, they made a frame no client can parse."""
    raised: list[BaseException] = []

    @vrt.server_tool(risk="low", parameters={"type": "object"})
    async def noisy(args: Any, ctx: vrt.ToolContext) -> str:
        try:
            ctx.emit(bad)
        except TypeError as exc:
            raised.append(exc)
        return "done"

    _, log, _session = await run_turn(agent([vrt.call("noisy", {})], tools=[noisy]))
    assert [str(e).startswith("progress must be JSON-serialisable") for e in raised] == [True]
    assert not [e for e in log if isinstance(e, vrt.ToolStream) and e.phase == P.PROGRESS]


@pytest.mark.parametrize(
    ("rewritten", "why"),
    [
        ({"city": float("nan")}, "not JSON"),
        ({"city": float("inf")}, "not JSON"),
        ({"city": {1, 2}}, "not JSON"),
        (["Paris"], "not a JSON object"),
    ],
)
async def test_a_rewrite_that_is_not_a_json_object_is_failed(rewritten: Any, why: str) -> None:
    async def hook(info: vrt.CallInfo) -> vrt.Rewrite:
        return vrt.Rewrite(rewritten)

    result, _, _ = await run_turn(
        agent([vrt.call("weather", {"city": "Oslo"})], before_tool_call=hook)
    )
    (call,) = result.calls
    assert call.result.code == vrt.ResultCode.FAILED and why in (call.result.message or "")
    assert call.arguments == {"city": "Oslo"}


def test_the_model_never_reads_nan() -> None:
    """A server tool's output with NaN or Infinity went to the provider as ``NaN``, which
    no JSON parser takes: rendered as null, as JavaScript writes them."""
    import json

    from vrt.models._render import strict_json

    def strict(text: str) -> Any:
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in {text}"))

    assert strict(strict_json({"a": [float("nan"), 1.5, {"b": -float("inf")}]})) == {
        "a": [None, 1.5, {"b": None}]
    }
    assert strict(strict_json({"when": {1}})) == {"when": "{1}"}  # not JSON: its str, as before
