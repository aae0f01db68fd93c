"""Anthropic Messages, sans-IO: the request body, the history, and the stream mapper.

The stream is typed events: ``message_start``, then per content block
``content_block_start`` (``text`` or ``tool_use`` with its id and name),
``content_block_delta`` (``text_delta`` or ``input_json_delta``), ``content_block_stop``;
then ``message_delta`` (the ``stop_reason``) and ``message_stop``. ``ping`` is ignored; an
``error`` event raises :class:`~vrt.ModelError`. A tool block ends at its
``content_block_stop``, but the API stops a block cut off at ``max_tokens`` like a whole
one (``content_block_stop``, then ``message_delta`` saying ``max_tokens``): so the last
tool block's ``CallEnd`` is held until the next block starts or the ``message_delta``
comes, and dropped if that says ``max_tokens``: the call was cut off, it fails. A stream
that ends before ``message_stop`` raises :class:`~vrt.ModelError`.
"""

from __future__ import annotations

import re
from typing import Any

from vrt._errors import ModelError
from vrt.models._chat import MakeId
from vrt.models._protocol import (
    CallDelta,
    CallEnd,
    CallStart,
    ModelEvent,
    ModelRequest,
    Text,
    Usage,
    tokens,
)
from vrt.models._render import User, arguments_object, conversation, result_text, tools_of

_ID = re.compile(r"[^A-Za-z0-9_-]")
EMPTY_INPUT = "(an empty message)"
"""What an empty user input is sent as: the API refuses an empty text block."""


def _tool_id(call_id: str) -> str:
    """Anthropic takes ``^[a-zA-Z0-9_-]+$`` for a tool_use id (the same both ways)."""
    return _ID.sub("_", call_id) or "call"


def render_anthropic(request: ModelRequest) -> tuple[str, list[dict[str, Any]]]:
    """The ``system`` text and the Messages ``messages`` for ``request``.

    Roles alternate: each assistant step's ``tool_use`` blocks are answered by
    ``tool_result`` blocks at the start of the next user message, which also carries the
    next input (consecutive user content is merged into one message). The API refuses
    empty and whitespace-only text blocks: such an assistant text is left out, such a user
    input is sent as :data:`EMPTY_INPUT`.
    """
    messages: list[dict[str, Any]] = []

    def user(blocks: list[dict[str, Any]]) -> None:
        if messages and messages[-1]["role"] == "user":
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": "user", "content": blocks})

    for entry in conversation(request.history):
        if isinstance(entry, User):
            user(
                [{"type": "text", "text": entry.content if entry.content.strip() else EMPTY_INPUT}]
            )
            continue
        blocks: list[dict[str, Any]] = []
        if entry.text.strip():
            blocks.append({"type": "text", "text": entry.text})
        for call in entry.calls:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": _tool_id(call.call_id),
                    "name": call.name,
                    "input": arguments_object(call.arguments),
                }
            )
        if not blocks:
            continue  # a step that produced nothing
        messages.append({"role": "assistant", "content": blocks})
        if entry.calls:
            user(
                [
                    {
                        "type": "tool_result",
                        "tool_use_id": _tool_id(call.call_id),
                        "content": result_text(call.result),
                        "is_error": not call.result.ok,
                    }
                    for call in entry.calls
                ]
            )
    messages = [m for m in messages if m["content"]]
    return request.instructions, messages


def anthropic_body(request: ModelRequest, model: str, max_tokens: int) -> dict[str, Any]:
    """The request body (``extra_body`` is merged in by the adapter)."""
    system, messages = render_anthropic(request)
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "messages": messages,
        "stream": True,
    }
    if system:
        body["system"] = system
    if request.tools:
        body["tools"] = [
            {"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
            for t in tools_of(request.tools)
        ]
    return body


class AnthropicMapper:
    """Messages stream events (``event:`` name, parsed ``data:``) to vrt events."""

    def __init__(self, make_id: MakeId) -> None:
        self._make_id = make_id
        # index -> (vrt id, any input_json_delta yet, the input the block started with)
        self._blocks: dict[Any, tuple[str, bool, dict[str, Any]]] = {}
        self._held: CallEnd | None = None  # the last tool block's end, until it is sure
        self._input: int | None = None  # input tokens, as message_start said
        self.finished = False

    def event(self, name: str, data: Any) -> list[ModelEvent]:
        """The vrt events of one stream event."""
        if not isinstance(data, dict):
            raise ModelError("the stream sent an event that is not a JSON object")
        kind = data.get("type", name)
        if kind == "error":
            error = data.get("error") or {}
            message = error.get("message") if isinstance(error, dict) else None
            raise ModelError(f"the provider reported an error: {message or error}")
        if kind == "content_block_start":
            events = self._release()  # a block after it: the held call was whole
            block = data.get("content_block") or {}
            index = data.get("index")
            if isinstance(block, dict) and block.get("type") == "tool_use":
                provider_id = block.get("id") if isinstance(block.get("id"), str) else None
                call_id = self._make_id(provider_id or None)
                given = block.get("input")
                self._blocks[index] = (call_id, False, given if isinstance(given, dict) else {})
                events.append(CallStart(call_id=call_id, name=str(block.get("name"))))
            elif isinstance(block, dict) and block.get("type") == "text" and block.get("text"):
                events.append(Text(text=block["text"]))
            return events
        if kind == "content_block_delta":
            delta = data.get("delta") or {}
            if not isinstance(delta, dict):
                return []
            if delta.get("type") == "text_delta" and delta.get("text"):
                return [Text(text=str(delta["text"]))]
            if delta.get("type") == "input_json_delta":
                found = self._blocks.get(data.get("index"))
                fragment = delta.get("partial_json")
                if found is not None and isinstance(fragment, str) and fragment:
                    self._blocks[data.get("index")] = (found[0], True, found[2])
                    return [CallDelta(call_id=found[0], delta=fragment)]
            return []
        if kind == "content_block_stop":
            found = self._blocks.pop(data.get("index"), None)
            if found is None:
                return []
            call_id, streamed, given = found
            events = self._release()
            self._held = (
                CallEnd(call_id=call_id) if streamed else CallEnd(call_id=call_id, arguments=given)
            )
            return events
        if kind == "message_start":
            message = data.get("message")
            usage = tokens(
                message.get("usage") if isinstance(message, dict) else None,
                "input_tokens",
                "output_tokens",
            )
            if usage is None:
                return []
            self._input = usage.input_tokens
            return [usage]
        if kind == "message_delta":
            delta = data.get("delta") or {}
            if isinstance(delta, dict) and delta.get("stop_reason") == "max_tokens":
                self._held = None  # cut off, though its block was stopped: it fails
                self._blocks.clear()  # still open: cut off, they fail
            events = self._release()
            usage = tokens(data.get("usage"), "input_tokens", "output_tokens")
            if usage is not None:  # output_tokens so far; input_tokens was at the start
                events.append(
                    Usage(
                        input_tokens=usage.input_tokens or self._input,
                        output_tokens=usage.output_tokens,
                    )
                )
            return events
        if kind == "message_stop":
            self.finished = True
            return self._release()
        return []  # message_start, ping, and what a newer API adds

    def end(self) -> list[ModelEvent]:
        """The end of the stream: it must have said ``message_stop``."""
        if not self.finished:
            raise ModelError("the provider's stream ended before its last event")
        return []

    def _release(self) -> list[ModelEvent]:
        held, self._held = self._held, None
        return [held] if held is not None else []
