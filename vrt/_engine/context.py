"""What a running tool receives: its identity, its abort signal, progress, safe commits."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from vrt._errors import CallAborted


class Signal:
    """Mirrors the reference's AbortSignal: ``aborted``, ``reason``, ``await wait()``.

    It aborts when the call's turn is interrupted (reason ``"interrupted"``) or at the
    call's timeout deadline (``"timeout"``); an app tool's also when the server gave up on
    the call for another reason (``"aborted"``) or the session closed (``"closed"``). The
    task is cancelled at its next checkpoint as well; the signal is for code between
    checkpoints and right before committing.
    """

    __slots__ = ("_aborted", "_deadline", "_event", "_reason")

    def __init__(self) -> None:
        self._aborted = False
        self._reason: str | None = None
        self._deadline: float | None = None
        self._event: trio.Event | None = None

    @property
    def aborted(self) -> bool:
        """Whether the call should stop: its turn was interrupted or its deadline passed."""
        if (
            not self._aborted
            and self._deadline is not None
            and trio.current_time() >= self._deadline
        ):
            self.abort("timeout")
        return self._aborted

    @property
    def reason(self) -> str | None:
        """``"interrupted"`` or ``"timeout"`` once aborted, else None."""
        return self._reason if self.aborted else None

    async def wait(self) -> None:
        """Return once the signal has aborted. Cancellable like any Trio wait."""
        if self.aborted:
            await trio.lowlevel.checkpoint()
            return
        if self._event is None:
            self._event = trio.Event()
        with trio.move_on_at(self._deadline if self._deadline is not None else math.inf):
            await self._event.wait()
        self.abort("timeout")  # no-op if the event fired first

    def abort(self, reason: str) -> None:
        """Abort (idempotent: the first reason stays)."""
        if self._aborted:
            return
        self._aborted = True
        self._reason = reason
        if self._event is not None:
            self._event.set()

    def set_deadline(self, deadline: float) -> None:
        """Abort with reason ``"timeout"`` from ``deadline`` (Trio time) on."""
        self._deadline = deadline

    def __repr__(self) -> str:
        return f"<Signal aborted={self.aborted} reason={self.reason!r}>"


class ToolContext:
    """The second argument of a server tool's ``run``: ``call_id``, ``turn_id``, ``epoch``,
    ``name``, ``principal``, ``signal``, ``emit(progress)`` and ``committing()``.

    ``principal`` is what ``vrt.serve``'s ``authenticate`` hook returned for the session's
    connection (None in process, without the hook, and in app tools).

    Group a turn's effects by ``turn_id`` to undo it whole; use ``call_id`` as an
    idempotency key.
    """

    __slots__ = (
        "_max_progress",
        "_progress",
        "call_id",
        "epoch",
        "name",
        "principal",
        "signal",
        "turn_id",
    )

    def __init__(
        self,
        *,
        call_id: str,
        turn_id: str,
        epoch: int,
        name: str,
        signal: Signal,
        progress: Callable[[Any], None],
        principal: Any = None,
        max_progress_bytes: int | None = None,
    ) -> None:
        self.call_id = call_id
        self.principal = principal
        self.turn_id = turn_id
        self.epoch = epoch
        self.name = name
        self.signal = signal
        self._progress = progress
        self._max_progress = max_progress_bytes

    def emit(self, progress: Any) -> None:
        """Report progress (a ``progress`` stream phase). Synchronous, never blocks.

        Progress reported after the call ended (interrupted, timed out) is dropped.
        Raises TypeError at once if ``progress`` is not JSON: it is application data the
        app receives over the wire; and ValueError if its JSON is over the server's limit
        (``vrt.serve``: half its ``max_message_size``), which no client takes.
        """
        try:
            text = json.dumps(progress, allow_nan=False)  # NaN and Infinity are not JSON
        except (TypeError, ValueError) as exc:
            raise TypeError(f"progress must be JSON-serialisable: {exc}") from None
        limit = self._max_progress
        if limit is not None and len(text) > limit:
            raise ValueError(f"progress is {len(text)} bytes of JSON, over the limit of {limit}")
        self._progress(progress)

    @asynccontextmanager
    async def committing(self) -> AsyncIterator[None]:
        """Guard the block that commits the tool's effect.

        Raises :class:`~vrt.CallAborted` if the signal has already aborted; otherwise the
        block runs shielded from cancellation, so an interrupt arriving mid-commit cannot
        leave it half done. The interrupt still wins afterwards: the call's result is
        INTERRUPTED and whatever the tool returns is dropped.
        """
        if self.signal.aborted:
            raise CallAborted(f"call {self.call_id} was aborted ({self.signal.reason})")
        with trio.CancelScope(shield=True):
            yield

    def __repr__(self) -> str:
        return f"<ToolContext {self.name} call_id={self.call_id!r} turn_id={self.turn_id!r}>"
