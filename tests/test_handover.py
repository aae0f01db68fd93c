"""Sessions that move between servers sharing a store (``handover-v1``), in one process.

Two (or three) ``vrt.serve`` on loopback share a :class:`MemoryStore`; the client reaches
them through a :class:`LoopbackProxy` whose target the test moves, as a load balancer
without affinity would. Covered: a resume that lands on the other server is relayed to the
one running the session and its turn goes on, then the session moves at the turn's end; a
drain hands every session over (idle at once, in a turn at its end, a long turn at the
drain timeout); a crash (the server gone, its lease run out) costs only the turn in flight,
each open call ending ``cancelled`` and the turn ``interrupted``. The same rules on Redis
are in tests/test_store.py and tests/test_deploy.py.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio

import vrt
from tests.conftest import Log, until
from vrt._cluster.store import MemoryStore
from vrt.testing import LoopbackProxy

P = vrt.Phase


class Recording:
    """A model that says what it was asked: the user inputs of its history, and whether a
    turn of it is marked interrupted; a ``slow`` input streams for a second; ``app``
    calls the app's ``hold``."""

    def __init__(self) -> None:
        self.requests: list[vrt.ModelRequest] = []

    async def stream(self, request: vrt.ModelRequest) -> AsyncIterator[Any]:
        self.requests.append(request)
        inputs = [h.text for h in request.history if isinstance(h, vrt.models.UserInput)]
        last = inputs[-1]
        answered = any(isinstance(h, vrt.CallRecord) and h.result.ok for h in request.history[-3:])
        if last.startswith("app") and request.step == 1:
            yield vrt.models.CallStart(call_id=f"c_{request.turn_id}", name="hold")
            yield vrt.models.CallEnd(call_id=f"c_{request.turn_id}", arguments={})
            return
        if last.startswith("slow") and not answered:
            for i in range(10):
                yield vrt.models.Text(text=f"{i} ")
                await trio.sleep(0.1)
        marked = sum(isinstance(h, vrt.models.TurnInterrupted) for h in request.history)
        yield vrt.models.Text(text=f"seen {len(inputs)} inputs, {marked} interrupted")


def make_agent(model: Recording) -> vrt.Agent:
    return vrt.define_agent(model=model, client_tools="accept")


@attrs.define
class Node:
    server: vrt.Server
    scope: trio.CancelScope
    model: Recording
    done: trio.Event


@asynccontextmanager
async def nodes(count: int, **options: Any) -> AsyncIterator[tuple[list[Node], MemoryStore]]:
    store = MemoryStore()
    async with trio.open_nursery() as nursery:
        started = []
        for i in range(count):
            model = Recording()
            scope = trio.CancelScope()
            done = trio.Event()
            server_ready: list[vrt.Server] = []

            async def run(
                scope: trio.CancelScope = scope,
                done: trio.Event = done,
                model: Recording = model,
                i: int = i,
                *,
                task_status: trio.TaskStatus[vrt.Server],
            ) -> None:
                try:
                    with scope:
                        await vrt.serve(
                            make_agent(model),
                            "127.0.0.1",
                            0,
                            store=store,
                            node=f"n{i}",
                            task_status=task_status,
                            **options,
                        )
                finally:
                    done.set()

            server = await nursery.start(run)
            server_ready.append(server)
            started.append(Node(server=server, scope=scope, model=model, done=done))
        yield started, store
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def via(target: Node) -> AsyncIterator[LoopbackProxy]:
    proxy = LoopbackProxy(target.server.port)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        yield proxy
        nursery.cancel_scope.cancel()


def move(proxy: LoopbackProxy, to: Node, *, cut: bool = True) -> None:
    """The load balancer now sends new connections to ``to`` (and, with ``cut``, the
    network drops the current ones)."""
    proxy.target_port = to.server.port
    if cut:
        proxy.cut()


async def crash(node: Node, store: MemoryStore, proxy: LoopbackProxy, to: Node) -> None:
    """``node`` dies: the network first (nothing more reaches its clients, who reconnect
    to ``to``), then the process; then its lease runs out (by hand: 5 s, otherwise)."""
    move(proxy, to)
    node.scope.cancel()
    await node.done.wait()
    await store.forget_node(node.server.node or "")


def ended(e: Any) -> bool:
    return isinstance(e, vrt.TurnEnded)


