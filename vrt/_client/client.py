"""The vrt/1 client, hosting app tools in the user's app.

The client pumps a sans-IO :class:`~vrt._wire.client.ClientProtocol`: the epoch gate, the
CallView of every call and the serial app-tool queue all live there; this module owns the
tasks (reader, writer, app runner, acks) and runs the app tools. ``vrt.connect``
(:mod:`vrt._client.dial`) opens its connections; :func:`open_client` runs it on any.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import trio
from trio_websocket import (
    ConnectionClosed,
    HandshakeError,
)

from vrt._client.apptools import AppTools
from vrt._client.reconnect import (
    CLOSE_TIMEOUT,
    CONNECT_TIMEOUT,
    HANDOVER_CLOSE,
    RESUME_TIMEOUT,
    RETRIED_STATUSES,
    STABLE_AFTER,
    Lost,
    await_welcome,
    backoff,
    close_code,
    too_large,
)
from vrt._core.events import (
    Closed,
    ConfirmRequest,
    Event,
    Reconnecting,
    Resumed,
    ToolPreview,
    pcm16,
)
from vrt._engine.groups import single_unwrapped
from vrt._engine.subscription import Subscription
from vrt._engine.tools import AppTool
from vrt._errors import RemoteProtocolError, SessionClosed
from vrt._net.pumps import AckTimer, Outgoing, patiently, send_frames
from vrt._wire import messages as m
from vrt._wire.audio import (
    MIC_BACKLOG_SECONDS,
    AudioInfo,
    AudioRun,
    Backlog,
    bytes_per_second,
    split,
)
from vrt._wire.client import AbortApp, ClientProtocol, Welcomed
from vrt._wire.endpoint import FrameTooLarge
from vrt._wire.server import MAX_MESSAGE_SIZE

log = logging.getLogger("vrt.client")

Reconnect = Callable[[], AbstractAsyncContextManager[Any]]


class Client:
    """A connected client. Build it with :func:`connect`."""

    def __init__(
        self,
        tools: Sequence[AppTool],
        capabilities: Sequence[str],
        reconnect: Reconnect | None = None,
        resume_timeout: float = RESUME_TIMEOUT,
        *,
        resume: bool = True,
        connect_timeout: float = CONNECT_TIMEOUT,
        max_message_size: int = MAX_MESSAGE_SIZE,
    ) -> None:
        self._reconnect = reconnect
        self._resume = resume
        self._connect_timeout = connect_timeout
        self._max_message_size = max_message_size
        self._closing = False
        self._links_done = trio.Event()
        self._acks = AckTimer()
        self._resume_timeout = resume_timeout
        self.app_tools = AppTools(tools)
        """The app tools this client hosts, and the one running now."""
        self.proto = self._new_protocol(
            [
                m.ToolDecl(name=t.name, description=t.description, parameters=t.parameters)
                for t in tools
            ],
            capabilities,
        )
        self._out, self._frames = trio.open_memory_channel[Outgoing](math.inf)
        self._mic = Backlog(0)  # the user's audio unsent: sized by its first send_audio
        self.audio_dropped = 0
        """Bytes of the user's audio :meth:`send_audio` took and never sent: while the
        connection was down, or past the unsent bound (the oldest first)."""
        self._subscribers: list[trio.MemorySendChannel[Event]] = []
        self._no_previews: set[trio.MemorySendChannel[Event]] = set()
        """Subscribers that asked for no :class:`~vrt.ToolPreview`."""
        self._wake = trio.Event()
        self.closed: Closed | None = None
        """The session's final event, once the server ended it."""
        self._closed = trio.Event()

    # -- the public surface -----------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The client's epoch: raised by one on each :meth:`interrupt`."""
        return self.proto.epoch

    @property
    def session_id(self) -> str | None:
        """The server's id for this session."""
        return self.proto.session_id

    @property
    def capabilities(self) -> tuple[str, ...]:
        """What client and server both support (e.g. ``("tool-stream-v1",)``)."""
        return self.proto.capabilities

    @property
    def audio(self) -> AudioInfo | None:
        """The session's audio rates when ``audio-v1`` was negotiated (``connect(...,
        audio=True)`` to a server whose agent has a realtime model), else None."""
        return self.proto.audio

    @asynccontextmanager
    async def subscribe(self, *, previews: bool = True) -> AsyncIterator[Subscription[Event]]:
        """Receive every event from now on, as :meth:`vrt.Session.subscribe` does.

        Ends after :class:`~vrt.Closed`. Raises :class:`~vrt.SessionClosed` once closed.
        ``previews=False``: without the legacy :class:`~vrt.ToolPreview` events, as the
        session's.
        """
        if self.closed is not None:
            raise SessionClosed("the session is closed")
        send, receive = trio.open_memory_channel[Event](math.inf)
        self._subscribers.append(send)
        if not previews:
            self._no_previews.add(send)
        try:
            async with receive:
                yield Subscription(receive)
        finally:
            if send in self._subscribers:
                self._subscribers.remove(send)
            self._no_previews.discard(send)
            send.close()

    async def send_text(self, text: str) -> None:
        """Send user input: a new turn (an open one is interrupted first, server-side).

        Raises ValueError if the frame would be over ``max_message_size`` (the server
        would refuse it).
        """
        self._check_open()
        try:
            self.proto.send_input(text)
        except FrameTooLarge:
            raise ValueError(
                f"the text is over max_message_size ({self._max_message_size} bytes as a frame)"
            ) from None
        self._flush()
        await trio.lowlevel.checkpoint()

    def send_audio(self, pcm: bytes) -> None:
        """Send the user's voice (``audio-v1``): PCM16 little-endian mono at
        ``client.audio.input_rate``, any length (it goes in frames of at most 100 ms).

        Sync and never blocks: audio is realtime data, never replayed. While the connection
        is down it is dropped; past 5 s of it unsent (a slow connection) the oldest is
        dropped; both counted in :attr:`audio_dropped`. Send it as it is captured: the
        server closes a session whose audio runs more than ``audio_speed_limit`` times
        faster than real time (8 s of it at once passes with the defaults).

        Raises ``TypeError`` for anything but bytes, ``ValueError`` for an odd length (not
        PCM16), ``RuntimeError`` if ``audio-v1`` was not negotiated (``connect(...,
        audio=True)``, and an agent with a realtime model), :class:`~vrt.SessionClosed`
        once closed.
        """
        data = pcm16(pcm)
        self._check_open()
        info = self.proto.audio
        if info is None:
            raise RuntimeError(
                "audio-v1 was not negotiated: connect with audio=True to a server whose "
                "agent has a realtime model"
            )
        if self.proto.connection.state != "open":
            self.audio_dropped += len(data)  # realtime: not kept for a resume
            return
        if not self._mic.limit:
            self._mic.limit = int(MIC_BACKLOG_SECONDS * bytes_per_second(info.input_rate))
        for frame in split(data, info.input_rate):
            run, dropped = self._mic.add("mic", frame)
            if run is not None:
                self._out.send_nowait(run)
            self.audio_dropped += dropped

    def interrupt(self, heard_ms: int | None = None) -> None:
        """The user interrupted (sync): raise the epoch and cancel every open call at once.

        Emits the ``cancelled`` events locally before any server reply, aborts the
        running app tool's signal and cancels it, drops queued app calls, then tells the
        server. The server's own late terminal events for those calls are dropped, and so
        is the interrupted turn's audio still on its way (no :class:`~vrt.AudioDelta` of
        it follows).

        ``heard_ms`` (``audio-v1``): milliseconds of the turn's audio the user heard,
        counted from its first :class:`~vrt.AudioDelta`; the model forgets the rest. Sent
        only when ``audio-v1`` was negotiated. ValueError if it is not a whole number of 0
        or more.
        """
        if heard_ms is not None and (
            isinstance(heard_ms, bool) or not isinstance(heard_ms, int) or heard_ms < 0
        ):
            raise ValueError(f"heard_ms must be a whole number of 0 or more, not {heard_ms!r}")
        self._check_open()
        for item in self.proto.interrupt(heard_ms):
            self._dispatch(item)
        self._flush()

    # -- internals --------------------------------------------------------------------------------

    def _new_protocol(
        self, tools: Sequence[m.ToolDecl], capabilities: Sequence[str]
    ) -> ClientProtocol:
        proto = ClientProtocol(tools, capabilities)
        proto.max_frame = self._max_message_size  # what the server takes by default
        return proto

    def _check_open(self) -> None:
        if self.closed is not None:
            raise SessionClosed(f"the session is closed ({self.closed.reason})")

    def _flush(self) -> None:
        frames = self.proto.take_outbox()
        if frames:
            self._mic.cut()  # audio sent later goes after these
        for frame in frames:
            self._out.send_nowait(frame)
        if self.proto.overflowed and self.closed is None and not self._closing:
            # PROTOCOL.md: the session can no longer be resumed once the replay buffer
            # dropped what the server has not acked: it is closed (as vrt.js does).
            log.warning(
                "session %s: %d unacked messages (%d bytes): over the replay buffer's "
                "bound, the session is closed (overflow)",
                self.session_id,
                len(self.proto.replay),
                self.proto.replay_bytes,
            )
            self._closing = True
            if self.proto.connection.state == "open":
                self.proto.close()
                self._mic.cut()
                for frame in self.proto.take_outbox():
                    self._out.send_nowait(frame)
            self._dispatch(Closed(reason="overflow"))

    def _emit(self, event: Event) -> None:
        gone = None
        skip = self._no_previews if type(event) is ToolPreview else ()
        for channel in self._subscribers:
            if channel in skip:
                continue
            try:
                channel.send_nowait(event)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                gone = [*(gone or ()), channel]
        if gone:
            for channel in gone:
                self._subscribers.remove(channel)

    def _dispatch(self, item: Any) -> None:
        if isinstance(item, AbortApp):
            self.app_tools.abort(item.call_id, item.reason)
        elif isinstance(item, m.ConfirmRequestMessage):
            self._emit(
                ConfirmRequest(
                    call_id=item.call_id,
                    name=item.name,
                    arguments=item.arguments,
                    risk=item.risk,
                    prompt=item.prompt,
                    reply=self._reply_for(item.call_id),
                )
            )
        elif isinstance(item, m.Error):
            log.info("server error %s: %s (ref %s)", item.code, item.message, item.ref)
        elif isinstance(item, Closed):
            self.closed = item
            if not self.proto.connection.final:  # lost for good, or closed here
                self.proto.connection.send("close")
            for abort in self.proto.abort_all(
                "closed"
            ):  # none left if `closed` came from the server
                self._dispatch(abort)
            self._emit(item)
            for channel in self._subscribers:
                channel.close()
            self._subscribers.clear()
            self._closed.set()
        elif isinstance(item, Welcomed):
            pass
        else:
            self._emit(item)

    def _reply_for(self, call_id: str) -> Any:
        async def reply(approved: bool, reason: str | None) -> None:
            if self.closed is None:
                try:
                    self.proto.confirm_reply(call_id, approved, reason)
                except FrameTooLarge:
                    raise ValueError("the reason is over max_message_size") from None
                self._flush()
            await trio.lowlevel.checkpoint()

        return reply

    async def _links(self, first: Any, *, task_status: trio.TaskStatus[None]) -> None:
        """Open the session on ``first``, then carry it on every connection that resumes it.

        A connection lost during the opening handshake is retried with a fresh ``hello``
        (nothing had happened yet). A lost session connection moves the Connection machine
        to ``reconnecting`` (the app gets :class:`~vrt.Reconnecting`); new connections are
        tried with backoff until one resumes the session (:class:`~vrt.Resumed`), the
        server refuses the resume (:class:`~vrt.Closed` ``expired``), or
        ``resume_timeout`` passes (``lost``). Without ``reconnect`` a loss is the end.
        """
        try:
            await self._carry(first, task_status)
        finally:
            self._links_done.set()

    async def _carry(self, first: Any, task_status: trio.TaskStatus[None]) -> None:
        reconnect = self._reconnect
        opening_until = trio.current_time() + self._connect_timeout
        resume_until: float | None = None
        attempt = 0
        moved = False
        while True:
            lost = True
            timed_out = False
            opening = self.proto.connection.state == "connecting"  # no session yet
            now = trio.current_time()
            until = opening_until if opening else resume_until or math.inf
            try:
                with trio.move_on_at(min(until, now + self._connect_timeout)) as attempt_scope:
                    async with self._connection(first, attempt) as ws:
                        if opening:
                            if attempt:
                                self.proto = self._new_protocol(
                                    self.proto.tools, self.proto.offered
                                )
                            self.proto.hello()
                            refusal = await await_welcome(self.proto, ws)
                            if refusal is not None:
                                # The server said ``closed``: it closes next. A short wait
                                # for its close handshake, so the error comes promptly.
                                with trio.move_on_after(1.0):
                                    await ws.aclose()
                                raise refusal
                            task_status.started()
                        else:
                            self.proto.resume_hello()
                            refusal = await await_welcome(self.proto, ws)
                            if refusal is not None:
                                log.info("session %s: resume refused: %s", self.session_id, refusal)
                                # after our ``close`` the session is gone because it closed
                                self._dispatch(
                                    Closed(reason="client" if self._closing else "expired")
                                )
                                return
                            self._resumed()
                        attempt_scope.deadline = math.inf  # connected: no deadline any more
                        if attempt == 0:
                            attempt = 1
                        connected_at = trio.current_time()
                        if self.proto.ack_due:
                            # the welcome; on a resume, everything again
                            self._acks.due(self._send_ack)
                        lost = await self._pump(ws)
                        moved = close_code(ws) == HANDOVER_CLOSE
                        if trio.current_time() - connected_at >= STABLE_AFTER or moved:
                            # It held: a later loss is a new episode, with a fresh budget.
                            # One that drops at once keeps the backoff and the deadline,
                            # so a server that drops every resume does not loop forever.
                            resume_until, attempt = None, 1
                        if lost and too_large(ws):
                            # Resuming would replay the same frame into the same refusal.
                            log.warning(
                                "session %s: a frame over max_message_size (close 1009): "
                                "the session cannot go on",
                                self.session_id,
                            )
                            self._dispatch(Closed(reason="too_large"))
                            return
                timed_out = attempt_scope.cancelled_caught
            except OSError:
                if opening and not attempt:
                    raise  # nothing listens there (refused, unreachable): at once
                log.debug("session %s: connection attempt %d failed", self.session_id, attempt)
            except (Lost, HandshakeError) as exc:
                log.debug(
                    "session %s: connection attempt %d failed: %r", self.session_id, attempt, exc
                )
            except RemoteProtocolError as exc:
                if exc.code in RETRIED_STATUSES:
                    # A server draining (handover-v1) or overloaded (503), or a proxy that
                    # lost its way to one that is restarting (502, 504): another try, which
                    # the load balancer sends elsewhere, within the same deadlines.
                    log.debug("session %s: attempt %d: %s", self.session_id, attempt, exc.code)
                elif opening:
                    raise  # vrt.connect's own error: refused, or not a vrt server
                else:
                    # A resume refused at the door (the upgrade, a hello too large): the
                    # session is over for this client, heard as an event, not a raise.
                    log.info("session %s: resume failed: %s", self.session_id, exc)
                    self._dispatch(
                        Closed(reason="too_large" if exc.code == "TOO_LARGE" else "expired")
                    )
                    return
            if not lost:
                return
            if self.proto.connection.state == "open":
                self.proto.lost()
                assert self.proto.session_id is not None
                self._emit(Reconnecting(session_id=self.proto.session_id))
            now = trio.current_time()
            if self.proto.connection.state == "connecting":
                until = opening_until
            else:
                if resume_until is None:
                    resume_until = now + self._resume_timeout
                until = resume_until
            delay = backoff(attempt)
            if moved:  # 1012 (handover-v1): "resume now, elsewhere": no backoff
                delay, moved = 0.0, False
            can_retry = reconnect is not None and (self._resume or self.proto.session_id is None)
            if not can_retry or now + delay >= until:
                if self.proto.connection.state == "connecting":  # never had a session
                    if timed_out:
                        raise RemoteProtocolError(
                            "TIMEOUT",
                            f"no complete handshake within {self._connect_timeout:g} s "
                            "(connect_timeout)",
                        )
                    raise RemoteProtocolError(
                        "CLOSED", "the server closed the connection during the handshake"
                    )
                log.info("session %s: gave up resuming", self.session_id)
                self._dispatch(Closed(reason="lost"))
                return
            with trio.move_on_after(delay):
                await self._closed.wait()  # the app left meanwhile: stop trying
            if self.closed is not None:
                return
            attempt += 1

    def _connection(self, first: Any, attempt: int) -> AbstractAsyncContextManager[Any]:
        """The connection of attempt ``attempt``: ``first`` if given, then new ones."""
        if attempt == 0 and first is not None:
            return contextlib.nullcontext(first)
        assert self._reconnect is not None
        return self._reconnect()

    def _resumed(self) -> None:
        """The session is back: our frames queued meanwhile are superseded by the replay
        the protocol just queued (every numbered one is in it)."""
        with contextlib.suppress(trio.WouldBlock):
            while True:
                frame = self._frames.receive_nowait()
                if isinstance(frame, AudioRun):  # the user's audio of the lost connection
                    while frame.peek() is not None:
                        self.audio_dropped += len(frame.take())
        self._mic.cut()
        self._flush()
        assert self.proto.session_id is not None
        self._emit(Resumed(session_id=self.proto.session_id))
        if self.proto.queue:
            self._wake.set()

    async def _pump(self, ws: Any) -> bool:
        """Read and write ``ws`` until it closes; True if it was lost (no ``closed``)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._writer, ws)
            await self._reader(ws)
            nursery.cancel_scope.cancel()
        return self.closed is None

    async def _writer(self, ws: Any) -> None:
        # Batches only once a welcome said so, and never the first frame: the hello (a
        # resume's too) is read before the server knows this connection's capabilities.
        await send_frames(self._frames, ws, batch=self.proto.batch_limit, first_alone=True)

    async def _reader(self, ws: Any) -> None:
        frame: Any
        while True:
            try:
                frame = await ws.get_message()
            except ConnectionClosed:
                return
            if self.closed is not None:
                continue  # keep reading so the server's close handshake completes
            for item in self.proto.receive(frame):
                self._dispatch(item)
            if self.proto.queue:
                self._wake.set()
            self._flush()
            if self.proto.ack_due:
                self._acks.due(self._send_ack)

    def _send_ack(self) -> None:
        if self.proto.send_ack():
            self._flush()

    async def _runner(self) -> None:
        """Run app calls one at a time, in arrival order."""
        while True:
            ticket = self.proto.next_app_call()
            if ticket is None:
                await self._wake.wait()
                self._wake = trio.Event()
                continue
            result = await self.app_tools.run(ticket)
            if self.proto.answer(ticket.call_id, result):
                self._flush()

    async def _say_close(self) -> None:
        """Send ``close`` (once) and wait for the server's ``closed``."""
        if self.closed is None and self.proto.connection.state == "open" and not self._closing:
            self._closing = True
            self.proto.close()
            self._flush()
        if self.closed is None and self._closing:
            await self._closed.wait()

    async def _leave(self) -> None:
        """End the session for good: ``close``, its ``closed``, the connection's end; each
        up to CLOSE_TIMEOUT, or CANCEL_GRACE once the caller is cancelled."""
        try:
            await patiently(self._say_close, CLOSE_TIMEOUT)
        finally:
            self._closed_here()  # no answer, or no connection to ask on: closed here
        # Let the connection end on its own (the server closes it after ``closed``):
        # cancelling it would stop trio-websocket's reader, and a close handshake then
        # waits for a reply nobody reads.
        await patiently(self._links_done.wait, CLOSE_TIMEOUT)

    def _closed_here(self) -> None:
        if self.closed is None:
            self._dispatch(Closed(reason="client"))


