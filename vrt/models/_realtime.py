"""Realtime (speech-to-speech) models: the sans-IO contract between the engine and an API.

A realtime model (OpenAI Realtime, Gemini Live) is held open over one WebSocket for a
session's life and keeps its own conversation. The engine (``vrt._engine.realtime``) owns
everything that decides what happens (turns, calls, barge-in, one answer per call); an
API's *protocol* only translates, in both directions, with no I/O:

- :meth:`RealtimeProtocol.receive` turns one JSON message from the server into the generic
  :data:`RealtimeEvent` list below (possibly empty: a message the engine does not need);
- the other methods turn what the engine decided into the JSON messages to send.

A realtime model class (:class:`RealtimeModel`) holds the configuration, makes one protocol
per connection, and says where and how to connect (the API key goes in a header only).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol, TypeGuard, runtime_checkable

import attrs

from vrt._core.results import CallRecord
from vrt.models._protocol import CallDelta, CallEnd, CallStart, HistoryItem, Text, ToolSpec, Usage

# -- what a protocol decodes from the server -----------------------------------------------------


@attrs.frozen(kw_only=True)
class Ready:
    """The model session is set up (OpenAI ``session.updated``/``session.created`` after our
    ``session.update``; Gemini ``setupComplete``): the seed may be sent now."""


@attrs.frozen(kw_only=True)
class ResponseStarted:
    """The model began a response (OpenAI ``response.created``; Gemini: the first content
    or ``toolCall`` after the previous response ended, with an id the protocol makes)."""

    response_id: str


@attrs.frozen(kw_only=True)
class ResponseOutput:
    """Text the model writes (output "text"), or a call: ``CallStart``, ``CallDelta``
    (OpenAI streams arguments), ``CallEnd`` (only for a call item that *completed*: a call
    cut off mid-arguments never gets one), or ``Usage``."""

    response_id: str
    event: Text | CallStart | CallDelta | CallEnd | Usage


@attrs.frozen(kw_only=True)
class AudioOut:
    """A piece of the model's voice: PCM16 little-endian mono at the model's output rate.
    ``item_id``: the assistant item it belongs to (what a truncate names; Gemini: "")."""

    response_id: str
    item_id: str
    pcm: bytes


@attrs.frozen(kw_only=True)
class TranscriptOut:
    """What the model said aloud, as text (a fragment)."""

    response_id: str
    text: str


@attrs.frozen(kw_only=True)
class UserTranscript:
    """What the user said, as text (the API's transcription of the input audio)."""

    text: str


@attrs.frozen(kw_only=True)
class ResponseDone:
    """The response ended: ``status`` ``completed``, ``cancelled`` (an interrupt),
    ``incomplete`` (cut off: a length limit) or ``failed`` (``message`` says why).

    Gemini: at ``turnComplete``, at a ``toolCall`` (the model then waits for the answers),
    or at ``interrupted``."""

    response_id: str
    status: Literal["completed", "cancelled", "incomplete", "failed"]
    message: str | None = None


@attrs.frozen(kw_only=True)
class SpeechStarted:
    """The model's voice detector heard the user start speaking (OpenAI
    ``input_audio_buffer.speech_started``; Gemini ``serverContent.interrupted``, which also
    ends the response)."""

    audio_ms: int | None = None


@attrs.frozen(kw_only=True)
class CallsCancelled:
    """Gemini ``toolCallCancellation``: these calls must get no answer."""

    call_ids: tuple[str, ...]


@attrs.frozen(kw_only=True)
class Settled:
    """Gemini ``turnComplete`` after an interrupt: the cancelled ids are all known now, so
    the answers of the interrupted turn may go (OpenAI never needs it)."""


@attrs.frozen(kw_only=True)
class UpstreamError:
    """The server said something went wrong (OpenAI ``error``; Gemini ``goAway`` or a close
    reason). ``fatal``: the connection is over. ``message`` is short and carries no secret
    (the protocol redacts the key if the server echoed it)."""

    message: str
    fatal: bool = False
    code: str | None = None


@attrs.frozen(kw_only=True)
class Spoken:
    """Not an API's: what the engine feeds a turn's step for :class:`TranscriptOut` (the
    turn keeps it as the agent's words and emits it as a ``vrt.Transcript``)."""

    text: str


RealtimeEvent = (
    Ready
    | ResponseStarted
    | ResponseOutput
    | AudioOut
    | TranscriptOut
    | UserTranscript
    | ResponseDone
    | SpeechStarted
    | CallsCancelled
    | Settled
    | UpstreamError
)


# -- what the engine tells a protocol to send ----------------------------------------------------


@attrs.frozen(kw_only=True)
class RealtimeSeed:
    """What a new model session starts from: the agent's instructions, the tools offered,
    and the conversation so far (empty for a new session; the stored history after a lost
    connection, a handover or a deploy)."""

    instructions: str
    tools: tuple[ToolSpec, ...]
    history: Sequence[HistoryItem] = ()


Message = dict[str, Any]
"""One JSON message to send (a text frame)."""


class RealtimeProtocol(Protocol):
    """One connection's translation, both ways. No I/O, no Trio."""

    answers_wait_for_settled: bool
    """True (Gemini): the answers of an interrupted turn wait for :class:`Settled`."""
    cancels: bool
    """Whether the API can cancel a response (OpenAI ``response.cancel``; Gemini: False,
    an interrupt forgets a response asked for, since what comes next answers the user)."""

    def setup(self, seed: RealtimeSeed) -> list[Message]:
        """The messages that open the model session (OpenAI ``session.update``; Gemini
        ``setup``): instructions, tools, audio formats, voice, turn detection."""
        ...

    def seed(self, seed: RealtimeSeed) -> list[Message]:
        """After :class:`Ready`: the history, as the API's conversation items (OpenAI
        ``conversation.item.create`` each; Gemini one ``clientContent`` with
        ``turnComplete`` false). Never asks for a response."""
        ...

    def receive(self, message: Any) -> list[RealtimeEvent]:
        """One decoded JSON message from the server. Unknown types give ``[]``; a message
        that is not what the API documents raises ``ValueError`` with a short reason."""
        ...

    def user_text(self, text: str) -> list[Message]:
        """The user typed ``text``: add it to the conversation and ask for a response."""
        ...

    def answers(self, records: Sequence[CallRecord], *, respond: bool) -> list[Message]:
        """One answer per record (its result as the API expects: OpenAI one
        ``function_call_output`` item each; Gemini one ``toolResponse``), then, if
        ``respond`` (OpenAI), ``response.create``. Empty ``records`` and not ``respond``:
        ``[]``."""
        ...

    def respond(self) -> list[Message]:
        """Ask for a response (OpenAI ``response.create``; Gemini: ``[]``, it answers by
        itself)."""
        ...

    def cancel(self) -> list[Message]:
        """Stop the active response (OpenAI ``response.cancel``; Gemini has none: ``[]``)."""
        ...

    def truncate(self, item_id: str, audio_ms: int) -> list[Message]:
        """The user heard ``audio_ms`` of the assistant's audio item ``item_id`` (OpenAI
        ``conversation.item.truncate``; Gemini: ``[]``)."""
        ...

    def audio(self, pcm: bytes) -> list[Message]:
        """The user's voice: PCM16 little-endian mono at the input rate (OpenAI
        ``input_audio_buffer.append``; Gemini ``realtimeInput.audio``)."""
        ...


@runtime_checkable
class RealtimeModel(Protocol):
    """A model held open for a session's life (``vrt.models.OpenAIRealtime``,
    ``vrt.models.GeminiLive``). The engine recognises one by :attr:`realtime`."""

    realtime: Literal[True]
    input_rate: int
    """Samples per second of the PCM16 the model hears."""
    output_rate: int
    """Samples per second of the PCM16 the model speaks."""
    timeout: float
    """Seconds allowed to connect and to get :class:`Ready`."""

    def protocol(self) -> RealtimeProtocol:
        """A new protocol object for one connection."""
        ...

    def endpoint(self) -> tuple[str, list[tuple[str, str]]]:
        """Where to connect: the ``ws(s)://`` URL (no secret in it) and the headers (the
        key, in ``Authorization`` or ``x-goog-api-key``)."""
        ...


def is_realtime(model: object) -> TypeGuard[RealtimeModel]:
    """Whether ``model`` is a realtime one (held open for a session's life)."""
    return getattr(model, "realtime", False) is True and isinstance(model, RealtimeModel)
