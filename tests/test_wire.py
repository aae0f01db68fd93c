"""vrt/1 end to end over a real loopback WebSocket (port 0), with the Python client."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
from trio_websocket import ConnectionClosed, WebSocketRequest, serve_websocket

import vrt
from tests.conftest import Log, drain, until
from vrt import models
from vrt._wire import messages as m
from vrt.testing import assert_stream_valid

P = vrt.Phase
Serve = Callable[..., Awaitable[vrt.Server]]
OBJ = {"type": "object", "properties": {"i": {"type": "integer"}}}


def settled(e: Any) -> bool:
    return isinstance(e, vrt.TurnEnded)


def app_calls(n: int, name: str = "edit") -> list[Any]:
    return [vrt.call(name, {"i": i}) for i in range(n)]


def agent(*steps: list[Any], **kw: Any) -> vrt.Agent:
    kw.setdefault("client_tools", "accept")
    return vrt.define_agent(model=vrt.ScriptedModel(steps), **kw)


async def run_turn(client: vrt.Client, text: str = "go") -> list[Any]:
    async with client.subscribe() as channel:
        events = Log(channel)
        await client.send_text(text)
        await until(events, settled)
        return drain(events)


@vrt.server_tool(risk="low", parameters=OBJ)
async def lookup(args: Any, ctx: vrt.ToolContext) -> int:
    ctx.emit({"looking": args["i"]})
    await trio.sleep(0.05)
    return int(args["i"])


async def test_app_tools_run_one_at_a_time_in_arrival_order(vrt_serve: Serve) -> None:
    log: list[tuple[str, int]] = []

    @vrt.app_tool(parameters=OBJ)
    async def edit(args: Any, ctx: Any) -> int:
        log.append(("begin", args["i"]))
        await trio.sleep(0.03 * (3 - args["i"]))  # the first is the slowest
        log.append(("end", args["i"]))
        return int(args["i"]) * 10

    server = await vrt_serve(agent(app_calls(3), [vrt.say("done")]))
    async with vrt.connect(server.url, tools=[edit]) as client:
        events = await run_turn(client)
    assert log == [("begin", 0), ("end", 0), ("begin", 1), ("end", 1), ("begin", 2), ("end", 2)]
    settles = [e for e in events if isinstance(e, vrt.ToolStream) and e.phase == P.SETTLED]
    assert [(e.call_id, e.kind, e.ok) for e in settles] == [
        ("call_1", "app", True),
        ("call_2", "app", True),
        ("call_3", "app", True),
    ]
    assert_stream_valid(events)


async def test_results_reach_the_model(vrt_serve: Serve) -> None:
    requests: list[models.ModelRequest] = []
    model = vrt.ScriptedModel(
        [[vrt.call("edit", {"i": 4}), vrt.call("lookup", {"i": 5})], [vrt.say("ok")]]
    )
    original = model.stream

    def spy(request: models.ModelRequest) -> Any:
        requests.append(request)
        return original(request)

    model.stream = spy  # type: ignore[method-assign]

    @vrt.app_tool(description="edit a block", parameters=OBJ)
    async def edit(args: Any, ctx: Any) -> dict[str, int]:
        return {"edited": args["i"]}

    server = await vrt_serve(vrt.define_agent(model=model, tools=[lookup], client_tools="accept"))
    async with vrt.connect(server.url, tools=[edit]) as client:
        await run_turn(client)
    assert [t.name for t in requests[0].tools] == ["lookup", "edit"]
    records = [h for h in requests[1].history if isinstance(h, vrt.CallRecord)]
    assert [(r.name, r.kind, r.result.output) for r in records] == [
        ("edit", "app", {"edited": 4}),
        ("lookup", "server", 5),
    ]


async def test_ignore_does_not_offer_app_tools(vrt_serve: Serve) -> None:
    requests: list[models.ModelRequest] = []
    model = vrt.ScriptedModel([[vrt.call("edit", {"i": 1})]])
    original = model.stream

    def spy(request: models.ModelRequest) -> Any:
        requests.append(request)
        return original(request)

    model.stream = spy  # type: ignore[method-assign]

    @vrt.app_tool(parameters=OBJ)
    async def edit(args: Any, ctx: Any) -> None:
        raise AssertionError("must not run")

    server = await vrt_serve(vrt.define_agent(model=model, client_tools="ignore"))
    async with vrt.connect(server.url, tools=[edit]) as client:
        events = await run_turn(client)
    assert requests[0].tools == ()
    settle = next(e for e in events if isinstance(e, vrt.ToolStream) and e.phase == P.SETTLED)
    assert (settle.ok, settle.code) == (False, vrt.ResultCode.FAILED)


async def test_app_tool_failures(vrt_pair: Any) -> None:
    @vrt.app_tool(parameters=OBJ)
    async def edit(args: Any, ctx: Any) -> Any:
        vrt.validate_arguments(args, {"type": "object", "properties": {"i": {"maximum": 5}}})
        if args["i"] == 3:
            raise KeyError("no block 3")
        return {"i": args["i"]} if args["i"] != 4 else object()

    ag = agent([vrt.call("edit", {"i": i}) for i in (1, 9, 3, 4)] + [vrt.call("edit", {"i": "x"})])
    async with vrt_pair(ag, [edit]) as client:
        events = await run_turn(client)
    settles = {
        e.call_id: e for e in events if isinstance(e, vrt.ToolStream) and e.phase == P.SETTLED
    }
    codes = [settles[f"call_{i}"].code for i in range(1, 6)]
    assert codes == [
        None,
        vrt.ResultCode.INVALID,
        vrt.ResultCode.FAILED,
        vrt.ResultCode.FAILED,
        vrt.ResultCode.INVALID,
    ]  # last: the server's JSON Schema check
    assert settles["call_3"].message == "KeyError: 'no block 3'"
    assert "JSON" in (settles["call_4"].message or "")
    assert_stream_valid(events)


async def test_client_interrupt_cancels_locally_before_any_server_reply(vrt_serve: Serve) -> None:
    started = trio.Event()
    aborted: list[str | None] = []

    @vrt.app_tool(parameters=OBJ)
    async def edit(args: Any, ctx: Any) -> None:
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            aborted.append(ctx.signal.reason)

    @vrt.server_tool(risk="low", parameters=OBJ)
    async def slow(args: Any, ctx: vrt.ToolContext) -> None:
        await trio.sleep_forever()

    ag = agent(
        [vrt.call("slow", {"i": 0}), vrt.call("edit", {"i": 1}), vrt.call("edit", {"i": 2})],
        [vrt.say("never")],
        tools=[slow],
    )
    server = await vrt_serve(ag)
    async with vrt.connect(server.url, tools=[edit]) as client, client.subscribe() as channel:
        events = Log(channel)
        await client.send_text("go")
        await started.wait()
        await until(
            events,
            lambda e: (
                isinstance(e, vrt.ToolStream)
                and e.call_id == "call_3"
                and e.phase == P.ARGUMENTS_COMPLETE
            ),
        )
        before = len(drain(events))
        client.interrupt()  # synchronous: the cancelled events are already delivered
        local = drain(events)[before:]
        assert client.epoch == 1
        assert {(e.call_id, e.phase) for e in local} == {
            ("call_1", P.CANCELLED),
            ("call_2", P.CANCELLED),
            ("call_3", P.CANCELLED),
        }
        ended = await until(events, settled)
        everything = drain(events)
    assert ended == vrt.TurnEnded(turn_id="t_1", epoch=1, reason="interrupted")
    assert aborted == ["interrupted"]
    assert not [e for e in everything if isinstance(e, vrt.TextDelta)]
    assert_stream_valid(everything)  # the server's own cancelled events were dropped


async def test_stale_tool_call_never_runs() -> None:
    """A scripted raw server sends a tool.call of epoch 0 after the client moved to 1."""
    frames: list[dict[str, Any]] = []
    interrupted = trio.Event()
    answered = trio.Event()

    async def handler(request: WebSocketRequest) -> None:
        ws = await request.accept()
        frames.append(json.loads(await ws.get_message()))  # hello
        await ws.send_message(
            json.dumps(
                {
                    "type": "welcome",
                    "seq": 1,
                    "sessionId": "s",
                    "resumeToken": "t",
                    "epoch": 0,
                    "capabilities": [],
                    "resumed": False,
                    "lastSeq": 1,
                }
            )
        )
        await interrupted.wait()
        frames.append(json.loads(await ws.get_message()))  # interrupt
        await ws.send_message(
            json.dumps(
                {
                    "type": "tool.call",
                    "seq": 2,
                    "callId": "c1",
                    "turnId": "t_1",
                    "epoch": 0,
                    "name": "edit",
                    "arguments": {},
                }
            )
        )
        with contextlib.suppress(ConnectionClosed):  # the client leaves once closed
            while True:
                frame = json.loads(await ws.get_message())
                if frame["type"] == "tool.result":
                    frames.append(frame)
                    answered.set()
                if frame["type"] == "close":
                    closed = json.dumps({"type": "closed", "seq": 3, "reason": "client"})
                    await ws.send_message(closed)

    ran = []

    @vrt.app_tool()
    async def edit(args: Any, ctx: Any) -> None:
        ran.append(args)

    async with trio.open_nursery() as nursery:
        listener = await nursery.start(serve_websocket, handler, "127.0.0.1", 0, None)
        async with vrt.connect(f"ws://127.0.0.1:{listener.port}/", tools=[edit]) as client:
            client.interrupt()
            interrupted.set()
            with trio.fail_after(5):
                await answered.wait()
        nursery.cancel_scope.cancel()  # the client closed first; the raw server goes
    assert frames[1] == {"type": "interrupt", "seq": 2, "epoch": 1}
    assert frames[2]["callId"] == "c1" and frames[2]["epoch"] == 0
    assert frames[2]["result"]["ok"] is False and frames[2]["result"]["code"] == "INTERRUPTED"
    assert ran == []


@pytest.mark.parametrize(
    ("client_caps", "server_caps"), [((), ("tool-stream-v1",)), (("tool-stream-v1",), ())]
)
async def test_without_tool_stream_v1_only_previews(
    vrt_serve: Serve, client_caps: tuple[str, ...], server_caps: tuple[str, ...]
) -> None:
    server = await vrt_serve(
        agent([vrt.call("lookup", {"i": 1}, chunks=2)], tools=[lookup]), capabilities=server_caps
    )
    async with vrt.connect(server.url, capabilities=client_caps) as client:
        assert client.capabilities == ()
        events = await run_turn(client)
    assert not [e for e in events if isinstance(e, vrt.ToolStream)]
    previews = [e for e in events if isinstance(e, vrt.ToolPreview)]
    # coalesced (vrt._server.frames.Previews): the first, then the complete one
    assert [(p.arguments, p.complete) for p in previews] == [("", False), ('{"i": 1}', True)]


@pytest.mark.parametrize("offer", [m.LEGACY, m.CAPABILITIES])
async def test_with_tool_stream_v1_streams_and_previews(
    vrt_serve: Serve, offer: tuple[str, ...]
) -> None:
    """Previews from the wire (legacy) or made by the client (local-preview-v1): the same."""
    server = await vrt_serve(agent([vrt.call("lookup", {"i": 1}, chunks=2)], tools=[lookup]))
    async with vrt.connect(server.url, capabilities=offer) as client:
        assert client.capabilities == offer
        events = await run_turn(client)
    streams = [e for e in events if isinstance(e, vrt.ToolStream)]
    assert [e.phase for e in streams] == [
        P.START,
        P.ARGUMENTS_DELTA,
        P.ARGUMENTS_DELTA,
        P.ARGUMENTS_COMPLETE,
        P.PROGRESS,
        P.SETTLED,
    ]
    assert streams[4].progress == {"looking": 1}
    previews = [e for e in events if isinstance(e, vrt.ToolPreview)]
    assert [(p.arguments, p.complete) for p in previews] == [("", False), ('{"i": 1}', True)]


async def test_app_tool_timeout_aborts_in_the_client(vrt_serve: Serve) -> None:
    aborted: list[str | None] = []
    stopped = trio.Event()

    @vrt.app_tool(parameters=OBJ)
    async def edit(args: Any, ctx: Any) -> None:
        try:
            await trio.sleep(10)
        finally:
            aborted.append(ctx.signal.reason)
            stopped.set()

    server = await vrt_serve(agent([vrt.call("edit", {"i": 1})], client_tool_timeout=0.2))
    async with vrt.connect(server.url, tools=[edit]) as client:
        events = await run_turn(client)
        with trio.fail_after(2):
            await stopped.wait()
    settle = next(e for e in events if isinstance(e, vrt.ToolStream) and e.phase == P.SETTLED)
    assert (settle.ok, settle.code) == (False, vrt.ResultCode.TIMEOUT)
    assert "may still have completed" in (settle.message or "")
    assert aborted == ["timeout"]  # tool.abort reached the client and cancelled it


@vrt.server_tool(risk="high", parameters=OBJ)
async def wire_money(args: Any, ctx: vrt.ToolContext) -> str:
    return f"sent {args['i']}"


async def test_confirmation_approve_and_deny(vrt_serve: Serve) -> None:
    ag = agent(
        [
            vrt.call("wire_money", {"i": 1}),
            vrt.call("wire_money", {"i": 2}),
            vrt.call("lookup", {"i": 3}),
        ],
        tools=[wire_money, lookup],
        before_tool_call=vrt.require_confirmation(min_risk="high"),
    )
    server = await vrt_serve(ag)
    asked = []
    async with vrt.connect(server.url) as client, client.subscribe() as channel:
        await client.send_text("pay")
        async for event in channel:
            if isinstance(event, vrt.ConfirmRequest):
                asked.append(event)
                if event.arguments["i"] == 1:
                    await event.approve()
                else:
                    await event.deny("not that one")
            if isinstance(event, vrt.ToolStream) and event.phase == P.SETTLED:
                asked.append((event.call_id, event.ok, event.code, event.message))
            if settled(event):
                break
    requests = [a for a in asked if isinstance(a, vrt.ConfirmRequest)]
    assert sorted(r.arguments["i"] for r in requests) == [1, 2]  # lookup is low risk
    assert requests[0].risk == "high" and "wire_money" in requests[0].prompt
    outcomes = sorted(a for a in asked if isinstance(a, tuple))
    assert outcomes == [
        ("call_1", True, None, None),
        ("call_2", False, vrt.ResultCode.REJECTED, "not that one"),
        ("call_3", True, None, None),
    ]


async def test_interrupt_while_waiting_for_confirmation(vrt_pair: Any) -> None:
    ag = agent(
        [vrt.call("wire_money", {"i": 1})],
        tools=[wire_money],
        before_tool_call=vrt.require_confirmation(),
    )
    async with vrt_pair(ag) as client, client.subscribe() as channel:
        events = Log(channel)
        await client.send_text("pay")
        request = await until(events, lambda e: isinstance(e, vrt.ConfirmRequest))
        client.interrupt()
        await until(events, settled)
        await request.approve()  # too late: nothing happens
        log = drain(events)
    assert [e.phase for e in log if isinstance(e, vrt.ToolStream)][-1] == P.CANCELLED
    assert_stream_valid(log)


async def test_tool_conflict_refuses_the_connection(vrt_serve: Serve) -> None:
    @vrt.app_tool(name="lookup")
    async def clash(args: Any, ctx: Any) -> None:
        return None

    server = await vrt_serve(agent([], tools=[lookup]))
    with pytest.raises(vrt.RemoteProtocolError) as info:
        async with vrt.connect(server.url, tools=[clash]):
            pass
    assert info.value.code == "TOOL_CONFLICT"
    async with vrt.connect(server.url) as client:  # the server goes on
        assert client.session_id


async def test_closed_is_final_and_synthesizes_nothing(vrt_serve: Serve) -> None:
    @vrt.server_tool(risk="low")
    async def hang(args: Any, ctx: vrt.ToolContext) -> None:
        await trio.sleep_forever()

    scope = trio.CancelScope()

    async def run_server(task_status: trio.TaskStatus[vrt.Server]) -> None:
        with scope:
            await vrt.serve(
                agent([vrt.call("hang", {})], tools=[hang]), "127.0.0.1", 0, task_status=task_status
            )

    async with trio.open_nursery() as nursery:
        server = await nursery.start(run_server)
        async with vrt.connect(server.url) as client, client.subscribe() as channel:
            events = Log(channel)
            await client.send_text("go")
            await until(
                events, lambda e: isinstance(e, vrt.ToolStream) and e.phase == P.ARGUMENTS_COMPLETE
            )
            scope.cancel()  # the server shuts down
            closed = await until(events, lambda e: isinstance(e, vrt.Closed))
            log = drain(events)
            assert client.closed == closed
            with pytest.raises(vrt.SessionClosed):
                await client.send_text("again")
    assert closed == vrt.Closed(reason="shutdown")
    assert log[-1] == closed
    assert P.CANCELLED not in [e.phase for e in log if isinstance(e, vrt.ToolStream)]
    assert_stream_valid(log)


async def test_client_close_ends_the_server_session(vrt_pair: Any) -> None:
    async with vrt_pair(agent([vrt.say("hi")])) as client:
        await run_turn(client)
    assert client.closed == vrt.Closed(reason="client")


async def test_a_calls_stream_frames_precede_its_tool_call(vrt_serve: Serve) -> None:
    """The app never runs a call whose start it has not seen (frames leave in engine order)."""
    unseen = []

    async def check(ctx: Any) -> None:
        seen = {e.call_id for e in drain(events) if isinstance(e, vrt.ToolStream)}
        if ctx.call_id not in seen:
            unseen.append(ctx.call_id)

    @vrt.app_tool()
    async def highlight(args: Any, ctx: Any) -> None:
        await check(ctx)

    server = await vrt_serve(agent([vrt.call("highlight", {}) for _ in range(20)]))
    async with vrt.connect(server.url, tools=[highlight]) as client, client.subscribe() as ch:
        events = Log(ch)
        await client.send_text("go")
        await until(events, settled)
    assert unseen == []


async def test_barge_in_is_a_server_side_interrupt(vrt_pair: Any) -> None:
    """Input while a turn is open: the server interrupts it, the app sees its cancelled
    events from the server and the new epoch, and a running app tool is aborted."""
    started = trio.Event()
    aborted: list[str | None] = []

    @vrt.app_tool(parameters=OBJ)
    async def edit(args: Any, ctx: Any) -> None:
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            aborted.append(ctx.signal.reason)

    async with (
        vrt_pair(agent([vrt.call("edit", {"i": 1})], [vrt.say("new turn")]), [edit]) as client,
        client.subscribe() as channel,
    ):
        events = Log(channel)
        await client.send_text("first")
        await started.wait()
        await client.send_text("second")
        first = await until(events, settled)
        second = await until(events, settled)
        log = drain(events)
        assert client.epoch == 1
    assert first == vrt.TurnEnded(turn_id="t_1", epoch=1, reason="interrupted")
    assert second == vrt.TurnEnded(turn_id="t_2", epoch=1, reason="finished")
    phases = [e.phase for e in log if isinstance(e, vrt.ToolStream)]
    assert phases[-1] == P.CANCELLED
    assert aborted == ["interrupted"]  # tool.abort reached the client
    assert_stream_valid(log)


def _no_pacing(monkeypatch: pytest.MonkeyPatch) -> None:
    from vrt._net.options import Options

    monkeypatch.setattr(Options, "high_water", 10**9)


@vrt.server_tool(risk="low")
async def noop(args: Any, ctx: vrt.ToolContext) -> None:
    return None


# ~4,400 frames sent as fast as the server can: a client that reads at its own pace lags
LONG_TURN = [[vrt.call("noop", {"i": 1}, chunks=8)] * 10 for _ in range(20)]


async def test_a_long_turn_is_paced_by_the_clients_acks(vrt_pair: Any) -> None:
    # a replay buffer of 300: the model is held while the client is 120 messages behind
    async with vrt_pair(agent(*LONG_TURN, tools=[noop], max_steps=100), replay_limit=300) as client:
        events = await run_turn(client)
        assert client.closed is None
    assert events[-1] == vrt.TurnEnded(turn_id="t_1", epoch=0, reason="finished")


async def test_without_pacing_the_replay_buffer_overflows(
    vrt_pair: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_pacing(monkeypatch)
    async with vrt_pair(agent(*LONG_TURN, tools=[noop], max_steps=100), replay_limit=300) as client:
        async with client.subscribe() as channel:
            await client.send_text("go")
            with trio.fail_after(30):
                log = [event async for event in channel]
    assert log[-1] == vrt.Closed(reason="overflow")
    assert_stream_valid(log)


@pytest.mark.parametrize("offer", [m.LEGACY, m.CAPABILITIES])
async def test_client_subscribe_without_previews(vrt_serve: Serve, offer: tuple[str, ...]) -> None:
    """``client.subscribe(previews=False)`` like the session's: every event but the
    legacy previews, which another subscriber still gets."""
    server = await vrt_serve(agent([vrt.call("lookup", {"i": 1}, chunks=2)], tools=[lookup]))
    async with vrt.connect(server.url, capabilities=offer) as client:
        async with client.subscribe(previews=False) as plain:
            full = await run_turn(client)
            without = drain(plain)  # every event was emitted to both at once
    assert any(isinstance(e, vrt.ToolPreview) for e in full)
    assert without == [e for e in full if not isinstance(e, vrt.ToolPreview)]


async def test_a_rewrite_to_nan_is_failed_and_never_reaches_the_wire(vrt_serve: Serve) -> None:
    """A Rewrite hook's arguments went to the wire as they were: NaN made a tool.call no
    client parses. Arguments that are not a JSON object are the hook's error: FAILED."""
    ran: list[Any] = []

    @vrt.app_tool(parameters={"type": "object"})
    async def edit(args: Any, ctx: Any) -> None:
        ran.append(args)

    async def hook(info: vrt.CallInfo) -> vrt.Rewrite:
        return vrt.Rewrite({"i": float("nan")})

    server = await vrt_serve(agent(app_calls(1), [vrt.say("done")], before_tool_call=hook))
    async with vrt.connect(server.url, tools=[edit]) as client:
        events = await run_turn(client)
    (settled_,) = [e for e in events if isinstance(e, vrt.ToolStream) and e.phase == P.SETTLED]
    assert settled_.ok is False and settled_.code == vrt.ResultCode.FAILED
    assert not ran


async def test_the_client_closes_when_its_replay_buffer_overflows(vrt_serve: Serve) -> None:
    """PROTOCOL.md: over the replay buffer's bound the session cannot be resumed, so it is
    closed (``overflow``); the Python client let its buffer drop the oldest and went on."""
    server = await vrt_serve(agent([vrt.say("hi")] * 10))
    async with vrt.connect(server.url) as client, client.subscribe() as channel:
        client.proto.replay_limit = 3  # (the default is 10,000)
        for _ in range(5):  # faster than the server's 200 ms acks
            with contextlib.suppress(vrt.SessionClosed):
                await client.send_text("x")
        with trio.fail_after(5):
            events = [e async for e in channel]
    assert isinstance(events[-1], vrt.Closed) and events[-1].reason == "overflow"
