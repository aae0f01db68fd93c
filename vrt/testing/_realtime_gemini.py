"""The Gemini Live server of :class:`~vrt.testing.FakeRealtime`, with no I/O.

Messages as googleapis/python-genai's ``google/genai/types.py`` types them
(``LiveClientMessage``, ``LiveServerMessage`` and what they hold), in the camelCase JSON
the Gemini API puts on the wire (``live.py`` sends it; ``_live_converters.py`` reads the
server's ``usageMetadata`` as is). What the types leave out, as the real server does it:

- every server message is a *binary* frame holding the JSON (browsers see a Blob);
- ``setup`` must come first and is answered ``{"setupComplete": {}}``;
- a response streams ``serverContent.modelTurn`` parts (audio as ``inlineData``
  ``audio/pcm;rate=24000``, or text), ``outputTranscription`` pieces when the setup asked
  for ``outputAudioTranscription``, then ``generationComplete``, and ``turnComplete``
  with ``usageMetadata`` once the audio would have played (the server assumes realtime
  playback: a barge-in may come between the two); an interrupted one ends
  ``interrupted``, then ``turnComplete``;
- a step's calls come together in one ``toolCall`` after its text, and the model waits for
  a ``toolResponse`` answering every id before it goes on (the next step);
- a client message the server cannot parse (not JSON, an unknown field, no ``setup``
  first) closes the connection with 1007 and the reason, as the real server does; the
  client's snake_case field names are accepted too, as protobuf JSON parsing accepts them.

An answer for an id that was cancelled, answered already or never called gets no word
from Gemini; the fake records it as a violation.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

from vrt.models._scripted import Pause, Say, ScriptedCall
from vrt.testing._realtime_core import (
    OUTPUT_RATE,
    WORD_MS,
    Config,
    Message,
    Script,
    ServerCore,
    Thunk,
    VoiceDetector,
    tone,
    utterance,
    words,
)

LATE_CANCELLATION = 0.3
"""Seconds between ``interrupted`` and the cancellation that follows it, with quirk
``late-cancellation`` (the API does not say they come together with it)."""

PATHS = tuple(
    f"/ws/google.ai.generativelanguage.{version}.GenerativeService.BidiGenerateContent"
    for version in ("v1beta", "v1alpha")
)
_MESSAGES = ("setup", "clientContent", "realtimeInput", "toolResponse")
_SETUP_KEYS = {
    "model",
    "generationConfig",
    "systemInstruction",
    "tools",
    "realtimeInputConfig",
    "sessionResumption",
    "contextWindowCompression",
    "inputAudioTranscription",
    "outputAudioTranscription",
    "proactivity",
    "explicitVadSignal",
    "historyConfig",
    "avatarConfig",
    "safetySettings",
}
_INPUT_KEYS = {
    "mediaChunks",
    "audio",
    "audioStreamEnd",
    "video",
    "text",
    "activityStart",
    "activityEnd",
}
_AUDIO_MIME = f"audio/pcm;rate={OUTPUT_RATE}"


def _snake(name: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name)


def _field(message: Any, name: str) -> Any:
    """``message[name]`` by its camelCase or its snake_case name (None if neither)."""
    if not isinstance(message, dict):
        return None
    return message[name] if name in message else message.get(_snake(name))


def _unknown(message: dict[str, Any], allowed: set[str]) -> str | None:
    known = allowed | {_snake(name) for name in allowed}
    extra = sorted(set(message) - known)
    return extra[0] if extra else None


class GeminiServer(ServerCore):
    """One connection's server: its setup, then turns, tool calls and interruptions.

    ``phase``: ``setup`` (nothing but ``setup`` may come), ``idle``, ``responding`` (a
    response is playing), ``awaiting`` (its ``toolCall`` went out; the model waits for the
    answers). An interruption (speech, or client content) ends ``responding`` and
    ``awaiting`` alike.
    """

    binary = True

    def __init__(self, script: Script, config: Config, violations: list[str]) -> None:
        super().__init__(script, config, violations)
        self.phase = "setup"
        self.setup: dict[str, Any] = {}
        self.pending: dict[str, str] = {}
        """Call ids the model waits answers for (id -> name)."""
        self.cancelled: set[str] = set()
        self.answered: set[str] = set()
        self.orphaned: set[str] = set()
        """Ids of an interrupted turn that were never cancelled (quirk ``no-cancellation``):
        their answers are taken and lead nowhere."""
        self._late: list[Message] = []
        """What an interrupt still owes, with quirk ``late-cancellation``: it goes before
        anything else, after its pause."""
        self.turns = 0
        self.detector: VoiceDetector | None = None
        self.speaking = False
        self._transcript: str | None = None
        self._audio = config.audio

    # -- plumbing ------------------------------------------------------------------------------

    @property
    def awaiting_setup(self) -> bool:
        return self.phase == "setup"

    def _close(self, reason: str, violation: str) -> None:
        self.violation(violation)
        if self.closing is None:
            self.closing = (1007, reason)
        self.replace_plan()

    def malformed(self, reason: str) -> None:
        self._close(f"Invalid JSON payload received. {reason}", reason)

    @property
    def _vad(self) -> dict[str, Any]:
        config = _field(self.setup, "realtimeInputConfig") or {}
        detection = _field(config, "automaticActivityDetection") or {}
        return detection if isinstance(detection, dict) else {}

    @property
    def _interrupts(self) -> bool:
        config = _field(self.setup, "realtimeInputConfig") or {}
        return bool(_field(config, "activityHandling") != "NO_INTERRUPTION")

    # -- client messages -----------------------------------------------------------------------

    def receive(self, message: Any) -> None:
        if not isinstance(message, dict):
            self._close("Invalid JSON payload received.", "a message that is not an object")
            return
        unknown = _unknown(message, set(_MESSAGES))
        if unknown is not None:
            reason = f'Invalid JSON payload received. Unknown name "{unknown}": Cannot find field.'
            self._close(reason, f"unknown message field {unknown!r}")
            return
        kinds = [name for name in _MESSAGES if _field(message, name) is not None]
        if len(kinds) != 1:
            self._close("Invalid JSON payload received.", f"a message holding {kinds or 'nothing'}")
            return
        kind = kinds[0]
        body = _field(message, kind)
        if self.phase == "setup" and kind != "setup":
            self._close("setup must be the first message", f"{kind} before setup")
            return
        if kind == "setup":
            self._setup(body)
        elif kind == "clientContent":
            self._client_content(body)
        elif kind == "realtimeInput":
            self._realtime_input(body)
        else:
            self._tool_response(body)

    def _setup(self, setup: Any) -> None:
        if self.phase != "setup":
            self._close("setup may be sent only once", "a second setup")
            return
        if not isinstance(setup, dict):
            self._close("Invalid JSON payload received.", "a setup that is not an object")
            return
        unknown = _unknown(setup, _SETUP_KEYS)
        if unknown is not None:
            reason = (
                f"Invalid JSON payload received. Unknown name \"{unknown}\" at 'setup': "
                "Cannot find field."
            )
            self._close(reason, f"unknown setup field {unknown!r}")
            return
        model = setup.get("model")
        if not isinstance(model, str) or not model.startswith("models/"):
            self._close("setup.model must be 'models/{model}'", f"setup.model {model!r}")
            return
        self.setup = setup
        modalities = _field(_field(setup, "generationConfig"), "responseModalities")
        if isinstance(modalities, list) and modalities:
            self._audio = modalities != ["TEXT"]
        self.phase = "idle"
        self.outbox.append({"setupComplete": {}})

    def _client_content(self, content: Any) -> None:
        turns = _field(content, "turns") or []
        if not isinstance(turns, list):
            self._close("clientContent.turns must be a list", "clientContent.turns not a list")
            return
        self.turns += len(turns)
        if self.phase in ("responding", "awaiting"):
            self._interrupt()  # "A message here will interrupt any current model generation."
        if _field(content, "turnComplete"):
            self._start()

    def _realtime_input(self, given: Any) -> None:
        if not isinstance(given, dict) or _unknown(given, _INPUT_KEYS) is not None:
            self._close("Invalid JSON payload received.", "an unknown realtimeInput field")
            return
        blobs = list(_field(given, "mediaChunks") or [])
        if _field(given, "audio") is not None:
            blobs.append(_field(given, "audio"))
        for blob in blobs:
            self._hear(blob)
        automatic = not _field(self._vad, "disabled")
        for name, started in (("activityStart", True), ("activityEnd", False)):
            if _field(given, name) is None:
                continue
            if automatic:
                self.violation(f"{name} while automatic activity detection is on")
            elif started:
                self._speech_start()
            else:
                self._speech_stop()
        if _field(given, "audioStreamEnd") and automatic and self.speaking:
            self.speech_stopped()
        if isinstance(_field(given, "text"), str):
            if self.phase in ("responding", "awaiting"):
                self._interrupt()
            self._start()

    def _hear(self, blob: Any) -> None:
        mime = _field(blob, "mimeType")
        try:
            pcm = base64.b64decode(_field(blob, "data") or "", validate=True)
        except (binascii.Error, TypeError, ValueError):
            self._close(
                "Invalid value at 'realtime_input.audio.data' (TYPE_BYTES)",
                "audio that is not base64",
            )
            return
        if not isinstance(mime, str) or not mime.startswith("audio/pcm"):
            self.violation(f"audio of type {mime!r}")
            return
        self.audio_received += len(pcm)
        found = re.search(r"rate=(\d+)", mime)
        rate = int(found.group(1)) if found else 16000
        if self.detector is None or self.detector.rate != rate:
            silence = int(_field(self._vad, "silenceDurationMs") or 300)
            self.detector = VoiceDetector(rate, self.config.vad_threshold, stop_ms=silence)
        heard = self.detector.feed(pcm)
        if _field(self._vad, "disabled"):
            return  # the client says when the user speaks (activityStart / activityEnd)
        for event in heard:
            if event.started:
                self._speech_start()
            else:
                self._speech_stop()

    def _tool_response(self, response: Any) -> None:
        answers = _field(response, "functionResponses")
        if not isinstance(answers, list):
            self._close(
                "toolResponse.functionResponses must be a list",
                "a toolResponse without functionResponses",
            )
            return
        for answer in answers:
            call_id = _field(answer, "id")
            if not isinstance(_field(answer, "response"), dict):
                self.violation(f"an answer for {call_id!r} whose response is not an object")
            if call_id in self.cancelled:
                self.violation(f"an answer for cancelled call {call_id!r}")
            elif call_id in self.answered:
                self.violation(f"a second answer for {call_id!r}")
            elif call_id in self.pending:
                del self.pending[call_id]
                self.answered.add(call_id)
            elif call_id in self.orphaned:
                self.orphaned.discard(call_id)
                self.answered.add(call_id)
            else:
                self.violation(f"an answer for unknown call {call_id!r}")
        if self.phase == "awaiting" and not self.pending:
            self._start()  # the model goes on with the answers: the next step

    # -- the voice detector --------------------------------------------------------------------

    def speech_started(self) -> None:
        if self.phase == "setup" or self.speaking:
            return
        if self.detector is not None:
            self.detector.force(True)
        self._speech_start()

    def speech_stopped(self) -> None:
        if self.phase == "setup" or not self.speaking:
            return
        if self.detector is not None:
            self.detector.force(False)
        self._speech_stop()

    def user_said(self, text: str) -> None:
        self._transcript = text

    def _speech_start(self) -> None:
        self.speaking = True
        if self.phase in ("responding", "awaiting") and self._interrupts:
            self._interrupt()

    def _speech_stop(self) -> None:
        self.speaking = False
        said = self._transcript if self._transcript is not None else "(speech)"
        self._transcript = None
        if _field(self.setup, "inputAudioTranscription") is not None:
            self.outbox.append({"serverContent": {"inputTranscription": {"text": said}}})
        if self.phase == "idle":
            self._start()

    def _interrupt(self) -> None:
        """``interrupted``; the cancellation of the calls it waited answers for (unless
        quirk ``no-cancellation``); then ``turnComplete`` (both :data:`LATE_CANCELLATION`
        seconds later with quirk ``late-cancellation``, before anything else; a response
        that starts meanwhile waits behind them, and the pause starts again with it)."""
        self.outbox.append({"serverContent": {"interrupted": True}})
        after: list[Message] = []
        if self.pending:
            ids = sorted(self.pending)
            if "no-cancellation" in self.config.quirks:
                self.orphaned.update(ids)
            else:
                self.cancelled.update(ids)  # dropped now, whenever the client hears of it
                after.append({"toolCallCancellation": {"ids": ids}})
            self.pending.clear()
        after.append({"serverContent": {"turnComplete": True}})
        if "late-cancellation" in self.config.quirks:
            self._late += after
            self.replace_plan(self._owed())
        else:
            self.outbox.extend(after)
            self.replace_plan()
        self.phase = "idle"

    # -- responses -----------------------------------------------------------------------------

    def _owed(self) -> list[Thunk | float]:
        """The plan's head for what an interrupt still owes (quirk ``late-cancellation``):
        a new response's messages wait behind it."""
        if not self._late:
            return []
        return [LATE_CANCELLATION, *(self._pop_late for _ in self._late)]

    def _pop_late(self) -> Message | None:
        return self._late.pop(0) if self._late else None

    def _start(self) -> None:
        self.phase = "responding"
        plan: list[Thunk | float] = []
        calls: list[dict[str, Any]] = []
        spoken = 0
        for item in self.script.next_step():
            if isinstance(item, Pause):
                plan.append(float(item.seconds))
            elif isinstance(item, Say):
                plan += self._say(item.text)
                spoken += len(words(item.text))
            elif isinstance(item, ScriptedCall):
                if item.truncate:
                    break  # cut off before the call was whole: Gemini sends no part of it
                call = {
                    "id": self.script.call_id(item, "function-call-"),
                    "name": item.name,
                    "args": _args(item),
                }
                calls.append(call)
        if calls:
            times = 2 if "duplicate-call" in self.config.quirks else 1
            plan += [self._tool_call(calls) for _ in range(times)]
        else:
            plan.append(_content({"generationComplete": True}))
            if self._audio:  # the server waits for the playback it assumes to end
                plan.append(spoken * WORD_MS / 1000)
            plan.append(self._turn_complete(spoken))
        self.replace_plan([*self._owed(), *self.paced(plan)])

    def _say(self, text: str) -> list[Thunk | float]:
        plan: list[Thunk | float] = []
        if not self._audio:
            for piece in words(text):
                plan.append(_content({"modelTurn": {"parts": [{"text": piece}]}}))
            return plan
        transcribe = _field(self.setup, "outputAudioTranscription") is not None
        for chunk in utterance(text, self.config.chunk_ms):
            if chunk.transcript and transcribe:
                plan.append(_content({"outputTranscription": {"text": chunk.transcript}}))
            if chunk.samples:
                plan.append(self._audio_chunk(chunk.start, chunk.samples))
        return plan

    def _audio_chunk(self, start: int, count: int) -> Thunk:
        def thunk() -> Message:
            data = base64.b64encode(tone(start, count)).decode("ascii")
            part = {"inlineData": {"mimeType": _AUDIO_MIME, "data": data}}
            return {"serverContent": {"modelTurn": {"parts": [part]}}}

        return thunk

    def _tool_call(self, calls: list[dict[str, Any]]) -> Thunk:
        def thunk() -> Message:
            if self.phase == "responding":
                self.phase = "awaiting"
                self.pending.update((call["id"], call["name"]) for call in calls)
            return {"toolCall": {"functionCalls": [dict(call) for call in calls]}}

        return thunk

    def _turn_complete(self, spoken: int) -> Thunk:
        def thunk() -> Message:
            self.phase = "idle"
            prompt = 20 * (self.turns + 1)
            made = spoken * (3 if self._audio else 1)
            usage = {
                "promptTokenCount": prompt,
                "responseTokenCount": made,
                "totalTokenCount": prompt + made,
                "responseTokensDetails": [
                    {"modality": "AUDIO" if self._audio else "TEXT", "tokenCount": made}
                ],
            }
            return {"serverContent": {"turnComplete": True}, "usageMetadata": usage}

        return thunk


def _content(content: Message) -> Thunk:
    """A thunk for the ``serverContent`` message ``content``."""
    return lambda: {"serverContent": content}


def _args(item: ScriptedCall) -> dict[str, Any]:
    """A call's arguments as the object Gemini sends (text that is not a JSON object, which
    Gemini cannot send, becomes ``{}``)."""
    if isinstance(item.arguments, dict):
        return item.arguments
    try:
        value = json.loads(item.arguments) if isinstance(item.arguments, str) else None
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {}
