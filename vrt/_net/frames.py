"""What the app sees of a session, as vrt/1 messages: a pure function of an engine event.

The server actor listens to its session's events (synchronously, in the engine's own order)
and sends what :func:`message_of` makes of each; no socket, no state, so every event's
translation is testable on its own. What depends on the session's state (``tool.abort``
after an app call's terminal phase) is the actor's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vrt._core.events import (
    ConfirmRequest,
    Event,
    TextDelta,
    ToolPreview,
    ToolStream,
    TurnEnded,
    TurnStarted,
)
from vrt._wire import messages as m

Message = tuple[Callable[..., Any], dict[str, Any]]
"""A message class and its fields but ``seq`` (the protocol numbers it when it is sent)."""


def message_of(event: Event, *, tool_stream: bool) -> Message | None:
    """The message that carries ``event`` to the client, or None if none does.

    ``tool_stream``: whether ``tool-stream-v1`` was negotiated (without it a
    :class:`~vrt.ToolStream` has no frame; the legacy ``tool.preview`` carries the call).
    """
    if isinstance(event, ToolStream):
        if not tool_stream:
            return None
        return m.ToolStreamMessage, {
            "call_id": event.call_id,
            "turn_id": event.turn_id,
            "epoch": event.epoch,
            "name": event.name,
            "kind": event.kind,
            "phase": str(event.phase),
            "delta": event.delta,
            "arguments": event.arguments,
            "progress": event.progress,
            "ok": event.ok,
            "code": None if event.code is None else str(event.code),
            "message": event.message,
        }
    if isinstance(event, ToolPreview):
        return m.ToolPreviewMessage, {
            "call_id": event.call_id,
            "turn_id": event.turn_id,
            "name": event.name,
            "arguments": event.arguments,
            "complete": event.complete,
        }
    if isinstance(event, TextDelta):
        return m.TextDeltaMessage, {"turn_id": event.turn_id, "text": event.text}
    if isinstance(event, TurnStarted):
        return m.TurnStartedMessage, {"turn_id": event.turn_id, "epoch": event.epoch}
    if isinstance(event, TurnEnded):
        return m.TurnEndedMessage, {
            "turn_id": event.turn_id,
            "epoch": event.epoch,
            "reason": event.reason,
        }
    if isinstance(event, ConfirmRequest):
        return m.ConfirmRequestMessage, {
            "call_id": event.call_id,
            "name": event.name,
            "arguments": event.arguments,
            "risk": event.risk,
            "prompt": event.prompt,
        }
    return None