def texts(events: list[Any], turn_id: str) -> str:
    return "".join(e.text for e in events if isinstance(e, vrt.TextDelta) and e.turn_id == turn_id)


HOLD_PARAMS = {"type": "object", "properties": {}}


async def test_a_resume_on_another_server_is_relayed_and_the_session_moves_after_its_turn() -> None:
    async with nodes(2) as ([a, b], _store), via(a) as proxy:
        async with vrt.connect(f"ws://127.0.0.1:{proxy.port}/") as client:
            async with client.subscribe() as channel:
                events = Log(channel)
                await client.send_text("slow one")
                await until(events, lambda e: isinstance(e, vrt.TextDelta))
                move(proxy, b)  # the resume lands on b, which relays it to a
                first = await until(events, ended)
                assert first.reason == "finished"
                assert texts(events.events, first.turn_id).startswith("0 1 2 3 4 5 6 7 8 9 ")
                # a hands the session over at the turn's end (1012); b adopts it
                await until(events, lambda e: isinstance(e, vrt.Resumed))
                await client.send_text("and now?")
                second = await until(events, ended)
    assert second.reason == "finished"
    assert sum(isinstance(e, vrt.Resumed) for e in events.events) == 2  # the cut, the move
    assert texts(events.events, second.turn_id) == "seen 2 inputs, 0 interrupted"
    assert not any(isinstance(e, vrt.Closed) and e.reason != "client" for e in events.events)
    assert len(a.model.requests) == 1 and len(b.model.requests) == 1  # moved with its history
    vrt.testing.assert_stream_valid(events.events)


async def test_an_idle_session_resumed_elsewhere_is_adopted_there_at_once() -> None:
    """The session's server hands it over before its welcome: the other server adopts it on
    the client's own connection (one resume, no second reconnect)."""
    async with nodes(2) as ([a, b], _store), via(a) as proxy:
        async with vrt.connect(f"ws://127.0.0.1:{proxy.port}/") as client:
            async with client.subscribe() as channel:
                events = Log(channel)
                await client.send_text("hi")
                await until(events, ended)
                move(proxy, b)
                await until(events, lambda e: isinstance(e, vrt.Resumed))
                await client.send_text("still there?")
                second = await until(events, ended)
    resumes = [e for e in events.events if isinstance(e, vrt.Resumed)]
    assert len(resumes) == 1
    assert texts(events.events, second.turn_id) == "seen 2 inputs, 0 interrupted"
    assert len(b.model.requests) == 1


async def test_a_drain_hands_every_session_over_and_the_server_returns() -> None:
    async with nodes(2, drain_timeout=5.0) as ([a, b], store), via(a) as proxy:
        async with (
            vrt.connect(f"ws://127.0.0.1:{proxy.port}/") as idle,
            vrt.connect(f"ws://127.0.0.1:{proxy.port}/") as busy,
        ):
            async with idle.subscribe() as idle_events, busy.subscribe() as busy_channel:
                idle_log, busy_log = Log(idle_events), Log(busy_channel)
                await idle.send_text("hi")
                await until(idle_log, ended)
                await busy.send_text("slow one")
                await until(busy_log, lambda e: isinstance(e, vrt.TextDelta))
                move(proxy, b, cut=False)  # the load balancer takes a out
                a.server.drain()
                first = await until(busy_log, ended)  # the turn in flight ends on a
                assert first.reason == "finished"
                with trio.fail_after(5):
                    await a.done.wait()  # every session handed over: a's serve returned
                for log_ in (idle_log, busy_log):
                    await until(log_, lambda e: isinstance(e, vrt.Resumed))
                await idle.send_text("after")
                await busy.send_text("after")
                after = [await until(idle_log, ended), await until(busy_log, ended)]
    assert [e.reason for e in after] == ["finished", "finished"]
    assert texts(idle_log.events, after[0].turn_id) == "seen 2 inputs, 0 interrupted"
    assert texts(busy_log.events, after[1].turn_id) == "seen 2 inputs, 0 interrupted"
    for log_ in (idle_log, busy_log):
        assert not any(isinstance(e, vrt.Closed) for e in log_.events)
        vrt.testing.assert_stream_valid(log_.events)
    assert await store.node_address("n0") is None  # its lease ended with the drain


