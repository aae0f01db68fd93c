"""Gemini Live (the Gemini API's ``BidiGenerateContent``), sans-IO: the messages both ways.

Theory of operation. Our ``setup`` opens the session and ``setupComplete`` is
:class:`~vrt.models._realtime.Ready`. Gemini names no response, so this protocol does
(``g1``, ``g2``, ...): a response starts at the first model content (a text or audio part)
or ``toolCall`` while none is active, and ends

- at a ``toolCall``: its calls come whole (``CallStart`` then ``CallEnd`` with the parsed
  arguments) and the model then waits for their answers, so the response is ``completed``
  and the answers' reply is the next response;
- at ``interrupted`` (the user spoke over it): ``SpeechStarted``, then ``cancelled``;
- at ``turnComplete``: ``completed``.

A ``turnComplete`` after an interrupt (``interrupted`` or a ``toolCallCancellation``
since the last ``turnComplete``) is also :class:`~vrt.models._realtime.Settled`: the
ids the server cancelled are all known, so the interrupted turn's answers may go.
Gemini has no cancel and no truncate, and answers by itself: those messages are ``[]``.

What the protocol keeps: whether it is ready, the active response, and whether an
interrupt came since the last ``turnComplete``. Content, transcripts and usage that come
while no response is active (what is left of one that ended) are dropped: the engine
would drop them as stale anyway.

Wire names are the JSON (camelCase) names of the API's protobuf messages.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any, Literal

from vrt._core.bounded import RecentSet
from vrt._core.results import CallRecord, ToolResult
from vrt.models._protocol import CallEnd, CallStart, Text, tokens
from vrt.models._realtime import (
    AudioOut,
    CallsCancelled,
    Message,
    Ready,
    RealtimeEvent,
    RealtimeSeed,
    ResponseDone,
    ResponseOutput,
    ResponseStarted,
    Settled,
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
from vrt.models._render import User, arguments_object, conversation, strict_json

URL = (
    "wss://generativelanguage.googleapis.com/ws/"
    "google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent"
)
OUTPUT_RATE = 24000
"""Gemini Live speaks PCM16 at 24 kHz."""


class GeminiLive:
    """Google's Gemini Live API as a realtime model: one WebSocket per session, the model's
    own voice detection and turn-taking.

    ``model``: a Live model's name (``models/`` is added when missing). ``api_key`` None:
    ``$GEMINI_API_KEY``, else ``$GOOGLE_API_KEY`` (read now); sent in the
    ``x-goog-api-key`` header only. ``output``: ``"audio"`` (the model speaks, with a
    transcript) or ``"text"``. ``voice``: a prebuilt voice's name. ``input_rate``: the
    PCM16 rate of the user's audio. ``timeout``: the seconds allowed to connect and be
    ready.
    """

    realtime: Literal[True] = True
    output_rate: int = OUTPUT_RATE

    def __init__(
        self,
        model: str,
        *,
        url: str = URL,
        api_key: str | None = None,
        voice: str | None = None,
        output: Output = "audio",
        input_rate: int = 16000,
        timeout: float = 30.0,
    ) -> None:
        check_common(model, url, output, voice, input_rate, timeout)
        self.model = model
        self.url = url
        self.voice = voice
        self.output: Output = output
        self.input_rate = input_rate
        self.timeout = float(timeout)
        self._api_key = read_key(api_key, ("GEMINI_API_KEY", "GOOGLE_API_KEY"))

    def __repr__(self) -> str:  # never the key
        return f"GeminiLive(model={self.model!r}, url={self.url!r})"

    def protocol(self) -> GeminiLiveProtocol:
        """A new protocol object for one connection."""
        return GeminiLiveProtocol(self, self._api_key)

    def endpoint(self) -> tuple[str, list[tuple[str, str]]]:
        """The URL as given, and the key's header."""
        key = self._api_key
        return self.url, [("x-goog-api-key", key)] if key else []


