"""Every vrt/1 message as a frozen, keyword-only attrs record.

Field names are the Python (snake_case) spelling of the wire's camelCase ones; the codec
renames them. ``seq`` is every message's delivery number (0 outside a session and for
acks). ``TYPE`` is the wire ``type``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

PROTOCOL = "vrt/1"
TOOL_STREAM_V1 = "tool-stream-v1"
BATCH_V1 = "batch-v1"
"""After ``welcome``, a frame may carry a JSON array of messages, in either direction."""
LOCAL_PREVIEW_V1 = "local-preview-v1"
"""The client derives ``tool.preview`` from ``tool.stream``: none on the wire (with
``tool-stream-v1`` only)."""
BATCH_MESSAGES = 100
"""The most messages one batch holds in this implementation: both Python writers stay
under it, and the server reads no further (a frame of tiny messages would otherwise hold
tens of thousands, each handled before the server's thread does anything else)."""
HANDOVER_V1 = "handover-v1"
"""The session may move to another server process: close code 1012 means "resume now,
elsewhere", and a resume ``hello`` says which calls (and turn) the client holds open."""
AUDIO_V1 = "audio-v1"
"""Binary frames carry PCM16 audio both ways, in ``audio.start``/``audio.end`` spans
(PROTOCOL.md, "Audio"). Not in :data:`CAPABILITIES`: a client offers it when it has a
microphone and a speaker (vrt.js with ``audio: true``)."""
CAPABILITIES: tuple[str, ...] = (TOOL_STREAM_V1, BATCH_V1, LOCAL_PREVIEW_V1, HANDOVER_V1)
"""What both Python sides support and offer by default."""
LEGACY: tuple[str, ...] = (TOOL_STREAM_V1,)
"""What they offered before batches and local previews: the wire of one object a frame,
previews included."""


def local_previews(capabilities: tuple[str, ...]) -> bool:
    """Whether ``local-preview-v1`` applies: negotiated, with ``tool-stream-v1``."""
    return LOCAL_PREVIEW_V1 in capabilities and TOOL_STREAM_V1 in capabilities


# -- parts ---------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ToolDecl:
    """An app tool as the client declares it in ``hello``."""

    name: str
    description: str
    parameters: dict[str, Any]


@attrs.frozen(kw_only=True)
class ResumeRequest:
    """``hello.resume``: the session to resume and the last server seq processed."""

    session_id: str
    token: str = attrs.field(repr=False)  # a secret: never in a log or a repr
    last_seq: int


@attrs.frozen(kw_only=True)
class OpenCall:
    """``hello.open`` (``handover-v1``): a call the resuming client holds open (no terminal
    phase seen), or with no ``call_id`` the turn it holds open (``turn.started`` seen, not
    ``turn.ended``). ``name`` and ``kind`` are what the client saw at the call's start."""

    turn_id: str
    call_id: str | None = None
    name: str | None = None
    kind: str | None = None


OPEN_LIMIT = 256
"""The most entries a resume hello's ``open`` holds (the server's max_open_calls is 64)."""


@attrs.frozen(kw_only=True)
class WireResult:
    """An app tool's result on the wire: ``{"ok": true, "output": ...}`` or a failure."""

    ok: bool
    output: Any = None
    code: str | None = None
    message: str | None = None


# -- client to server ----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Hello:
    TYPE: ClassVar[str] = "hello"
    seq: int
    protocol: str
    capabilities: tuple[str, ...] = ()
    tools: tuple[ToolDecl, ...] = ()
    resume: ResumeRequest | None = None
    open: tuple[OpenCall, ...] = ()


@attrs.frozen(kw_only=True)
class Input:
    TYPE: ClassVar[str] = "input"
    seq: int
    text: str


@attrs.frozen(kw_only=True)
class Interrupt:
    TYPE: ClassVar[str] = "interrupt"
    seq: int
    epoch: int
    heard_ms: int | None = None
    """``audio-v1``: the milliseconds of the current turn's audio the client played."""


@attrs.frozen(kw_only=True)
class ToolResultMessage:
    TYPE: ClassVar[str] = "tool.result"
    seq: int
    call_id: str
    epoch: int
    result: WireResult


@attrs.frozen(kw_only=True)
class ConfirmReply:
    TYPE: ClassVar[str] = "confirm.reply"
    seq: int
    call_id: str
    approved: bool
    reason: str | None = None


@attrs.frozen(kw_only=True)
class Ack:
    TYPE: ClassVar[str] = "ack"
    seq: int


@attrs.frozen(kw_only=True)
class Close:
    TYPE: ClassVar[str] = "close"
    seq: int


# -- server to client ----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Welcome:
    TYPE: ClassVar[str] = "welcome"
    seq: int
    session_id: str
    resume_token: str = attrs.field(repr=False)
    epoch: int
    capabilities: tuple[str, ...]
    resumed: bool
    last_seq: int
    audio: dict[str, Any] | None = None
    """With ``audio-v1``: ``{"input": {"format": "pcm16", "rate": R}, "output": ...}``."""


@attrs.frozen(kw_only=True)
class TurnStartedMessage:
    TYPE: ClassVar[str] = "turn.started"
    seq: int
    turn_id: str
    epoch: int


@attrs.frozen(kw_only=True)
class TextDeltaMessage:
    TYPE: ClassVar[str] = "text.delta"
    seq: int
    turn_id: str
    text: str


@attrs.frozen(kw_only=True)
class ToolStreamMessage:
    TYPE: ClassVar[str] = "tool.stream"
    seq: int
    call_id: str
    turn_id: str
    epoch: int
    name: str
    kind: str
    phase: str
    delta: str | None = None
    arguments: Any = None
    progress: Any = None
    ok: bool | None = None
    code: str | None = None
    message: str | None = None


@attrs.frozen(kw_only=True)
class ToolPreviewMessage:
    TYPE: ClassVar[str] = "tool.preview"
    seq: int
    call_id: str
    turn_id: str
    name: str
    arguments: str
    complete: bool


@attrs.frozen(kw_only=True)
class ToolCallMessage:
    TYPE: ClassVar[str] = "tool.call"
    seq: int
    call_id: str
    turn_id: str
    epoch: int
    name: str
    arguments: Any


@attrs.frozen(kw_only=True)
class ToolAbort:
    TYPE: ClassVar[str] = "tool.abort"
    seq: int
    call_id: str


@attrs.frozen(kw_only=True)
class ConfirmRequestMessage:
    TYPE: ClassVar[str] = "confirm.request"
    seq: int
    call_id: str
    name: str
    arguments: Any
    risk: str | None
    prompt: str


@attrs.frozen(kw_only=True)
class TurnEndedMessage:
    TYPE: ClassVar[str] = "turn.ended"
    seq: int
    turn_id: str
    epoch: int
    reason: str


@attrs.frozen(kw_only=True)
class Error:
    TYPE: ClassVar[str] = "error"
    seq: int
    code: str
    message: str
    ref: int | None = None


@attrs.frozen(kw_only=True)
class ClosedMessage:
    TYPE: ClassVar[str] = "closed"
    seq: int
    reason: str


@attrs.frozen(kw_only=True)
class AudioStart:
    """``audio-v1``: the turn's audio follows, in binary frames, until ``audio.end``."""

    TYPE: ClassVar[str] = "audio.start"
    seq: int
    turn_id: str
    epoch: int


@attrs.frozen(kw_only=True)
class AudioEnd:
    """``audio-v1``: the turn's last audio frame was sent; ``sent_ms`` of audio in all."""

    TYPE: ClassVar[str] = "audio.end"
    seq: int
    turn_id: str
    sent_ms: int


@attrs.frozen(kw_only=True)
class Transcript:
    """``audio-v1``: the model's transcript of the user's or the agent's speech."""

    TYPE: ClassVar[str] = "transcript"
    seq: int
    turn_id: str
    role: str
    text: str


ClientMessage = Hello | Input | Interrupt | ToolResultMessage | ConfirmReply | Ack | Close
ServerMessage = (
    Welcome
    | TurnStartedMessage
    | TextDeltaMessage
    | ToolStreamMessage
    | ToolPreviewMessage
    | ToolCallMessage
    | ToolAbort
    | ConfirmRequestMessage
    | TurnEndedMessage
    | Error
    | ClosedMessage
    | Ack
)
Message = ClientMessage | ServerMessage

CLIENT_TYPES: tuple[type[Any], ...] = (
    Hello,
    Input,
    Interrupt,
    ToolResultMessage,
    ConfirmReply,
    Ack,
    Close,
)
SERVER_TYPES: tuple[type[Any], ...] = (
    Welcome,
    TurnStartedMessage,
    TextDeltaMessage,
    ToolStreamMessage,
    ToolPreviewMessage,
    ToolCallMessage,
    ToolAbort,
    ConfirmRequestMessage,
    TurnEndedMessage,
    Error,
    ClosedMessage,
    Ack,
)

AUDIO_SERVER_TYPES: tuple[type[Any], ...] = (AudioStart, AudioEnd, Transcript)
"""The server's ``audio-v1`` messages: with their schemas and records here, for vrt.js
(which speaks ``audio-v1``); outside :data:`SERVER_TYPES` while the Python client does not
offer it, so to it they are unknown types, as any message of a capability it lacks."""

#: Error codes of PROTOCOL.md.
BAD_JSON = "BAD_JSON"
BAD_MESSAGE = "BAD_MESSAGE"
UNKNOWN_TYPE = "UNKNOWN_TYPE"
TOO_LARGE = "TOO_LARGE"
BAD_STATE = "BAD_STATE"
UNKNOWN_CALL = "UNKNOWN_CALL"
STALE_EPOCH = "STALE_EPOCH"
DUPLICATE_RESULT = "DUPLICATE_RESULT"
UNSUPPORTED_PROTOCOL = "UNSUPPORTED_PROTOCOL"
RESUME_FAILED = "RESUME_FAILED"
TOOL_CONFLICT = "TOOL_CONFLICT"
RATE_LIMITED = "RATE_LIMITED"
INTERNAL = "INTERNAL"