async def test_a_node_above_its_share_hands_idle_sessions_over_until_even() -> None:
    """Rebalancing: 20 sessions on a, none on b (a node just started, say), the balancer
    now sending new connections to b: a's census finds it holds more than its share
    (10 and a tenth, rounded up) and hands idle sessions over, a few a round, until it
    holds 11; their clients resume on b, never closed, their next turns there."""
    async with nodes(2) as ([a, b], store), via(a) as proxy:
        async with contextlib.AsyncExitStack() as stack:
            clients = [
                await stack.enter_async_context(vrt.connect(f"ws://127.0.0.1:{proxy.port}/"))
                for _ in range(20)
            ]
            logs = [Log(await stack.enter_async_context(c.subscribe())) for c in clients]
            for client, log_ in zip(clients, logs, strict=True):
                await client.send_text("hi")
                await until(log_, ended)
            move(proxy, b, cut=False)  # new connections go to b from now on
            with trio.fail_after(10):
                while True:
                    counts = await store.census("probe", -1, 1.0)
                    if counts.get("n0") == 11 and counts.get("n1") == 9:
                        break
                    await trio.sleep(0.2)
            for client, log_ in zip(clients, logs, strict=True):
                await client.send_text("still there?")
                last = await until(log_, ended)
                assert texts(log_.events, last.turn_id) == "seen 2 inputs, 0 interrupted"
    moved = [log_ for log_ in logs if any(isinstance(e, vrt.Resumed) for e in log_.events)]
    assert len(moved) == 9
    for log_ in logs:
        assert not any(isinstance(e, vrt.Closed) and e.reason != "client" for e in log_.events)
        vrt.testing.assert_stream_valid(log_.events)
    assert len(b.model.requests) == 9  # the moved sessions' second turns ran on b


async def test_a_drain_interrupts_a_turn_still_open_at_its_timeout() -> None:
    @vrt.app_tool(parameters=HOLD_PARAMS)
    async def hold(args: Any, ctx: vrt.ToolContext) -> None:
        await trio.sleep_forever()

    async with nodes(2, drain_timeout=0.3) as ([a, b], _store), via(a) as proxy:
        async with vrt.connect(f"ws://127.0.0.1:{proxy.port}/", tools=[hold]) as client:
            async with client.subscribe() as channel:
                events = Log(channel)
                await client.send_text("app please")
                await until(
                    events,
                    lambda e: isinstance(e, vrt.ToolStream) and e.phase == P.ARGUMENTS_COMPLETE,
                )
                move(proxy, b, cut=False)
                a.server.drain()
                first = await until(events, ended)
                assert first.reason == "interrupted"
                await until(events, lambda e: isinstance(e, vrt.Resumed))
                await client.send_text("hello again")
                second = await until(events, ended)
    phases = [e.phase for e in events.events if isinstance(e, vrt.ToolStream)]
    assert phases.count(P.CANCELLED) == 1
    assert texts(events.events, second.turn_id) == "seen 2 inputs, 1 interrupted"
    vrt.testing.assert_stream_valid(events.events)


async def test_a_crash_costs_only_the_turn_in_flight() -> None:
    """The server dies mid-turn, with an app call open in the app: once its lease is over
    (here: ended by hand, as 5 s would), the other server adopts the session from the turn's
    start; the app gets its one terminal for the call and the turn, the model the turn
    marked interrupted."""
    aborted = trio.Event()

    @vrt.app_tool(parameters=HOLD_PARAMS)
    async def hold(args: Any, ctx: vrt.ToolContext) -> None:
        try:
            await trio.sleep_forever()
        finally:
            if ctx.signal.aborted:
                aborted.set()

    async with nodes(2) as ([a, b], store), via(a) as proxy:
        async with vrt.connect(f"ws://127.0.0.1:{proxy.port}/", tools=[hold]) as client:
            async with client.subscribe() as channel:
                events = Log(channel)
                await client.send_text("hi")
                await until(events, ended)
                await client.send_text("app please")
                await until(
                    events,
                    lambda e: isinstance(e, vrt.ToolStream) and e.phase == P.ARGUMENTS_COMPLETE,
                )
                crashed_at = trio.current_time()
                await crash(a, store, proxy, b)
                lost = await until(events, ended)
                assert lost.reason == "interrupted"
                assert trio.current_time() - crashed_at < 2.0  # one resume, adopted at once
                with trio.fail_after(2):
                    await aborted.wait()
                await client.send_text("what happened?")
                after = await until(events, ended)
    streams = [
        e for e in events.events if isinstance(e, vrt.ToolStream) and e.call_id.startswith("c_")
    ]
    assert [e.phase for e in streams][-1] == P.CANCELLED
    assert sum(e.phase in (P.CANCELLED, P.SETTLED, P.FAILED) for e in streams) == 1
    assert streams[-1].name == "hold" and streams[-1].kind == "app"
    assert texts(events.events, after.turn_id) == "seen 3 inputs, 1 interrupted"
    assert not any(isinstance(e, vrt.Closed) for e in events.events)
    vrt.testing.assert_stream_valid(events.events)
    history = b.model.requests[-1].history
    assert [type(h).__name__ for h in history][:4] == [
        "UserInput",
        "AgentText",
        "UserInput",
        "TurnInterrupted",
    ]


