"""The OpenAI Realtime (GA) server of :class:`~vrt.testing.FakeRealtime`, with no I/O.

Events as openai/openai-python's ``src/openai/types/realtime/`` types them (the GA shapes:
``response.output_audio.delta``, ``output_modalities``, ``audio.input.turn_detection``);
what the types leave out, as the real server does it:

- a client item is acknowledged with ``conversation.item.added`` then
  ``conversation.item.done`` (the GA server's events; ``conversation.item.created`` is
  the beta's), and so is each item a response makes and each user utterance committed;
- a response's events in their real order; a cancelled or cut-off response still closes
  each open part and item (``.done`` events with what was sent so far: the types say they
  are "also emitted when a Response is interrupted, incomplete, or cancelled"), the item
  ``incomplete``, then ``response.done`` with ``status_details``;
- the real error codes where they are known (``conversation_already_has_active_response``,
  ``response_cancel_not_active``, ``invalid_tool_call_id``, ``missing_required_parameter``,
  ``unknown_parameter``, ``input_audio_buffer_commit_empty``) and the real wording of a
  truncate past the audio ("Audio content of 600ms is already shorter than 900ms"); the
  fake's own wording elsewhere;
- the input transcription (only when the session asks for it) after ``response.created``:
  the real one runs beside the response and often lands there.

Every misuse of the protocol is also recorded as a violation (see
:attr:`FakeRealtime.violations <vrt.testing.FakeRealtime.violations>`).
"""

from __future__ import annotations

import base64
import binascii
import copy
import functools
from collections.abc import Callable
from typing import Any, ClassVar

import attrs

from vrt.models._scripted import Pause, Say, ScriptedCall
from vrt.testing._providers import _parts, _text
from vrt.testing._realtime_core import (
    OUTPUT_RATE,
    Config,
    Heard,
    Message,
    Script,
    ServerCore,
    Thunk,
    VoiceDetector,
    tone,
    utterance,
    words,
)

PATH = "/v1/realtime"

_SESSION_KEYS = {
    "type",
    "audio",
    "include",
    "instructions",
    "max_output_tokens",
    "model",
    "output_modalities",
    "parallel_tool_calls",
    "prompt",
    "reasoning",
    "tool_choice",
    "tools",
    "tracing",
    "truncation",
}
_AUDIO_KEYS = {"input", "output"}
_INPUT_KEYS = {"format", "noise_reduction", "transcription", "turn_detection"}
_OUTPUT_KEYS = {"format", "speed", "voice"}
_TOOL_KEYS = {"type", "name", "description", "parameters"}
_ITEM_KEYS = {
    "id",
    "type",
    "object",
    "status",
    "role",
    "content",
    "name",
    "arguments",
    "call_id",
    "output",
}
_CONTENT_TYPES = {
    "user": {"input_text", "input_audio", "input_image"},
    "system": {"input_text"},
    "assistant": {"output_text"},  # "cannot populate assistant audio messages"
}
_VAD_DEFAULTS: dict[str, Message] = {
    "server_vad": {
        "type": "server_vad",
        "threshold": 0.5,
        "prefix_padding_ms": 300,
        "silence_duration_ms": 500,
        "idle_timeout_ms": None,
        "create_response": True,
        "interrupt_response": True,
    },
    "semantic_vad": {
        "type": "semantic_vad",
        "eagerness": "auto",
        "create_response": True,
        "interrupt_response": True,
    },
}
_PCM = {"type": "audio/pcm", "rate": OUTPUT_RATE}


@attrs.define
class _Output:
    """One item of a response, as far as it was sent."""

    item: Message
    index: int
    sent: set[str] = attrs.Factory(set)
    said: str = ""
    arguments: str = ""
    samples: int = 0
    final: bool = False

    @property
    def open(self) -> bool:
        return "response.output_item.added" in self.sent and (
            "response.output_item.done" not in self.sent
        )


@attrs.define
class _Response:
    id: str
    audio: bool
    outputs: list[_Output] = attrs.Factory(list)
    announced: bool = False
    cancelling: bool = False


