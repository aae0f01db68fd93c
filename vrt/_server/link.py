"""One connection carrying a session: its writer and its reader.

A session outlives its connections; while one carries it, that connection is a
:class:`Link`. The actor hands it frames in protocol order (:meth:`Link.send`, and the
model's voice with :meth:`Link.send_audio`), and one writer task sends them, so they leave
in that order. The reader (the task that accepted the connection) takes each frame past the
session's rate limit (:class:`~vrt._server.ratelimit.RateLimit`; the user's voice past its
bound in bytes instead, :class:`~vrt._server.voice.Voice`), then to the actor.
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import TYPE_CHECKING, Any

import trio
from trio_websocket import ConnectionClosed

from vrt._engine import telemetry
from vrt._net.pumps import Outgoing, send_frames
from vrt._server.ratelimit import Verdict
from vrt._wire.audio import Backlog

if TYPE_CHECKING:
    from vrt._net.accept import GuardedStream
    from vrt._server.actor import SessionActor

log = logging.getLogger("vrt.server")

FINISH_TIMEOUT = 5.0
"""Seconds a connection the session is done with has to take its last frames and close."""


class Link:
    """One connection carrying a session: its frames out, in order, and its reader.

    :attr:`backlog` counts the bytes queued and not yet written: a peer that stops reading
    (or acks what it never read) shows here, and the actor holds the model, then closes the
    session, on it. Once finished (the session closed, or a newer connection took it), the
    connection gets FINISH_TIMEOUT seconds to take what is queued and close; then, or at
    once on :meth:`abort`, its socket is reset, whatever the peer does.
    """

    __slots__ = (
        "aborted",
        "actor",
        "audio",
        "backlog",
        "batch",
        "close_code",
        "frames",
        "out",
        "scope",
        "stream",
        "ws",
    )

    def __init__(self, ws: Any, actor: SessionActor, stream: GuardedStream | None = None) -> None:
        self.ws = ws
        self.actor = actor
        self.stream = stream
        self.out, self.frames = trio.open_memory_channel[Outgoing](math.inf)
        self.backlog = 0
        """Bytes of text frames queued for the writer and not yet written."""
        voice = actor.voice
        self.audio = Backlog(voice.backlog_limit if voice is not None else 0)
        """The model's voice queued for the writer (``audio-v1``), bounded in bytes."""
        self.scope = trio.CancelScope()
        self.aborted = False
        self.batch = actor.proto.batch_limit
        """``batch-v1``: the largest batch frame (0: one message a frame)."""
        self.close_code = 1000
        """The WebSocket close code once finished (1012: the session was handed over)."""

    @property
    def current(self) -> bool:
        """Whether this connection still carries its open session (not replaced, not closed)."""
        return self.actor.link is self and self.actor.proto.state == "open"

    def send(self, frame: str) -> None:
        """Queue ``frame`` for the writer."""
        self.out.send_nowait(frame)
        self.backlog += len(frame)
        self.audio.cut()

    def send_audio(self, turn_id: str, frame: bytes) -> int:
        """Queue an audio frame of turn ``turn_id`` for the writer (after every frame queued
        so far); the bytes of that turn's audio dropped to stay under the backlog's bound
        (the oldest first)."""
        run, dropped = self.audio.add(turn_id, frame)
        if run is not None:
            self.out.send_nowait(run)
        return dropped

    def _sent(self, frame: str) -> None:
        self.backlog -= len(frame)
        self.actor.pace.written()

    def finish(self, code: int = 1000) -> None:
        """No more frames: the writer sends what it has, then closes the connection with
        ``code``, within FINISH_TIMEOUT seconds."""
        self.close_code = code
        self.out.close()
        self.scope.deadline = min(self.scope.deadline, trio.current_time() + FINISH_TIMEOUT)

    def abort(self) -> None:
        """Drop the connection now: nothing more is written, the socket is reset."""
        self.aborted = True
        self.out.close()
        self.scope.cancel()
        if self.stream is not None:
            self.stream.abort()

    def pending(self) -> list[str]:
        """The text frames the writer did not get to, in order (none once aborted): the
        audio among them is lost, as audio in flight is when a connection ends."""
        frames = []
        with contextlib.suppress(trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            while not self.aborted:
                frame = self.frames.receive_nowait()
                if type(frame) is str:
                    frames.append(frame)
        return frames

    async def run(self) -> None:
        """Read and write until the connection ends, the actor is done with it, or the
        finish deadline passes."""
        with self.scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer, nursery.cancel_scope)
                await self._reader()
                nursery.cancel_scope.cancel()
        if self.scope.cancelled_caught and not self.aborted:
            log.info("session %s: connection too slow to finish, reset", self.actor.log_id)
            self.abort()

    async def _writer(self, scope: trio.CancelScope) -> None:
        # The first frame is the welcome (or the resume's): never in a batch.
        voice = self.actor.voice
        pace = voice.outbound_rate() if voice is not None else None
        if await send_frames(
            self.frames,
            self.ws,
            self._sent,
            batch=self.batch,
            first_alone=True,
            metered=True,
            pace=pace,
        ):
            with trio.move_on_after(FINISH_TIMEOUT):
                await self.ws.aclose(code=self.close_code)  # closed, replaced or moved
        scope.cancel()

    async def _reader(self) -> None:
        actor = self.actor
        while True:
            try:
                frame = await self.ws.get_message()
            except ConnectionClosed:
                return
            telemetry.frame(telemetry.INBOUND, frame)
            if not self.current:
                continue  # replaced or closed: drain until the close handshake ends
            voice = actor.voice
            if voice is not None and type(frame) is not str:
                # The user's voice: bounded in bytes a second, not counted as messages.
                if voice.inbound(len(frame)):
                    actor.receive(frame)
                else:
                    voice.over_rate()
                continue
            verdict, wait = actor.rate.check(trio.current_time())
            if verdict is not Verdict.READ:
                if verdict is Verdict.CLOSE:
                    actor.over_rate()
                    continue
                if verdict is Verdict.WARN:
                    actor.rate_limited()
                await trio.sleep(wait)
                if not self.current:
                    continue  # replaced or closed while it waited: the newer reader reads
                actor.rate.waited(trio.current_time())
            actor.receive(frame)


async def send_and_close(ws: Any, frames: list[str], code: int = 1000) -> None:
    """Best effort, shielded, bounded: ``frames``, then close the connection (``code``)."""
    with trio.move_on_after(1.0) as scope:
        scope.shield = True
        try:
            for frame in frames:
                await ws.send_message(frame)
            await ws.aclose(code=code)
        except ConnectionClosed:
            pass
