"""Regressions for interrupts landing at awkward moments and odd failures in tools.

Each test here reproduces a defect found in review; see the commit that added it.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
import trio.testing

import vrt
from tests.conftest import drain, subscribed
from vrt import models
from vrt.testing import assert_stream_valid


@vrt.server_tool(risk="low")
async def noop(args: Any, ctx: vrt.ToolContext) -> int:
    return 1


class BufferedModel:
    """A model whose await completes, then yields buffered events without a checkpoint."""

    def __init__(self) -> None:
        self.ready = trio.Event()
        self.requests = 0

    async def stream(self, request: models.ModelRequest) -> Any:
        self.requests += 1
        await self.ready.wait()
        yield models.Text(text="Sure, transferring now")
        yield models.CallStart(call_id="c1", name="noop")
        yield models.CallEnd(call_id="c1", arguments={})


async def test_interrupt_right_after_start_turn_runs_no_model_step() -> None:
    model = BufferedModel()
    model.ready.set()
    agent = vrt.define_agent(model=model, tools=[noop])
    async with vrt.open_session(agent) as session, subscribed(session) as events:
        turn = await session.start_turn("go")
        session.interrupt()  # before the turn's task ever ran
        result = await turn.wait()
        log = drain(events)
    assert result.status == "interrupted"
    assert result.calls == ()
    assert model.requests == 0
    assert not [e for e in log if isinstance(e, vrt.TextDelta | vrt.ToolStream)]
    assert not [h for h in session.history if isinstance(h, models.AgentText)]


async def test_interrupt_while_model_yields_buffered_events() -> None:
    model = BufferedModel()
    agent = vrt.define_agent(model=model, tools=[noop])
    async with vrt.open_session(agent) as session, subscribed(session) as events:
        turn = await session.start_turn("go")
        await trio.sleep(0.01)
        model.ready.set()  # the model's await completes...
        turn.interrupt()  # ...and the interrupt lands in the same tick
        result = await turn.wait()
        log = drain(events)
    assert result.status == "interrupted"
    assert result.calls == ()  # the buffered call was never created
    assert_stream_valid(log)


@vrt.server_tool(risk="low")
async def fanout(args: Any, ctx: vrt.ToolContext) -> None:
    """A tool whose own nursery fails to clean up when cancelled."""

    async def flaky() -> None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            raise RuntimeError("rollback failed") from None

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.sleep_forever)
        nursery.start_soon(flaky)


async def test_cleanup_error_during_interrupt_keeps_turn_interrupted(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    agent = vrt.define_agent(model=vrt.ScriptedModel([[vrt.call("fanout", {})]]), tools=[fanout])
    with caplog.at_level(logging.CRITICAL, logger="vrt"):
        async with vrt.open_session(agent) as session:
            turn = await session.start_turn("go")
            await trio.sleep(1)
            turn.interrupt()
            result = await turn.wait()
    assert result.status == "interrupted"
    assert result.calls[0].result.code == vrt.ResultCode.INTERRUPTED
    assert isinstance(session.history[-1], models.TurnInterrupted)


async def test_cleanup_error_during_close_does_not_escape(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    agent = vrt.define_agent(model=vrt.ScriptedModel([[vrt.call("fanout", {})]]), tools=[fanout])
    with caplog.at_level(logging.CRITICAL, logger="vrt"):
        async with vrt.open_session(agent) as session:
            turn = await session.start_turn("go")
            await trio.sleep(1)
    with pytest.raises(vrt.SessionClosed):
        await turn.wait()


async def test_model_end_with_unencodable_arguments_is_a_model_error() -> None:
    class Model:
        async def stream(self, request: models.ModelRequest) -> Any:
            yield models.CallStart(call_id="c1", name="noop")
            yield models.CallEnd(call_id="c1", arguments={"when": object()})

    agent = vrt.define_agent(model=Model(), tools=[noop])
    async with vrt.open_session(agent) as session, subscribed(session) as events:
        result = await (await session.start_turn("go")).wait()
        log = drain(events)
    assert result.status == "failed"
    assert (result.message or "").startswith("model failed: TypeError")
    assert result.calls[0].result.code == vrt.ResultCode.FAILED
    assert_stream_valid(log)


async def test_dangling_ref_fails_at_define_agent() -> None:
    for ref, message in (
        ("#/$defs/City", "points nowhere"),
        ("https://example.com/city.json", "is not local"),
    ):
        bad = vrt.ServerTool(
            name="t",
            description="",
            risk="low",
            run=noop.run,
            parameters={"type": "object", "properties": {"c": {"$ref": ref}}},
        )
        with pytest.raises(vrt.DefinitionError, match=message):
            vrt.define_agent(model=vrt.ScriptedModel([]), tools=[bad])
    good = vrt.ServerTool(
        name="t",
        description="",
        risk="low",
        run=noop.run,
        parameters={
            "type": "object",
            "properties": {"c": {"$ref": "#/$defs/City"}},
            "$defs": {"City": {"type": "string"}},
        },
    )
    vrt.define_agent(model=vrt.ScriptedModel([]), tools=[good])


async def test_validate_raising_any_error_is_invalid_for_that_call_only() -> None:
    def explode(args: Any) -> Any:
        raise SystemError("validator bug")

    @vrt.server_tool(risk="low", validate=explode)
    async def strict(args: Any, ctx: vrt.ToolContext) -> None:
        return None

    agent = vrt.define_agent(
        model=vrt.ScriptedModel([[vrt.call("strict", {}), vrt.call("noop", {})]]),
        tools=[strict, noop],
    )
    async with vrt.open_session(agent) as session:
        result = await (await session.start_turn("go")).wait()
    assert result.status == "finished"
    bad, good = (c.result for c in result.calls)
    assert bad.code == vrt.ResultCode.INVALID and bad.message == "SystemError: validator bug"
    assert good.ok


def test_async_validate_is_refused() -> None:
    async def check(args: Any) -> Any:
        return args

    tool = vrt.ServerTool(name="t", description="", risk="low", run=noop.run, validate=check)
    with pytest.raises(vrt.DefinitionError, match="validate must be synchronous"):
        vrt.define_agent(model=vrt.ScriptedModel([]), tools=[tool])


async def test_timeout_aborts_the_signal_at_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    effects = []

    @vrt.server_tool(risk="high", timeout=1)
    async def transfer(args: Any, ctx: vrt.ToolContext) -> None:
        with trio.CancelScope(shield=True):
            await trio.sleep(2)  # a load that ignores cancellation, past the deadline
        effects.append(("aborted", ctx.signal.aborted, ctx.signal.reason))
        async with ctx.committing():
            effects.append("money moved")

    agent = vrt.define_agent(
        model=vrt.ScriptedModel([[vrt.call("transfer", {})]]), tools=[transfer]
    )
    async with vrt.open_session(agent) as session:
        result = await (await session.start_turn("go")).wait()
    assert effects == [("aborted", True, "timeout")]
    assert result.calls[0].result.code == vrt.ResultCode.FAILED  # CallAborted raised by the tool


async def test_signal_wait_wakes_at_deadline(autojump_clock: trio.testing.MockClock) -> None:
    woke = []

    @vrt.server_tool(risk="low", timeout=3)
    async def waiter(args: Any, ctx: vrt.ToolContext) -> None:
        with trio.CancelScope(shield=True):
            await ctx.signal.wait()
            woke.append((trio.current_time(), ctx.signal.reason))

    agent = vrt.define_agent(model=vrt.ScriptedModel([[vrt.call("waiter", {})]]), tools=[waiter])
    start = trio.current_time()
    async with vrt.open_session(agent) as session:
        result = await (await session.start_turn("go")).wait()
    assert woke == [(pytest.approx(start + 3), "timeout")]
    assert result.calls[0].result.ok  # it returned normally from its shield: honest ok


async def test_unknown_tool_passes_the_hook_first() -> None:
    seen: list[vrt.CallInfo] = []

    async def hook(info: vrt.CallInfo) -> Any:
        seen.append(info)
        return vrt.Reject("not allowed") if info.name == "delete_account" else None

    agent = vrt.define_agent(
        model=vrt.ScriptedModel([[vrt.call("delete_account", {}), vrt.call("teleport", {})]]),
        before_tool_call=hook,
    )
    async with vrt.open_session(agent) as session:
        result = await (await session.start_turn("go")).wait()
    assert sorted(i.name for i in seen) == ["delete_account", "teleport"]
    assert all(i.risk is None for i in seen)
    rejected, unknown = (c.result for c in result.calls)
    assert rejected.code == vrt.ResultCode.REJECTED
    assert unknown.code == vrt.ResultCode.FAILED


async def test_body_error_comes_out_unwrapped() -> None:
    with pytest.raises(KeyError, match="app bug"):
        async with vrt.open_session(vrt.define_agent(model=vrt.ScriptedModel([]))):
            raise KeyError("app bug")


async def test_subscribe_after_close_raises() -> None:
    async with vrt.open_session(vrt.define_agent(model=vrt.ScriptedModel([]))) as session:
        session.close()
        with pytest.raises(vrt.SessionClosed):
            async with session.subscribe():
                pass


async def test_closed_sessions_hold_no_turn_or_script_cursor(
    autojump_clock: trio.testing.MockClock,
) -> None:
    @vrt.server_tool(risk="low")
    async def slow(args: Any, ctx: vrt.ToolContext) -> None:
        await trio.sleep(10)

    model = vrt.ScriptedModel([[vrt.call("slow", {})]])
    agent = vrt.define_agent(model=model, tools=[slow])
    for _ in range(3):
        async with vrt.open_session(agent) as session:
            await session.start_turn("go")
            await trio.sleep(1)
        assert session.turn is None
    assert model._cursors == {}


# -- found by vrt check (vrt.check.BREAKABLE "late-dispatch" and "overtake") ---------------------

EDIT = models.ToolSpec(name="edit", description="an app tool", parameters={"type": "object"})


class RecordingHost:
    """An app host that records the calls sent to it; each waits until ``release``.
    ``eager``: the first call in line is sent from the turn's task (as with batch-v1)."""

    def __init__(self, eager: bool = False) -> None:
        self.eager = eager
        self.sent: list[str] = []
        self.changed = trio.Event()
        self.release = trio.Event()

    def send_app(self, call: Any) -> Any:
        self.sent.append(call.call_id)  # "sends tool.call"
        self.changed.set()
        self.changed = trio.Event()
        return _Released(self, call.call_id)


