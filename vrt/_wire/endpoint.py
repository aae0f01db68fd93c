"""What both sides of vrt/1 share: seq numbering, acks, de-duplication, the replay buffer.

Sans-IO: :meth:`Endpoint.send` numbers a message and queues its frame in :attr:`outbox`;
:meth:`Endpoint.accept` decides whether an incoming message is new (processed) or a replay
(dropped); acks trim the replay buffer. The owner drains :attr:`outbox` to its socket.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from vrt._wire import codec
from vrt._wire import messages as m

M = TypeVar("M")

ACK_EVERY = 50
"""Send an ack at least every this many processed messages (and every 200 ms)."""
REPLAY_LIMIT = 10_000
"""Default bound of the replay buffer (messages the peer has not acked)."""
REPLAY_LIMIT_BYTES = 2 * 1024 * 1024
"""Default bound of the replay buffer in bytes (the frames' characters, one byte each in
the ASCII the codec writes)."""
ERROR_MESSAGE_LIMIT = 300
"""The longest ``error`` message, in characters: a short explanation, never a frame echoed."""


class FrameTooLarge(Exception):
    """A message to send would make a frame over :attr:`Endpoint.max_frame` (not sent)."""


class Endpoint:
    """One side's delivery state for one session."""

    def __init__(
        self, *, replay_limit: int = REPLAY_LIMIT, replay_limit_bytes: int = REPLAY_LIMIT_BYTES
    ) -> None:
        self.outbox: list[str] = []
        self.sent_seq = 0
        """The last seq this side assigned."""
        self.received_seq = 0
        """The highest peer seq processed (answered with error counts)."""
        self.acked_by_peer = 0
        self.replay: deque[tuple[int, str]] = deque()
        self.replay_limit = replay_limit
        self.replay_bytes = 0
        """The size of the frames in :attr:`replay`."""
        self.replay_limit_bytes = replay_limit_bytes
        self.overflowed = False
        """The replay buffer went over its bound: the session can no longer resume."""
        self.max_frame: int | None = None
        """The largest frame the peer takes (characters: the codec writes ASCII); None: any."""
        self._ack_sent = 0
        self.batching = False
        """``batch-v1`` was negotiated: frames may carry arrays of messages."""
        self._ack_queued: tuple[int, str] | None = None
        """The outbox's last ack (index, frame), while not taken: a later one replaces it."""
        self.ack_limit: int | None = None
        """Ack nothing above this seq (None: all that is processed). A server with a store
        acks only what its last save holds: the client keeps the rest and replays it to
        the process that adopts the session if this one dies (``handover-v1``)."""

    @property
    def batch_limit(self) -> int:
        """The largest frame a writer may make of queued messages (``batch-v1``); 0: one
        message a frame."""
        return (self.max_frame or 0) if self.batching else 0

    # -- sending ----------------------------------------------------------------------------------

    def send(self, cls: Callable[..., M], **fields: Any) -> M:
        """Number a message of ``cls``, keep it for replay, and queue its frame.

        Raises :class:`FrameTooLarge` (and numbers nothing) if the frame is over
        :attr:`max_frame`: the peer would refuse it, and a resume would replay it forever.
        """
        message = cls(seq=self.sent_seq + 1, **fields)
        frame = codec.encode(message)
        if self.max_frame is not None and len(frame) > self.max_frame:
            raise FrameTooLarge(f"a {message.TYPE} frame of {len(frame)} bytes")  # type: ignore[attr-defined]
        self.sent_seq += 1
        self.outbox.append(frame)
        replay = self.replay
        replay.append((self.sent_seq, frame))
        self.replay_bytes += len(frame)
        while len(replay) > self.replay_limit or self.replay_bytes > self.replay_limit_bytes:
            self.overflowed = True  # the peer can no longer be given all it missed
            self.replay_bytes -= len(replay.popleft()[1])
        return message

    def send_unnumbered(self, cls: Callable[..., M], **fields: Any) -> M:
        """Queue a message outside the session's numbering (``seq`` 0): never replayed."""
        message = cls(seq=0, **fields)
        self.outbox.append(codec.encode(message))
        return message

    def error(
        self, code: str, message: str, ref: int | None = None, *, numbered: bool = True
    ) -> None:
        """Queue an ``error`` (numbered inside a session, seq 0 outside one).

        ``message`` is cut to :data:`ERROR_MESSAGE_LIMIT` characters: some quote the peer's
        own data (a JSON Schema error about a tool's parameters quotes the schema).
        """
        message = codec.shorten(message, ERROR_MESSAGE_LIMIT)
        if numbered:
            self.send(m.Error, code=code, message=message, ref=ref)
        else:
            self.send_unnumbered(m.Error, code=code, message=message, ref=ref)

    def take_outbox(self) -> list[str]:
        """The frames queued since the last call, in order."""
        frames, self.outbox = self.outbox, []
        self._ack_queued = None
        return frames

    # -- receiving --------------------------------------------------------------------------------

    def accept(self, seq: int) -> bool:
        """Whether a message numbered ``seq`` is new; if so it counts as processed.

        A replay (``seq`` not above the last processed) is dropped silently. Acks every
        :data:`ACK_EVERY` processed messages.
        """
        if seq <= self.received_seq:
            return False
        self.received_seq = seq
        if self._ackable - self._ack_sent >= ACK_EVERY:
            self.send_ack()
        return True

    @property
    def _ackable(self) -> int:
        limit = self.ack_limit
        return self.received_seq if limit is None else min(self.received_seq, limit)

    def peer_acked(self, seq: int) -> bool:
        """The peer processed everything up to ``seq``: forget those frames.

        False for an ack above :attr:`sent_seq`, which claims messages never sent (a broken
        peer): it is ignored, since taken it would stop every later, true ack from trimming
        the buffer, and the caller answers it as a protocol error.
        """
        if seq > self.sent_seq:
            return False
        if self.acked_by_peer < seq:
            self.acked_by_peer = seq
            replay = self.replay
            while replay and replay[0][0] <= seq:
                self.replay_bytes -= len(replay.popleft()[1])
        return True

    def ack_state_reset(self) -> None:
        """A new connection: ack what was processed again at the next chance."""
        self._ack_sent = 0

    @property
    def ack_due(self) -> bool:
        """Whether something processed (up to :attr:`ack_limit`) has not been acked yet."""
        return self._ackable > self._ack_sent

    def send_ack(self) -> bool:
        """Queue an ack for the highest processed seq (up to :attr:`ack_limit`) if it was
        not acked yet."""
        if not self.ack_due:
            return False
        self._ack_sent = seq = self._ackable
        frame = codec.encode(m.Ack(seq=seq))
        outbox, queued = self.outbox, self._ack_queued
        if queued is not None and queued[0] < len(outbox) and outbox[queued[0]] is queued[1]:
            # One ack still waits to be written (a batch of hundreds of messages reaches
            # ACK_EVERY several times): the newer one says all it said, in its place.
            outbox[queued[0]] = frame
            self._ack_queued = (queued[0], frame)
            return True
        self._ack_queued = (len(outbox), frame)
        outbox.append(frame)
        return True
