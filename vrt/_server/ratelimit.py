"""A session's inbound rate limit: a token bucket that decides, the reader acts.

The bucket outlives the session's connections. :meth:`RateLimit.check` says what to do with
one frame read at a given time, and nothing else: the connection's reader
(:class:`~vrt._server.link.Link`) waits, warns the client or closes the session on its word.
"""

from __future__ import annotations

import enum

RATE_CLOSE_AFTER = 5.0
"""Seconds a connection may stay over its message rate before its session is closed."""


class Verdict(enum.Enum):
    """What to do with a frame read (see :meth:`RateLimit.check`)."""

    READ = "read"
    """Read it now."""
    WARN = "warn"
    """The first wait of an episode: tell the client (``RATE_LIMITED``), wait, then read."""
    WAIT = "wait"
    """Wait, then read."""
    CLOSE = "close"
    """Over the rate for too long: close the session."""


class RateLimit:
    """``rate`` frames a second, with a second's worth of burst.

    A frame over it waits for its token, and the reader with it: the peer's frames back up
    (trio-websocket's queue, then TCP flow control), none is dropped. The first wait of an
    episode is a :attr:`Verdict.WARN`; waits that go on for RATE_CLOSE_AFTER seconds are a
    :attr:`Verdict.CLOSE`. An episode ends after a second without a wait.
    """

    __slots__ = ("_limited_at", "_limited_since", "_refill_at", "_tokens", "rate")

    def __init__(self, rate: float, now: float) -> None:
        self.rate = rate
        self._tokens = rate
        self._refill_at = now
        self._limited_since: float | None = None
        self._limited_at = 0.0

    def check(self, now: float) -> tuple[Verdict, float]:
        """The verdict on one frame read at ``now``, and the seconds to wait before it is
        read (after a wait, :meth:`waited`)."""
        rate = self.rate
        self._tokens = min(rate, self._tokens + (now - self._refill_at) * rate)
        self._refill_at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return Verdict.READ, 0.0
        wait = (1 - self._tokens) / rate
        if self._limited_since is None or now - self._limited_at > 1.0:
            self._limited_since = now
            return Verdict.WARN, wait
        if now - self._limited_since > RATE_CLOSE_AFTER:
            return Verdict.CLOSE, 0.0
        return Verdict.WAIT, wait

    def waited(self, now: float) -> None:
        """The frame waited for its token until ``now``: it takes it."""
        self._tokens, self._refill_at = 0.0, now
        self._limited_at = now

    def charge(self, messages: int) -> None:
        """``messages`` more read in the frame just admitted (a batch's others): the
        frames after it wait for their tokens, as if each message had come alone."""
        self._tokens -= messages
