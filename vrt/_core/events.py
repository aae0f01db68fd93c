"""Events an app receives from a session (in process) or a client (over the wire).

All are frozen, keyword-only attrs records. :class:`ToolStream` mirrors the wire's
``tool.stream`` message; :class:`ToolPreview` the legacy ``tool.preview``.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from vrt._core.results import Kind, ResultCode


class Phase(enum.StrEnum):
    """A call's stream phase; the values are the wire strings."""

    START = "start"
    ARGUMENTS_DELTA = "arguments-delta"
    ARGUMENTS_COMPLETE = "arguments-complete"
    PROGRESS = "progress"
    SETTLED = "settled"
    CANCELLED = "cancelled"
    FAILED = "failed"


#: The phases that end a call's stream.
TERMINAL_PHASES = frozenset({Phase.SETTLED, Phase.CANCELLED, Phase.FAILED})


@attrs.frozen(kw_only=True)
class ToolStream:
    """One lifecycle event of one call (the ``tool.stream`` message).

    Per phase: ``delta`` (arguments-delta), ``arguments`` (arguments-complete, the parsed
    object or the raw text when it did not parse), ``progress`` (progress), ``ok`` and
    ``code`` (settled), ``message`` (failed; for settled, a failure's message).
    A server tool's output is never included.
    """

    call_id: str
    turn_id: str
    epoch: int
    name: str
    kind: Kind
    phase: Phase
    delta: str | None = None
    arguments: Any = None
    progress: Any = None
    ok: bool | None = None
    code: ResultCode | None = None
    message: str | None = None


@attrs.frozen(kw_only=True)
class ToolPreview:
    """The legacy preview of a call: the arguments' JSON text received so far."""

    call_id: str
    turn_id: str
    name: str
    arguments: str
    complete: bool


@attrs.frozen(kw_only=True)
class TurnStarted:
    """A turn began (``turn.started``)."""

    turn_id: str
    epoch: int


@attrs.frozen(kw_only=True)
class TurnEnded:
    """A turn ended (``turn.ended``); ``epoch`` is the session's epoch after it ended."""

    turn_id: str
    epoch: int
    reason: str


@attrs.frozen(kw_only=True)
class TextDelta:
    """Model text, what the agent says (``text.delta``)."""

    turn_id: str
    text: str


@attrs.frozen(kw_only=True)
class ConfirmRequest:
    """The user must confirm a call (sent by :func:`vrt.require_confirmation`'s hook).

    Answer with ``await request.approve()`` or ``await request.deny(reason)``; a denial
    settles the call REJECTED with the reason. An interrupt while the request is open
    settles it INTERRUPTED; answering after that does nothing.
    """

    call_id: str
    name: str
    arguments: Any
    risk: str | None
    prompt: str
    _reply: Callable[[bool, str | None], Awaitable[None]] = attrs.field(
        alias="reply", eq=False, repr=False
    )

    async def approve(self) -> None:
        """Let the call run."""
        await self._reply(True, None)

    async def deny(self, reason: str = "the user declined") -> None:
        """Refuse the call: its result is REJECTED with ``reason``."""
        await self._reply(False, reason)


@attrs.frozen(kw_only=True)
class Closed:
    """The session is over for good (``closed``): clear any preview state.

    No terminal event is synthesized for calls still open when a session closes.
    """

    reason: str


@attrs.frozen(kw_only=True)
class Reconnecting:
    """The client lost its connection and is resuming the session (``vrt.connect`` only).

    The server keeps the session meanwhile: turns and server tools go on, and a running app
    tool goes on too; its result goes through after the resume. Either :class:`Resumed`
    or :class:`Closed` follows.
    """

    session_id: str


@attrs.frozen(kw_only=True)
class Resumed:
    """The session is back on a new connection; what was missed is replayed, in order."""

    session_id: str


Event = (
    ToolStream
    | ToolPreview
    | TurnStarted
    | TurnEnded
    | TextDelta
    | ConfirmRequest
    | Reconnecting
    | Resumed
    | Closed
)