class OpenAIServer(ServerCore):
    """One connection's server: a session, its conversation, at most one response."""

    def __init__(self, script: Script, config: Config, violations: list[str], model: str) -> None:
        super().__init__(script, config, violations)
        self.session: Message = {
            "type": "realtime",
            "object": "realtime.session",
            "id": script.new_id("sess_"),
            "model": model,
            "output_modalities": ["audio" if config.audio else "text"],
            "instructions": "You are a helpful assistant.",
            "tools": [],
            "tool_choice": "auto",
            "max_output_tokens": "inf",
            "tracing": None,
            "truncation": "auto",
            "prompt": None,
            "include": None,
            "expires_at": 0,
            "audio": {
                "input": {
                    "format": dict(_PCM),
                    "transcription": None,
                    "noise_reduction": None,
                    "turn_detection": dict(_VAD_DEFAULTS["server_vad"]),
                },
                "output": {"format": dict(_PCM), "voice": "marin", "speed": 1.0},
            },
        }
        self.items: list[Message] = []
        self.calls: set[str] = set()
        self.answered: set[str] = set()
        self.audio_samples: dict[str, int] = {}
        """Samples of audio sent for each assistant item (what a truncate may keep)."""
        self.response: _Response | None = None
        self.detector = VoiceDetector(OUTPUT_RATE, config.vad_threshold, stop_ms=500)
        self._events = 0
        self._buffered = 0  # bytes appended since the last commit
        self._speech_item: str | None = None
        self._transcript: str | None = None
        self._client_event: Any = None

    # -- plumbing ------------------------------------------------------------------------------

    def stamp(self, message: Message) -> Message:
        self._events += 1
        return {"type": message.pop("type"), "event_id": f"event_{self._events:04d}", **message}

    def _error(self, code: str | None, text: str, *, param: str | None = None) -> None:
        error = {
            "type": "invalid_request_error",
            "code": code,
            "message": text,
            "param": param,
            "event_id": self._client_event,
        }
        self.outbox.append({"type": "error", "error": error})

    def _refuse(
        self, code: str | None, text: str, violation: str, param: str | None = None
    ) -> None:
        self._error(code, text, param=param)
        self.violation(violation)

    @property
    def _vad(self) -> Message | None:
        detection: Message | None = self.session["audio"]["input"]["turn_detection"]
        return detection

    @property
    def _audio_out(self) -> bool:
        return bool(self.session["output_modalities"] == ["audio"])

    def opened(self) -> None:
        self.outbox.append({"type": "session.created", "session": copy.deepcopy(self.session)})

    def malformed(self, reason: str) -> None:
        self._client_event = None
        self._refuse("invalid_json", f"The server could not parse the event: {reason}.", reason)

    # -- client events -------------------------------------------------------------------------

    def receive(self, message: Any) -> None:
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            self._client_event = None
            self._refuse(
                "missing_required_parameter",
                "Missing required parameter: 'type'.",
                "an event without a type",
                "type",
            )
            return
        self._client_event = message.get("event_id")
        kind = message["type"]
        handler = self._HANDLERS.get(kind)
        if handler is None:
            self._refuse(
                "invalid_value",
                f"Invalid value: '{kind}'. Supported values are: "
                + ", ".join(f"'{name}'" for name in self._HANDLERS)
                + ".",
                f"unknown event type {kind!r}",
                "type",
            )
            return
        handler(self, message)

    def _session_update(self, message: Message) -> None:
        session = message.get("session")
        if not isinstance(session, dict):
            self._refuse(
                "missing_required_parameter",
                "Missing required parameter: 'session'.",
                "session.update without a session",
                "session",
            )
            return
        if "type" not in session:
            self._refuse(
                "missing_required_parameter",
                "Missing required parameter: 'session.type'.",
                "session.update without session.type",
                "session.type",
            )
            return
        if session["type"] != "realtime":
            self._refuse(
                "invalid_value",
                f"Invalid value: '{session['type']}'. The fake serves 'realtime' sessions only.",
                f"session.type {session['type']!r}",
                "session.type",
            )
            return
        unknown = _unknown(session, _SESSION_KEYS, "session")
        audio = session.get("audio")
        if not unknown and isinstance(audio, dict):
            unknown = _unknown(audio, _AUDIO_KEYS, "session.audio")
            for part, keys in (("input", _INPUT_KEYS), ("output", _OUTPUT_KEYS)):
                if not unknown and isinstance(audio.get(part), dict):
                    unknown = _unknown(audio[part], keys, f"session.audio.{part}")
        for index, tool in enumerate(session.get("tools") or ()):
            if not unknown and isinstance(tool, dict) and tool.get("type") == "function":
                unknown = _unknown(tool, _TOOL_KEYS, f"session.tools[{index}]")
        if unknown:
            self._refuse("unknown_parameter", f"Unknown parameter: '{unknown}'.", unknown, unknown)
            return
        modalities = session.get("output_modalities")
        if modalities is not None and modalities not in (["audio"], ["text"]):
            self._refuse(
                "invalid_value",
                "output_modalities must be ['audio'] or ['text'].",
                f"output_modalities {modalities!r}",
                "session.output_modalities",
            )
            return
        for key, value in session.items():
            if key != "audio":
                self.session[key] = copy.deepcopy(value)
        for part in ("input", "output"):
            given = (audio or {}).get(part) or {}
            for key, value in given.items():
                if key == "turn_detection" and isinstance(value, dict):
                    value = {**_VAD_DEFAULTS.get(value.get("type", ""), {}), **value}
                self.session["audio"][part][key] = copy.deepcopy(value)
        vad = self._vad
        if vad is not None and vad.get("type") == "server_vad":
            self.detector.stop_ms = int(vad.get("silence_duration_ms") or 500)
        self.outbox.append({"type": "session.updated", "session": copy.deepcopy(self.session)})

    def _item_create(self, message: Message) -> None:
        item = message.get("item")
        if not isinstance(item, dict):
            self._refuse(
                "missing_required_parameter",
                "Missing required parameter: 'item'.",
                "conversation.item.create without an item",
                "item",
            )
            return
        problem = self._check_item(item)
        if problem is not None:
            code, text, violation, param = problem
            self._refuse(code, text, violation, param)
            return
        previous = message.get("previous_item_id")
        if previous is not None and previous != "root" and self._find(previous) is None:
            self._refuse(
                "item_not_found",
                f"Previous item with id '{previous}' not found.",
                f"previous_item_id {previous!r} not in the conversation",
                "previous_item_id",
            )
            return
        added = copy.deepcopy(item)
        added.setdefault("id", self.script.new_id("item_"))
        added["object"] = "realtime.item"
        added["status"] = "completed"
        for part in added.get("content") or ():
            if isinstance(part, dict):
                part.pop("audio", None)  # the events never carry audio
        before = self._find(previous) if previous not in (None, "root") else None
        if previous is None:
            self.items.append(added)
        else:
            self.items.insert(0 if before is None else self.items.index(before) + 1, added)
        if added["type"] == "function_call":
            self.calls.add(added.get("call_id") or added["id"])
        elif added["type"] == "function_call_output":
            self.answered.add(added["call_id"])
        self._acknowledge(added)

    def _check_item(self, item: Message) -> tuple[str, str, str, str] | None:
        """What is wrong with a client's item, as (code, message, violation, param)."""
        unknown = _unknown(item, _ITEM_KEYS, "item")
        if unknown:
            return "unknown_parameter", f"Unknown parameter: '{unknown}'.", unknown, unknown
        kind = item.get("type")
        if item.get("id") is not None and self._find(item["id"]) is not None:
            text = f"Item with id '{item['id']}' already exists."
            return "invalid_value", text, f"a second item with id {item['id']!r}", "item.id"
        if kind == "message":
            role = item.get("role")
            if role not in _CONTENT_TYPES:
                return "invalid_value", f"Invalid value: '{role}'.", f"role {role!r}", "item.role"
            content = item.get("content")
            if not isinstance(content, list) or not content:
                text = "Missing required parameter: 'item.content'."
                return (
                    "missing_required_parameter",
                    text,
                    "a message without content",
                    "item.content",
                )
            for index, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind not in _CONTENT_TYPES[role]:
                    allowed = ", ".join(f"'{t}'" for t in sorted(_CONTENT_TYPES[role]))
                    text = f"Invalid value: '{kind}'. Supported values are: {allowed}."
                    param = f"item.content[{index}].type"
                    return "invalid_value", text, f"{role} content of type {kind!r}", param
            return None
        if kind == "function_call":
            for key in ("name", "arguments"):
                if not isinstance(item.get(key), str):
                    text = f"Missing required parameter: 'item.{key}'."
                    return "missing_required_parameter", text, f"function_call without {key}", key
            return None
        if kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(item.get("output"), str):
                text = "Invalid type for 'item.output': expected a string."
                return (
                    "invalid_type",
                    text,
                    "function_call_output whose output is not a string",
                    "item.output",
                )
            if call_id not in self.calls:
                text = f"Tool call ID '{call_id}' not found in conversation."
                return (
                    "invalid_tool_call_id",
                    text,
                    f"output for unknown call {call_id!r}",
                    "item.call_id",
                )
            if call_id in self.answered:
                text = f"Tool call ID '{call_id}' already has an output."  # the fake's words
                return (
                    "invalid_tool_call_id",
                    text,
                    f"second output for {call_id!r}",
                    "item.call_id",
                )
            return None
        text = (
            f"Invalid value: '{kind}'. The fake takes 'message', 'function_call' and"
            " 'function_call_output'."
        )
        return "invalid_value", text, f"item of type {kind!r}", "item.type"

    def _find(self, item_id: str) -> Message | None:
        return next((item for item in self.items if item.get("id") == item_id), None)

    def _acknowledge(self, item: Message) -> None:
        self.outbox.append({"type": "conversation.item.added", **self._placed(item)})
        self.outbox.append({"type": "conversation.item.done", **self._placed(item)})

    def _item_delete(self, message: Message) -> None:
        item = self._find(str(message.get("item_id")))
        if item is None:
            text = f"Item with id '{message.get('item_id')}' not found."
            self._refuse("item_not_found", text, "delete of an unknown item", "item_id")
            return
        self.items.remove(item)
        self.outbox.append({"type": "conversation.item.deleted", "item_id": item["id"]})

    def _item_retrieve(self, message: Message) -> None:
        item = self._find(str(message.get("item_id")))
        if item is None:
            text = f"Item with id '{message.get('item_id')}' not found."
            self._refuse("item_not_found", text, "retrieve of an unknown item", "item_id")
            return
        self.outbox.append({"type": "conversation.item.retrieved", "item": copy.deepcopy(item)})

    def _item_truncate(self, message: Message) -> None:
        """``conversation.item.truncate``: the real server refuses an ``audio_end_ms`` past
        the audio it sent for the item ("Audio content of 600ms is already shorter than
        900ms"), and a truncate of anything but an assistant message; so does the fake,
        and records the violation."""
        item_id = message.get("item_id")
        end = message.get("audio_end_ms")
        item = self._find(str(item_id))
        if not isinstance(end, int) or end < 0:
            self._refuse(
                "invalid_value",
                "audio_end_ms must be an integer >= 0.",
                "a bad audio_end_ms",
                "audio_end_ms",
            )
            return
        if item is None or item.get("role") != "assistant":
            text = f"Only assistant message items can be truncated; '{item_id}' is not one."
            self._refuse("invalid_value", text, f"truncate of {item_id!r}", "item_id")
            return
        if message.get("content_index", 0) != 0:
            self._refuse(
                "invalid_value",
                "content_index must be 0.",
                "truncate of content_index != 0",
                "content_index",
            )
            return
        have = self.audio_samples.get(item["id"], 0) * 1000 // OUTPUT_RATE
        if end > have:
            text = f"Audio content of {have}ms is already shorter than {end}ms"
            self._refuse(
                None, text, f"truncate of {item_id} at {end} ms past its {have} ms", "audio_end_ms"
            )
            return
        for part in item.get("content") or ():
            if isinstance(part, dict) and "transcript" in part:
                part["transcript"] = ""  # what the user did not hear leaves the context
        truncated = {"item_id": item["id"], "content_index": 0, "audio_end_ms": end}
        self.outbox.append({"type": "conversation.item.truncated", **truncated})

    def _append(self, message: Message) -> None:
        try:
            pcm = base64.b64decode(message.get("audio", ""), validate=True)
        except (binascii.Error, TypeError, ValueError):
            self._refuse(
                "invalid_value",
                "Invalid 'audio'. Expected base64-encoded audio.",
                "audio that is not base64",
                "audio",
            )
            return
        self.audio_received += len(pcm)
        self._buffered += len(pcm)
        if self._vad is None:
            self.detector.feed(pcm)  # keeps the time; nothing is detected without VAD
            self.detector.force(False)
            return
        for heard in self.detector.feed(pcm):
            self._heard(heard)

    def _commit(self, message: Message) -> None:
        if not self._buffered:
            text = (
                "Error committing input audio buffer: buffer too small."
                " Expected at least 100ms of audio."
            )
            self._refuse("input_audio_buffer_commit_empty", text, "commit of an empty audio buffer")
            return
        self._commit_speech(self._speech_item or self.script.new_id("item_"))

    def _clear(self, message: Message) -> None:
        self._buffered = 0
        self.outbox.append({"type": "input_audio_buffer.cleared"})

    def _response_create(self, message: Message) -> None:
        if self.response is not None:
            text = (
                f"Conversation already has an active response in progress: {self.response.id}."
                " Wait until the response is finished before creating a new one."
            )
            violation = f"response.create while {self.response.id} is active"
            self._refuse("conversation_already_has_active_response", text, violation)
            return
        self._start()

    def _response_cancel(self, message: Message) -> None:
        if self.response is None:
            text = "Cancellation failed: no active response found"
            self._refuse(
                "response_cancel_not_active", text, "response.cancel with no active response"
            )
            return
        self._cancel("client_cancelled")

    _HANDLERS: ClassVar[dict[str, Callable[[OpenAIServer, Message], None]]] = {
        "session.update": _session_update,
        "conversation.item.create": _item_create,
        "conversation.item.delete": _item_delete,
        "conversation.item.retrieve": _item_retrieve,
        "conversation.item.truncate": _item_truncate,
        "input_audio_buffer.append": _append,
        "input_audio_buffer.commit": _commit,
        "input_audio_buffer.clear": _clear,
        "response.create": _response_create,
        "response.cancel": _response_cancel,
    }

    # -- the voice detector --------------------------------------------------------------------

    def _heard(self, heard: Heard) -> None:
        if heard.started:
            self._speech_start(heard.at_ms)
        else:
            self._speech_stop(heard.at_ms)

    def speech_started(self) -> None:
        if self._vad is not None and not self.detector.speaking:  # none runs without VAD
            self.detector.force(True)
            self._speech_start(self.detector.heard_ms)

    def speech_stopped(self) -> None:
        if self._vad is not None and self.detector.speaking:
            self.detector.force(False)
            self._speech_stop(self.detector.heard_ms)

    def user_said(self, text: str) -> None:
        self._transcript = text

    def _speech_start(self, at_ms: int) -> None:
        vad = self._vad or {}
        self._speech_item = self.script.new_id("item_")
        start = max(0, at_ms - int(vad.get("prefix_padding_ms") or 0))
        started = {"audio_start_ms": start, "item_id": self._speech_item}
        self.outbox.append({"type": "input_audio_buffer.speech_started", **started})
        if self.response is not None and vad.get("interrupt_response", True):
            self._cancel("turn_detected")

    def _speech_stop(self, at_ms: int) -> None:
        item_id = self._speech_item or self.script.new_id("item_")
        stopped = {"audio_end_ms": at_ms, "item_id": item_id}
        self.outbox.append({"type": "input_audio_buffer.speech_stopped", **stopped})
        vad = self._vad or {}
        self._commit_speech(item_id, respond=bool(vad.get("create_response", True)))

    def _commit_speech(self, item_id: str, *, respond: bool = False) -> None:
        """The audio buffer becomes a user message item (with its transcript, if the
        session asks for them); ``respond``: and a response starts, unless one is on."""
        self._speech_item = None
        self._buffered = 0
        previous = self.items[-1]["id"] if self.items else None
        committed = {"item_id": item_id, "previous_item_id": previous}
        self.outbox.append({"type": "input_audio_buffer.committed", **committed})
        heard: Message = {"type": "input_audio", "transcript": None}
        item = {
            "id": item_id,
            "object": "realtime.item",
            "type": "message",
            "status": "completed",
            "role": "user",
            "content": [heard],
        }
        self.items.append(item)
        self._acknowledge(item)
        said = self._transcript if self._transcript is not None else "(speech)"
        self._transcript = None
        transcribed: Message | None = None
        if self.session["audio"]["input"].get("transcription"):
            heard["transcript"] = said
            transcribed = {
                "type": "conversation.item.input_audio_transcription.completed",
                "item_id": item_id,
                "content_index": 0,
                "transcript": said,
                "usage": {"type": "duration", "seconds": 1},
            }
        if respond and self.response is None:
            self._start(transcribed)
        elif transcribed is not None:
            self.outbox.append(transcribed)

    # -- responses -----------------------------------------------------------------------------

    def _start(self, transcribed: Message | None = None) -> None:
        response = self.response = _Response(id=self.script.new_id("resp_"), audio=self._audio_out)
        plan: list[Thunk | float] = []
        if "no-created" not in self.config.quirks:
            plan.append(self._created(response))
        if transcribed is not None:
            plan.append(lambda: transcribed)
        step = self.script.next_step()
        for item in step:
            if isinstance(item, Pause):
                plan.append(float(item.seconds))
            elif isinstance(item, Say):
                plan += self._say(response, item.text)
            elif isinstance(item, ScriptedCall):
                plan += self._call(response, item)
                if item.truncate:
                    break
        else:
            plan.append(lambda: self._done(response, "completed"))
        self.replace_plan(self.paced(plan))

    def _created(self, response: _Response) -> Thunk:
        def thunk() -> Message:
            response.announced = True
            return self._response_event("response.created", response, "in_progress")

        return thunk

    def _output(self, response: _Response, item: Message) -> tuple[_Output, list[Thunk | float]]:
        """A new output item and the events that open it."""
        output = _Output(item=item, index=-1)

        def added() -> Message:
            output.index = len(response.outputs)
            response.outputs.append(output)
            output.sent.add("response.output_item.added")
            self.items.append(item)
            if item["type"] == "function_call":
                self.calls.add(item["call_id"])
            opened = copy.deepcopy(item)
            return self._event("response.output_item.added", response, output, item=opened)

        def conversation() -> Message:
            output.sent.add("conversation.item.added")
            return {"type": "conversation.item.added", **self._placed(item)}

        return output, [added, conversation]

    def _placed(self, item: Message) -> Message:
        """``item`` (a copy) and the id of the item before it in the conversation."""
        at = self.items.index(item) if item in self.items else 0
        return {
            "item": copy.deepcopy(item),
            "previous_item_id": self.items[at - 1]["id"] if at else None,
        }

    def _say(self, response: _Response, text: str) -> list[Thunk | float]:
        item = {
            "id": self.script.new_id("item_"),
            "object": "realtime.item",
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        output, plan = self._output(response, item)
        audio = response.audio
        part: Message = (
            {"type": "audio", "transcript": ""} if audio else {"type": "text", "text": ""}
        )

        def part_added() -> Message:
            output.sent.add("response.content_part.added")
            return self._event("response.content_part.added", response, output, part=part)

        plan.append(part_added)
        if audio:
            for chunk in utterance(text, self.config.chunk_ms):
                if chunk.transcript:
                    plan.append(self._transcript_delta(response, output, chunk.transcript))
                if chunk.samples:
                    plan.append(self._audio_delta(response, output, chunk.start, chunk.samples))
        else:
            for piece in words(text):
                plan.append(self._text_delta(response, output, piece))
        plan += self._finish(response, output, "completed")
        return plan

    def _transcript_delta(self, response: _Response, output: _Output, text: str) -> Thunk:
        def thunk() -> Message:
            output.said += text
            return self._event(
                "response.output_audio_transcript.delta", response, output, delta=text
            )

        return thunk

    def _text_delta(self, response: _Response, output: _Output, text: str) -> Thunk:
        def thunk() -> Message:
            output.said += text
            return self._event("response.output_text.delta", response, output, delta=text)

        return thunk

    def _audio_delta(self, response: _Response, output: _Output, start: int, count: int) -> Thunk:
        def thunk() -> Message:
            output.samples += count
            self.audio_samples[output.item["id"]] = output.samples
            data = base64.b64encode(tone(start, count)).decode("ascii")
            return self._event("response.output_audio.delta", response, output, delta=data)

        return thunk

    def _call(self, response: _Response, call: ScriptedCall) -> list[Thunk | float]:
        call_id = self.script.call_id(call, "call_")
        plan = self._call_item(response, call, call_id)
        if "duplicate-call" in self.config.quirks and not call.truncate:
            output, opening = self._output(response, self._call_message(call, call_id))
            plan += opening
            output.arguments = _text(call)
            plan += self._finish(response, output, "completed")
        return plan

    def _call_message(self, call: ScriptedCall, call_id: str) -> Message:
        return {
            "id": self.script.new_id("item_"),
            "object": "realtime.item",
            "type": "function_call",
            "status": "in_progress",
            "name": call.name,
            "call_id": call_id,
            "arguments": "",
        }

    def _call_item(
        self, response: _Response, call: ScriptedCall, call_id: str
    ) -> list[Thunk | float]:
        output, plan = self._output(response, self._call_message(call, call_id))
        for part in _parts(_text(call), call):

            def delta(part: str = part) -> Message:
                output.arguments += part
                extra = {"call_id": call_id, "delta": part}
                return self._event(
                    "response.function_call_arguments.delta", response, output, **extra
                )

            plan.append(delta)
        if call.truncate:
            plan += self._finish(response, output, "incomplete")
            plan.append(lambda: self._done(response, "incomplete", "max_output_tokens"))
        else:
            plan += self._finish(response, output, "completed")
        return plan

    def _finish(
        self, response: _Response, output: _Output, status: str, *, again: bool = False
    ) -> list[Thunk | float]:
        """The events that close ``output`` (each sent once: a cancel sends those a
        response had not sent yet); ``again``: resend its ``response.output_item.done``."""
        kind = output.item["type"]

        def once(name: str, build: Callable[[], Message], *, part: bool = False) -> Thunk:
            def thunk() -> Message | None:
                if name in output.sent and not again:
                    return None
                if part and "response.content_part.added" not in output.sent:
                    return None
                output.sent.add(name)
                return build()

            return thunk

        def final_item() -> Message:
            item = output.item
            if output.final:  # its status is said: a later event repeats it
                return copy.deepcopy(item)
            output.final = True
            item["status"] = status
            if kind == "function_call":
                item["arguments"] = output.arguments
            elif response.audio:
                item["content"] = [{"type": "output_audio", "transcript": output.said}]
            else:
                item["content"] = [{"type": "output_text", "text": output.said}]
            return copy.deepcopy(item)

        def item_done() -> Message:
            return self._event("response.output_item.done", response, output, item=final_item())

        def conversation_done() -> Message:
            final_item()
            return {"type": "conversation.item.done", **self._placed(output.item)}

        def closes(name: str) -> Message:
            """The event ``name`` about ``output`` as it stands."""
            fields: Message = {}
            if name == "response.function_call_arguments.done":
                fields = {"call_id": output.item["call_id"], "name": output.item["name"]}
                fields["arguments"] = output.arguments
            elif name == "response.output_audio_transcript.done":
                fields = {"transcript": output.said}
            elif name == "response.output_text.done":
                fields = {"text": output.said}
            elif name == "response.content_part.done":
                part = {"transcript": output.said} if response.audio else {"text": output.said}
                fields = {"part": {"type": "audio" if response.audio else "text", **part}}
            return self._event(name, response, output, **fields)

        if again:
            return [once("response.output_item.done", item_done)]
        if kind == "function_call":
            names = ["response.function_call_arguments.done"]
        elif response.audio:
            names = ["response.output_audio.done", "response.output_audio_transcript.done"]
        else:
            names = ["response.output_text.done"]
        if kind == "message":
            names.append("response.content_part.done")
        thunks: list[Thunk | float] = [
            once(name, functools.partial(closes, name), part=kind == "message") for name in names
        ]
        thunks.append(once("response.output_item.done", item_done))
        thunks.append(once("conversation.item.done", conversation_done))
        return thunks

    def _cancel(self, reason: str) -> None:
        """Stop the response where it is: close its open item, then ``response.done``
        ``cancelled`` (quirk ``late-done``: the open item's last events come after it, or
        the last item's ``response.output_item.done`` again if none was open)."""
        response = self.response
        if response is None or response.cancelling:
            return
        response.cancelling = True
        closing: list[Thunk | float] = []
        late: list[Thunk | float] = []
        if not response.announced and "no-created" not in self.config.quirks:
            closing.append(self._created(response))  # cancelled before it was announced
        for output in response.outputs:
            if "conversation.item.done" in output.sent:
                continue
            ending = self._finish(response, output, "incomplete")
            if output.open and "late-done" in self.config.quirks:
                keep = len(ending) - (3 if output.item["type"] == "function_call" else 2)
                ending, late = ending[:keep], ending[keep:]
            closing += ending
        if "late-done" in self.config.quirks and not late and response.outputs:
            last = response.outputs[-1]
            late = self._finish(response, last, last.item["status"], again=True)

        def done() -> Message:
            return self._done(response, "cancelled", reason)

        self.replace_plan([*closing, done, *late])

    def _done(self, response: _Response, status: str, reason: str | None = None) -> Message:
        self.response = None
        details = None if reason is None else {"type": status, "reason": reason}
        return self._response_event("response.done", response, status, details)

    def _response_event(
        self, kind: str, response: _Response, status: str, details: Message | None = None
    ) -> Message:
        final = kind == "response.done"
        output = [copy.deepcopy(o.item) for o in response.outputs] if final else []
        return {
            "type": kind,
            "response": {
                "object": "realtime.response",
                "id": response.id,
                "status": status,
                "status_details": details,
                "output": output,
                "conversation_id": "conv_fake",
                "output_modalities": ["audio" if response.audio else "text"],
                "max_output_tokens": "inf",
                "audio": {
                    "output": {
                        "format": dict(_PCM),
                        "voice": self.session["audio"]["output"]["voice"],
                    }
                },
                "usage": self._usage(response) if final else None,
                "metadata": None,
            },
        }

    def _usage(self, response: _Response) -> Message:
        text = sum(len(words(o.said)) + len(o.arguments) // 4 for o in response.outputs)
        audio = sum(o.samples for o in response.outputs) // (OUTPUT_RATE // 20)  # 20 a second
        given = 20 * len(self.items)
        return {
            "total_tokens": given + text + audio,
            "input_tokens": given,
            "output_tokens": text + audio,
            "input_token_details": {
                "text_tokens": given,
                "audio_tokens": 0,
                "image_tokens": 0,
                "cached_tokens": 0,
                "cached_tokens_details": {"text_tokens": 0, "audio_tokens": 0, "image_tokens": 0},
            },
            "output_token_details": {"text_tokens": text, "audio_tokens": audio},
        }

    def _event(self, kind: str, response: _Response, output: _Output, **fields: Any) -> Message:
        """A response event about ``output``: where it is, then ``fields`` (an event that
        carries the whole item names no ``item_id``)."""
        where: Message = {"response_id": response.id, "output_index": output.index}
        if "item" not in fields:
            where["item_id"] = output.item["id"]
            if output.item["type"] == "message":
                where["content_index"] = 0
        return {"type": kind, **where, **fields}


def _unknown(given: Message, allowed: set[str], where: str) -> str | None:
    """The first key of ``given`` not in ``allowed``, as its parameter path."""
    extra = sorted(set(given) - allowed)
    return f"{where}.{extra[0]}" if extra else None
