"""A realtime model's connection: dial (TCP, TLS), the WebSocket upgrade, the pumps that send
and receive its messages within their bounds, and the reconnect loop with its backoff.

A :class:`Link` knows sockets, JSON and the API's protocol object, not turns: what the
model's events mean, and every state change, belong to its owner (the session's
:class:`~vrt._engine.realtime.Upstream`, through the narrow :class:`Owner` interface). The
owner's Upstream machine says when the user's audio may go and moves as the link connects,
loses its connection and tries again; the link only asks and reports.
"""

from __future__ import annotations

import contextlib
import json
import logging
import ssl
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Protocol
from urllib.parse import urlsplit

import trio
import trio_websocket

from vrt._engine.groups import single_unwrapped
from vrt.models._realtime import Message, RealtimeEvent, RealtimeModel, RealtimeProtocol

log = logging.getLogger("vrt")

AUDIO_BUFFER_SECONDS = 5.0
"""The user's audio held while the connection is busy or down: past it, the oldest goes
(counted in :attr:`Link.audio_dropped`)."""
MAX_UPSTREAM_MESSAGE = 16 * 1024 * 1024
"""Bytes of one message from the model (audio deltas are base64 in JSON)."""
RECONNECT_DELAYS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
"""Seconds between two attempts to connect (the last repeats)."""


class Owner(Protocol):
    """What a :class:`Link` asks of the driver that owns it."""

    def audio_may_go(self) -> bool:
        """Whether the user's audio may be sent now (not while the model session is set up)."""
        ...

    def setup(self, protocol: RealtimeProtocol) -> Iterable[Message]:
        """The first messages of a new connection, which speaks ``protocol``."""
        ...

    async def received(self, events: Sequence[RealtimeEvent], protocol: RealtimeProtocol) -> bool:
        """Act on the events of one message; True if they made the model session ready.
        Raises :class:`Fatal` when the model says the connection is over."""
        ...

    def lost(self) -> None:
        """The connection is gone (why: :attr:`Link.failure`); its queues are empty."""
        ...

    def retrying(self) -> None:
        """The backoff is over: the next attempt to connect begins."""
        ...


class Fatal(Exception):
    """The model said the connection is over."""


