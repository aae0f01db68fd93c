"""``vrt.mcp`` against real MCP servers: ``mcp-server-time`` from PyPI,
``@modelcontextprotocol/server-everything`` from npm, and servers written with the SDK's
``MCPServer`` for what those cannot show (tests/mcp_servers.py), over stdio and
streamable HTTP, started and stopped by the tests (marked ``network``: first pass only).
The mapping's table is tests/test_mcp_mapping.py."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

import vrt
import vrt.mcp
from tests.servers import ROOT, free_port

EVERYTHING = (
    ROOT / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
)
P = vrt.Phase


# -- servers -------------------------------------------------------------------------------------


@asynccontextmanager
async def ours(tmp_path: Path, **options: Any) -> AsyncIterator[tuple[vrt.mcp.McpServer, Path]]:
    """tests/mcp_servers.py over stdio: the connection, and the log of what it saw."""
    log = tmp_path / "server.log"
    log.touch()
    async with vrt.mcp.connect_stdio(
        sys.executable, [str(ROOT / "tests" / "mcp_servers.py"), str(log)], **options
    ) as server:
        yield server, log


async def seen(log: Path, text: str, within: float = 3.0) -> None:
    """Wait until the server's own log has ``text`` (it writes it as it happens)."""
    with trio.fail_after(within):
        while text not in await trio.Path(log).read_text():  # noqa: ASYNC110 - its file
            await trio.sleep(0.02)


def agent_of(steps: list[list[Any]], tools: list[vrt.ServerTool], **kw: Any) -> vrt.Agent:
    return vrt.define_agent(model=vrt.ScriptedModel(steps), tools=tools, **kw)


async def one_turn(agent: vrt.Agent, text: str = "go") -> tuple[vrt.TurnResult, list[Any]]:
    async with vrt.open_session(agent) as session, session.subscribe(previews=False) as events:
        turn = await session.start_turn(text)
        result = await turn.wait()
        log = []
        with contextlib.suppress(trio.WouldBlock):
            while True:
                log.append(events.receive_nowait())
        return result, log


pytestmark = pytest.mark.network


async def test_our_server_maps_and_runs_its_tools(tmp_path: Path) -> None:
    async with ours(tmp_path, prefix="t_") as (server, _):
        tools = {t.name: t for t in server.tools}
        assert {"t_count", "t_never", "t_fail", "t_echo"} <= tools.keys()
        assert (tools["t_count"].risk, tools["t_never"].risk, tools["t_die"].risk) == (
            "low",
            "medium",
            "high",
        )
        assert tools["t_count"].parameters["required"] == ["steps", "pause"]
        steps = [
            [vrt.call("t_count", {"steps": 3, "pause": 0.02})],
            [vrt.call("t_fail", {"size": 3})],
            [vrt.call("t_count", {"steps": "three", "pause": 0})],  # the server's schema
            [],
        ]
        result, events = await one_turn(agent_of(steps, server.tools))
    counted, failed, invalid = (c.result for c in result.calls)
    assert counted.ok and counted.output == {"result": "counted to 3"}
    assert (failed.code, failed.message) == (
        vrt.ResultCode.FAILED,
        "Error executing tool fail: no no no",
    )
    assert invalid.code == vrt.ResultCode.INVALID  # never sent: the schema said no
    progress = [
        e.progress for e in events if isinstance(e, vrt.ToolStream) and e.phase == P.PROGRESS
    ]
    assert progress == [
        {"progress": 1.0, "total": 3.0, "message": "step 1"},
        {"progress": 2.0, "total": 3.0, "message": "step 2"},
        {"progress": 3.0, "total": 3.0, "message": "step 3"},
    ]
    vrt.testing.assert_stream_valid(events)


async def test_an_interrupt_settles_at_once_and_reaches_the_server(tmp_path: Path) -> None:
    async with ours(tmp_path) as (server, log):
        agent = agent_of([[vrt.call("never", {})], []], server.tools)
        async with vrt.open_session(agent) as session, session.subscribe(previews=False) as events:
            turn = await session.start_turn("go")
            async for event in events:
                if isinstance(event, vrt.ToolStream) and event.phase == P.ARGUMENTS_COMPLETE:
                    break
            await trio.sleep(0.2)  # running at the server
            start = trio.current_time()
            session.interrupt()
            async for event in events:
                if isinstance(event, vrt.ToolStream) and event.phase == P.CANCELLED:
                    break
            settled_in = trio.current_time() - start
            result = await turn.wait()
        await seen(log, "cancelled never")  # its handler was cancelled: the notification came
    assert settled_in < 0.05, settled_in
    assert result.calls[0].result.code == vrt.ResultCode.INTERRUPTED