@pytest.mark.usefixtures("no_errors")
async def test_a_session_another_node_took_over_is_let_go_at_its_next_save() -> None:
    """This node's lease ran out (a long pause, say) and another node took its session
    over from the store: the save at the next turn's start finds it owned elsewhere
    (Movement ``taken``), and the session is let go at once, its turn and all, without an
    error; the client resumes where it runs now, which settles that turn (interrupted),
    and the input it replays runs there: nothing is lost."""
    async with nodes(2) as ([a, b], store), via(a) as proxy:
        async with vrt.connect(f"ws://127.0.0.1:{proxy.port}/") as client:
            async with client.subscribe() as channel:
                events = Log(channel)
                await client.send_text("hi")
                await until(events, ended)
                assert client.session_id is not None
                assert await store.claim(client.session_id, "n0", "n1") is not None
                move(proxy, b, cut=False)
                await client.send_text("slow two")
                lost = await until(events, ended)
                assert lost.reason == "interrupted"
                again = await until(events, ended)
    assert again.reason == "finished"
    # the turn a let go was not saved: its input, replayed by the client, runs anew at b
    assert texts(events.events, again.turn_id).endswith("seen 2 inputs, 0 interrupted")
    assert len(b.model.requests) == 1
    assert not any(isinstance(e, vrt.Closed) for e in events.events)
    vrt.testing.assert_stream_valid(events.events)


async def test_without_a_store_nothing_drains() -> None:
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            functools.partial(vrt.serve, make_agent(Recording()), "127.0.0.1", 0)
        )
        with pytest.raises(ValueError, match="without a store"):
            server.drain()
        nursery.cancel_scope.cancel()


async def test_what_the_client_sent_after_the_last_save_survives_a_crash() -> None:
    """Found by vrt check (helper's ``ack-unsaved``): an interrupt between turns raises the
    epoch on the server but saves nothing; acked, the client forgot it, and after a crash
    the new server was an epoch behind: every app call of the next turn refused as stale.
    A server with a store acks only what its last save holds, so the client replays it."""
    ran = trio.Event()

    @vrt.app_tool(parameters=HOLD_PARAMS)
    async def hold(args: Any, ctx: vrt.ToolContext) -> str:
        ran.set()
        return "held"

    async with nodes(2) as ([a, b], store), via(a) as proxy:
        async with vrt.connect(f"ws://127.0.0.1:{proxy.port}/", tools=[hold]) as client:
            async with client.subscribe() as channel:
                events = Log(channel)
                await client.send_text("hi")
                await until(events, ended)
                client.interrupt()  # epoch 1, with no turn open
                await trio.sleep(0.5)  # past the 200 ms in which an ack would come
                await crash(a, store, proxy, b)
                await until(events, lambda e: isinstance(e, vrt.Resumed))
                await client.send_text("app please")
                after = await until(events, ended)
                with trio.fail_after(2):
                    await ran.wait()  # run, not refused by the epoch gate
    assert after.reason == "finished" and client.epoch == 1
    calls = [e for e in events.events if isinstance(e, vrt.ToolStream) and e.phase == P.SETTLED]
    assert calls and calls[-1].ok


