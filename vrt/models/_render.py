"""What every provider's history rendering shares: the history in conversational shape.

A vrt history is a flat list (user inputs, the agent's text, call records, interrupted
marks). Each provider wants messages: the user's, the assistant's (its text and the calls
it made in one step), then one result per call, right after the assistant message that
made it. :func:`conversation` does that grouping once, so the three renderings differ
only in their JSON. The rules they all keep (the providers answer HTTP 400 otherwise):

- every call the model started has exactly one result, right after its assistant message,
  interrupted, rejected, invalid and failed ones included;
- its arguments are always a valid JSON object text (``"{}"`` when they never completed
  or were not an object);
- an interrupted turn is marked (the note, which says "interrupted", goes with the next
  user message) so the model does not assume the user heard or saw all of it;
- a result is the JSON text of its :class:`~vrt.ToolResult`: ``{"ok": true, "output":
  ...}`` or ``{"ok": false, "code": ..., "message": ...}``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

import attrs

from vrt._core.results import CallRecord, ToolResult
from vrt.models._protocol import AgentText, HistoryItem, TurnInterrupted, UserInput


@attrs.define
class User:
    """A user message: the input, after the notes of the interrupted turns before it."""

    text: str
    notes: list[str] = attrs.Factory(list)

    @property
    def content(self) -> str:
        """The text the provider gets: the notes first, in brackets."""
        return "\n\n".join([*(f"[{note}]" for note in self.notes), self.text])


@attrs.define
class Assistant:
    """One model step as the model produced it: its text, then its calls."""

    text: str = ""
    calls: list[CallRecord] = attrs.Factory(list)


def conversation(history: Iterable[HistoryItem]) -> list[User | Assistant]:
    """The history as alternating user messages and assistant steps (a step's calls carry
    their results). Notes of an interrupted turn that nothing followed come last, as a
    user message of their own."""
    entries: list[User | Assistant] = []
    notes: list[str] = []
    current: Assistant | None = None
    for item in history:
        if isinstance(item, UserInput):
            current = None
            entries.append(User(text=item.text, notes=notes))
            notes = []
        elif isinstance(item, AgentText):
            if current is None or current.calls:
                current = Assistant()
                entries.append(current)
            current.text += item.text
        elif isinstance(item, CallRecord):
            if current is None:
                current = Assistant()
                entries.append(current)
            current.calls.append(item)
        elif isinstance(item, TurnInterrupted):
            current = None
            notes.append(item.note)
    if notes:
        entries.append(User(text="", notes=notes))
    return entries


def arguments_text(arguments: Any) -> str:
    """A call's arguments as the JSON text of an object, always (``"{}"`` otherwise)."""
    return strict_json(arguments_object(arguments))


def strict_json(value: Any) -> str:
    """``value`` as JSON text that any parser reads: what is not JSON becomes its ``str``,
    and NaN and the infinities ``null`` (as JavaScript's ``JSON.stringify`` writes them),
    never the ``NaN`` that Python's json writes and a provider refuses."""
    try:
        return json.dumps(value, default=str, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(value), default=str, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def arguments_object(arguments: Any) -> dict[str, Any]:
    """A call's arguments as a JSON object: parsed if they are text, ``{}`` when they never
    completed or are not an object."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return {}
    return arguments if isinstance(arguments, dict) else {}


def result_text(result: ToolResult) -> str:
    """A result as the model reads it: the JSON text of ``ok`` and ``output``, or ``ok``,
    ``code`` and ``message``."""
    if result.ok:
        body: dict[str, Any] = {"ok": True, "output": result.output}
    else:
        body = {"ok": False, "code": str(result.code), "message": result.message or ""}
    return strict_json(body)


def function_call_item(call: CallRecord) -> dict[str, Any]:
    """A call as an OpenAI ``function_call`` item (the Responses API and Realtime alike)."""
    return {
        "type": "function_call",
        "call_id": call.call_id,
        "name": call.name,
        "arguments": arguments_text(call.arguments),
    }


def function_output_item(call: CallRecord) -> dict[str, Any]:
    """A call's result as an OpenAI ``function_call_output`` item (both APIs alike)."""
    return {
        "type": "function_call_output",
        "call_id": call.call_id,
        "output": result_text(call.result),
    }


def tools_of(specs: Iterable[Any]) -> list[dict[str, Any]]:
    """Name, description and parameters of each :class:`~vrt.ToolSpec`, in order."""
    return [
        {"name": spec.name, "description": spec.description, "parameters": spec.parameters}
        for spec in specs
    ]
