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

This module keeps the session and the event dispatch; what a ``session.update`` or an
item may hold is checked in ``_realtime_openai_checks``, and a response is played by
``_realtime_openai_responses``.
"""

from __future__ import annotations

import base64
import binascii
import copy
from collections.abc import Callable
from typing import Any, ClassVar

from vrt.testing._realtime_core import (
    OUTPUT_RATE,
    Config,
    Heard,
    Message,
    Script,
    ServerCore,
    VoiceDetector,
)
from vrt.testing._realtime_openai_checks import Refusal, item_refusal, session_refusal
from vrt.testing._realtime_openai_responses import PCM, Conversation, Responder

PATH = "/v1/realtime"

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
                    "format": dict(PCM),
                    "transcription": None,
                    "noise_reduction": None,
                    "turn_detection": dict(_VAD_DEFAULTS["server_vad"]),
                },
                "output": {"format": dict(PCM), "voice": "marin", "speed": 1.0},
            },
        }
        self.conversation = Conversation()
        self.responder = Responder(script, config, self.conversation, self.session)
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

    def _refused(self, refusal: Refusal) -> None:
        self._refuse(refusal.code, refusal.text, refusal.violation, refusal.param)

    @property
    def _vad(self) -> Message | None:
        detection: Message | None = self.session["audio"]["input"]["turn_detection"]
        return detection

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
        refusal = session_refusal(message)
        if refusal is not None:
            self._refused(refusal)
            return
        session = message["session"]
        audio = session.get("audio")
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
        conversation = self.conversation
        items = conversation.items
        refusal = item_refusal(message, items, conversation.calls, conversation.answered)
        if refusal is not None:
            self._refused(refusal)
            return
        item = message["item"]
        previous = message.get("previous_item_id")
        added = copy.deepcopy(item)
        added.setdefault("id", self.script.new_id("item_"))
        added["object"] = "realtime.item"
        added["status"] = "completed"
        for part in added.get("content") or ():
            if isinstance(part, dict):
                part.pop("audio", None)  # the events never carry audio
        before = conversation.find(previous) if previous not in (None, "root") else None
        if previous is None:
            items.append(added)
        else:
            items.insert(0 if before is None else items.index(before) + 1, added)
        if added["type"] == "function_call":
            conversation.calls.add(added.get("call_id") or added["id"])
        elif added["type"] == "function_call_output":
            conversation.answered.add(added["call_id"])
        self._acknowledge(added)

    def _acknowledge(self, item: Message) -> None:
        self.outbox.append({"type": "conversation.item.added", **self.conversation.placed(item)})
        self.outbox.append({"type": "conversation.item.done", **self.conversation.placed(item)})

    def _item_delete(self, message: Message) -> None:
        item = self.conversation.find(str(message.get("item_id")))
        if item is None:
            text = f"Item with id '{message.get('item_id')}' not found."
            self._refuse("item_not_found", text, "delete of an unknown item", "item_id")
            return
        self.conversation.items.remove(item)
        self.outbox.append({"type": "conversation.item.deleted", "item_id": item["id"]})

    def _item_retrieve(self, message: Message) -> None:
        item = self.conversation.find(str(message.get("item_id")))
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
        item = self.conversation.find(str(item_id))
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
        have = self.conversation.audio_samples.get(item["id"], 0) * 1000 // OUTPUT_RATE
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
        active = self.responder.active
        if active is not None:
            text = (
                f"Conversation already has an active response in progress: {active.id}."
                " Wait until the response is finished before creating a new one."
            )
            violation = f"response.create while {active.id} is active"
            self._refuse("conversation_already_has_active_response", text, violation)
            return
        self._start()

    def _response_cancel(self, message: Message) -> None:
        if self.responder.active is None:
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
        if self.responder.active is not None and vad.get("interrupt_response", True):
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
        items = self.conversation.items
        previous = items[-1]["id"] if items else None
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
        items.append(item)
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
        if respond and self.responder.active is None:
            self._start(transcribed)
        elif transcribed is not None:
            self.outbox.append(transcribed)

    # -- responses -----------------------------------------------------------------------------

    def _start(self, transcribed: Message | None = None) -> None:
        self.replace_plan(self.paced(self.responder.start(transcribed)))

    def _cancel(self, reason: str) -> None:
        plan = self.responder.cancel(reason)
        if plan is not None:
            self.replace_plan(plan)