async def test_a_scripted_model_goes_on_where_it_was_after_a_move() -> None:
    """Its place in the script moves with the session (``session_state``): the next turn
    plays the next step, not the first again (whose call ids the session already used)."""
    store = MemoryStore()
    steps = [[vrt.call("ping", {})], [vrt.say("one")], [vrt.say("two")], []]

    @vrt.server_tool(risk="low")
    async def ping(args: Any, ctx: vrt.ToolContext) -> str:
        return "pong"

    async with trio.open_nursery() as nursery:
        servers = [
            await nursery.start(
                functools.partial(
                    vrt.serve,
                    vrt.define_agent(model=vrt.ScriptedModel(steps), tools=[ping]),
                    "127.0.0.1",
                    0,
                    store=store,
                    node=f"s{i}",
                )
            )
            for i in range(2)
        ]
        proxy = LoopbackProxy(servers[0].port)
        await nursery.start(proxy.run)
        async with vrt.connect(f"ws://127.0.0.1:{proxy.port}/") as client:
            async with client.subscribe() as channel:
                events = Log(channel)
                await client.send_text("first")
                first = await until(events, ended)
                proxy.target_port = servers[1].port
                servers[0].drain()
                await until(events, lambda e: isinstance(e, vrt.Resumed))
                await client.send_text("second")
                second = await until(events, ended)
        nursery.cancel_scope.cancel()
    assert texts(events.events, first.turn_id) == "one"
    assert texts(events.events, second.turn_id) == "two"


async def test_a_trimmed_history_moves_item_by_item() -> None:
    """Saves write what a turn added and trim what the session dropped: after a move the
    new node's model sees the same history, its oldest turns dropped as the old node's
    would have (max_history_bytes), none twice, in order."""
    async with nodes(2, max_history_bytes=3000) as ([a, b], _), via(a) as proxy:
        async with vrt.connect(f"ws://127.0.0.1:{proxy.port}/") as client:
            async with client.subscribe() as channel:
                events = Log(channel)
                for i in range(8):
                    await client.send_text(f"input {i} " + "x" * 400)
                    await until(events, ended)
                move(proxy, b, cut=False)
                a.server.drain()
                await until(events, lambda e: isinstance(e, vrt.Resumed))
                await client.send_text("input 8")
                await until(events, ended)
    before = a.model.requests[-1].history
    after = b.model.requests[-1].history
    texts_after = [h.text for h in after if isinstance(h, vrt.models.UserInput)]
    assert texts_after[-1] == "input 8" and len(texts_after) < 9  # the oldest dropped
    numbers = [int(t.split()[1]) for t in texts_after]
    assert numbers == list(range(numbers[0], 9))  # a contiguous, ordered suffix
    assert list(after[: len(after) - 2]) == list(before[len(before) - (len(after) - 2) :])


async def test_a_handover_the_store_forgot_before_anyone_took_it_is_written_again() -> None:
    """A node keeps the last save of each session it handed over for a while (PARKED_FOR):
    the store restarted empty (or flushed) before another node claimed it, so nobody has
    it; at its next heartbeat the node finds its own lease gone and writes the parked
    save again, owned by nobody, its whole history; a session claimed meanwhile is left
    alone (the store has it again), and a parked save past its time is dropped."""
    from vrt._cluster.node import PARKED_FOR, Node, Parked
    from vrt._cluster.record import encode_item

    store = MemoryStore()
    node = Node(store, "a", resume_window=30.0)
    items = [
        vrt.models.UserInput(turn_id="t_1", text="hi"),
        vrt.models.AgentText(turn_id="t_1", text="yo"),
    ]
    encoded = [encode_item(i) for i in items]
    for session_id in ("s_1", "s_2", "s_3"):
        assert await store.save(session_id, "a", "", b"state", 60.0, items=encoded)
        node.park(session_id, Parked(b"state", 0, items, 60.0))
    store.flush()
    assert await store.save("s_2", "b", "b", b"b's", 60.0)  # b took it over, saved it again
    node.parked["s_3"].until = trio.current_time()  # past its time
    await node._unpark()
    found = await store.load("s_1")
    assert found is not None and found.owner == "" and found.state == b"state"
    assert found.history == tuple(encoded)
    taken = await store.load("s_2")
    assert taken is not None and taken.owner == "b" and taken.state == b"b's"
    assert await store.load("s_3") is None
    assert node.parked == {} and PARKED_FOR >= 5.0
