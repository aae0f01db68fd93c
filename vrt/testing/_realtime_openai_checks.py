"""What the fake OpenAI Realtime server refuses in a client's ``session.update`` and
``conversation.item.create``, as pure functions.

Each check takes the client's message (and, for an item, what the conversation holds) and
gives back the :class:`Refusal` the server answers with, or None when the message is fine.
The keys each part of a session, a tool and an item may hold are tables here: anything
else is refused as ``unknown_parameter``, as the real server does.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import attrs

from vrt.testing._realtime_core import Message

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


@attrs.frozen(kw_only=True)
class Refusal:
    """The ``error`` event's code, message and param, and the violation recorded."""

    code: str | None
    text: str
    violation: str
    param: str | None = None


def session_refusal(message: Message) -> Refusal | None:
    """What is wrong with a ``session.update`` (its shape, its keys, its modalities)."""
    session = message.get("session")
    if not isinstance(session, dict):
        return Refusal(
            code="missing_required_parameter",
            text="Missing required parameter: 'session'.",
            violation="session.update without a session",
            param="session",
        )
    if "type" not in session:
        return Refusal(
            code="missing_required_parameter",
            text="Missing required parameter: 'session.type'.",
            violation="session.update without session.type",
            param="session.type",
        )
    if session["type"] != "realtime":
        return Refusal(
            code="invalid_value",
            text=f"Invalid value: '{session['type']}'. The fake serves 'realtime' sessions only.",
            violation=f"session.type {session['type']!r}",
            param="session.type",
        )
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
        return _unknown_parameter(unknown)
    modalities = session.get("output_modalities")
    if modalities is not None and modalities not in (["audio"], ["text"]):
        return Refusal(
            code="invalid_value",
            text="output_modalities must be ['audio'] or ['text'].",
            violation=f"output_modalities {modalities!r}",
            param="session.output_modalities",
        )
    return None


def item_refusal(
    message: Message, items: Sequence[Message], calls: Collection[str], answered: Collection[str]
) -> Refusal | None:
    """What is wrong with a ``conversation.item.create``, given the conversation's
    ``items``, the ``calls`` made in it and the calls ``answered``."""
    item = message.get("item")
    if not isinstance(item, dict):
        return Refusal(
            code="missing_required_parameter",
            text="Missing required parameter: 'item'.",
            violation="conversation.item.create without an item",
            param="item",
        )
    refusal = _item_refusal(item, items, calls, answered)
    if refusal is not None:
        return refusal
    previous = message.get("previous_item_id")
    if previous is not None and previous != "root" and not _holds(items, previous):
        return Refusal(
            code="item_not_found",
            text=f"Previous item with id '{previous}' not found.",
            violation=f"previous_item_id {previous!r} not in the conversation",
            param="previous_item_id",
        )
    return None


def _item_refusal(
    item: Message, items: Sequence[Message], calls: Collection[str], answered: Collection[str]
) -> Refusal | None:
    """What is wrong with a client's item (its keys, its id, what its type needs)."""
    unknown = _unknown(item, _ITEM_KEYS, "item")
    if unknown:
        return _unknown_parameter(unknown)
    kind = item.get("type")
    if item.get("id") is not None and _holds(items, item["id"]):
        return Refusal(
            code="invalid_value",
            text=f"Item with id '{item['id']}' already exists.",
            violation=f"a second item with id {item['id']!r}",
            param="item.id",
        )
    if kind == "message":
        return _message_refusal(item)
    if kind == "function_call":
        for key in ("name", "arguments"):
            if not isinstance(item.get(key), str):
                return Refusal(
                    code="missing_required_parameter",
                    text=f"Missing required parameter: 'item.{key}'.",
                    violation=f"function_call without {key}",
                    param=key,
                )
        return None
    if kind == "function_call_output":
        return _output_refusal(item, calls, answered)
    return Refusal(
        code="invalid_value",
        text=(
            f"Invalid value: '{kind}'. The fake takes 'message', 'function_call' and"
            " 'function_call_output'."
        ),
        violation=f"item of type {kind!r}",
        param="item.type",
    )


def _message_refusal(item: Message) -> Refusal | None:
    """A message item needs a known role and content of the types that role may send."""
    role = item.get("role")
    if role not in _CONTENT_TYPES:
        return Refusal(
            code="invalid_value",
            text=f"Invalid value: '{role}'.",
            violation=f"role {role!r}",
            param="item.role",
        )
    content = item.get("content")
    if not isinstance(content, list) or not content:
        return Refusal(
            code="missing_required_parameter",
            text="Missing required parameter: 'item.content'.",
            violation="a message without content",
            param="item.content",
        )
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _CONTENT_TYPES[role]:
            allowed = ", ".join(f"'{t}'" for t in sorted(_CONTENT_TYPES[role]))
            return Refusal(
                code="invalid_value",
                text=f"Invalid value: '{kind}'. Supported values are: {allowed}.",
                violation=f"{role} content of type {kind!r}",
                param=f"item.content[{index}].type",
            )
    return None


def _output_refusal(
    item: Message, calls: Collection[str], answered: Collection[str]
) -> Refusal | None:
    """A tool's output is a string, for a call made and not answered yet."""
    call_id = item.get("call_id")
    if not isinstance(item.get("output"), str):
        return Refusal(
            code="invalid_type",
            text="Invalid type for 'item.output': expected a string.",
            violation="function_call_output whose output is not a string",
            param="item.output",
        )
    if call_id not in calls:
        return Refusal(
            code="invalid_tool_call_id",
            text=f"Tool call ID '{call_id}' not found in conversation.",
            violation=f"output for unknown call {call_id!r}",
            param="item.call_id",
        )
    if call_id in answered:
        return Refusal(
            code="invalid_tool_call_id",
            text=f"Tool call ID '{call_id}' already has an output.",  # the fake's words
            violation=f"second output for {call_id!r}",
            param="item.call_id",
        )
    return None


def _holds(items: Sequence[Message], item_id: object) -> bool:
    return any(item.get("id") == item_id for item in items)


def _unknown_parameter(unknown: str) -> Refusal:
    return Refusal(
        code="unknown_parameter",
        text=f"Unknown parameter: '{unknown}'.",
        violation=unknown,
        param=unknown,
    )


def _unknown(given: Message, allowed: set[str], where: str) -> str | None:
    """The first key of ``given`` not in ``allowed``, as its parameter path."""
    extra = sorted(set(given) - allowed)
    return f"{where}.{extra[0]}" if extra else None
