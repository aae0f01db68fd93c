"""``vrt.serve``: the vrt/1 WebSocket server, one session actor per connection.

Each connection pumps a sans-IO :class:`~vrt._wire.server.ServerProtocol` and runs an
in-process :class:`~vrt.Session` for its conversation: frames in become session actions,
session events become frames out. One writer task owns the socket's sending side, so
frames leave in the order the protocol numbered them. A bad peer gets ``error`` frames, or
is dropped; the server itself never goes down for it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import secrets
from collections.abc import Collection
from typing import Any, NoReturn

import attrs
import trio
from trio_websocket import (
    ConnectionClosed,
    WebSocketConnection,
    WebSocketRequest,
    WebSocketServer,
)

from vrt._agent import Agent
from vrt._call import Call
from vrt._events import (
    TERMINAL_PHASES,
    ConfirmRequest,
    TextDelta,
    ToolPreview,
    ToolStream,
    TurnEnded,
    TurnStarted,
)
from vrt._memory import send_frames
from vrt._results import ResultCode, ToolResult
from vrt._session import Session, open_session
from vrt._wire import messages as m
from vrt._wire.server import MAX_MESSAGE_SIZE, ServerProtocol
from vrt.models import ToolSpec

log = logging.getLogger("vrt.server")

ACK_INTERVAL = 0.2
HIGH_WATER = 4000
STALL_TIMEOUT = 30.0
"""Unacked messages at which the model is held (under the replay buffer's 10,000)."""


@attrs.frozen(kw_only=True)
class Server:
    """A running server, as ``nursery.start(vrt.serve, ...)`` returns it."""

    host: str
    port: int
    """The real port (when 0 was asked for, the one the OS chose)."""

    @property
    def url(self) -> str:
        """``ws://host:port/``, what ``vrt.connect`` takes."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"ws://{host}:{self.port}/"


@attrs.frozen(kw_only=True)
class _Options:
    capabilities: tuple[str, ...] = m.CAPABILITIES
    max_message_size: int = MAX_MESSAGE_SIZE


async def serve(
    agent: Agent,
    host: str = "127.0.0.1",
    port: int = 8765,
    *,
    capabilities: Collection[str] = m.CAPABILITIES,
    max_message_size: int = MAX_MESSAGE_SIZE,
    task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Serve ``agent`` over vrt/1 WebSockets until cancelled.

    Use ``server = await nursery.start(vrt.serve, agent, host, 0)`` to learn the real
    port. ``capabilities`` is what this server supports (pass ``()`` to act as a server
    without ``tool-stream-v1``). A text frame over ``max_message_size`` bytes is answered
    ``TOO_LARGE`` and the session goes on; one over four times that is refused by the
    WebSocket layer (close code 1009). On cancellation every open session is sent
    ``closed`` with reason ``shutdown`` and its connection closed.
    """
    options = _Options(capabilities=tuple(capabilities), max_message_size=max_message_size)
    # Our own listeners, closed on the way out: trio-websocket leaves them to the GC.
    listeners = await trio.open_tcp_listeners(port, host=host)
    try:
        async with trio.open_nursery() as nursery:
            ws_server = WebSocketServer(
                functools.partial(_handle, agent, options),
                listeners,
                handler_nursery=nursery,
                max_message_size=4 * max_message_size,
            )
            await nursery.start(ws_server.run)
            task_status.started(Server(host=host, port=ws_server.port))
            await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            for listener in listeners:
                await listener.aclose()
    raise AssertionError("unreachable")  # pragma: no cover


async def _handle(agent: Agent, options: _Options, request: WebSocketRequest) -> None:
    try:
        ws = await request.accept()
    except ConnectionClosed:
        return
    await serve_connection(agent, ws, options)


async def serve_connection(agent: Agent, ws: Any, options: _Options | None = None) -> None:
    """Serve one session over one already-open connection (a trio-websocket connection,
    or anything with its ``get_message``/``send_message``/``aclose``, such as the memory
    pair of :mod:`vrt.testing`). Returns when the connection or the session ends."""
    try:
        await _Connection(agent, options or _Options(), ws).run()
    except Exception:  # a bug must cost one connection, never the server
        log.exception("connection failed")


class _Pending:
    """An app call waiting for the client's ``tool.result``."""

    __slots__ = ("done", "epoch", "result")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.done = trio.Event()
        self.result: ToolResult | None = None


class _Connection:
    """One client's session actor: the protocol pumped, the session driven."""

    def __init__(self, agent: Agent, options: _Options, ws: WebSocketConnection) -> None:
        # ``ws`` may also be a memory connection (vrt.testing): only get_message,
        # send_message and aclose are used.
        self.agent = agent
        self.ws = ws
        self.proto = ServerProtocol(
            session_id=f"s_{secrets.token_hex(8)}",
            resume_token=secrets.token_urlsafe(32),  # 256 random bits
            server_tools=agent.registry.keys(),
            capabilities=options.capabilities,
            max_message_size=options.max_message_size,
        )
        self.out, self._frames = trio.open_memory_channel[str](math.inf)
        self.inputs, self._inputs = trio.open_memory_channel[tuple[str, int]](math.inf)
        self.session: Session | None = None
        self._scope: trio.CancelScope | None = None
        self._acked = trio.Event()
        self.pending: dict[str, _Pending] = {}
        self._interrupts = 0
        self.issued: set[str] = set()
        self.answered: set[str] = set()

    def flush(self) -> None:
        """Hand every frame the protocol queued to the writer, in order."""
        for frame in self.proto.take_outbox():
            self.out.send_nowait(frame)

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer)
                try:
                    hello = await self._handshake()
                    if hello is not None:
                        await self._serve(hello)
                except Exception:  # a bug: the peer learns only that it happened
                    log.exception("session %s failed", self.proto.session_id)
                    if self.proto.state != "closed":
                        self.proto.error(
                            m.INTERNAL, "internal server error", numbered=self.proto.state == "open"
                        )
                        self.proto.close("server")
                finally:
                    self.flush()
                    self.out.close()
                    nursery.cancel_scope.deadline = trio.current_time() + 5.0
        finally:
            if self.proto.state == "open":  # cancelled from outside (or the peer vanished)
                self.proto.close("shutdown")
                await self._send_last()

    async def _send_last(self) -> None:
        """Best effort, shielded: the frames the writer did not get to, ``closed`` last."""
        frames = []
        with contextlib.suppress(trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            while True:
                frames.append(self._frames.receive_nowait())
        frames.extend(self.proto.take_outbox())
        with trio.move_on_after(1.0) as scope:
            scope.shield = True
            try:
                for frame in frames:
                    await self.ws.send_message(frame)
                await self.ws.aclose()
            except ConnectionClosed:
                pass

    async def _handshake(self) -> m.Hello | None:
        while self.proto.state == "handshaking":
            try:
                frame = await self.ws.get_message()
            except ConnectionClosed:
                return None
            accepted = self.proto.receive(frame)
            self.flush()
            if accepted:
                hello: m.Hello = accepted[0]
                return hello
        return None

    async def _serve(self, hello: m.Hello) -> None:
        specs = [
            ToolSpec(name=t.name, description=t.description, parameters=t.parameters)
            for t in hello.tools
        ]
        async with open_session(
            self.agent, session_id=self.proto.session_id, app_tools=specs, app_host=self
        ) as session:
            self.session = session
            session.pace = self._pace
            session.listen(self._on_event)  # frames in the engine's own order
            async with trio.open_nursery() as nursery:
                self._scope = nursery.cancel_scope
                nursery.start_soon(self._turns, session)
                nursery.start_soon(self._acks)
                await self._reader(session)
                nursery.cancel_scope.cancel()

    # -- tasks --------------------------------------------------------------------------------

    async def _writer(self) -> None:
        if not await send_frames(self._frames, self.ws):
            return
        if self.proto.state == "closed":
            with trio.move_on_after(5.0):
                await self.ws.aclose()

    async def _reader(self, session: Session) -> None:
        proto = self.proto
        while proto.state == "open":
            try:
                frame = await self.ws.get_message()
            except ConnectionClosed:
                return  # no resume yet: the session ends with its connection
            acked = proto.acked_by_peer
            for message in proto.receive(frame):
                self._act(session, message)
            self.flush()
            if proto.acked_by_peer != acked:
                self._acked.set()

    async def _pace(self) -> None:
        """Hold the model while the client is more than HIGH_WATER messages behind.

        A client that acks nothing for STALL_TIMEOUT seconds while held has stopped reading:
        the session closes with ``overflow`` (it could never catch up within the buffer).
        """
        proto = self.proto
        while proto.sent_seq - proto.acked_by_peer > HIGH_WATER and proto.state == "open":
            self._acked = trio.Event()
            with trio.move_on_after(STALL_TIMEOUT):
                await self._acked.wait()
                continue
            self.end("overflow")
            await trio.lowlevel.checkpoint()

    async def _turns(self, session: Session) -> None:
        """Start turns one at a time, in arrival order (``input`` may await a barge-in)."""
        async for text, generation in self._inputs:
            turn = await session.start_turn(text)
            if generation != self._interrupts:
                turn.interrupt()  # the user interrupted after sending it

    async def _acks(self) -> None:
        while True:
            await trio.sleep(ACK_INTERVAL)
            if self.proto.send_ack():
                self.flush()

    def _on_event(self, event: Any) -> None:
        """A session event to a frame, synchronously (a session listener)."""
        proto = self.proto
        if proto.state != "open":
            return
        if isinstance(event, ToolStream):
            if m.TOOL_STREAM_V1 in proto.capabilities:
                proto.send(
                    m.ToolStreamMessage,
                    call_id=event.call_id,
                    turn_id=event.turn_id,
                    epoch=event.epoch,
                    name=event.name,
                    kind=event.kind,
                    phase=str(event.phase),
                    delta=event.delta,
                    arguments=event.arguments,
                    progress=event.progress,
                    ok=event.ok,
                    code=None if event.code is None else str(event.code),
                    message=event.message,
                )
            if event.phase in TERMINAL_PHASES and event.kind == "app":
                # Ended without the app's result (interrupt or timeout): the app sees the
                # terminal phase first, then tool.abort, so the tool learns why it stops.
                if self.pending.pop(event.call_id, None) is not None:
                    proto.send(m.ToolAbort, call_id=event.call_id)
        elif isinstance(event, ToolPreview):
            proto.send(
                m.ToolPreviewMessage,
                call_id=event.call_id,
                turn_id=event.turn_id,
                name=event.name,
                arguments=event.arguments,
                complete=event.complete,
            )
        elif isinstance(event, TextDelta):
            proto.send(m.TextDeltaMessage, turn_id=event.turn_id, text=event.text)
        elif isinstance(event, TurnStarted):
            proto.send(m.TurnStartedMessage, turn_id=event.turn_id, epoch=event.epoch)
        elif isinstance(event, TurnEnded):
            proto.send(
                m.TurnEndedMessage, turn_id=event.turn_id, epoch=event.epoch, reason=event.reason
            )
        elif isinstance(event, ConfirmRequest):
            proto.send(
                m.ConfirmRequestMessage,
                call_id=event.call_id,
                name=event.name,
                arguments=event.arguments,
                risk=event.risk,
                prompt=event.prompt,
            )
        if proto.overflowed:
            self.end("overflow")
        self.flush()

    def end(self, reason: str) -> None:
        """Close the session for good with ``reason`` (the writer sends ``closed`` last)."""
        self.proto.close(reason)
        self.flush()
        if self._scope is not None:
            self._scope.cancel()

    # -- acting on client messages ------------------------------------------------------------

    def _act(self, session: Session, message: Any) -> None:
        proto = self.proto
        if isinstance(message, m.Input):
            session.interrupt()  # barge-in: at once, before the new turn is queued
            self.inputs.send_nowait((message.text, self._interrupts))
        elif isinstance(message, m.Interrupt):
            self._interrupts += 1
            session.interrupt(max(message.epoch, session.epoch + 1))
        elif isinstance(message, m.ToolResultMessage):
            self._result(message)
        elif isinstance(message, m.ConfirmReply):
            if not session.answer_confirmation(message.call_id, message.approved, message.reason):
                proto.error(
                    m.UNKNOWN_CALL,
                    f"no open confirmation for call {message.call_id!r}",
                    message.seq,
                )

    def _result(self, message: m.ToolResultMessage) -> None:
        call_id = message.call_id
        pending = self.pending.get(call_id)
        if pending is None or pending.result is not None:
            session = self.session
            if call_id in self.answered:
                code, text = m.DUPLICATE_RESULT, f"call {call_id!r} already has its result"
            elif call_id in self.issued and session is not None and message.epoch < session.epoch:
                code, text = (
                    m.STALE_EPOCH,
                    f"call {call_id!r} was interrupted (epoch {session.epoch})",
                )
            else:
                code, text = m.UNKNOWN_CALL, f"no open app call {call_id!r}"
            self.proto.error(code, text, message.seq)
            return
        if message.epoch != pending.epoch:
            self.proto.error(
                m.STALE_EPOCH,
                f"call {call_id!r} runs in epoch {pending.epoch}, not {message.epoch}",
                message.seq,
            )
            return
        wire = message.result
        pending.result = (
            ToolResult.success(wire.output)
            if wire.ok
            else ToolResult.failure(ResultCode(wire.code or "FAILED"), wire.message)
        )
        pending.done.set()
        self.answered.add(call_id)

    # -- the app host (vrt._call.AppHost) -----------------------------------------------------

    async def run_app(self, call: Call) -> ToolResult:
        """Send an app call to the client and wait for its ``tool.result``."""
        call_id = call.call_id
        pending = _Pending(call.turn.epoch)
        self.pending[call_id] = pending
        self.issued.add(call_id)
        self.proto.send(
            m.ToolCallMessage,
            call_id=call_id,
            turn_id=call.turn.turn_id,
            epoch=call.turn.epoch,
            name=call.name,
            arguments=call.arguments,
        )
        self.flush()
        try:
            await pending.done.wait()
        finally:
            # Without a result (cancelled), ``pending`` stays until the call's terminal
            # phase, which sends tool.abort after it (``_on_event``).
            if pending.result is not None:
                del self.pending[call_id]
        assert pending.result is not None
        return pending.result