class GeminiLiveProtocol:
    """One connection's translation, both ways (see the module's docstring). Made by
    :meth:`GeminiLive.protocol`."""

    answers_wait_for_settled = True
    cancels = False

    def __init__(self, config: GeminiLive, key: str | None) -> None:
        self._config = config
        self._key = key  # to redact what the server says
        self._ready = False
        self._responses = 0
        self._active: str | None = None
        self._interrupted = False
        self._calls: RecentSet[str] = RecentSet(10_000)  # call ids this connection delivered

    # -- what to send ---------------------------------------------------------------------------

    def setup(self, seed: RealtimeSeed) -> list[Message]:
        """One ``setup``: the model, modalities, voice, instructions, tools, transcriptions."""
        config = self._config
        generation: dict[str, Any] = {"responseModalities": [config.output.upper()]}
        if config.voice is not None:
            generation["speechConfig"] = {
                "voiceConfig": {"prebuiltVoiceConfig": {"voiceName": config.voice}}
            }
        model = config.model
        if not model.startswith(("models/", "tunedModels/")):
            model = f"models/{model}"
        setup: dict[str, Any] = {"model": model, "generationConfig": generation}
        if seed.instructions:
            setup["systemInstruction"] = {"parts": [{"text": seed.instructions}]}
        if seed.tools:
            # parametersJsonSchema takes any JSON Schema; ``parameters`` is an OpenAPI
            # subset that refuses keywords a tool's schema may have (additionalProperties).
            declarations = [
                {
                    "name": spec.name,
                    "description": spec.description,
                    "parametersJsonSchema": spec.parameters,
                }
                for spec in seed.tools
            ]
            setup["tools"] = [{"functionDeclarations": declarations}]
        setup["inputAudioTranscription"] = {}
        if config.output == "audio":
            setup["outputAudioTranscription"] = {}
        return [{"setup": setup}]

    def seed(self, seed: RealtimeSeed) -> list[Message]:
        """The history as one ``clientContent`` (``turnComplete`` false: no answer asked);
        ``[]`` when it is empty."""
        turns: list[dict[str, Any]] = []
        for entry in conversation(seed.history):
            if isinstance(entry, User):
                turns.append({"role": "user", "parts": [{"text": user_text(entry)}]})
                continue
            parts: list[dict[str, Any]] = [{"text": entry.text}] if entry.text else []
            for call in entry.calls:
                parts.append(
                    {
                        "functionCall": {
                            "id": call.call_id,
                            "name": call.name,
                            "args": _json(arguments_object(call.arguments)),
                        }
                    }
                )
            if parts:
                turns.append({"role": "model", "parts": parts})
            if entry.calls:
                responses = [{"functionResponse": _answer(call)} for call in entry.calls]
                turns.append({"role": "user", "parts": responses})
        if not turns:
            return []
        return [{"clientContent": {"turns": turns, "turnComplete": False}}]

    def user_text(self, text: str) -> list[Message]:
        """A user turn, complete (the model answers it)."""
        turn = {"role": "user", "parts": [{"text": text}]}
        return [{"clientContent": {"turns": [turn], "turnComplete": True}}]

    def answers(self, records: Sequence[CallRecord], *, respond: bool) -> list[Message]:
        """One ``toolResponse`` with every record's answer (``respond`` is ignored: the
        model answers by itself); ``[]`` for no records."""
        if not records:
            return []
        return [{"toolResponse": {"functionResponses": [_answer(r) for r in records]}}]

    def respond(self) -> list[Message]:
        """Nothing: Gemini answers by itself."""
        return []

    def cancel(self) -> list[Message]:
        """Nothing: Gemini has no cancel (the engine drops what is left of the response)."""
        return []

    def truncate(self, item_id: str, audio_ms: int) -> list[Message]:
        """Nothing: Gemini has no truncate."""
        return []

    def audio(self, pcm: bytes) -> list[Message]:
        """``realtimeInput.audio`` at the input rate (nothing for no audio)."""
        if not pcm:
            return []
        blob = {
            "data": base64.b64encode(pcm).decode(),
            "mimeType": f"audio/pcm;rate={self._config.input_rate}",
        }
        return [{"realtimeInput": {"audio": blob}}]

    # -- what the server says -------------------------------------------------------------------

    def receive(self, message: Any) -> list[RealtimeEvent]:
        """The events of one server message; ``[]`` for what the engine does not need
        (``sessionResumptionUpdate``, ``generationComplete``, ...). Raises ValueError (a
        short reason) for a message that breaks the API's shapes."""
        if not isinstance(message, dict):
            raise ValueError("a server message that is not an object")
        events: list[RealtimeEvent] = []
        if "setupComplete" in message and not self._ready:
            self._ready = True
            events.append(Ready())
        if "toolCallCancellation" in message:
            events.extend(self._cancellation(_object(message, "toolCallCancellation")))
        content = _object(message, "serverContent") if "serverContent" in message else {}
        events.extend(self._content(content))
        if "usageMetadata" in message:
            usage = tokens(
                _object(message, "usageMetadata"), "promptTokenCount", "responseTokenCount"
            )
            if usage is not None and self._active is not None:
                events.append(ResponseOutput(response_id=self._active, event=usage))
        if "toolCall" in message:
            events.extend(self._tool_call(_object(message, "toolCall")))
        if content.get("interrupted"):
            self._interrupted = True
            events.append(SpeechStarted())
            events.extend(self._end("cancelled"))
        if content.get("turnComplete"):
            events.extend(self._end("completed"))
            if self._interrupted:
                self._interrupted = False
                events.append(Settled())
        if "goAway" in message:
            left = _object(message, "goAway").get("timeLeft")
            when = f"in {left}" if isinstance(left, str) and left else "soon"
            text = upstream_text(f"the server will close the connection {when}", self._key)
            events.append(UpstreamError(message=text, fatal=False))
        return events

    def _start(self) -> str:
        if self._active is None:
            self._responses += 1
            self._active = f"g{self._responses}"
        return self._active

    def _started(self) -> list[RealtimeEvent]:
        """``ResponseStarted`` if no response is active (one is now)."""
        if self._active is not None:
            return []
        return [ResponseStarted(response_id=self._start())]

    def _end(self, status: Literal["completed", "cancelled"]) -> list[RealtimeEvent]:
        if self._active is None:
            return []
        done = ResponseDone(response_id=self._active, status=status)
        self._active = None
        return [done]

    def _content(self, content: dict[str, Any]) -> list[RealtimeEvent]:
        events: list[RealtimeEvent] = []
        if "modelTurn" in content:
            parts = _object(content, "modelTurn", "serverContent").get("parts", [])
            if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
                raise ValueError("serverContent.modelTurn whose parts are not a list of objects")
            for part in parts:
                events.extend(self._part(part))
        heard = _transcription(content, "inputTranscription")
        if heard:
            events.append(UserTranscript(text=heard))
        said = _transcription(content, "outputTranscription")
        if said and (self._active is not None or not self._interrupted):
            # the model's words may come before its audio (Gemini does not order them): a
            # response starts with either, unless the user cut the last one and it has not
            # said its turnComplete yet (then they are the cut response's, and dropped)
            events.extend(self._started())
            events.append(TranscriptOut(response_id=self._start(), text=said))
        return events

    def _part(self, part: dict[str, Any]) -> list[RealtimeEvent]:
        text = part.get("text")
        if isinstance(text, str) and text and self._config.output == "text":
            if part.get("thought"):
                return []  # the model's thinking, not what it says
            events = self._started()
            return [*events, ResponseOutput(response_id=self._start(), event=Text(text=text))]
        blob = part.get("inlineData")
        if blob is None:
            return []  # text with audio output (thoughts), code, ...
        if not isinstance(blob, dict) or not isinstance(blob.get("data"), str):
            raise ValueError("serverContent.modelTurn inlineData without its data")
        mime = blob.get("mimeType")
        if isinstance(mime, str) and not mime.startswith("audio/pcm"):
            return []
        pcm = _bytes(blob["data"])
        if not pcm:
            return []
        events = self._started()
        return [*events, AudioOut(response_id=self._start(), item_id="", pcm=pcm)]

    def _tool_call(self, call: dict[str, Any]) -> list[RealtimeEvent]:
        calls = call.get("functionCalls")
        if not isinstance(calls, list) or not calls:
            raise ValueError("toolCall without functionCalls")
        found: list[tuple[str, str, dict[str, Any]]] = []
        for function in calls:
            if not isinstance(function, dict):
                raise ValueError("toolCall whose functionCalls are not objects")
            call_id, name, args = function.get("id"), function.get("name"), function.get("args")
            if not isinstance(call_id, str) or not call_id:
                raise ValueError("toolCall with a function call without its id")
            if not isinstance(name, str) or not name:
                raise ValueError("toolCall with a function call without its name")
            if args is not None and not isinstance(args, dict):
                raise ValueError("toolCall with a function call whose args are not an object")
            if call_id not in self._calls:  # a call delivered again (seen by real servers)
                found.append((call_id, name, args or {}))
        if not found:
            return []  # nothing new: no response either (it would open a turn)
        for call_id, _, _ in found:
            self._calls.add(call_id)
        events = self._started()
        response_id = self._start()
        for call_id, name, args in found:
            events += [
                ResponseOutput(
                    response_id=response_id, event=CallStart(call_id=call_id, name=name)
                ),
                ResponseOutput(
                    response_id=response_id, event=CallEnd(call_id=call_id, arguments=args)
                ),
            ]
        return [*events, *self._end("completed")]

    def _cancellation(self, cancellation: dict[str, Any]) -> list[RealtimeEvent]:
        ids = cancellation.get("ids")
        if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
            raise ValueError("toolCallCancellation without a list of ids")
        self._interrupted = True  # the server cut a turn: its turnComplete settles it
        return [CallsCancelled(call_ids=tuple(ids))]


