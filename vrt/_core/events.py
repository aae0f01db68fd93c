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


_new = object.__new__
(
    _call_id,
    _turn_id,
    _epoch,
    _name,
    _kind,
    _phase,
    _delta,
    _arguments,
    _progress,
    _ok,
    _code,
    _message,
) = (getattr(ToolStream, f.name).__set__ for f in attrs.fields(ToolStream))


def tool_stream(
    call_id: str,
    turn_id: str,
    epoch: int,
    name: str,
    kind: Kind,
    phase: Phase,
    delta: str | None = None,
    arguments: Any = None,
    progress: Any = None,
    ok: bool | None = None,
    code: ResultCode | None = None,
    message: str | None = None,
) -> ToolStream:
    """``ToolStream(...)`` for the engine's hot path: the same record, its slots set
    directly (0.75 µs against attrs' 1.3; a call makes seven). ToolStream has no
    validators or converters for attrs' ``__init__`` to run; a test keeps the two equal."""
    event: ToolStream = _new(ToolStream)
    _call_id(event, call_id)
    _turn_id(event, turn_id)
    _epoch(event, epoch)
    _name(event, name)
    _kind(event, kind)
    _phase(event, phase)
    _delta(event, delta)
    _arguments(event, arguments)
    _progress(event, progress)
    _ok(event, ok)
    _code(event, code)
    _message(event, message)
    return event


class TextSoFar:
    """A call's arguments text so far as the engine holds it: the first ``count``
    fragments of a list that only grows, joined the first time someone reads it.

    Why: a preview per fragment, each with all the text so far, cost the square of the
    arguments' length when every preview was a new string (a 128 KiB argument in 4-byte
    fragments took seconds of CPU). Built this way a preview costs O(1) until read.
    """

    __slots__ = ("_count", "_fragments", "_text", "length")

    def __init__(self, fragments: list[str], count: int, length: int) -> None:
        self._fragments = fragments
        self._count = count
        self._text: str | None = None
        self.length = length
        """The text's length in characters (without joining it)."""

    def __str__(self) -> str:
        if self._text is None:
            self._text = "".join(self._fragments[: self._count])
        return self._text


@attrs.frozen(kw_only=True, eq=False, repr=False)
class ToolPreview:
    """The legacy preview of a call: the arguments' JSON text received so far."""

    call_id: str
    turn_id: str
    name: str
    _text: str | TextSoFar = attrs.field(alias="arguments")
    complete: bool

    @property
    def arguments(self) -> str:
        """The arguments' JSON text received so far."""
        text = self._text
        return text if isinstance(text, str) else str(text)

    def _key(self) -> tuple[str, str, str, str, bool]:
        return (self.call_id, self.turn_id, self.name, self.arguments, self.complete)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ToolPreview):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (
            f"ToolPreview(call_id={self.call_id!r}, turn_id={self.turn_id!r}, "
            f"name={self.name!r}, arguments={self.arguments!r}, complete={self.complete!r})"
        )


def preview_length(preview: ToolPreview) -> int:
    """``len(preview.arguments)``, without joining an engine preview's fragments."""
    text = preview._text
    return len(text) if isinstance(text, str) else text.length


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


def pcm16(pcm: object) -> bytes:
    """The user's voice as given to a ``send_audio`` (the session's or the client's), as
    bytes: TypeError for anything but bytes, ValueError for an odd length (not PCM16)."""
    if not isinstance(pcm, bytes | bytearray | memoryview):
        raise TypeError(f"pcm must be bytes, not {type(pcm).__name__}")
    data = bytes(pcm)
    if len(data) % 2:
        raise ValueError(f"pcm must be PCM16 (an even number of bytes), not {len(data)}")
    return data


@attrs.frozen(kw_only=True)
class AudioDelta:
    """A piece of the model's voice (a realtime model): PCM16 little-endian mono at
    ``sample_rate``. Only the current turn's: an interrupted turn's audio never follows
    its interrupt."""

    turn_id: str
    pcm: bytes = attrs.field(repr=lambda pcm: f"<{len(pcm)} bytes>")
    sample_rate: int


@attrs.frozen(kw_only=True)
class Transcript:
    """What was said aloud, as text (a realtime model's transcription): ``role``
    ``"user"`` (the user's speech, whole) or ``"agent"`` (the model's, a fragment)."""

    turn_id: str
    role: str
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
    | AudioDelta
    | Transcript
    | ConfirmRequest
    | Reconnecting
    | Resumed
    | Closed
)
"""Any event ``session.subscribe()`` and ``client.subscribe()`` yield."""
