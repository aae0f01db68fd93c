"""What keeps 1,000 sessions cheap (bench/load.py): the shared ack timer and the tasks an idle
server session holds."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import trio
import trio.testing

import vrt
from tests.test_safety import connected
from tests.test_wire_errors import serving
from vrt._net.pumps import ACK_INTERVAL, AckTimer


async def test_the_ack_timer_sends_each_ack_once_an_interval_after_it_was_due(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sent: list[tuple[str, float]] = []

    def sender(name: str) -> object:
        return lambda: sent.append((name, round(trio.current_time(), 6)))

    a, b = sender("a"), sender("b")
    timer = AckTimer()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(timer.run)
        start = trio.current_time()
        timer.due(a)
        await trio.sleep(0.05)
        timer.due(a)  # already due: nothing more
        await trio.sleep(0.05)
        timer.due(b)
        await trio.sleep(1.0)
        assert sent == [
            ("a", round(start + ACK_INTERVAL, 6)),
            ("b", round(start + 0.1 + ACK_INTERVAL, 6)),
        ]
        timer.due(a)  # due again after its ack: a new interval
        await trio.sleep(1.0)
        assert sent[2:] == [("a", round(start + 1.1 + ACK_INTERVAL, 6))]
        nursery.cancel_scope.cancel()


async def test_one_failing_ack_does_not_stop_the_others(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    sent: list[str] = []

    def broken() -> None:
        raise RuntimeError("boom")

    timer = AckTimer()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(timer.run)
        with caplog.at_level(logging.ERROR, logger="vrt"):
            timer.due(broken)
            timer.due(lambda: sent.append("after"))
            await trio.sleep(1.0)
            timer.due(lambda: sent.append("later"))
            await trio.sleep(1.0)
        nursery.cancel_scope.cancel()
    assert sent == ["after", "later"]
    assert [r.getMessage() for r in caplog.records] == ["sending an ack failed"]


def _tasks(task: trio.lowlevel.Task) -> Iterator[trio.lowlevel.Task]:
    yield task
    for nursery in task.child_nurseries:
        for child in nursery.child_tasks:
            yield from _tasks(child)


def _server_tasks() -> Counter[str]:
    """vrt's tasks under the ``vrt.serve`` task, by name (trio names a task after its
    function)."""
    root = trio.lowlevel.current_root_task()
    assert root is not None
    (serve,) = (task for task in _tasks(root) if task.name == "vrt._server.serve.serve")
    return Counter(task.name for task in _tasks(serve) if task.name.startswith("vrt."))


async def test_an_idle_server_session_holds_three_tasks_of_its_own() -> None:
    """vrt's own tasks per idle session: its actor, its connection's task (the reader; it
    took the place of the task trio-websocket's server gave each connection) and its
    writer. A timer, a turn starter or a host task per session would show here (each
    costs ~2 kB a session: bench/load.py)."""
    agent = vrt.define_agent(model=vrt.ScriptedModel([[vrt.say("hi")]] * 10))
    async with trio.open_nursery() as nursery:
        server = await nursery.start(vrt.serve, agent, "127.0.0.1", 0)
        before = _server_tasks()
        async with vrt.connect(server.url) as a, vrt.connect(server.url) as b:
            for client in (a, b):
                async with client.subscribe() as events:
                    await client.send_text("hello")
                    async for event in events:
                        if isinstance(event, vrt.TurnEnded):
                            break
            await trio.sleep(2 * ACK_INTERVAL)  # the acks go out; nothing waits
            during = _server_tasks() - before
        nursery.cancel_scope.cancel()
    assert during == {
        "vrt._server.actor.SessionActor.run": 2,
        "vrt._server.hub.Hub.handle_stream": 2,
        "vrt._server.link.Link._writer": 2,
    }


@vrt.server_tool(risk="low", description="Slow to stop", parameters={"type": "object"})
async def slow_to_stop(args: Any, ctx: vrt.ToolContext) -> Any:
    try:
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            await trio.sleep(0.5)  # a graceful cleanup: the session takes a while to end


async def test_the_shared_ack_timer_never_acks_after_closed() -> None:
    """The client's ``close`` makes an ack due; the session ends slowly (a tool's shielded
    cleanup). A per-session timer died with the session; the shared one must check that it
    is still open (``closed`` is the last frame; the Peer asserts nothing follows it)."""
    steps: list[list[Any]] = [[vrt.call("slow_to_stop", {})], []]
    agent = vrt.define_agent(model=vrt.ScriptedModel(steps), tools=[slow_to_stop])
    async with serving(agent) as server, connected(server) as peer:
        await peer.hello()
        await peer.send("input", text="go")
        await peer.until(lambda f: f["type"] == "tool.stream")
        await peer.send("close")
        await peer.expect_disconnect()
    assert peer.frames[-1]["type"] == "closed"