class Link:
    """One session's connection to its realtime model, held by :meth:`run` (see the
    module's docstring)."""

    def __init__(self, owner: Owner, model: RealtimeModel, session_id: str) -> None:
        self.owner = owner
        self.model = model
        self.session_id = session_id
        self.protocol: RealtimeProtocol | None = None
        """The API's protocol object of the current (or last) connection."""
        self.failure: str | None = None
        """Why the last attempt to connect failed (short, no secret), or None."""
        self.connections = 0
        """How many times the model session was set up (1 + reconnects)."""
        self.audio_dropped = 0
        """Bytes of the user's audio dropped because the buffer was full."""
        self._out: deque[Message] = deque()  # control messages, in order
        self._audio: deque[bytes] = deque()
        self._audio_bytes = 0
        self._wake = trio.Event()

    def send(self, messages: Iterable[Message]) -> None:
        """Queue control messages for the model, in order: sync, never blocks."""
        self._out.extend(messages)
        self._wake.set()

    def send_audio(self, pcm: bytes) -> None:
        """Queue the user's voice for the model: sync, never blocks; the buffer keeps the
        newest :data:`AUDIO_BUFFER_SECONDS` (the oldest is dropped and counted)."""
        limit = int(AUDIO_BUFFER_SECONDS * self.model.input_rate) * 2
        if len(pcm) > limit:
            self.audio_dropped += len(pcm) - limit
            pcm = pcm[len(pcm) - limit :]
        self._audio.append(pcm)
        self._audio_bytes += len(pcm)
        while self._audio_bytes > limit:  # the oldest goes, to the byte (PCM16: even)
            excess = self._audio_bytes - limit
            oldest = self._audio.popleft()
            if len(oldest) > excess:
                self._audio.appendleft(oldest[excess:])
                self._audio_bytes -= excess
                self.audio_dropped += excess
            else:
                self._audio_bytes -= len(oldest)
                self.audio_dropped += len(oldest)
        self._wake.set()

    async def run(self) -> None:
        """Hold the connection for the session's life, reconnecting with backoff when it is
        lost; runs until cancelled (with the session), the socket then closed at once."""
        attempt = 0
        while True:
            was_ready = await self._connection()
            if was_ready:
                attempt = 0
            delay = RECONNECT_DELAYS[min(attempt, len(RECONNECT_DELAYS) - 1)]
            attempt += 1
            if attempt == 1 or was_ready:
                log.warning(
                    "session %s: the realtime model's connection %s (%s): connecting again",
                    self.session_id,
                    "was lost" if was_ready else "failed",
                    self.failure,
                )
            await trio.sleep(delay)
            self.owner.retrying()

    async def _connection(self) -> bool:
        """One connection, until it is lost; whether the model session got ready."""
        url, headers = self.model.endpoint()
        protocol = self.model.protocol()
        self.protocol = protocol
        ready = False
        try:
            with single_unwrapped():
                async with (
                    _open_ws(url, headers, self.model.timeout) as ws,
                    trio.open_nursery() as nursery,
                ):
                    nursery.start_soon(self._writer, ws)
                    self.send(self.owner.setup(protocol))
                    with trio.fail_after(self.model.timeout):
                        while not ready:
                            ready = await self._read_one(ws, protocol)
                    self.connections += 1
                    self.failure = None
                    if self.connections > 1:
                        log.info("session %s: the realtime model is connected again",
                                 self.session_id)  # fmt: skip
                    while True:
                        await self._read_one(ws, protocol)
        except trio.TooSlowError:
            self.failure = f"no answer from the model within {self.model.timeout:g} s"
        except trio_websocket.ConnectionRejected as exc:
            self.failure = f"the model refused the connection (HTTP {exc.status_code})"
        except (trio_websocket.ConnectionClosed, trio_websocket.HandshakeError) as exc:
            reason = getattr(exc, "reason", None)
            code = getattr(reason, "code", None)
            self.failure = "the connection closed" + (f" ({code})" if code else "")
        except OSError as exc:
            self.failure = f"cannot connect: {exc.strerror or type(exc).__name__}"
        except trio.BrokenResourceError:  # a TLS handshake that failed (trio wraps the error)
            self.failure = "the TLS handshake with the model failed"
        except Fatal as exc:
            self.failure = str(exc)
        self._out.clear()
        self._audio.clear()  # the user's words of the outage: stale by the next connection
        self._audio_bytes = 0
        self.owner.lost()
        return ready

    async def _writer(self, ws: trio_websocket.WebSocketConnection) -> None:
        with contextlib.suppress(trio_websocket.ConnectionClosed):  # the reader sees it too
            await self._write(ws)

    async def _write(self, ws: trio_websocket.WebSocketConnection) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while self._out or (self._audio and self.owner.audio_may_go()):
                if self._out:
                    message = self._out.popleft()
                else:
                    pcm = self._audio.popleft()
                    self._audio_bytes -= len(pcm)
                    assert self.protocol is not None
                    message = self.protocol.audio(pcm)[0]
                await ws.send_message(json.dumps(message, separators=(",", ":")))

    async def _read_one(
        self, ws: trio_websocket.WebSocketConnection, protocol: RealtimeProtocol
    ) -> bool:
        """Read one message and hand its events to the owner; True if they made the model
        session ready."""
        data = await ws.get_message()
        try:
            message = json.loads(data)
            events = protocol.receive(message)
        except (ValueError, RecursionError) as exc:  # (JSON nested past Python's stack)
            log.debug("session %s: a message from the model dropped: %s",
                      self.session_id, str(exc)[:200])  # fmt: skip
            return False
        return await self.owner.received(events, protocol)


@asynccontextmanager
async def _open_ws(
    url: str, headers: list[tuple[str, str]], seconds: float
) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    """A WebSocket to the model: TCP (TLS for ``wss://``, the system's trust store), then
    the upgrade, each within ``seconds``. We open and always close the TCP stream
    ourselves: trio-websocket's client leaves it open when the server closes first. When
    the session closes (a cancel), the socket is closed without a close handshake: the
    reader that would take the peer's reply is cancelled with it."""
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise Fatal(f"not a ws:// or wss:// URL: {parts.scheme}://{parts.hostname}")
    secure = parts.scheme == "wss"
    port = parts.port or (443 if secure else 80)
    resource = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    with trio.fail_after(seconds):
        tcp = await trio.open_tcp_stream(parts.hostname, port)
    try:
        stream: trio.abc.Stream = tcp
        if secure:
            tls = trio.SSLStream(
                tcp,
                ssl.create_default_context(),
                server_hostname=parts.hostname,
                https_compatible=True,
            )
            with trio.fail_after(seconds):
                await tls.do_handshake()
            stream = tls
        async with trio.open_nursery() as nursery:
            with trio.fail_after(seconds):
                ws = await trio_websocket.wrap_client_stream(
                    nursery,
                    stream,  # type: ignore[arg-type]
                    parts.hostname,
                    resource,
                    extra_headers=[(k.encode(), v.encode()) for k, v in headers],
                    max_message_size=MAX_UPSTREAM_MESSAGE,
                    message_queue_size=16,
                )
            try:
                yield ws
            finally:
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await tcp.aclose()