async def test_a_timeout_is_timeout_and_cancels_at_the_server(tmp_path: Path) -> None:
    async with ours(tmp_path, timeout=0.3) as (server, log):
        result, _ = await one_turn(agent_of([[vrt.call("never", {})], []], server.tools))
        await seen(log, "cancelled never")
    assert result.calls[0].result.code == vrt.ResultCode.TIMEOUT


async def test_a_server_that_dies_mid_call_fails_it_and_is_started_again(tmp_path: Path) -> None:
    async with ours(tmp_path) as (server, log):
        steps = [[vrt.call("pid", {})], [vrt.call("die", {})], [vrt.call("pid", {})], []]
        result, _ = await one_turn(agent_of(steps, server.tools))
        assert server.restarts == 1
    before, died, after = (c.result for c in result.calls)
    assert died.code == vrt.ResultCode.FAILED and "closed the connection" in (died.message or "")
    assert before.ok and after.ok and before.output != after.output  # a new process
    assert "dying" in log.read_text()


async def test_elicitation_goes_to_on_elicit_or_is_declined(tmp_path: Path) -> None:
    asked: list[vrt.mcp.Elicitation] = []

    async def on_elicit(request: vrt.mcp.Elicitation) -> Any:
        asked.append(request)
        return {"action": "accept", "content": {"name": "Ada"}}

    steps = [[vrt.call("ask", {})], []]
    async with ours(tmp_path, on_elicit=on_elicit) as (server, _):
        accepted, _ = await one_turn(agent_of(steps, server.tools))
    async with ours(tmp_path) as (server, _):
        declined, _ = await one_turn(agent_of(steps, server.tools))
    assert accepted.calls[0].result.output == {"result": "hello Ada"}
    assert asked[0].message == "What is your name?"
    assert asked[0].schema is not None and "name" in asked[0].schema["properties"]
    assert declined.calls[0].result.output == {"result": "no name (decline)"}


async def test_an_elicitation_never_outlives_its_call(tmp_path: Path) -> None:
    """The user never answers: the interrupt ends the call (INTERRUPTED) and the question
    with it (on_elicit cancelled)."""
    ended = trio.Event()

    async def on_elicit(request: vrt.mcp.Elicitation) -> Any:
        try:
            await trio.sleep_forever()
        finally:
            ended.set()

    async with ours(tmp_path, on_elicit=on_elicit) as (server, _):
        agent = agent_of([[vrt.call("ask", {})], []], server.tools)
        async with vrt.open_session(agent) as session:
            turn = await session.start_turn("go")
            await trio.sleep(0.5)  # the question is asked
            session.interrupt()
            result = await turn.wait()
            with trio.fail_after(2):
                await ended.wait()
    assert result.calls[0].result.code == vrt.ResultCode.INTERRUPTED