class _Released:
    def __init__(self, host: RecordingHost, call_id: str) -> None:
        self.host, self.call_id = host, call_id

    async def wait(self) -> vrt.ToolResult:
        await self.host.release.wait()
        return vrt.ToolResult.success(self.call_id)


@pytest.mark.parametrize("eager", [False, True])
async def test_an_interrupt_never_sends_the_app_call_waiting_behind_another(eager: bool) -> None:
    """late-dispatch: call_2 waits for call_1; the interrupt ends call_1 (waking call_2)
    before it cancels the turn's scope, and call_2 was still sent to the app."""
    host = RecordingHost(eager)
    script = vrt.ScriptedModel([[vrt.call("edit", {}), vrt.call("edit", {})]])
    agent = vrt.define_agent(model=script, client_tools="accept")
    async with vrt.open_session(agent, app_tools=[EDIT], app_host=host) as session:
        turn = await session.start_turn("edit twice")
        while host.sent != ["call_1"]:
            await host.changed.wait()
        session.interrupt()
        await turn.wait()
        await trio.testing.wait_all_tasks_blocked()
        codes = [i.result.code for i in session.history if isinstance(i, vrt.CallRecord)]
    assert host.sent == ["call_1"]
    assert codes == [vrt.ResultCode.INTERRUPTED] * 2


@pytest.mark.parametrize("eager", [False, True])
async def test_an_app_call_never_overtakes_an_earlier_one_still_in_its_hook(eager: bool) -> None:
    """overtake: call_3 waited only for call_2; call_2 was rejected at once, so call_3 was
    sent while call_1, the earliest, was still in its hook."""
    host = RecordingHost(eager)
    host.release.set()
    in_hook = trio.Event()
    hook_done = trio.Event()

    async def hook(info: vrt.CallInfo) -> vrt.Reject | None:
        if info.call_id == "call_1":
            in_hook.set()
            await hook_done.wait()
        if info.call_id == "call_2":
            return vrt.Reject("no")
        return None

    script = vrt.ScriptedModel([[vrt.call("edit", {}), vrt.call("edit", {}), vrt.call("edit", {})]])
    agent = vrt.define_agent(model=script, client_tools="accept", before_tool_call=hook)
    async with vrt.open_session(agent, app_tools=[EDIT], app_host=host) as session:
        turn = await session.start_turn("edit three times")
        await in_hook.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert host.sent == []  # call_3 waits for call_1 although call_2 is over
        hook_done.set()
        await turn.wait()
    assert host.sent == ["call_1", "call_3"]
