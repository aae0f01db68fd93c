"""OpenAI Realtime (the GA API), sans-IO: the session's messages both ways.

Theory of operation. The connection opens with the model in the URL; our
``session.update`` sets the instructions, tools, audio formats, voice and turn detection,
and its ``session.updated`` is :class:`~vrt.models._realtime.Ready` (``session.created``
comes first and carries the server's defaults, so it is not). A response is
``response.created`` … ``response.done``, every event in between names it by
``response_id``. A call is a ``function_call`` output item: ``response.output_item.added``
starts it (its ``call_id`` is the vrt call id), ``response.function_call_arguments.delta``
streams its arguments, and ``response.output_item.done`` ends it, only when the item's
status is ``completed``: an item cut off by a cancel or a length limit is done
``incomplete`` and its call gets no ``CallEnd`` (``function_call_arguments.done`` comes in
both cases, so it says nothing). The protocol keeps no other state: which response is
current, and what is stale, is the engine's business.

The history seeds a new session as conversation items, rendered as the Responses API
renders them (:mod:`vrt.models._render`): user and assistant messages, each call a
``function_call`` item followed by its ``function_call_output``, an interrupted turn's
note in the next user message.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, Literal
from urllib.parse import urlencode

from vrt._core.results import CallRecord
from vrt.models._protocol import CallDelta, CallEnd, CallStart, Text, tokens
from vrt.models._realtime import (
    AudioOut,
    Message,
    Ready,
    RealtimeEvent,
    RealtimeSeed,
    ResponseDone,
    ResponseOutput,
    ResponseStarted,
    SpeechStarted,
    TranscriptOut,
    UpstreamError,
    UserTranscript,
)
from vrt.models._realtime_config import (
    Output,
    check_common,
    read_key,
    upstream_text,
    user_text,
)
from vrt.models._render import (
    User,
    conversation,
    function_call_item,
    function_output_item,
    tools_of,
)

TRANSCRIBER = "gpt-4o-mini-transcribe"
"""The model that transcribes the user's audio (so the engine gets what the user said)."""
OUTPUT_RATE = 24000
"""The API speaks PCM16 at 24 kHz (the only PCM rate it takes)."""

_STATUSES = ("completed", "cancelled", "incomplete", "failed")


class OpenAIRealtime:
    """OpenAI's Realtime API (GA) as a realtime model: one WebSocket per session, the
    model's own voice detection and turn-taking.

    ``api_key`` None: ``$OPENAI_API_KEY`` (read now); sent in the ``Authorization`` header
    only. ``output``: ``"audio"`` (the model speaks, with a transcript) or ``"text"``.
    ``turn_detection``: ``"server_vad"``, ``"semantic_vad"`` (both answer and stop on the
    user's voice by themselves) or None (the app decides when the user is done).
    ``input_rate``: the PCM16 rate of the user's audio (the API takes 24000).
    ``extra_session`` merges into the top of the ``session`` object of the
    ``session.update``; ``timeout`` is the seconds allowed to connect and be ready.
    """

    realtime: Literal[True] = True
    output_rate: int = OUTPUT_RATE

    def __init__(
        self,
        model: str = "gpt-realtime",
        *,
        url: str = "wss://api.openai.com/v1/realtime",
        api_key: str | None = None,
        voice: str | None = None,
        output: Output = "audio",
        turn_detection: Literal["server_vad", "semantic_vad"] | None = "server_vad",
        input_rate: int = 24000,
        extra_session: dict[str, Any] | None = None,
        timeout: float = 30.0,
    ) -> None:
        check_common(model, url, output, voice, input_rate, timeout)
        if turn_detection not in ("server_vad", "semantic_vad", None):
            raise ValueError(
                f'turn_detection must be "server_vad", "semantic_vad" or None, '
                f"not {turn_detection!r}"
            )
        if extra_session is not None and not isinstance(extra_session, dict):
            raise ValueError("extra_session must be a dict (merged into the session object)")
        self.model = model
        self.url = url
        self.voice = voice
        self.output: Output = output
        self.turn_detection = turn_detection
        self.input_rate = input_rate
        self.extra_session = dict(extra_session or {})
        self.timeout = float(timeout)
        self._api_key = read_key(api_key, ("OPENAI_API_KEY",))

    def __repr__(self) -> str:  # never the key
        return f"OpenAIRealtime(model={self.model!r}, url={self.url!r})"

    def protocol(self) -> OpenAIRealtimeProtocol:
        """A new protocol object for one connection."""
        return OpenAIRealtimeProtocol(self, self._api_key)

    def endpoint(self) -> tuple[str, list[tuple[str, str]]]:
        """The URL with the model in its query (not a secret), and the key's header."""
        joiner = "&" if "?" in self.url else "?"
        url = f"{self.url}{joiner}{urlencode({'model': self.model})}"
        key = self._api_key
        return url, [("Authorization", f"Bearer {key}")] if key else []


