"""Regressions for wire defects found in review: lost interrupts, calls after close,
timeouts that counted queue time, frames that could not be encoded, hangs on close."""

from __future__ import annotations

import functools
import json
import math
from typing import Any

import pytest
import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request, TextMessage

import vrt
from tests.conftest import Log, drain, until
from vrt._client import client as _client
from vrt._wire import messages as m
from vrt._wire.client import ClientProtocol
from vrt.testing import assert_stream_valid

P = vrt.Phase


def ended(e: Any) -> bool:
    return isinstance(e, vrt.TurnEnded)


@pytest.mark.parametrize("turn_open_before", [False, True])
async def test_an_interrupt_right_after_input_is_never_lost(turn_open_before: bool) -> None:
    ran = []

    @vrt.app_tool()
    async def edit(args: Any, ctx: Any) -> str:
        ran.append(ctx.epoch)
        return "ok"

    steps: list[list[Any]] = [[vrt.pause(0.2), vrt.say("t1")]] if turn_open_before else []
    steps += [[vrt.pause(0.05), vrt.call("edit", {})], [vrt.say("done")]]
    agent = vrt.define_agent(model=vrt.ScriptedModel(steps), client_tools="accept")
    async with vrt.testing.open_pair(agent, [edit]) as client, client.subscribe() as ch:
        events = Log(ch)
        if turn_open_before:
            await client.send_text("first")
            await until(events, lambda e: isinstance(e, vrt.TurnStarted))
        await client.send_text("second")
        client.interrupt()  # the user: stop! (right after the input)
        last = await until(events, lambda e: ended(e) and e.turn_id == f"t_{1 + turn_open_before}")
        with trio.move_on_after(0.3):
            await trio.sleep_forever()  # nothing else may run
    assert last.reason == "interrupted"
    assert ran == []


async def test_app_calls_stop_when_the_session_closes() -> None:
    log: list[str] = []
    began = trio.Event()

    @vrt.app_tool()
    async def edit(args: Any, ctx: Any) -> None:
        log.append(f"begin {args['i']}")
        began.set()
        try:
            await trio.sleep(0.2)
        finally:
            log.append(f"end {args['i']} {ctx.signal.reason}")

    agent = vrt.define_agent(
        model=vrt.ScriptedModel([[vrt.call("edit", {"i": i}) for i in range(3)]]),
        client_tools="accept",
    )
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def run_server(task_status: trio.TaskStatus[vrt.Server]) -> None:
            with scope:
                await vrt.serve(agent, "127.0.0.1", 0, task_status=task_status)

        server = await nursery.start(run_server)
        async with vrt.connect(server.url, tools=[edit]) as client, client.subscribe() as ch:
            events = Log(ch)
            await client.send_text("go")
            await until(events, lambda e: isinstance(e, vrt.ToolStream) and e.call_id == "call_3")
            await began.wait()
            scope.cancel()  # the server goes away while the first app call runs
            await until(events, lambda e: isinstance(e, vrt.Closed))
            await trio.sleep(0.5)
    # the first call is aborted (tool.abort on shutdown, or the close itself); none other runs
    assert log in (["begin 0", "end 0 interrupted"], ["begin 0", "end 0 closed"])


async def test_client_tool_timeout_counts_only_the_calls_own_time() -> None:
    @vrt.app_tool()
    async def edit(args: Any, ctx: Any) -> int:
        await trio.sleep(0.3)
        return int(args["i"])

    agent = vrt.define_agent(
        model=vrt.ScriptedModel([[vrt.call("edit", {"i": i}) for i in range(3)]]),
        client_tools="accept",
        client_tool_timeout=0.5,
    )
    async with vrt.testing.open_pair(agent, [edit]) as client, client.subscribe() as ch:
        events = Log(ch)
        await client.send_text("go")
        await until(events, ended)
    settles = [e for e in drain(events) if isinstance(e, vrt.ToolStream) and e.phase == P.SETTLED]
    assert [(e.call_id, e.ok) for e in settles] == [
        ("call_1", True),
        ("call_2", True),
        ("call_3", True),
    ]


