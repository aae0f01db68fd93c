"""What the tasks of both sides share: a connection's one writer, and the 200 ms ack rule."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import trio
from trio_websocket import ConnectionClosed

from vrt._engine import telemetry
from vrt._wire import messages as m
from vrt._wire.audio import AudioRun, ByteRate

log = logging.getLogger("vrt")

CANCEL_GRACE = 0.25
"""What a goodbye step (a close frame, a close handshake) gets once its task is being
cancelled: leaving ``vrt.connect`` by cancellation returns within a second."""


def cancelled() -> bool:
    """Whether the calling task is being cancelled (an enclosing scope is)."""
    return trio.current_effective_deadline() == -math.inf


async def patiently(step: Callable[[], Awaitable[object]], patience: float) -> None:
    """Await ``step()`` for up to ``patience`` seconds, shielded from nothing: a cancel
    that arrives meanwhile (or had already) cuts it to :data:`CANCEL_GRACE`, shielded, and
    is re-raised. For a goodbye that should be polite, but never hold a cancelled caller."""
    if not cancelled():
        try:
            with trio.move_on_after(patience):
                await step()
            return
        except trio.Cancelled:
            with trio.move_on_after(CANCEL_GRACE) as grace:
                grace.shield = True
                await step()
            raise
    with trio.move_on_after(CANCEL_GRACE) as grace:
        grace.shield = True
        await step()


Outgoing = str | AudioRun
"""What a connection's queue holds: text frames, and runs of audio frames (``audio-v1``)."""


async def send_frames(
    frames: trio.MemoryReceiveChannel[Outgoing],
    ws: Any,
    sent: Callable[[str], object] | None = None,
    *,
    batch: int = 0,
    first_alone: bool = False,
    metered: bool = False,
    pace: ByteRate | None = None,
) -> bool:
    """Send every frame from ``frames`` on ``ws`` until the channel closes (True) or the
    connection does (False); ``sent(frame)`` after each text frame.

    The one writer of a connection, so frames leave in the order they were queued. Frames
    already queued go out without a scheduler pass each (a pass per frame cost ~10 us).
    ``batch`` (``batch-v1``): the largest frame the peer takes; the messages already
    queued when the writer runs go out as one JSON array of at most that size and
    :data:`~vrt._wire.messages.BATCH_MESSAGES` messages (it never
    waits for more, so a batch adds no latency), a message alone as itself.
    ``first_alone``: the first frame is never batched (the server's ``welcome``, which
    tells the client batches may follow). ``metered``: count each frame sent in the
    server's metrics.

    An :class:`~vrt._wire.audio.AudioRun` in the queue is sent as binary frames, one at a
    time, never batched, until it is empty (frames that join it meanwhile too); ``pace``
    bounds them in bytes a second (the writer waits, nothing is dropped for speed).
    """
    held: Outgoing | None = None  # taken from the channel, but not for the last batch
    first = first_alone
    while True:
        if held is not None:
            frame, held = held, None
        else:
            try:
                frame = frames.receive_nowait()
            except trio.WouldBlock:
                try:
                    frame = await frames.receive()
                except trio.EndOfChannel:
                    return True
            except trio.EndOfChannel:
                return True
        if isinstance(frame, AudioRun):
            if not await _send_run(frame, ws, pace, metered):
                return False
            continue
        group: list[str] | None = None
        if batch and not first:
            size, count = len(frame) + 2, 1
            while count < m.BATCH_MESSAGES:
                try:
                    more = frames.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                if isinstance(more, AudioRun):  # audio: never in a batch
                    held = more
                    break
                size += len(more) + 1
                if size > batch:
                    held = more
                    break
                if group is None:
                    group = [frame]
                group.append(more)
                count += 1
        first = False
        data = frame if group is None else "[" + ",".join(group) + "]"
        try:
            await ws.send_message(data)
        except ConnectionClosed:
            return False
        if metered:
            telemetry.frame(telemetry.OUTBOUND, data)
        if sent is not None:
            if group is None:
                sent(frame)
            else:
                for one in group:
                    sent(one)


async def _send_run(run: AudioRun, ws: Any, pace: ByteRate | None, metered: bool) -> bool:
    """Send ``run``'s frames until it is empty (True), or the connection closed (False).
    Each frame is taken only when it goes: while the writer waits for ``pace``, the
    backlog may still drop or purge it."""
    while (size := run.peek()) is not None:
        if pace is not None:
            wait = pace.wait(size, trio.current_time())
            if wait > 0:
                await trio.sleep(wait)
                continue  # (the frame may be gone meanwhile)
            pace.charge(size, trio.current_time())
        data = run.take()
        try:
            await ws.send_message(data)
        except ConnectionClosed:
            return False
        if metered:
            telemetry.frame(telemetry.OUTBOUND, data)
    return True


ACK_INTERVAL = 0.2
"""An ack goes out at most this long after the first message it acknowledges."""


class AckTimer:
    """The 200 ms ack rule for any number of sessions, in one task asleep while no ack is due.

    Call :meth:`due` with a session's ``send`` when one of its processed messages has not
    been acked (``ack_due``); :meth:`run` calls ``send()`` once, ACK_INTERVAL later (more
    ``due`` calls meanwhile change nothing). A server runs one for all its sessions: a
    timer task per session cost a task's memory each, and waking every 200 ms took half a
    core for 1,000 idle sessions (bench/load.py).
    """

    def __init__(self) -> None:
        # A list and a dict, not a deque and a set: a client has one of these, and an idle
        # one should cost little (due entries leave in batches, so no pop(0) per entry).
        self._queue: list[tuple[float, Callable[[], object]]] = []
        self._armed: dict[Callable[[], object], None] = {}
        self._wake: trio.Event | None = None

    def due(self, send: Callable[[], object]) -> None:
        """Something of ``send``'s session waits for an ack."""
        if send in self._armed:
            return
        self._armed[send] = None
        self._queue.append((trio.current_time() + ACK_INTERVAL, send))
        if self._wake is not None:
            self._wake.set()

    async def run(self) -> NoReturn:
        """Send acks when they are due, until cancelled (a task of its own)."""
        queue = self._queue
        while True:
            if not queue:
                self._wake = trio.Event()
                await self._wake.wait()
                self._wake = None
            await trio.sleep_until(queue[0][0])
            now = trio.current_time()
            due = 0
            while due < len(queue) and queue[due][0] <= now:
                due += 1
            sends = [send for _, send in queue[:due]]
            del queue[:due]
            for send in sends:
                del self._armed[send]
                try:
                    send()
                except Exception:  # one session's bug must not stop every session's acks
                    log.exception("sending an ack failed")