@asynccontextmanager
async def open_client(
    ws: Any,
    tools: Sequence[AppTool] = (),
    *,
    capabilities: Sequence[str] = m.CAPABILITIES,
    reconnect: Reconnect | None = None,
    resume: bool = True,
    resume_timeout: float = RESUME_TIMEOUT,
    connect_timeout: float = CONNECT_TIMEOUT,
    max_message_size: int = MAX_MESSAGE_SIZE,
    audio: bool = False,
) -> AsyncIterator[Client]:
    """:func:`connect` over a connection: ``ws`` if given (see :mod:`vrt.testing`), else
    the first one ``reconnect`` opens.

    ``reconnect`` opens a new connection to the same server (an async context manager
    factory); without it, or with ``resume=False``, a lost connection ends the session
    (``Closed("lost")``). ``audio``: offer ``audio-v1`` (see :func:`connect`).
    """
    if ws is None and reconnect is None:
        raise TypeError("open_client needs a connection or a way to open one")
    if audio and m.AUDIO_V1 not in capabilities:
        capabilities = (*capabilities, m.AUDIO_V1)
    client = Client(
        tools,
        capabilities,
        reconnect,
        resume_timeout,
        resume=resume,
        connect_timeout=connect_timeout,
        max_message_size=max_message_size,
    )
    with single_unwrapped():
        async with trio.open_nursery() as nursery:
            await nursery.start(client._links, ws)
            nursery.start_soon(client._runner)
            nursery.start_soon(client._acks.run)
            try:
                yield client
            finally:
                try:
                    await client._leave()
                finally:
                    nursery.cancel_scope.cancel()
