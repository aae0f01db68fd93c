"""Helpers for testing code built on vrt (public).

- :func:`assert_stream_valid` checks an app-facing event log against the lifecycle every
  call must follow. It runs the log through the CallView machine, the same rules the
  engine and the client are built on, so a user can check their own logs with it.
- :func:`open_pair` runs a server session and a client over an in-memory connection:
  the whole vrt/1 protocol, no sockets.
- pytest fixtures (``pytest_plugins = ["vrt.testing"]``): ``vrt_pair`` (the
  :func:`open_pair` factory) and ``vrt_serve`` (serve an agent on loopback port 0 in the
  test's nursery, return the :class:`~vrt.Server`).
- Hypothesis strategies (Hypothesis is needed only when one is built): :func:`scripts`
  (model steps of ``vrt.say``/``vrt.call``/``vrt.pause``; also :func:`script_steps`,
  :func:`tool_calls`, :func:`tool_arguments`) and :func:`interrupt_times`; the agent
  their calls run against, :func:`scripted_agent` (with :func:`scripted_app_tools` for the
  client), whose tools do what each call's arguments say, so :func:`expected_result`
  knows every call's result in advance (:func:`asks_confirmation`, :func:`truncated`);
  :class:`TurnScripts`, a model that plays one generated script per user input.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import trio
from trio_websocket import CloseReason, ConnectionClosed

from vrt._client import Client, open_client
from vrt._core.events import Closed, Phase, ToolStream, TurnEnded
from vrt._core.tables import CALL_VIEW, Machine, StrictMachine
from vrt._engine.agent import Agent
from vrt._engine.groups import single_unwrapped
from vrt._engine.tools import AppTool
from vrt._errors import InvalidTransition
from vrt._memory import MemoryConnection, memory_connection_pair
from vrt._proxy import LoopbackProxy
from vrt._server import Hub, Server, _Options, serve
from vrt._strategies import (
    TurnScripts,
    asks_confirmation,
    expected_result,
    interrupt_times,
    script_steps,
    scripted_agent,
    scripted_app_tools,
    scripts,
    tool_arguments,
    tool_calls,
    truncated,
)
from vrt._wire import messages as m

__all__ = [
    "CuttingConnection",
    "LoopbackProxy",
    "TurnScripts",
    "asks_confirmation",
    "assert_stream_valid",
    "expected_result",
    "interrupt_times",
    "open_pair",
    "script_steps",
    "scripted_agent",
    "scripted_app_tools",
    "scripts",
    "tool_arguments",
    "tool_calls",
    "truncated",
    "vrt_pair",
    "vrt_serve",
]

_EVENT_OF_PHASE = {
    Phase.ARGUMENTS_DELTA: "delta",
    Phase.ARGUMENTS_COMPLETE: "complete",
    Phase.PROGRESS: "progress",
    Phase.SETTLED: "settle",
    Phase.CANCELLED: "cancel",
    Phase.FAILED: "fail",
}

_RULES = {
    ("started", "progress"): "progress before arguments-complete",
    ("streaming", "progress"): "progress before arguments-complete",
    ("started", "settle"): "settled before arguments-complete",
    ("streaming", "settle"): "settled before arguments-complete",
    ("issued", "delta"): "arguments-delta after arguments-complete",
    ("issued", "complete"): "a second arguments-complete",
    ("issued", "fail"): "failed after arguments-complete (the arguments were complete)",
}


def assert_stream_valid(events: Iterable[Any], *, complete: bool = True) -> None:
    """Raise AssertionError, naming the call and the rule, if ``events`` break a lifecycle.

    Checked for every call (``ToolStream`` events; others are used only as markers):
    the first phase is ``start`` and there is only one; ``arguments-delta`` only before
    ``arguments-complete``; ``progress`` and ``settled`` only after it; exactly one terminal
    (``settled``, ``cancelled``, ``failed``) and nothing after it; per-phase fields present
    (``delta``, ``ok``, ``code`` when not ok); ``turn_id``, ``name``, ``kind`` and ``epoch``
    constant. With ``complete=True`` (the default: a whole log), every call must also have
    its terminal by its turn's ``TurnEnded`` and by the end of the log, unless a
    :class:`~vrt.Closed` event ended the session first; nothing may follow ``Closed``.
    """
    views: dict[str, tuple[ToolStream, Machine | StrictMachine]] = {}
    closed = False
    for index, event in enumerate(events):
        if closed:
            raise AssertionError(f"event #{index} ({type(event).__name__}) after Closed")
        if isinstance(event, Closed):
            closed = True
        elif isinstance(event, TurnEnded) and complete:
            for call_id, (first, view) in views.items():
                if first.turn_id == event.turn_id and not view.final:
                    raise AssertionError(
                        f"call {call_id}: turn {event.turn_id} ended while the call was "
                        f"{view.state} (no terminal phase)"
                    )
        elif isinstance(event, ToolStream):
            _check_event(index, event, views)
    if complete and not closed:
        for call_id, (_, view) in views.items():
            if not view.final:
                raise AssertionError(
                    f"call {call_id}: no terminal phase (settled, cancelled or failed); "
                    f"the log ends with the call {view.state}"
                )


def _check_event(
    index: int, event: ToolStream, views: dict[str, tuple[ToolStream, Machine | StrictMachine]]
) -> None:
    where = f"call {event.call_id} (event #{index}, phase {event.phase})"
    phase = Phase(event.phase)
    if phase is Phase.START:
        if event.call_id in views:
            raise AssertionError(f"{where}: a second start")
        views[event.call_id] = (event, CALL_VIEW.new())
        return
    if event.call_id not in views:
        raise AssertionError(f"{where}: the first phase of a call must be start")
    first, view = views[event.call_id]
    for field in ("turn_id", "name", "kind", "epoch"):
        if getattr(event, field) != getattr(first, field):
            raise AssertionError(
                f"{where}: {field} changed from {getattr(first, field)!r} "
                f"to {getattr(event, field)!r}"
            )
    before = view.state
    try:
        view.send(_EVENT_OF_PHASE[phase])
    except InvalidTransition:
        if view.final:
            rule = f"{phase} after the terminal phase {before}"
        else:
            rule = _RULES.get((before, _EVENT_OF_PHASE[phase]), f"{phase} while {before}")
        raise AssertionError(f"{where}: {rule}") from None
    if phase is Phase.ARGUMENTS_DELTA and not isinstance(event.delta, str):
        raise AssertionError(f"{where}: arguments-delta carries no delta")
    if phase is Phase.SETTLED:
        if event.ok is None:
            raise AssertionError(f"{where}: settled carries no ok")
        if not event.ok and event.code is None:
            raise AssertionError(f"{where}: settled with ok=false carries no code")


@asynccontextmanager
async def open_pair(
    agent: Agent,
    tools: Sequence[AppTool] = (),
    *,
    capabilities: Sequence[str] = m.CAPABILITIES,
    server_capabilities: Collection[str] = m.CAPABILITIES,
    resume: bool = True,
    transport: Callable[[MemoryConnection], Any] | None = None,
    **server: Any,
) -> AsyncIterator[Client]:
    """A client connected to a server session of ``agent`` over in-memory connections.

    The same protocol cores and actors as ``vrt.serve``/``vrt.connect``, without sockets;
    ``server`` takes ``vrt.serve``'s safety options (``resume_window``, ``max_open_calls``,
    ...). A lost connection is resumed on a new in-memory connection unless ``resume`` is
    False. ``transport`` wraps each client end (e.g. in a :class:`CuttingConnection`).
    Leaving the block closes the session and stops the server side.
    """
    options = _Options(capabilities=tuple(server_capabilities), **server)

    @asynccontextmanager
    async def connection() -> AsyncIterator[Any]:
        server_end, client_end = memory_connection_pair()
        nursery.start_soon(hub.serve_connection, server_end)
        try:
            yield client_end if transport is None else transport(client_end)
        finally:
            await client_end.aclose()

    with single_unwrapped():
        async with trio.open_nursery() as nursery:
            hub = Hub(agent, options, nursery)
            async with (
                connection() as ws,
                open_client(
                    ws,
                    tools,
                    capabilities=capabilities,
                    reconnect=connection if resume else None,
                ) as client,
            ):
                yield client
            nursery.cancel_scope.cancel()


class CuttingConnection:
    """A client connection that is cut once: before or after its ``n``-th message in one
    direction (``"send"``: client to server; ``"receive"``: server to client).

    Fault injection for resume tests. Acks are not counted (their timing varies), every
    other frame is. "Before" loses the ``n``-th message (it never arrives); "after"
    delivers it, then cuts. After the cut both ends see the connection closed, and frames
    still in flight towards the client are lost.
    """

    def __init__(self, ws: Any, *, direction: str, n: int, before: bool) -> None:
        if direction not in ("send", "receive"):
            raise ValueError(f"direction is 'send' or 'receive', not {direction!r}")
        self.ws = ws
        self.direction = direction
        self.n = n
        self.before = before
        self.count = 0
        self.cut = False

    async def send_message(self, message: str) -> None:
        """Send one frame (see the class for when the cut happens)."""
        if self.cut:
            raise ConnectionClosed(CloseReason(1006, "cut"))
        if self.direction == "send" and self._counts(message):
            if self.before:
                await self._cut()
                raise ConnectionClosed(CloseReason(1006, "cut"))
            await self.ws.send_message(message)
            await self._cut()
            return
        await self.ws.send_message(message)

    async def get_message(self) -> str:
        """The next frame (see the class for when the cut happens)."""
        if self.cut:
            raise ConnectionClosed(CloseReason(1006, "cut"))
        message: str = await self.ws.get_message()
        if self.direction == "receive" and self._counts(message):
            await self._cut()
            if self.before:
                raise ConnectionClosed(CloseReason(1006, "cut"))
        return message

    async def aclose(self) -> None:
        """Close the connection."""
        await self.ws.aclose()

    def _counts(self, message: str) -> bool:
        if '"type":"ack"' in message:
            return False
        self.count += 1
        return self.count == self.n

    async def _cut(self) -> None:
        self.cut = True
        await self.ws.aclose(1006, "cut")


try:  # the fixtures need pytest; the rest of this module does not
    import pytest
except ImportError:  # pragma: no cover
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.fixture
    def vrt_pair() -> Callable[..., AbstractAsyncContextManager[Client]]:
        """The :func:`open_pair` factory: ``async with vrt_pair(agent, tools) as client``."""
        return open_pair

    @pytest.fixture
    def vrt_serve(nursery: trio.Nursery) -> Callable[..., Awaitable[Server]]:
        """Serve an agent on 127.0.0.1, port 0, in the test's nursery: ``await vrt_serve(agent)``.

        Needs pytest-trio (its ``nursery`` fixture).
        """

        async def start(agent: Agent, **options: Any) -> Server:
            server: Server = await nursery.start(
                functools.partial(serve, agent, "127.0.0.1", 0, **options)
            )
            return server

        return start
