"""What ``subscribe()`` yields: a receive channel of events that reads bursts cheaply."""

from __future__ import annotations

from typing import TypeVar

import trio

T = TypeVar("T")

BURST = 64
"""Events taken without yielding to the scheduler before :class:`Subscription` yields."""


class Subscription(trio.abc.ReceiveChannel[T]):
    """A memory receive channel whose iteration takes buffered events in bursts.

    Why: a tool call produces about fourteen events, and ``MemoryReceiveChannel.receive``
    always yields to the scheduler, even with events waiting; with one subscriber that
    scheduler pass per event cost more than the engine itself (about 90 of 130 µs per
    call). ``receive()`` and every iteration step remain cancel points, as in Trio; the
    iteration is a schedule point whenever it has to wait and at least every
    :data:`BURST` events, so a subscriber never starves other tasks.
    """

    __slots__ = ("_burst", "_channel")

    def __init__(self, channel: trio.MemoryReceiveChannel[T]) -> None:
        self._channel = channel
        self._burst = 0

    def receive_nowait(self) -> T:
        """The next buffered event, or raise ``trio.WouldBlock``."""
        return self._channel.receive_nowait()

    async def receive(self) -> T:
        """The next event; a cancel point, and a schedule point at least every BURST calls.

        Raises ``trio.EndOfChannel`` after the session's last event (:class:`~vrt.Closed`).
        """
        try:
            return await self.__anext__()
        except StopAsyncIteration:
            raise trio.EndOfChannel from None

    async def __anext__(self) -> T:
        # The iteration is the hot path (14 events a call): one coroutine a step here,
        # where trio's ReceiveChannel.__anext__ awaits receive(), two.
        if self._burst < BURST:
            await trio.lowlevel.checkpoint_if_cancelled()
            try:
                event = self._channel.receive_nowait()
            except trio.WouldBlock:
                pass
            except trio.EndOfChannel:
                raise StopAsyncIteration from None
            else:
                self._burst += 1
                return event
        self._burst = 0
        try:
            return await self._channel.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    def close(self) -> None:
        """Stop receiving; the session drops this subscriber at its next event."""
        self._channel.close()

    async def aclose(self) -> None:
        """Like :meth:`close`, as a checkpoint."""
        await self._channel.aclose()

    def statistics(self) -> trio.MemoryChannelStatistics:
        """The underlying memory channel's statistics (e.g. ``current_buffer_used``)."""
        return self._channel.statistics()
