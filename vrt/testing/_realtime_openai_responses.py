"""How the fake OpenAI Realtime server plays a response, with no I/O.

A :class:`Responder` turns the script's next step into a plan (see ``_realtime_core``):
thunks that build each ``response.*`` event when it is pulled and keep the record of what
was sent (:class:`Output`), so a cancel closes exactly what is open. The conversation
(:class:`Conversation`) is shared with the server, which adds the client's items to it.
"""

from __future__ import annotations

import base64
import copy
import functools
from collections.abc import Callable
from typing import Any

import attrs

from vrt.models._scripted import Pause, Say, ScriptedCall
from vrt.testing._providers import _parts, _text
from vrt.testing._realtime_core import (
    OUTPUT_RATE,
    Config,
    Message,
    Script,
    Thunk,
    tone,
    utterance,
    words,
)

PCM = {"type": "audio/pcm", "rate": OUTPUT_RATE}
"""The audio format of both directions."""


@attrs.define
class Conversation:
    """A session's conversation: its items, and what is known of its calls and audio."""

    items: list[Message] = attrs.Factory(list)
    calls: set[str] = attrs.Factory(set)
    answered: set[str] = attrs.Factory(set)
    audio_samples: dict[str, int] = attrs.Factory(dict)
    """Samples of audio sent for each assistant item (what a truncate may keep)."""

    def find(self, item_id: str) -> Message | None:
        """The item with id ``item_id``, if the conversation holds it."""
        return next((item for item in self.items if item.get("id") == item_id), None)

    def placed(self, item: Message) -> Message:
        """``item`` (a copy) and the id of the item before it in the conversation."""
        at = self.items.index(item) if item in self.items else 0
        return {
            "item": copy.deepcopy(item),
            "previous_item_id": self.items[at - 1]["id"] if at else None,
        }


@attrs.define
class Output:
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
class Response:
    """The response being played: its items so far, and whether it was announced or is
    being cancelled."""

    id: str
    audio: bool
    outputs: list[Output] = attrs.Factory(list)
    announced: bool = False
    cancelling: bool = False


class Responder:
    """One connection's responses, at most one active; the server plays the plans."""

    def __init__(
        self, script: Script, config: Config, conversation: Conversation, session: Message
    ) -> None:
        self.script = script
        self.config = config
        self.conversation = conversation
        self.session = session
        """The server's session, read as it stands (the output modality, the voice)."""
        self.active: Response | None = None

    def start(self, transcribed: Message | None = None) -> list[Thunk | float]:
        """A new response to the script's next step, active now: the plan that plays it
        (``transcribed``: the user's transcription, sent after ``response.created``)."""
        audio = bool(self.session["output_modalities"] == ["audio"])
        response = self.active = Response(id=self.script.new_id("resp_"), audio=audio)
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
        return plan

    def _created(self, response: Response) -> Thunk:
        def thunk() -> Message:
            response.announced = True
            return self._response_event("response.created", response, "in_progress")

        return thunk

    def _output(self, response: Response, item: Message) -> tuple[Output, list[Thunk | float]]:
        """A new output item and the events that open it."""
        output = Output(item=item, index=-1)

        def added() -> Message:
            output.index = len(response.outputs)
            response.outputs.append(output)
            output.sent.add("response.output_item.added")
            self.conversation.items.append(item)
            if item["type"] == "function_call":
                self.conversation.calls.add(item["call_id"])
            opened = copy.deepcopy(item)
            return self._event("response.output_item.added", response, output, item=opened)

        def conversation() -> Message:
            output.sent.add("conversation.item.added")
            return {"type": "conversation.item.added", **self.conversation.placed(item)}

        return output, [added, conversation]

    def _say(self, response: Response, text: str) -> list[Thunk | float]:
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

    def _transcript_delta(self, response: Response, output: Output, text: str) -> Thunk:
        def thunk() -> Message:
            output.said += text
            return self._event(
                "response.output_audio_transcript.delta", response, output, delta=text
            )

        return thunk

    def _text_delta(self, response: Response, output: Output, text: str) -> Thunk:
        def thunk() -> Message:
            output.said += text
            return self._event("response.output_text.delta", response, output, delta=text)

        return thunk

    def _audio_delta(self, response: Response, output: Output, start: int, count: int) -> Thunk:
        def thunk() -> Message:
            output.samples += count
            self.conversation.audio_samples[output.item["id"]] = output.samples
            data = base64.b64encode(tone(start, count)).decode("ascii")
            return self._event("response.output_audio.delta", response, output, delta=data)

        return thunk

    def _call(self, response: Response, call: ScriptedCall) -> list[Thunk | float]:
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
        self, response: Response, call: ScriptedCall, call_id: str
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
        self, response: Response, output: Output, status: str, *, again: bool = False
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
            return {"type": "conversation.item.done", **self.conversation.placed(output.item)}

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

    def cancel(self, reason: str) -> list[Thunk | float] | None:
        """The plan that stops the active response where it is: close its open item, then
        ``response.done`` ``cancelled`` (quirk ``late-done``: the open item's last events
        come after it, or the last item's ``response.output_item.done`` again if none was
        open). None: no response is active, or it is being cancelled already."""
        response = self.active
        if response is None or response.cancelling:
            return None
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

        return [*closing, done, *late]

    def _done(self, response: Response, status: str, reason: str | None = None) -> Message:
        self.active = None
        details = None if reason is None else {"type": status, "reason": reason}
        return self._response_event("response.done", response, status, details)

    def _response_event(
        self, kind: str, response: Response, status: str, details: Message | None = None
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
                        "format": dict(PCM),
                        "voice": self.session["audio"]["output"]["voice"],
                    }
                },
                "usage": self._usage(response) if final else None,
                "metadata": None,
            },
        }

    def _usage(self, response: Response) -> Message:
        text = sum(len(words(o.said)) + len(o.arguments) // 4 for o in response.outputs)
        audio = sum(o.samples for o in response.outputs) // (OUTPUT_RATE // 20)  # 20 a second
        given = 20 * len(self.conversation.items)
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

    def _event(self, kind: str, response: Response, output: Output, **fields: Any) -> Message:
        """A response event about ``output``: where it is, then ``fields`` (an event that
        carries the whole item names no ``item_id``)."""
        where: Message = {"response_id": response.id, "output_index": output.index}
        if "item" not in fields:
            where["item_id"] = output.item["id"]
            if output.item["type"] == "message":
                where["content_index"] = 0
        return {"type": kind, **where, **fields}