async def test_a_changed_tool_list_is_taken_at_the_next_step_never_mid_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``grow`` adds ``extra``; with the server's tool list slow (0.5 s a listing), the
    step right after still has the old list (``extra`` unknown), a later turn the new."""
    monkeypatch.setenv("VRT_TEST_MCP_LIST_DELAY", "0.5")
    async with ours(tmp_path, env={"VRT_TEST_MCP_LIST_DELAY": "0.5"}) as (server, _):
        agent = agent_of(
            [[vrt.call("grow", {})], [vrt.call("extra", {})], [], [vrt.call("extra", {})], []],
            server.tools,
        )
        async with vrt.open_session(agent) as session:
            first = await (await session.start_turn("grow")).wait()
            with trio.fail_after(5):
                while "extra" not in {t.name for t in server.tools}:  # noqa: ASYNC110
                    await trio.sleep(0.05)
            second = await (await session.start_turn("again")).wait()
    grown, too_soon = (c.result for c in first.calls)
    assert grown.ok and too_soon.code == vrt.ResultCode.FAILED
    assert "no tool named 'extra'" in (too_soon.message or "")
    assert second.calls[0].result.output == {"result": "extra!"}


async def test_prefixes_and_clashes(tmp_path: Path) -> None:
    async with ours(tmp_path) as (a, _), ours(tmp_path) as (b, _):
        with pytest.raises(vrt.DefinitionError, match="two server tools are named 'count'"):
            vrt.define_agent(model=vrt.ScriptedModel([]), tools=[*a.tools, *b.tools])
    async with ours(tmp_path, prefix="a_") as (a, _), ours(tmp_path, prefix="b_") as (b, _):
        agent = vrt.define_agent(model=vrt.ScriptedModel([]), tools=[*a.tools, *b.tools])
        assert {"a_count", "b_count"} <= set(agent.registry)


async def test_the_hook_sees_mcp_calls_with_their_risk(tmp_path: Path) -> None:
    seen_risks: list[tuple[str, str | None]] = []

    async def hook(info: vrt.CallInfo) -> Any:
        seen_risks.append((info.name, info.risk))
        return vrt.Reject("not today") if info.risk == "high" else None

    async with ours(tmp_path, risk={"echo": "high"}) as (server, _):
        steps = [[vrt.call("echo", {"text": "hi"}), vrt.call("pid", {})], []]
        result, _ = await one_turn(agent_of(steps, server.tools, before_tool_call=hook))
    assert sorted(seen_risks) == [("echo", "high"), ("pid", "low")]  # the calls run at once
    assert result.calls[0].result.code == vrt.ResultCode.REJECTED and result.calls[1].result.ok


async def test_a_server_that_cannot_start_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(vrt.mcp.McpError, match=r"sys.exit\(2\): Connection closed"):
        async with vrt.mcp.connect_stdio(sys.executable, ["-c", "import sys; sys.exit(2)"]):
            pass  # pragma: no cover


# -- mcp-server-time (PyPI) ----------------------------------------------------------------------


async def test_the_time_server_through_a_real_model_adapter() -> None:
    """A scripted turn through the OpenAI Chat adapter and a FakeProvider: the model calls
    the time server's tool, and its result is in the model's next request, as the
    provider reads it (a ``tool`` message with the JSON)."""
    async with vrt.mcp.connect_stdio(
        sys.executable, ["-m", "mcp_server_time"], prefix="time_"
    ) as time_server:
        names = {t.name: t.risk for t in time_server.tools}
        assert names == {"time_get_current_time": "low", "time_convert_time": "low"}
        steps = [
            [vrt.call("time_get_current_time", {"timezone": "Europe/Paris"})],
            [vrt.say("It is evening in Paris.")],
        ]
        async with (
            vrt.testing.FakeProvider(steps) as provider,
            vrt.models.OpenAIChat("fake", base_url=provider.base_url) as model,
        ):
            result, _ = await one_turn(
                vrt.define_agent(model=model, tools=time_server.tools), "time in Paris?"
            )
    assert result.status == "finished" and result.calls[0].result.ok
    assert result.calls[0].result.output["timezone"] == "Europe/Paris"
    tool_messages = [m for m in provider.requests[1]["messages"] if m["role"] == "tool"]
    assert len(tool_messages) == 1
    body = json.loads(tool_messages[0]["content"])
    assert body["ok"] is True and body["output"]["timezone"] == "Europe/Paris"
    offered = {t["function"]["name"] for t in provider.requests[0]["tools"]}
    assert offered == {"time_get_current_time", "time_convert_time"}


# -- @modelcontextprotocol/server-everything (npm) -----------------------------------------------


def _everything() -> str:
    assert EVERYTHING.exists(), "npm ci installs @modelcontextprotocol/server-everything"
    return str(EVERYTHING)


async def _interrupt_a_long_operation(server: vrt.mcp.McpServer) -> tuple[list[Any], float]:
    """Run trigger-long-running-operation (10 steps over 2 s); interrupt at its third
    progress. Its progress, in order, and how long the interrupt took to settle it."""
    agent = agent_of(
        [[vrt.call("trigger-long-running-operation", {"duration": 2, "steps": 10})], []],
        server.tools,
    )
    progress: list[Any] = []
    async with vrt.open_session(agent) as session, session.subscribe(previews=False) as events:
        await session.start_turn("go")
        async for event in events:
            if not isinstance(event, vrt.ToolStream):
                continue
            if event.phase == P.PROGRESS:
                progress.append(event.progress)
                if len(progress) == 3:
                    start = trio.current_time()
                    session.interrupt()
            elif event.phase in (P.CANCELLED, P.SETTLED):
                assert event.phase == P.CANCELLED
                return progress, trio.current_time() - start
    raise AssertionError("no terminal phase")  # pragma: no cover


async def test_everything_over_stdio_progress_and_a_cancellation(tmp_path: Path) -> None:
    """Its long-running tool's progress arrives as phases in order; an interrupt settles
    it within 50 ms, and the server's stdin (recorded by tee) has the
    ``notifications/cancelled`` of its request."""
    stdin = tmp_path / "stdin.log"
    script = f"tee -a {stdin} | exec node {_everything()} stdio"
    async with vrt.mcp.connect_stdio("sh", ["-c", script]) as server:
        assert server.tools and {t.risk for t in server.tools} <= {"low", "medium", "high"}
        progress, took = await _interrupt_a_long_operation(server)
        await trio.sleep(0.2)
    assert [p["progress"] for p in progress] == [1.0, 2.0, 3.0]
    assert all(p["total"] == 10.0 for p in progress)
    assert took < 0.05, took
    cancels = [line for line in stdin.read_text().splitlines() if "notifications/cancelled" in line]
    assert len(cancels) == 1, cancels


async def test_everything_over_streamable_http(tmp_path: Path) -> None:
    """The same over streamable HTTP, through a proxy that records what the server was
    sent: the POST of ``notifications/cancelled``, answered 202 (accepted)."""
    port = free_port()
    process = await trio.lowlevel.open_process(
        ["node", _everything(), "streamableHttp"],
        env={**os.environ, "PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with trio.fail_after(15):
            while True:
                try:
                    await (await trio.open_tcp_stream("127.0.0.1", port)).aclose()
                    break
                except OSError:
                    await trio.sleep(0.05)
        async with trio.open_nursery() as nursery:
            recorder = Recorder(port)
            proxy_port = await nursery.start(recorder.run)
            async with vrt.mcp.connect_http(f"http://127.0.0.1:{proxy_port}/mcp") as server:
                progress, took = await _interrupt_a_long_operation(server)
                await trio.sleep(0.3)
                # a whole call, its result in the model's next request (Anthropic's format)
                steps = [[vrt.call("echo", {"message": "over HTTP"})], [vrt.say("Done.")]]
                async with (
                    vrt.testing.FakeProvider(steps, api="anthropic") as provider,
                    vrt.models.AnthropicMessages("fake", base_url=provider.base_url) as model,
                ):
                    echoed, _ = await one_turn(vrt.define_agent(model=model, tools=server.tools))
            nursery.cancel_scope.cancel()
    finally:
        process.terminate()
        await process.wait()
    assert [p["progress"] for p in progress] == [1.0, 2.0, 3.0]
    assert took < 0.05, took
    sent = bytes(recorder.up)
    assert b'"method":"notifications/cancelled"' in sent
    assert b"HTTP/1.1 202" in bytes(recorder.down)
    assert echoed.status == "finished" and echoed.calls[0].result.ok
    results = [
        block
        for message in provider.requests[1]["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block["type"] == "tool_result"
    ]
    assert len(results) == 1 and not results[0]["is_error"]
    assert "Echo: over HTTP" in results[0]["content"], results[0]


class Recorder:
    """A loopback TCP proxy to ``port`` keeping every byte each way."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.up = bytearray()
        self.down = bytearray()

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(self._pipe, listeners)

    async def _pipe(self, client: trio.SocketStream) -> None:
        async with client, await trio.open_tcp_stream("127.0.0.1", self.port) as server:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._copy, client, server, self.up, nursery.cancel_scope)
                nursery.start_soon(self._copy, server, client, self.down, nursery.cancel_scope)

    @staticmethod
    async def _copy(
        source: trio.SocketStream, sink: trio.SocketStream, kept: bytearray, done: trio.CancelScope
    ) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            async for data in source:
                kept += data
                await sink.send_all(data)
        done.cancel()
