"""One session's voice on the wire (``audio-v1``): the user's in, the model's out.

The actor hands its :class:`Voice` what concerns audio; the Voice decides with the sans-IO
books of :mod:`vrt._wire.audio` and acts through the actor's protocol and connection:

- in: a binary frame must fit the bound in bytes a second (``audio_speed_limit``: past it,
  ``error`` ``RATE_LIMITED`` and the session closes); then the protocol checks it (an odd
  length, over 100 ms) and the session hears it (``session.send_audio``);
- out: a piece of the model's voice (:class:`~vrt.AudioDelta`) goes out only if its turn's
  epoch is the session's (an interrupted turn's is dropped), after its turn's
  ``audio.start``, in frames of at most 100 ms, on the current connection only (realtime
  data: none is kept for a resume), whose backlog keeps the newest when the client does
  not read and whose writer keeps to the bound;
- a turn's end: an interrupted turn's audio still queued is purged, then ``audio.end``
  with ``sentMs`` goes before its ``turn.ended``;
- the client's ``interrupt``: ``heardMs`` at most ``sentMs``, and the audio of the open
  turns still queued purged at once.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from vrt._core.events import AudioDelta, TurnEnded, TurnStarted
from vrt._engine import telemetry
from vrt._wire import messages as m
from vrt._wire.audio import (
    VOICE_BACKLOG_SECONDS,
    AudioInfo,
    ByteRate,
    Spans,
    bytes_per_second,
    split,
)

if TYPE_CHECKING:
    from vrt._server.actor import SessionActor

log = logging.getLogger("vrt.server")


class Voice:
    """One session's audio both ways (see the module)."""

    __slots__ = ("_actor", "_in", "dropped", "info", "spans", "speed")

    def __init__(self, actor: SessionActor, info: AudioInfo, speed: float) -> None:
        self._actor = actor
        self.info = info
        self.speed = speed
        """The bound of each direction, in times real time (``audio_speed_limit``)."""
        self.spans = Spans(info.output_rate)
        self._in = ByteRate.for_audio(info.input_rate, speed, trio.current_time())
        self.dropped = 0
        """Bytes of the model's voice never sent: dropped at the epoch gate, while
        detached, or by a connection's backlog (the client did not read, or the turn was
        interrupted)."""

    @property
    def backlog_limit(self) -> int:
        """The model's voice one connection may hold unwritten, in bytes."""
        return int(VOICE_BACKLOG_SECONDS * bytes_per_second(self.info.output_rate))

    def outbound_rate(self) -> ByteRate:
        """The bound of a connection's writer on the model's voice."""
        return ByteRate.for_audio(self.info.output_rate, self.speed, trio.current_time())

    # -- in -----------------------------------------------------------------------------------

    def inbound(self, size: int) -> bool:
        """Whether a binary frame of ``size`` bytes from the client is within the bound."""
        return self._in.take(size, trio.current_time())

    def over_rate(self) -> None:
        """The client's audio is over the bound: told why, and its session closed."""
        actor = self._actor
        limit = self._in.rate
        log.info(
            "session %s closed: its audio is over %d bytes a second (%gx real time)",
            actor.log_id,
            limit,
            self.speed,
        )
        telemetry.refused("audio_rate")
        actor.proto.error(
            m.RATE_LIMITED,
            f"audio over {limit:,.0f} bytes a second ({self.speed:g}x real time at "
            f"{self.info.input_rate} Hz): the session is closed",
        )
        actor.end("server")

    # -- out ----------------------------------------------------------------------------------

    def turn_started(self, event: TurnStarted) -> None:
        self.spans.started(event.turn_id, event.epoch)

    def delta(self, event: AudioDelta) -> None:
        """A piece of the model's voice: through the epoch gate, onto the connection."""
        actor = self._actor
        session = actor.session
        assert session is not None
        turn_id, pcm = event.turn_id, event.pcm
        spans = self.spans
        verdict = spans.admit(turn_id, session.epoch)
        if verdict is None:
            self.dropped += len(pcm)
            return
        if verdict is Spans.START:
            actor.proto.send(m.AudioStart, turn_id=turn_id, epoch=spans.epoch(turn_id))
            actor.flush()
        link = actor.link
        if link is None:
            self.dropped += len(pcm)  # detached: audio is never replayed
            return
        for frame in split(pcm, self.info.output_rate):
            lost = link.send_audio(turn_id, frame)
            spans.sent(turn_id, len(frame) - lost)
            self.dropped += lost

    def turn_ended(self, event: TurnEnded) -> None:
        """Before the turn's ``turn.ended``: its ``audio.end``, if it had audio."""
        turn_id = event.turn_id
        if event.reason == "interrupted":
            self._purge(turn_id)
        sent_ms = self.spans.end(turn_id)
        if sent_ms is not None:
            self._actor.proto.send(m.AudioEnd, turn_id=turn_id, sent_ms=sent_ms)

    # -- the client's interrupt -----------------------------------------------------------------

    def heard(self, heard_ms: int | None) -> int | None:
        """What the client's ``heardMs`` tells the model: at most what was sent of the open
        turn's audio (None: no ``heardMs``, or no open turn)."""
        session = self._actor.session
        turn = session.turn if session is not None else None
        return self.spans.heard(turn.turn_id if turn is not None else None, heard_ms)

    def interrupted(self) -> None:
        """The client interrupted: the open turns' audio still queued goes now."""
        for turn_id in self.spans.opened():
            self._purge(turn_id)

    def _purge(self, turn_id: str) -> None:
        link = self._actor.link
        if link is None:
            return
        purged = link.audio.purge(turn_id)
        if purged:
            self.spans.sent(turn_id, -purged)
            self.dropped += purged
