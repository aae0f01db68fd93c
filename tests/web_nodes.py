"""Servers for the browser's ``handover-v1`` tests, on a Trio loop of their own thread
(tests/test_browser.py drives Playwright synchronously, from the main thread).

:func:`nodes`: two ``vrt.serve`` sharing a :class:`~vrt._cluster.store.MemoryStore` behind a
:class:`~vrt.testing.LoopbackProxy` whose target the test moves, as in
tests/test_handover.py: the test drains one (``Server.drain()``) or crashes it (its serve
scope cancelled, its lease ended by hand) while the page, or the Python client in the same
loop, holds a session on it.

:func:`handing_over`: a hand-written server that opens a session, sends the frames of one
of :data:`SCRIPTS`, closes the connection with 1012 (or another code), and records the
resume ``hello`` that comes back, so that the ``open`` entries of the page's and of the
Python client's can be compared.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import trio
from trio_websocket import ConnectionClosed, WebSocketRequest, serve_websocket

import vrt
from vrt._cluster.store import MemoryStore
from vrt.testing import LoopbackProxy


class Loop:
    """A Trio loop on a thread of its own, until the block ends: :meth:`call` runs an
    async function in it, :meth:`start` a task in its nursery (``nursery.start``)."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Loop:
        self._thread.start()
        self._ready.wait(10)
        if self._failed is not None or self._token is None:
            raise RuntimeError("the test loop did not start") from self._failed
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None and self._thread.is_alive():
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(10)
        assert not self._thread.is_alive(), "the test loop did not stop"
        if self._failed is not None:
            raise self._failed

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # reported by __exit__, in the test's thread
            self._failed = exc
            self._ready.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def call(self, fn: Callable[..., Awaitable[Any]], *args: Any, within: float = 30) -> Any:
        """``await fn(*args)`` in the loop (failing after ``within`` seconds)."""

        async def bounded() -> Any:
            with trio.fail_after(within):
                return await fn(*args)

        return trio.from_thread.run(bounded, trio_token=self._token)

    def start(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """``await nursery.start(fn, *args)`` in the loop's nursery: what it started with."""
        assert self._nursery is not None
        return trio.from_thread.run(self._nursery.start, fn, *args, trio_token=self._token)


# -- two nodes sharing a store ---------------------------------------------------------------


class Recording:
    """A model that says what it was asked (the user inputs of its history and how many
    turns of it are marked interrupted); a ``slow`` input streams for half a second
    first; an ``app`` input calls the app's ``hold`` (call id ``c_`` and the turn's id)."""

    def __init__(self) -> None:
        self.requests: list[vrt.ModelRequest] = []

    async def stream(self, request: vrt.ModelRequest) -> AsyncIterator[Any]:
        self.requests.append(request)
        inputs = [h.text for h in request.history if isinstance(h, vrt.models.UserInput)]
        if inputs[-1].startswith("app") and request.step == 1:
            yield vrt.models.CallStart(call_id=f"c_{request.turn_id}", name="hold")
            yield vrt.models.CallEnd(call_id=f"c_{request.turn_id}", arguments={})
            return
        if inputs[-1].startswith("slow"):
            for i in range(5):
                yield vrt.models.Text(text=f"{i} ")
                await trio.sleep(0.1)
        marked = sum(isinstance(h, vrt.models.TurnInterrupted) for h in request.history)
        yield vrt.models.Text(text=f"seen {len(inputs)} inputs, {marked} interrupted")


@attrs.define
class Node:
    server: vrt.Server
    scope: trio.CancelScope
    model: Recording
    done: trio.Event


@attrs.define
class Nodes:
    """The nodes ``n0``, ``n1``... and the proxy in front of them (at first to ``n0``)."""

    loop: Loop
    store: MemoryStore
    nodes: list[Node]
    proxy: LoopbackProxy

    @property
    def url(self) -> str:
        """The proxy's ws:// URL: where clients connect."""
        return f"ws://127.0.0.1:{self.proxy.port}/"

    def move(self, to: int, *, cut: bool = False) -> None:
        """New connections go to node ``to`` (with ``cut``, the current ones drop)."""
        self.loop.call(self.move_now, to, cut)

    async def move_now(self, to: int, cut: bool = False) -> None:
        self.proxy.target_port = self.nodes[to].server.port
        if cut:
            self.proxy.cut()
        await trio.lowlevel.checkpoint()

    def drain(self, i: int) -> None:
        """``Server.drain()`` of node ``i``."""
        self.loop.call(self.drain_now, i)

    async def drain_now(self, i: int) -> None:
        self.nodes[i].server.drain()
        await trio.lowlevel.checkpoint()

    def drained(self, i: int, within: float = 10) -> None:
        """Wait until node ``i``'s serve returned."""
        self.loop.call(self.nodes[i].done.wait, within=within)

    def crash(self, i: int, to: int) -> None:
        """The network to node ``i`` goes (new connections to ``to``), then its process:
        its serve scope is cancelled, and its lease ended (as it runs out after a few
        seconds), all before any client can reconnect."""
        self.loop.call(self.crash_now, i, to)

    async def crash_now(self, i: int, to: int) -> None:
        node = self.nodes[i]
        self.proxy.target_port = self.nodes[to].server.port
        self.proxy.cut()
        node.scope.cancel()
        await node.done.wait()
        await self.store.forget_node(f"n{i}")


@contextmanager
def nodes(count: int = 2, **options: Any) -> Iterator[Nodes]:
    """``count`` nodes on one store behind one proxy, on a loop of their own."""
    with Loop() as loop:
        store = MemoryStore()
        started: list[Node] = []
        for i in range(count):
            model = Recording()
            scope = trio.CancelScope()
            done = trio.Event()
            agent = vrt.define_agent(model=model, client_tools="accept")

            async def run(
                agent: vrt.Agent = agent,
                scope: trio.CancelScope = scope,
                done: trio.Event = done,
                name: str = f"n{i}",
                *,
                task_status: trio.TaskStatus[vrt.Server],
            ) -> None:
                try:
                    with scope:
                        await vrt.serve(
                            agent,
                            "127.0.0.1",
                            0,
                            store=store,
                            node=name,
                            task_status=task_status,
                            **options,
                        )
                finally:
                    done.set()

            server = loop.start(run)
            started.append(Node(server=server, scope=scope, model=model, done=done))
        proxy = LoopbackProxy(started[0].server.port)
        loop.start(proxy.run)
        yield Nodes(loop=loop, store=store, nodes=started, proxy=proxy)


# -- a hand-written server that hands over -------------------------------------------------


def _stream(call: str, phase: str, turn: str = "t_1", **fields: Any) -> dict[str, Any]:
    kind = "app" if call.startswith("a") else "server"
    name = "edit" if kind == "app" else "lookup"
    return {"type": "tool.stream", "callId": call, "turnId": turn, "epoch": 0, "name": name,
            "kind": kind, "phase": phase, **fields}  # fmt: skip


def _started(turn: str) -> dict[str, Any]:
    return {"type": "turn.started", "turnId": turn, "epoch": 0}


def _ended(turn: str, reason: str = "interrupted", epoch: int = 1) -> dict[str, Any]:
    return {"type": "turn.ended", "turnId": turn, "epoch": epoch, "reason": reason}


@attrs.frozen
class Script:
    before: tuple[dict[str, Any], ...]
    """What the server sends after the client's first input, before it closes."""
    after: tuple[dict[str, Any], ...] = ()
    """What it sends after the resumed welcome (an adopting server's settling)."""
    capabilities: tuple[str, ...] = ("tool-stream-v1", "batch-v1", "handover-v1")
    """What its welcome grants of what the client offers."""


SCRIPTS: dict[str, Script] = {
    # two calls open (one streaming its arguments), one settled: the open ones, no turn
    "calls": Script(
        (
            _started("t_1"),
            _stream("s1", "start"),
            _stream("s1", "arguments-delta", delta='{"q": '),
            _stream("a2", "start"),
            _stream("s3", "start"),
            _stream("s3", "arguments-complete", arguments={}),
            _stream("s3", "settled", ok=True),
        ),
        (
            {**_stream("s1", "cancelled"), "epoch": 0},
            {**_stream("a2", "cancelled"), "epoch": 0},
            _ended("t_1"),
            _ended("t_1"),  # again (an adopting server may): dropped
        ),
    ),
    # a turn ended, the next one open without calls: the open turn alone
    "turn": Script(
        (_started("t_1"), _ended("t_1", "finished", 0), _started("t_2")),
        (_ended("t_1"), _ended("t_2")),  # t_1 had ended: dropped
    ),
    # more calls open than a hello holds: 255 of them, then the open turn (of none of them)
    "many": Script(
        (_started("t_1"), *(_stream(f"s{i}", "start") for i in range(300)), _started("t_2")),
        (_ended("t_2"),),
    ),
    # nothing open: no `open` at all
    "idle": Script((_started("t_1"), _ended("t_1", "finished", 0))),
    # calls open, but handover-v1 not granted: no `open` either
    "no-handover": Script(
        (_started("t_1"), _stream("s1", "start")),
        capabilities=("tool-stream-v1", "batch-v1"),
    ),
}

WELCOME = {"sessionId": "s_moving", "resumeToken": "m" * 32, "epoch": 0}


@attrs.define
class HandingOver:
    """The hand-written server: ``url`` + a script's name is a session of that script,
    closed with ``code`` once its frames are sent. ``hellos[name]``: the resume hellos
    received (their JSON text), ``delays[name]``: seconds from each close to the next
    hello."""

    url: str
    loop: Loop
    code: int = 1012
    hellos: dict[str, list[str]] = attrs.Factory(dict)
    delays: dict[str, list[float]] = attrs.Factory(dict)
    _closed_at: dict[str, float] = attrs.Factory(dict)

    async def handler(self, request: WebSocketRequest) -> None:
        name = request.path.strip("/")
        script = SCRIPTS[name]
        ws = await request.accept()
        seq = 1

        async def send(message: dict[str, Any], numbered: bool = True) -> None:
            nonlocal seq
            if numbered:
                seq += 1
            await ws.send_message(json.dumps({**message, "seq": seq if numbered else 0}))

        async def receive() -> tuple[dict[str, Any], str]:
            while True:
                text = str(await ws.get_message())
                data = json.loads(text)
                for message in data if isinstance(data, list) else [data]:
                    if message["type"] != "ack":
                        return message, text

        try:
            hello, text = await receive()
            granted = [c for c in hello["capabilities"] if c in script.capabilities]
            if hello.get("resume") is None:
                await send({"type": "welcome", **WELCOME, "capabilities": granted,
                            "resumed": False, "lastSeq": hello["seq"]}, numbered=False)  # fmt: skip
                while (await receive())[0]["type"] != "input":
                    pass
                for item in script.before:
                    await send(item)
                self._closed_at[name] = trio.current_time()
                await ws.aclose(code=self.code)
                return
            self.hellos.setdefault(name, []).append(text)
            self.delays.setdefault(name, []).append(trio.current_time() - self._closed_at[name])
            # The session went on elsewhere: numbering goes on above what was sent.
            seq += len(script.before)
            await send({"type": "welcome", **WELCOME, "capabilities": granted, "resumed": True,
                        "lastSeq": 2}, numbered=False)  # fmt: skip
            for item in script.after:
                await send(item)
            await send({"type": "text.delta", "turnId": "end", "text": "."}, numbered=False)
            while (await receive())[0]["type"] != "close":
                pass
            await send({"type": "closed", "reason": "client"})
            await ws.aclose()
        except ConnectionClosed:
            pass


@contextmanager
def handing_over(code: int = 1012) -> Iterator[HandingOver]:
    """The hand-written server (closing with ``code``), on a loop of its own."""
    with Loop() as loop:
        holder: list[HandingOver] = []

        async def handler(request: WebSocketRequest) -> None:
            await holder[0].handler(request)

        listener = loop.start(
            lambda task_status: serve_websocket(
                handler, "127.0.0.1", 0, ssl_context=None, task_status=task_status
            )
        )
        port = listener.port
        holder.append(HandingOver(url=f"ws://127.0.0.1:{port}/", loop=loop, code=code))
        yield holder[0]
