"""OpenAI Responses, sans-IO and stateless: the request body, the input items, the mapper.

Stateless: ``store: false`` and the whole input every step, so nothing depends on what
the provider kept. A call is a ``function_call`` output item: it starts at
``response.output_item.added`` (its ``call_id`` becomes the vrt call id), its argument
fragments come as ``response.function_call_arguments.delta`` keyed by the item's id, and
``response.output_item.done`` is its authoritative end, with the whole arguments. A call
whose item is done with a status other than ``completed`` (``incomplete``: cut off at
``max_output_tokens``), or still open when the response ends, fails. ``error`` and
``response.failed`` raise :class:`~vrt.ModelError`, and so does a stream that ends before
the response does.
"""

from __future__ import annotations

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
    tokens,
)
from vrt.models._render import (
    User,
    conversation,
    function_call_item,
    function_output_item,
    tools_of,
)


def render_openai_responses(request: ModelRequest) -> list[dict[str, Any]]:
    """The Responses ``input`` items for ``request`` (the instructions go in the body's
    ``instructions``): user and assistant messages with text content, each call
    as a ``function_call`` item (by ``call_id``) and its ``function_call_output`` right
    after the step's calls."""
    items: list[dict[str, Any]] = []
    for entry in conversation(request.history):
        if isinstance(entry, User):
            items.append({"type": "message", "role": "user", "content": entry.content})
            continue
        if entry.text:
            # The input-message form with text content: an output message item (typed
            # ``output_text`` parts) would need the id and status the provider gave it,
            # and a stateless request has neither.
            items.append({"type": "message", "role": "assistant", "content": entry.text})
        items.extend(function_call_item(call) for call in entry.calls)
        items.extend(function_output_item(call) for call in entry.calls)
    return items


def responses_body(request: ModelRequest, model: str) -> dict[str, Any]:
    """The request body (``extra_body`` is merged in by the adapter)."""
    body: dict[str, Any] = {
        "model": model,
        "input": render_openai_responses(request),
        "stream": True,
        "store": False,
    }
    if request.instructions:
        body["instructions"] = request.instructions
    if request.tools:
        body["tools"] = [{"type": "function", **tool} for tool in tools_of(request.tools)]
    return body


class ResponsesMapper:
    """Responses stream events (parsed ``data:``) to vrt events."""

    def __init__(self, make_id: MakeId) -> None:
        self._make_id = make_id
        self._items: dict[str, str] = {}  # item id -> vrt call id, while open
        self._by_output: dict[Any, str] = {}  # output_index -> item id (deltas may use it)
        self.finished = False

    def event(self, data: Any) -> list[ModelEvent]:
        """The vrt events of one stream event."""
        if not isinstance(data, dict):
            raise ModelError("the stream sent an event that is not a JSON object")
        kind = data.get("type")
        if kind == "response.output_text.delta":
            delta = data.get("delta")
            return [Text(text=delta)] if isinstance(delta, str) and delta else []
        if kind == "response.output_item.added":
            item = data.get("item") or {}
            if isinstance(item, dict) and item.get("type") == "function_call":
                item_id = str(item.get("id") or item.get("call_id") or data.get("output_index"))
                provider_id = item.get("call_id") if isinstance(item.get("call_id"), str) else None
                call_id = self._make_id(provider_id or None)
                self._items[item_id] = call_id
                self._by_output[data.get("output_index")] = item_id
                return [CallStart(call_id=call_id, name=str(item.get("name")))]
            return []
        if kind == "response.function_call_arguments.delta":
            key = data.get("item_id") or self._by_output.get(data.get("output_index"))
            open_call = self._items.get(str(key))
            delta = data.get("delta")
            if open_call is not None and isinstance(delta, str) and delta:
                return [CallDelta(call_id=open_call, delta=delta)]
            return []
        if kind == "response.output_item.done":
            item = data.get("item") or {}
            if not isinstance(item, dict) or item.get("type") != "function_call":
                return []
            done = self._items.pop(
                str(item.get("id") or item.get("call_id") or data.get("output_index")), None
            )
            if done is None or item.get("status", "completed") != "completed":
                return []  # cut off (``incomplete``): no CallEnd, it fails
            arguments = item.get("arguments")
            if isinstance(arguments, str) and arguments:
                return [CallEnd(call_id=done, arguments=arguments)]  # the authoritative text
            return [CallEnd(call_id=done, arguments={})]
        if kind in ("response.completed", "response.incomplete"):
            self.finished = True
            self._items.clear()  # not done by now: cut off, they fail
            response = data.get("response")
            found = response.get("usage") if isinstance(response, dict) else None
            usage = tokens(found, "input_tokens", "output_tokens")
            return [usage] if usage is not None else []
        if kind in ("error", "response.failed"):
            raise ModelError(f"the provider reported an error: {_message(data)}")
        return []  # response.created, in_progress, content parts, reasoning, ...

    def end(self) -> list[ModelEvent]:
        """The end of the stream: the response must have ended."""
        if not self.finished:
            raise ModelError("the provider's stream ended before its last event")
        return []


def _message(data: dict[str, Any]) -> str:
    error = data.get("error")
    if error is None and isinstance(data.get("response"), dict):
        error = data["response"].get("error")
    if isinstance(error, dict):
        return str(error.get("message") or error.get("code") or "error")
    return str(data.get("message") or error or "error")
