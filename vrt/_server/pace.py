"""Backpressure: the model held while a session's client is far behind.

The engine asks before each model event whether it may go on (``Session.pace``). A client
far behind (unacked messages over the high water mark, or unacked or unwritten bytes over
40 % of ``replay_limit_bytes``), or detached, holds it; an ack, a frame written or a resume
lets it look again. A connected client that makes no progress for STALL_TIMEOUT seconds
while held has stopped reading: its session closes (``overflow``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from vrt._server.actor import SessionActor

STALL_TIMEOUT = 30.0
"""A connected client held at the high water mark this long without acking is closed."""


class Pace:
    """One session's backpressure (see the module)."""

    __slots__ = ("_actor", "_moved")

    def __init__(self, actor: SessionActor) -> None:
        self._actor = actor
        self._moved: trio.Event | None = None
        """Set when the client may have caught up (made when someone waits: idle sessions
        are many, and each object counts)."""

    def look_again(self) -> None:
        """Something changed (a resume, a frame sent): a held model looks again."""
        if self._moved is not None:
            self._moved.set()

    def acked(self) -> None:
        """The client acked: a held model looks again if the writer makes headway too (a
        client that acks what it never read, its socket full, makes no progress)."""
        if self._moved is not None and self._draining():
            self._moved.set()

    written = acked
    """The writer sent a frame: the same question."""

    async def wait(self) -> None:
        """Hold the model while the client is far behind (or detached): see the module.
        A detached client is waited for until the resume window ends."""
        actor = self._actor
        proto = actor.proto
        while self._behind() and proto.state != "closed":
            moved = self._moved = trio.Event()
            if proto.state == "detached":
                await moved.wait()
                continue
            with trio.move_on_after(STALL_TIMEOUT):
                await moved.wait()
                continue
            actor.overflow(f"no progress for {STALL_TIMEOUT:g} s while held")
            await trio.lowlevel.checkpoint()

    def _draining(self) -> bool:
        """Whether the current connection's backlog is under the high water mark."""
        link = self._actor.link
        return link is None or link.backlog <= self._actor.options.high_water_bytes

    def _behind(self) -> bool:
        actor = self._actor
        proto, options, link = actor.proto, actor.options, actor.link
        return (
            proto.sent_seq - proto.acked_by_peer > options.high_water
            or proto.replay_bytes > options.high_water_bytes
            or (link is not None and link.backlog > options.high_water_bytes)
        )
