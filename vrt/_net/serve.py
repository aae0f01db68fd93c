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
import hmac
import logging
import math
import secrets
from collections.abc import Awaitable, Callable, Collection
from typing import Any, NoReturn

import attrs
import trio
from trio_websocket import (
    ConnectionClosed,
    WebSocketRequest,
    WebSocketServer,
)

from vrt._core.events import (
    TERMINAL_PHASES,
    ConfirmRequest,
    TextDelta,
    ToolPreview,
    ToolStream,
    TurnEnded,
    TurnStarted,
)
from vrt._core.results import ResultCode, ToolResult
from vrt._engine.agent import Agent
from vrt._engine.call import Call
from vrt._engine.session import Session
from vrt._net.memory import AckTimer, send_frames
from vrt._wire import messages as m
from vrt._wire.endpoint import REPLAY_LIMIT
from vrt._wire.server import MAX_MESSAGE_SIZE, ServerProtocol
from vrt.models import ToolSpec

log = logging.getLogger("vrt.server")

HIGH_WATER = 4000
"""Unacked messages at which the model is held (under the replay buffer's 10,000)."""
STALL_TIMEOUT = 30.0
"""A connected client held at the high water mark this long without acking is closed."""
RESUME_WINDOW = 30.0
MAX_SESSIONS = 1000
MAX_OPEN_CALLS = 64
MAX_QUEUED_APP_CALLS = 32
MAX_MESSAGES_PER_SECOND = 100.0
RATE_CLOSE_AFTER = 5.0
"""Seconds a connection may stay over its message rate before its session is closed."""
HANDSHAKE_TIMEOUT = 10.0


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
class HandshakeRequest:
    """What ``authenticate`` sees of a WebSocket upgrade request."""

    path: str
    """The requested resource, with its query string (``/agent?room=7``)."""
    headers: tuple[tuple[str, str], ...]
    """Every header as ``(name, value)``, names lower-case, in the order sent."""
    remote: str
    """The peer's address as ``host:port`` (behind a proxy: the proxy's)."""

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or None."""
        name = name.lower()
        return next((value for key, value in self.headers if key == name), None)


class Refuse(Exception):
    """Raise from ``authenticate`` to refuse the WebSocket upgrade with an HTTP ``status``."""

    def __init__(self, status: int = 403, reason: str = "forbidden") -> None:
        if not 400 <= status <= 599:
            raise ValueError(f"status must be an HTTP 4xx or 5xx code, not {status}")
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason


Authenticate = Callable[[HandshakeRequest], Awaitable[Any]]


@attrs.frozen(kw_only=True)
class _Options:
    capabilities: tuple[str, ...] = m.CAPABILITIES
    max_message_size: int = MAX_MESSAGE_SIZE
    resume_window: float = RESUME_WINDOW
    max_sessions: int = MAX_SESSIONS
    max_open_calls: int = MAX_OPEN_CALLS
    max_queued_app_calls: int = MAX_QUEUED_APP_CALLS
    max_messages_per_second: float = MAX_MESSAGES_PER_SECOND
    replay_limit: int = REPLAY_LIMIT
    handshake_timeout: float = HANDSHAKE_TIMEOUT
    authenticate: Authenticate | None = None
    allowed_origins: frozenset[str] | None = None

    @property
    def high_water(self) -> int:
        """Unacked messages at which the model is held: well under the replay bound."""
        return max(1, min(HIGH_WATER, self.replay_limit * 2 // 5))


async def serve(
    agent: Agent,
    host: str = "127.0.0.1",
    port: int = 8765,
    *,
    capabilities: Collection[str] = m.CAPABILITIES,
    max_message_size: int = MAX_MESSAGE_SIZE,
    resume_window: float = RESUME_WINDOW,
    max_sessions: int = MAX_SESSIONS,
    max_open_calls: int = MAX_OPEN_CALLS,
    max_queued_app_calls: int = MAX_QUEUED_APP_CALLS,
    max_messages_per_second: float = MAX_MESSAGES_PER_SECOND,
    replay_limit: int = REPLAY_LIMIT,
    handshake_timeout: float = HANDSHAKE_TIMEOUT,
    authenticate: Authenticate | None = None,
    allowed_origins: Collection[str] | None = None,
    task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Serve ``agent`` over vrt/1 WebSockets until cancelled.

    Use ``server = await nursery.start(vrt.serve, agent, host, 0)`` to learn the real
    port. ``capabilities`` is what this server supports (pass ``()`` to act as a server
    without ``tool-stream-v1``). On cancellation every open session is sent ``closed``
    with reason ``shutdown`` and its connection closed.

    Safety (each has a default; see the README's "Running the server safely"):

    - ``resume_window`` (30 s): how long a session whose connection dropped is kept for
      the client to resume; turns and server tools go on meanwhile. Then it closes
      (``expired``). 0 ends a session with its connection.
    - ``max_sessions`` (1,000): live sessions, detached ones included; a new session over
      it is refused (``error`` ``RATE_LIMITED``, ``closed`` ``rejected``).
    - ``max_open_calls`` (64): calls of one turn without a result; a call over it fails at
      once (FAILED) and the model gets that result.
    - ``max_queued_app_calls`` (32): app calls waiting for the app; one over it FAILED.
    - ``max_messages_per_second`` (100, a one-second burst): inbound frames per
      connection; frames over it are read more slowly (never dropped) and the client
      gets ``error`` ``RATE_LIMITED`` once; after :data:`RATE_CLOSE_AFTER` seconds of
      that, the session is closed (``server``).
    - ``replay_limit`` (10,000 messages): the replay buffer; the model is held while the
      client is 40 % of it behind, and a client that stops reading for 30 s is closed
      (``overflow``).
    - ``handshake_timeout`` (10 s): a peer that has not sent a valid ``hello`` by then is
      disconnected.
    - ``max_message_size`` (1 MiB): a text frame over it is answered ``TOO_LARGE`` and the
      session goes on; one over four times that is refused by the WebSocket layer (close
      code 1009).
    - ``authenticate``: ``async (vrt.HandshakeRequest) -> principal``, run before the
      upgrade; raise :class:`vrt.Refuse` (or return None: 401) to refuse the upgrade with
      an HTTP status. The principal reaches server tools as ``ctx.principal``, and a resume
      must come with the same principal.
    - ``allowed_origins``: if given, an upgrade whose ``Origin`` header is present and not
      in it is refused (403): browsers send it, so a page elsewhere cannot use a user's
      cookies to open a session. Requests without ``Origin`` (not a browser) pass.
    """
    options = _Options(
        capabilities=tuple(capabilities),
        max_message_size=max_message_size,
        resume_window=_non_negative("resume_window", resume_window),
        max_sessions=_positive("max_sessions", max_sessions),
        max_open_calls=_positive("max_open_calls", max_open_calls),
        max_queued_app_calls=_positive("max_queued_app_calls", max_queued_app_calls),
        max_messages_per_second=_positive("max_messages_per_second", max_messages_per_second),
        replay_limit=_positive("replay_limit", replay_limit),
        handshake_timeout=_positive("handshake_timeout", handshake_timeout),
        authenticate=authenticate,
        allowed_origins=None if allowed_origins is None else frozenset(allowed_origins),
    )
    # Our own listeners, closed on the way out: trio-websocket leaves them to the GC.
    listeners = await trio.open_tcp_listeners(port, host=host)
    try:
        async with trio.open_nursery() as nursery:
            hub = Hub(agent, options, nursery)
            ws_server = WebSocketServer(
                functools.partial(_handle, hub),
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


def _positive(name: str, value: float) -> Any:
    if not value > 0:
        raise ValueError(f"{name} must be positive, not {value!r}")
    return value


def _non_negative(name: str, value: float) -> float:
    if not value >= 0:
        raise ValueError(f"{name} must not be negative, not {value!r}")
    return value


async def _handle(hub: Hub, request: WebSocketRequest) -> None:
    admitted, principal = await _admit(hub.options, request)
    if not admitted:
        return
    try:
        ws = await request.accept()
    except ConnectionClosed:
        return
    await hub.serve_connection(ws, principal)


async def _admit(options: _Options, request: WebSocketRequest) -> tuple[bool, Any]:
    """Check the upgrade request (origin, ``authenticate``): ``(True, principal)``, or
    ``(False, None)`` once it is refused with an HTTP status."""
    headers = tuple(
        (key.decode("latin-1").lower(), value.decode("latin-1")) for key, value in request.headers
    )
    remote = request.remote
    handshake = HandshakeRequest(
        path=request.path,
        headers=headers,
        remote=str(remote) if isinstance(remote, str) else f"{remote.address}:{remote.port}",
    )
    try:
        origin = handshake.header("origin")
        if options.allowed_origins is not None and origin is not None:
            if origin not in options.allowed_origins:
                raise Refuse(403, "origin not allowed")
        principal = None
        if options.authenticate is not None:
            with trio.fail_after(options.handshake_timeout):
                principal = await options.authenticate(handshake)
            if principal is None:
                raise Refuse(401, "unauthorized")
    except Refuse as refusal:
        log.info("refused %s: %s", handshake.remote, refusal)
        with contextlib.suppress(ConnectionClosed, trio.BrokenResourceError):
            await request.reject(refusal.status, body=refusal.reason.encode())
        return False, None
    except Exception:  # the hook's bug, or its timeout: refuse, never crash the server
        log.exception("authenticate failed for %s", handshake.remote)
        with contextlib.suppress(ConnectionClosed, trio.BrokenResourceError):
            await request.reject(500, body=b"internal server error")
        return False, None
    return True, principal


class Hub:
    """The sessions of one server, which outlive their connections while resumable.

    Each session's actor runs in the hub's nursery; each connection is served by the task
    that accepted it (:meth:`serve_connection`), attached to one session at a time.
    """

    def __init__(self, agent: Agent, options: _Options, nursery: trio.Nursery) -> None:
        self.agent = agent
        self.options = options
        self.nursery = nursery
        self.sessions: dict[str, _Live] = {}
        self.acks = AckTimer()
        """Every session's ack timer: one task for the server."""
        nursery.start_soon(self.acks.run)

    async def serve_connection(self, ws: Any, principal: Any = None) -> None:
        """Serve one connection: its handshake, then the session it opens or resumes, until
        the connection ends (or a newer one takes the session over).

        ``ws`` is a trio-websocket connection or anything with its ``get_message``,
        ``send_message`` and ``aclose`` (the memory pair of :mod:`vrt.testing`).
        """
        options = self.options
        proto = ServerProtocol(
            session_id=f"s_{secrets.token_hex(8)}",
            resume_token=secrets.token_urlsafe(32),  # 256 random bits
            server_tools=self.agent.registry.keys(),
            capabilities=options.capabilities,
            max_message_size=options.max_message_size,
            replay_limit=options.replay_limit,
            admit=lambda: len(self.sessions) < options.max_sessions,
        )
        try:
            hello = None
            with trio.move_on_after(options.handshake_timeout):
                hello = await _handshake(ws, proto)
            if hello is None:
                await _send_and_close(ws, proto.take_outbox())
                return
            if hello.resume is not None:
                live = self._resume(hello, proto, principal)
                if live is None:
                    await _send_and_close(ws, proto.take_outbox())
                    return
            else:
                live = _Live(self, proto, hello, principal)
                self.sessions[proto.session_id] = live
                await self.nursery.start(live.run)
            await live.serve(ws)
        except Exception:  # a bug must cost one connection, never the server
            log.exception("connection failed")
            with trio.move_on_after(1.0) as scope:
                scope.shield = True
                with contextlib.suppress(ConnectionClosed):
                    await ws.aclose()

    def _resume(self, hello: m.Hello, proto: ServerProtocol, principal: Any) -> _Live | None:
        """The session ``hello`` resumes, now attached; None (refused on ``proto``) if the
        session is unknown, closed, the token wrong or the principal another: one answer
        for all, so a refusal says nothing about whether a session exists."""
        assert hello.resume is not None
        live = self.sessions.get(hello.resume.session_id)
        token = live.proto.resume_token if live is not None else _DECOY_TOKEN
        matches = hmac.compare_digest(hello.resume.token.encode(), token.encode())
        if (
            live is None
            or not matches
            or live.principal != principal
            or not live.proto.can_resume(hello.resume.last_seq)
        ):
            log.info("refused a resume (session, token, principal or lastSeq do not match)")
            proto.refuse(m.RESUME_FAILED, "the session cannot be resumed", hello.seq)
            return None
        live.resume(hello)
        return live


def _pending_frames(link: _Link) -> list[str]:
    """The frames the connection's writer did not get to, in order."""
    frames = []
    with contextlib.suppress(trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
        while True:
            frames.append(link.frames.receive_nowait())
    return frames


_DECOY_TOKEN = secrets.token_urlsafe(32)  # compared against when the session is unknown


async def _handshake(ws: Any, proto: ServerProtocol) -> m.Hello | None:
    """Read frames until a valid ``hello`` (None if the peer left or was refused);
    protocol errors are answered on the way."""
    while proto.state == "handshaking":
        try:
            frame = await ws.get_message()
        except ConnectionClosed:
            return None
        accepted = proto.receive(frame)
        if accepted:
            hello: m.Hello = accepted[0]
            return hello
        for reply in proto.take_outbox():
            try:
                await ws.send_message(reply)
            except ConnectionClosed:
                return None
    return None


async def _send_and_close(ws: Any, frames: list[str]) -> None:
    """Best effort, shielded, bounded: ``frames``, then close the connection."""
    with trio.move_on_after(1.0) as scope:
        scope.shield = True
        try:
            for frame in frames:
                await ws.send_message(frame)
            await ws.aclose()
        except ConnectionClosed:
            pass


class _Pending:
    """An app call waiting for the client's ``tool.result``."""

    __slots__ = ("done", "epoch", "result")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.done = trio.Event()
        self.result: ToolResult | None = None


class _Link:
    """One connection carrying a session: its frames, in order, and its task's scope."""

    __slots__ = ("frames", "out", "ws")

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.out, self.frames = trio.open_memory_channel[str](math.inf)


def _set(event: trio.Event | None) -> None:
    if event is not None:
        event.set()


class _Live:
    """One session's actor: the protocol pumped, the session driven, across connections."""

    def __init__(self, hub: Hub, proto: ServerProtocol, hello: m.Hello, principal: Any) -> None:
        self.hub = hub
        self.agent = hub.agent
        self.options = hub.options
        self.proto = proto
        self.hello = hello
        self.principal = principal
        self.link: _Link | None = None
        self.session: Session | None = None
        self._nursery: trio.Nursery | None = None
        """The actor's: the session's turns run here, and cancelling it ends the session."""
        self._inputs: list[tuple[str, int]] = []
        """Inputs whose turns have not started, with the interrupt count when each came."""
        self._starting = False
        # Made when someone waits on them (idle sessions are many: each object counts).
        self._acked: trio.Event | None = None
        self._attached: trio.Event | None = None
        self._detached: trio.Event | None = None
        self.pending: dict[str, _Pending] = {}
        self._interrupts = 0
        self.issued: set[str] = set()
        self.answered: set[str] = set()
        rate = self.options.max_messages_per_second
        self._tokens = rate
        self._refill_at = trio.current_time()
        self._limited_since: float | None = None
        self._limited_at = 0.0

    @property
    def log_id(self) -> str:
        return self.proto.session_id

    def flush(self) -> None:
        """Hand every frame the protocol queued to the current connection, in order.

        Without a connection they are dropped here: every numbered one is in the replay
        buffer for the resume.
        """
        frames = self.proto.take_outbox()
        link = self.link
        if link is not None:
            for frame in frames:
                link.out.send_nowait(frame)

    # -- the session's life (in the hub's nursery) ------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the session until it closes or expires: one task and one nursery, which its
        turns share (the fewer per session, the more sessions fit: bench/load.py)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                session = self._open_session(nursery)
                try:
                    task_status.started()
                    await self._expiry()
                finally:
                    session.close("client")  # cancels the nursery: the turns end with it
        except Exception:  # a bug: the peer learns only that it happened
            log.exception("session %s failed", self.log_id)
            if self.proto.in_session:
                self.proto.error(m.INTERNAL, "internal server error")
                self.proto.close("server")
        finally:
            del self.hub.sessions[self.proto.session_id]
            if self.proto.in_session:  # cancelled: the server shuts down
                self.proto.close("shutdown")
            self.flush()
            self._drop_link()

    def _open_session(self, nursery: trio.Nursery) -> Session:
        specs = [
            ToolSpec(name=t.name, description=t.description, parameters=t.parameters)
            for t in self.hello.tools
        ]
        session = Session(
            self.agent,
            self.proto.session_id,
            app_tools=specs,
            app_host=self,
            principal=self.principal,
        )
        session.run_in(nursery)
        session.pace = self._pace
        session.max_open_calls = self.options.max_open_calls
        session.max_queued_app_calls = self.options.max_queued_app_calls
        session.listen(self._on_event)  # frames in the engine's own order
        self.session = session
        return session

    async def _expiry(self) -> None:
        """Until the session closes: whenever it is detached, close it (``expired``) if no
        connection resumes it within the resume window."""
        proto = self.proto
        while proto.state != "closed":
            if proto.state == "detached":
                self._attached = trio.Event()
                with trio.move_on_after(self.options.resume_window):
                    await self._attached.wait()
                    continue
                log.info("session %s expired", self.log_id)
                proto.expire()
                return
            self._detached = trio.Event()
            await self._detached.wait()

    def end(self, reason: str) -> None:
        """Close the session for good with ``reason`` (``closed`` goes out last)."""
        self.proto.close(reason)
        self.flush()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    # -- connections (each in the task that accepted it) ------------------------------------------

    def resume(self, hello: m.Hello) -> None:
        """A new connection resumes the session: the newest wins, the old one is closed."""
        session = self.session
        self.proto.resume(hello, session.epoch if session is not None else 0)
        self._drop_link()
        _set(self._attached)
        _set(self._acked)  # the pace check looks again

    async def serve(self, ws: Any) -> None:
        """Carry the session on ``ws`` until it ends or a newer connection takes over."""
        link = _Link(ws)
        self.link = link
        self.flush()  # welcome (and the replay, on a resume)
        if self.proto.ack_due:
            self.hub.acks.due(self._send_ack)  # the hello; on a resume, everything again
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer, link, nursery.cancel_scope)
                await self._reader(link)
                nursery.cancel_scope.cancel()
        finally:
            # Cancelled from outside: the server is shutting down (trio-websocket may
            # already have closed the socket under the reader, so this, not the exception).
            shutdown = trio.current_effective_deadline() == -math.inf
            frames = _pending_frames(link)
            if self.link is link:
                self.link = None
                proto = self.proto
                if shutdown and proto.in_session:
                    proto.close("shutdown")  # said on this connection, before it closes
                    frames += proto.take_outbox()
                elif proto.state == "open":  # the connection died under the session
                    log.info("session %s detached", self.log_id)
                    proto.drop()
                    if self.options.resume_window == 0:
                        proto.expire()
                        if self._nursery is not None:
                            self._nursery.cancel_scope.cancel()
                    else:
                        _set(self._detached)
            await _send_and_close(ws, frames)

    def _drop_link(self) -> None:
        """Stop using the current connection: its writer sends what it has, then closes."""
        link, self.link = self.link, None
        if link is not None:
            link.out.close()

    async def _writer(self, link: _Link, scope: trio.CancelScope) -> None:
        if await send_frames(link.frames, link.ws):
            with trio.move_on_after(5.0):
                await link.ws.aclose()  # done with it: closed session, or replaced
        scope.cancel()

    async def _reader(self, link: _Link) -> None:
        proto = self.proto
        session = self.session
        assert session is not None
        while True:
            try:
                frame = await link.ws.get_message()
            except ConnectionClosed:
                return
            if self.link is not link or proto.state != "open":
                continue  # replaced or closed: drain until the close handshake ends
            if not await self._admit(link):
                continue  # closed for its rate, or replaced or closed while it waited
            acked = proto.acked_by_peer
            for message in proto.receive(frame):
                self._act(session, message)
            self.flush()
            if proto.ack_due:
                self.hub.acks.due(self._send_ack)
            if proto.acked_by_peer != acked:
                _set(self._acked)
            if proto.state == "closed":  # the client's ``close``
                self.end("client")

    async def _admit(self, link: _Link) -> bool:
        """The inbound rate limit: a token bucket of ``max_messages_per_second`` a second
        (a second's worth of burst).

        A frame over it waits for its token, and the reader with it: the peer's frames back
        up (trio-websocket's queue, then TCP flow control), none is dropped. The first wait
        of an episode sends ``RATE_LIMITED``; waits that go on for RATE_CLOSE_AFTER seconds
        close the session (``server``). An episode ends after a second without a wait.
        False if the frame is not to be processed: the session closed, or ``link`` no longer
        carries it (a newer connection's reader owns the bucket then).
        """
        rate = self.options.max_messages_per_second
        now = trio.current_time()
        self._tokens = min(rate, self._tokens + (now - self._refill_at) * rate)
        self._refill_at = now
        if self._tokens < 1:
            if self._limited_since is None or now - self._limited_at > 1.0:
                self._limited_since = now
                self.proto.error(
                    m.RATE_LIMITED,
                    f"over {rate:g} messages a second: they are read more slowly "
                    "until the rate falls",
                )
                self.flush()
            elif now - self._limited_since > RATE_CLOSE_AFTER:
                log.info("session %s closed: over its message rate for too long", self.log_id)
                self.end("server")
                return False
            await trio.sleep((1 - self._tokens) / rate)
            if self.link is not link or self.proto.state != "open":
                return False
            self._tokens, self._refill_at = 1.0, trio.current_time()
            self._limited_at = self._refill_at
        self._tokens -= 1
        return True

    async def _pace(self) -> None:
        """Hold the model while the client is far behind on acks (or detached).

        A connected client that acks nothing for STALL_TIMEOUT seconds while held has
        stopped reading: the session closes with ``overflow`` (it could never catch up
        within the buffer). A detached one is waited for until the resume window ends.
        """
        proto = self.proto
        high_water = self.options.high_water
        while proto.sent_seq - proto.acked_by_peer > high_water and proto.state != "closed":
            self._acked = trio.Event()
            if proto.state == "detached":
                await self._acked.wait()
                continue
            with trio.move_on_after(STALL_TIMEOUT):
                await self._acked.wait()
                continue
            self.end("overflow")
            await trio.lowlevel.checkpoint()

    async def _turns(self, session: Session) -> None:
        """Start the waiting inputs' turns one at a time, in arrival order (``start_turn``
        may wait for a barge-in's turn to end): a task only while inputs wait."""
        try:
            while self._inputs:
                text, generation = self._inputs.pop(0)
                turn = await session.start_turn(text)
                if generation != self._interrupts:
                    turn.interrupt()  # the user interrupted after sending it
        finally:
            self._starting = False

    def _send_ack(self) -> None:
        if self.proto.send_ack():  # nothing once closed: the timer may call late
            self.flush()

    def _on_event(self, event: Any) -> None:
        """A session event to a frame, synchronously (a session listener)."""
        proto = self.proto
        if not proto.in_session:
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

    # -- acting on client messages ----------------------------------------------------------------

    def _act(self, session: Session, message: Any) -> None:
        proto = self.proto
        if isinstance(message, m.Input):
            session.interrupt()  # barge-in: at once, before the new turn is queued
            self._inputs.append((message.text, self._interrupts))
            if not self._starting:
                self._starting = True
                assert self._nursery is not None
                self._nursery.start_soon(self._turns, session)
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

    # -- the app host (vrt._engine.call.AppHost) --------------------------------------------------

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