def _answer(record: CallRecord) -> dict[str, Any]:
    """A ``functionResponse``: the record's id and name, and its result."""
    return {"id": record.call_id, "name": record.name, "response": _result(record.result)}


def _result(result: ToolResult) -> dict[str, Any]:
    """A result as Gemini reads one: ``output``, or ``error`` (with the vrt code)."""
    if result.ok:
        return {"output": _json(result.output)}
    code = str(result.code)
    return {"error": result.message or code, "code": code}


def _json(value: Any) -> Any:
    """``value`` as plain JSON (what is not JSON becomes its ``str``, NaN ``null``)."""
    return json.loads(strict_json(value))


def _object(data: dict[str, Any], key: str, where: str | None = None) -> dict[str, Any]:
    value = data.get(key)
    if not isinstance(value, dict):
        raise ValueError(f"{f'{where}.' if where else ''}{key} that is not an object")
    return value


def _transcription(content: dict[str, Any], key: str) -> str:
    if key not in content:
        return ""
    text = _object(content, key, "serverContent").get("text")
    return text if isinstance(text, str) else ""


def _bytes(data: str) -> bytes:
    """Base64 as protobuf's JSON writes bytes (the URL-safe alphabet is read too)."""
    try:
        if "-" in data or "_" in data:
            return base64.urlsafe_b64decode(data)
        return base64.b64decode(data, validate=True)
    except ValueError:  # binascii.Error, or not ASCII
        raise ValueError("serverContent.modelTurn inlineData whose data is not base64") from None
