"""What the app sees of a session, as vrt/1 messages: pure functions of engine events.

The server actor listens to its session's events (synchronously, in the engine's own order)
and sends what :func:`messages_of` makes of each; no socket, so every event's translation is
testable on its own (which legacy ``tool.preview`` frames go out is
:class:`vrt._core.previews.Previews`'s to decide). What depends on the session's state
(``tool.abort`` after an app call's terminal phase) is the actor's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from vrt._core.events import (
    ConfirmRequest,
    Event,
    TextDelta,
    ToolPreview,
    ToolStream,
    Transcript,
    TurnEnded,
    TurnStarted,
)
from vrt._wire import messages as m

Message = tuple[Callable[..., Any], dict[str, Any]]
"""A message class and its fields but ``seq`` (the protocol numbers it when it is sent)."""


def message_of(event: Event, *, tool_stream: bool, audio: bool = False) -> Message | None:
    """The message that carries ``event`` to the client, or None if none does.

    ``tool_stream``: whether ``tool-stream-v1`` was negotiated (without it a
    :class:`~vrt.ToolStream` has no frame; the legacy ``tool.preview`` carries the call).
    ``audio``: whether ``audio-v1`` was (without it a :class:`~vrt.Transcript` has no
    frame). The model's voice (:class:`~vrt.AudioDelta`) is never a message: it goes in
    binary frames (:mod:`vrt._server.voice`).
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
    if isinstance(event, Transcript):
        if not audio:
            return None
        return m.TranscriptMessage, {
            "turn_id": event.turn_id,
            "role": event.role,
            "text": event.text,
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


def messages_of(
    event: Event, *, tool_stream: bool, piece: int, audio: bool = False
) -> Iterator[Message]:
    """:func:`message_of`, with a model's text, a transcript and an argument fragment
    longer than ``piece`` characters cut into several messages of at most that (their
    concatenation is the same), so that no frame is over what the client takes."""
    message = message_of(event, tool_stream=tool_stream, audio=audio)
    if message is None:
        return
    cls, fields = message
    texts = cls is m.TextDeltaMessage or cls is m.TranscriptMessage
    key = "text" if texts else "delta" if fields.get("delta") else None
    if key is None or len(fields[key]) <= piece:
        yield message
        return
    text = fields[key]
    for start in range(0, len(text), piece):
        yield cls, {**fields, key: text[start : start + piece]}