class OpenAIRealtimeProtocol:
    """One connection's translation, both ways (see the module's docstring). Made by
    :meth:`OpenAIRealtime.protocol`."""

    answers_wait_for_settled = False
    cancels = True

    def __init__(self, config: OpenAIRealtime, key: str | None) -> None:
        self._config = config
        self._key = key  # to redact what the server echoes
        self._ready = False

    # -- what to send ---------------------------------------------------------------------------

    def setup(self, seed: RealtimeSeed) -> list[Message]:
        """One ``session.update``: instructions, tools, modalities, audio, turn detection."""
        config = self._config
        detection: dict[str, Any] | None = None
        if config.turn_detection is not None:
            detection = {
                "type": config.turn_detection,
                "create_response": True,
                "interrupt_response": True,
            }
        audio: dict[str, Any] = {
            "input": {
                "format": {"type": "audio/pcm", "rate": config.input_rate},
                "transcription": {"model": TRANSCRIBER},
                "turn_detection": detection,
            }
        }
        if config.output == "audio":
            out: dict[str, Any] = {"format": {"type": "audio/pcm", "rate": OUTPUT_RATE}}
            if config.voice is not None:
                out["voice"] = config.voice
            audio["output"] = out
        session: dict[str, Any] = {
            "type": "realtime",
            "model": config.model,
            "output_modalities": [config.output],
            "audio": audio,
        }
        if seed.instructions:
            session["instructions"] = seed.instructions
        if seed.tools:
            session["tools"] = [{"type": "function", **tool} for tool in tools_of(seed.tools)]
        session.update(config.extra_session)
        return [{"type": "session.update", "session": session}]

    def seed(self, seed: RealtimeSeed) -> list[Message]:
        """The history as ``conversation.item.create`` messages (none asks for a response)."""
        items: list[dict[str, Any]] = []
        for entry in conversation(seed.history):
            if isinstance(entry, User):
                items.append(_user_message(user_text(entry)))
                continue
            if entry.text:
                items.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": entry.text}],
                    }
                )
            items.extend(function_call_item(call) for call in entry.calls)
            items.extend(function_output_item(call) for call in entry.calls)
        return [_create(item) for item in items]

    def user_text(self, text: str) -> list[Message]:
        """A user message, then ``response.create``."""
        return [_create(_user_message(text)), *self.respond()]

    def answers(self, records: Sequence[CallRecord], *, respond: bool) -> list[Message]:
        """One ``function_call_output`` item per record, then ``response.create`` if
        ``respond``."""
        messages = [_create(function_output_item(record)) for record in records]
        return [*messages, *self.respond()] if respond else messages

    def respond(self) -> list[Message]:
        """``response.create``."""
        return [{"type": "response.create"}]

    def cancel(self) -> list[Message]:
        """``response.cancel`` (of the active response)."""
        return [{"type": "response.cancel"}]

    def truncate(self, item_id: str, audio_ms: int) -> list[Message]:
        """``conversation.item.truncate`` of the assistant's audio to what was heard."""
        return [
            {
                "type": "conversation.item.truncate",
                "item_id": item_id,
                "content_index": 0,
                "audio_end_ms": max(0, audio_ms),
            }
        ]

    def audio(self, pcm: bytes) -> list[Message]:
        """``input_audio_buffer.append`` (nothing for no audio)."""
        if not pcm:
            return []
        return [{"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}]

    # -- what the server says -------------------------------------------------------------------

    def receive(self, message: Any) -> list[RealtimeEvent]:
        """The events of one server message; ``[]`` for the many the engine does not need.
        Raises ValueError (a short reason) for a message that breaks the API's shapes."""
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            raise ValueError("a server message that is not an object with a type")
        kind: str = message["type"]
        decode = _DECODERS.get(kind)
        return [] if decode is None else decode(self, message)

    def _session_updated(self, message: dict[str, Any]) -> list[RealtimeEvent]:
        if self._ready:
            return []
        self._ready = True
        return [Ready()]

    def _response_created(self, message: dict[str, Any]) -> list[RealtimeEvent]:
        response = _object(message, "response")
        return [ResponseStarted(response_id=_id(response, "id", "response.created"))]

    def _item_added(self, message: dict[str, Any]) -> list[RealtimeEvent]:
        item = _object(message, "item")
        if item.get("type") != "function_call":
            return []
        where = "a function_call item"
        start = CallStart(call_id=_id(item, "call_id", where), name=_id(item, "name", where))
        return [ResponseOutput(response_id=_response_id(message), event=start)]

    def _arguments_delta(self, message: dict[str, Any]) -> list[RealtimeEvent]:
        delta = CallDelta(call_id=_id(message, "call_id"), delta=_text(message, "delta"))
        return [ResponseOutput(response_id=_response_id(message), event=delta)]

    def _item_done(self, message: dict[str, Any]) -> list[RealtimeEvent]:
        item = _object(message, "item")
        if item.get("type") != "function_call":
            return []
        where = "a function_call item"
        call_id = _id(item, "call_id", where)
        response_id = _response_id(message)
        if item.get("status") != "completed":
            return []  # cut off (a cancel, a length limit): the call never runs
        arguments = _text(item, "arguments", where)
        end = CallEnd(call_id=call_id, arguments=arguments or {})
        return [ResponseOutput(response_id=response_id, event=end)]

    def _text_delta(self, message: dict[str, Any]) -> list[RealtimeEvent]:
        response_id, delta = _response_id(message), _text(message, "delta")
        return [ResponseOutput(response_id=response_id, event=Text(text=delta))] if delta else []

    def _audio_delta(self, message: dict[str, Any]) -> list[RealtimeEvent]:
        response_id = _response_id(message)
        item_id, delta = _id(message, "item_id"), _text(message, "delta")
        try:
            pcm = base64.b64decode(delta, validate=True)
        except ValueError:  # binascii.Error, or not ASCII
            raise ValueError("response.output_audio.delta whose delta is not base64") from None
        return [AudioOut(response_id=response_id, item_id=item_id, pcm=pcm)] if pcm else []

    def _transcript_delta(self, message: dict[str, Any]) -> list[RealtimeEvent]:
        response_id, delta = _response_id(message), _text(message, "delta")
        return [TranscriptOut(response_id=response_id, text=delta)] if delta else []

    def _user_transcript(self, message: dict[str, Any]) -> list[RealtimeEvent]:
        transcript = _text(message, "transcript")
        return [UserTranscript(text=transcript)] if transcript else []

    def _response_done(self, message: dict[str, Any]) -> list[RealtimeEvent]:
        response = _object(message, "response")
        response_id = _id(response, "id", "response.done")
        status = response.get("status")
        if status not in _STATUSES:
            raise ValueError("response.done without a final status")
        events: list[RealtimeEvent] = []
        usage = tokens(response.get("usage"), "input_tokens", "output_tokens")
        if usage is not None:
            events.append(ResponseOutput(response_id=response_id, event=usage))
        reason = None
        if status == "failed":
            reason = upstream_text(_failure(response.get("status_details")), self._key)
        events.append(ResponseDone(response_id=response_id, status=status, message=reason))
        return events

    def _speech_started(self, message: dict[str, Any]) -> list[RealtimeEvent]:
        ms = message.get("audio_start_ms")
        if not isinstance(ms, int) or isinstance(ms, bool):
            raise ValueError("input_audio_buffer.speech_started without audio_start_ms")
        return [SpeechStarted(audio_ms=ms)]

    def _error(self, message: dict[str, Any]) -> list[RealtimeEvent]:
        error = _object(message, "error")
        text = next(
            (str(error[k]) for k in ("message", "type", "code") if error.get(k)),
            "the server reported an error",
        )
        code = error.get("code")
        return [
            UpstreamError(
                message=upstream_text(text, self._key) or "the server reported an error",
                fatal=False,
                code=upstream_text(code, self._key) if isinstance(code, str) and code else None,
            )
        ]


_DECODERS = {
    "session.updated": OpenAIRealtimeProtocol._session_updated,
    "response.created": OpenAIRealtimeProtocol._response_created,
    "response.output_item.added": OpenAIRealtimeProtocol._item_added,
    "response.function_call_arguments.delta": OpenAIRealtimeProtocol._arguments_delta,
    "response.output_item.done": OpenAIRealtimeProtocol._item_done,
    "response.output_text.delta": OpenAIRealtimeProtocol._text_delta,
    "response.output_audio.delta": OpenAIRealtimeProtocol._audio_delta,
    "response.output_audio_transcript.delta": OpenAIRealtimeProtocol._transcript_delta,
    "conversation.item.input_audio_transcription.completed": (
        OpenAIRealtimeProtocol._user_transcript
    ),
    "response.done": OpenAIRealtimeProtocol._response_done,
    "input_audio_buffer.speech_started": OpenAIRealtimeProtocol._speech_started,
    "error": OpenAIRealtimeProtocol._error,
}
"""The server events the engine needs, by type; every other type decodes to ``[]``
(``session.created``, ``response.function_call_arguments.done``, content parts, ...)."""


def _create(item: dict[str, Any]) -> Message:
    return {"type": "conversation.item.create", "item": item}


def _user_message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def _object(message: dict[str, Any], key: str) -> dict[str, Any]:
    value = message.get(key)
    if not isinstance(value, dict):
        raise ValueError(f"{message['type']} without its {key} object")
    return value


def _text(data: dict[str, Any], key: str, where: str | None = None) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{where or data['type']} without a string {key}")
    return value


def _id(data: dict[str, Any], key: str, where: str | None = None) -> str:
    value = _text(data, key, where)
    if not value:
        raise ValueError(f"{where or data['type']} with an empty {key}")
    return value


def _response_id(message: dict[str, Any]) -> str:
    return _id(message, "response_id")


def _failure(details: Any) -> str:
    """Why a response failed, from its ``status_details.error`` (a code and a type; some
    servers add a message)."""
    error = details.get("error") if isinstance(details, dict) else None
    if isinstance(error, dict):
        for key in ("message", "code", "type"):
            if isinstance(error.get(key), str) and error[key]:
                return str(error[key])
    return "the response failed"