async def test_non_finite_numbers_never_reach_the_wire() -> None:
    @vrt.app_tool()
    async def measure(args: Any, ctx: Any) -> float:
        return math.nan

    agent = vrt.define_agent(
        model=vrt.ScriptedModel([[vrt.call("measure", '{"x": NaN}'), vrt.call("measure", {})]]),
        client_tools="accept",
        client_tool_timeout=5,
    )
    async with vrt.testing.open_pair(agent, [measure]) as client, client.subscribe() as ch:
        events = Log(ch)
        await client.send_text("go")
        await until(events, ended)
    log = drain(events)
    settles = {e.call_id: e for e in log if isinstance(e, vrt.ToolStream) and e.phase == P.SETTLED}
    assert settles["call_1"].code == vrt.ResultCode.INVALID  # NaN is not JSON
    assert settles["call_2"].code == vrt.ResultCode.FAILED  # not TIMEOUT: answered at once
    assert_stream_valid(log)


async def test_lone_surrogates_are_escaped_not_fatal() -> None:
    @vrt.app_tool()
    async def echo(args: Any, ctx: Any) -> str:
        return "hi \ud83d"

    agent = vrt.define_agent(
        model=vrt.ScriptedModel([[vrt.call("echo", {"q": "\ud83d"})]]), client_tools="accept"
    )
    async with trio.open_nursery() as nursery:
        server = await nursery.start(vrt.serve, agent, "127.0.0.1", 0)
        async with vrt.connect(server.url, tools=[echo]) as client, client.subscribe() as ch:
            events = Log(ch)
            await client.send_text("go")
            await until(events, ended)
        nursery.cancel_scope.cancel()
    settle = next(
        e for e in drain(events) if isinstance(e, vrt.ToolStream) and e.phase == P.SETTLED
    )
    assert settle.ok


def test_no_confirmation_or_preview_for_a_call_cancelled_locally() -> None:
    client = ClientProtocol()
    client.receive(
        json.dumps(
            {
                "type": "welcome",
                "seq": 1,
                "sessionId": "s",
                "resumeToken": "t",
                "epoch": 0,
                "capabilities": ["tool-stream-v1"],
                "resumed": False,
                "lastSeq": 1,
            }
        )
    )
    base = {"callId": "c1", "turnId": "t", "epoch": 0, "name": "pay", "kind": "server"}
    client.receive(json.dumps({"type": "tool.stream", "seq": 2, "phase": "start", **base}))
    assert [e.phase for e in client.interrupt()] == [P.CANCELLED]
    late = [
        {
            "type": "tool.preview",
            "seq": 3,
            "callId": "c1",
            "turnId": "t",
            "name": "pay",
            "arguments": "{}",
            "complete": True,
        },
        {
            "type": "confirm.request",
            "seq": 4,
            "callId": "c1",
            "name": "pay",
            "arguments": {},
            "risk": "high",
            "prompt": "pay?",
        },
    ]
    assert [client.receive(json.dumps(frame)) for frame in late] == [[], []]
    second = client.receive(
        json.dumps(
            {
                "type": "welcome",
                "seq": 5,
                "sessionId": "s",
                "resumeToken": "t",
                "epoch": 0,
                "capabilities": [],
                "resumed": False,
                "lastSeq": 1,
            }
        )
    )
    assert isinstance(second[0], m.Error) and client.connection.state == "open"


async def _wedged_server(stream: trio.SocketStream) -> None:
    """Accepts, welcomes, then never reads again nor answers a close."""
    ws = WSConnection(ConnectionType.SERVER)
    while True:
        ws.receive_data(await stream.receive_some(65536))
        for event in ws.events():
            if isinstance(event, Request):
                await stream.send_all(ws.send(AcceptConnection()))
            elif isinstance(event, TextMessage):
                welcome = {
                    "type": "welcome",
                    "seq": 1,
                    "sessionId": "s_x",
                    "resumeToken": "t",
                    "epoch": 0,
                    "capabilities": [],
                    "resumed": False,
                    "lastSeq": 1,
                }
                await stream.send_all(ws.send(TextMessage(data=json.dumps(welcome))))
                await trio.sleep_forever()


async def test_leaving_connect_is_bounded_when_the_server_is_wedged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_client, "CLOSE_TIMEOUT", 0.2)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, _wedged_server, 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        start = trio.current_time()
        with trio.fail_after(5):
            async with vrt.connect(f"ws://127.0.0.1:{port}/"):
                pass
        assert trio.current_time() - start < 2
        nursery.cancel_scope.cancel()
