"""OpenAI Chat Completions, sans-IO: the request body, the history, and the stream mapper.

One mapper serves every server that speaks the API, with what they really send:

- a call is keyed by ``id``, then ``index``: a new id at an index in use is a new call
  (Ollama numbers every parallel call 0); a call without an id gets a stable one;
  indexes may start at 1 and skip;
- the name is set once and never concatenated (LM Studio and old llama.cpp repeat it,
  or send it empty, in every delta);
- arguments come as string fragments or, from some servers, as one object; a whole call
  may come in one chunk; a call with no arguments at all gets ``{}``;
- a call ends (``CallEnd``) only at a ``finish_reason`` of ``tool_calls`` or ``stop``
  (Ollama says ``stop`` after calls), at ``[DONE]`` or at the end of the stream, never
  when the next index starts; ``finish_reason: "length"`` means the calls still open were
  cut off: no ``CallEnd``, so they fail;
- an ``error`` object in the stream raises :class:`~vrt.ModelError`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vrt._errors import ModelError
from vrt.models._protocol import (
    CallDelta,
    CallEnd,
    CallStart,
    ModelEvent,
    ModelRequest,
    Text,
    tokens,
)
from vrt.models._render import (
    Assistant,
    User,
    arguments_text,
    conversation,
    result_text,
    tools_of,
)

MAX_NAMELESS = 1 << 20
"""Characters of a call's arguments kept while its name has not come."""

MakeId = Callable[[str | None], str]
"""A provider's call id (or None) to the call's vrt id: unique in the session."""


def render_openai_chat(request: ModelRequest) -> list[dict[str, Any]]:
    """The Chat Completions ``messages`` for ``request``: the instructions as the system
    message, then the conversation (each assistant step's ``tool_calls``, then one
    ``tool`` message per call, in call order)."""
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    for entry in conversation(request.history):
        if isinstance(entry, User):
            messages.append({"role": "user", "content": entry.content})
            continue
        messages.append(_assistant(entry))
        for call in entry.calls:
            messages.append(
                {"role": "tool", "tool_call_id": call.call_id, "content": result_text(call.result)}
            )
    return messages


def _assistant(step: Assistant) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": step.text or None}
    if step.calls:
        message["tool_calls"] = [
            {
                "id": call.call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": arguments_text(call.arguments)},
            }
            for call in step.calls
        ]
    elif not step.text:
        message["content"] = ""  # a step that said nothing: still a valid message
    return message


def chat_body(request: ModelRequest, model: str) -> dict[str, Any]:
    """The request body (``extra_body`` is merged in by the adapter)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": render_openai_chat(request),
        "stream": True,
    }
    if request.tools:
        body["tools"] = [{"type": "function", "function": tool} for tool in tools_of(request.tools)]
    return body


class _Call:
    __slots__ = (
        "buffer",
        "buffered",
        "ended",
        "has_arguments",
        "name",
        "provider_id",
        "started",
        "vrt_id",
        "whole",
    )

    def __init__(self, provider_id: str | None, vrt_id: str) -> None:
        self.provider_id = provider_id
        self.vrt_id = vrt_id
        self.name: str | None = None
        self.started = False
        self.ended = False
        self.has_arguments = False
        self.whole: Any = None  # arguments sent as one object
        self.buffer: list[str] = []  # fragments before the name was known
        self.buffered = 0  # their characters


class ChatMapper:
    """Chat Completions stream chunks (parsed JSON) to :mod:`vrt.models` events."""

    def __init__(self, make_id: MakeId) -> None:
        self._make_id = make_id
        self._slots: dict[Any, _Call] = {}  # index -> the call there now
        self._calls: list[_Call] = []  # every call, in order
        self._cut = False  # finish_reason "length"
        self.finished = False

    def chunk(self, data: Any) -> list[ModelEvent]:
        """The events of one ``data:`` object of the stream."""
        if not isinstance(data, dict):
            raise ModelError("the stream sent a chunk that is not a JSON object")
        error = data.get("error")
        if error:
            raise ModelError(_error_message(error))
        if data.get("object") == "error":  # vLLM's older form: the error is the chunk
            raise ModelError(_error_message(data))
        events: list[ModelEvent] = []
        choices = data.get("choices") or []
        for choice in choices[:1]:  # n=1: one choice
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta, dict):
                content = delta.get("content")
                if isinstance(content, str) and content:
                    events.append(Text(text=content))
                for position, part in enumerate(delta.get("tool_calls") or []):
                    if isinstance(part, dict):
                        self._part(position, part, events)
            reason = choice.get("finish_reason")
            if reason == "length":
                self._cut = True
            elif reason:  # tool_calls, stop (Ollama after calls), function_call, ...
                events.extend(self._end_all())
        usage = tokens(data.get("usage"), "prompt_tokens", "completion_tokens")
        if usage is not None:  # the last chunk (OpenAI: stream_options.include_usage)
            events.append(usage)
        return events

    def done(self) -> list[ModelEvent]:
        """``[DONE]`` or the end of the stream: the calls still open end (unless the
        stream was cut at ``length``)."""
        self.finished = True
        return self._end_all()

    def _part(self, position: int, part: dict[str, Any], events: list[ModelEvent]) -> None:
        index = part.get("index", position)
        provider_id = part.get("id") if isinstance(part.get("id"), str) and part["id"] else None
        call = self._slots.get(index)
        if (
            call is None
            or (
                provider_id is not None
                and call.provider_id is not None
                and provider_id != call.provider_id
            )
            or call.ended
        ):
            call = _Call(provider_id, self._make_id(provider_id))
            self._slots[index] = call
            self._calls.append(call)
        elif provider_id is not None and call.provider_id is None:
            call.provider_id = provider_id  # an id after the first delta: keep the vrt id
        function = part.get("function") or {}
        if not isinstance(function, dict):
            return
        name = function.get("name")
        if call.name is None and isinstance(name, str) and name:
            call.name = name  # once: a repeated or empty name later is ignored
        arguments = function.get("arguments")
        if call.name is not None and not call.started:
            call.started = True
            events.append(CallStart(call_id=call.vrt_id, name=call.name))
            for fragment in call.buffer:
                events.append(CallDelta(call_id=call.vrt_id, delta=fragment))
            call.buffer = []
        if isinstance(arguments, str):
            if arguments:
                call.has_arguments = True
                if call.started:
                    events.append(CallDelta(call_id=call.vrt_id, delta=arguments))
                else:
                    call.buffered += len(arguments)
                    if call.buffered > MAX_NAMELESS:
                        raise ModelError(
                            f"the stream sent over {MAX_NAMELESS} characters of a call's "
                            "arguments before its name"
                        )
                    call.buffer.append(arguments)
        elif isinstance(arguments, dict):
            call.whole = arguments  # the whole arguments, as an object

    def _end_all(self) -> list[ModelEvent]:
        events: list[ModelEvent] = []
        if self._cut:
            return events  # cut off at the length limit: the open calls fail
        for call in self._calls:
            if call.ended or not call.started:
                continue
            call.ended = True
            if call.whole is not None:
                events.append(CallEnd(call_id=call.vrt_id, arguments=call.whole))
            elif call.has_arguments:
                events.append(CallEnd(call_id=call.vrt_id))
            else:
                events.append(CallEnd(call_id=call.vrt_id, arguments={}))
        return events


def _error_message(error: Any) -> str:
    if isinstance(error, dict):
        message = error.get("message") or error.get("type") or "error"
    else:
        message = str(error)
    return f"the provider reported an error: {message}"
