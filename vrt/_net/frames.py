"""What the app sees of a session, as vrt/1 messages: pure functions of engine events.

The server actor listens to its session's events (synchronously, in the engine's own order)
and sends what :func:`messages_of` makes of each; no socket, so every event's translation is
testable on its own. :class:`Previews` decides which legacy ``tool.preview`` frames go out
(their total size proportional to the arguments, never their square). What depends on the
session's state (``tool.abort`` after an app call's terminal phase) is the actor's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from vrt._core.events import (
    TERMINAL_PHASES,
    ConfirmRequest,
    Event,
    TextDelta,
    ToolPreview,
    ToolStream,
    TurnEnded,
    TurnStarted,
    preview_length,
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


def messages_of(event: Event, *, tool_stream: bool, piece: int) -> Iterator[Message]:
    """:func:`message_of`, with a model's text and an argument fragment longer than
    ``piece`` characters cut into several messages of at most that (their concatenation is
    the same), so that no frame is over what the client takes."""
    message = message_of(event, tool_stream=tool_stream)
    if message is None:
        return
    cls, fields = message
    key = "text" if cls is m.TextDeltaMessage else "delta" if fields.get("delta") else None
    if key is None or len(fields[key]) <= piece:
        yield message
        return
    text = fields[key]
    for start in range(0, len(text), piece):
        yield cls, {**fields, key: text[start : start + piece]}


PREVIEW_STEP = 64
"""A preview of a call's growing arguments goes out once they grew this many characters and
a quarter of what was last sent: a geometric series, so the previews of arguments of length
L add up to under 6 L (plus their headers), however many fragments the model sent."""
_COMPLETE = -1


class Previews:
    """Which legacy ``tool.preview`` frames of each call go on the wire.

    Always the first, the one with ``complete: true`` (once: later phases repeat the same
    text), and the last text of a call that ended before its arguments completed; between
    them only when the text grew enough (:data:`PREVIEW_STEP`). The latest text wins, as
    the protocol allows a sender. Per call: the length last sent, forgotten at the call's
    end.
    """

    __slots__ = ("_ending", "_sent")

    def __init__(self) -> None:
        self._sent: dict[str, int] = {}
        self._ending: set[str] = set()

    def stream(self, event: ToolStream) -> None:
        """Note a call's stream event (its terminal phase comes just before its preview)."""
        if event.phase in TERMINAL_PHASES:
            self._ending.add(event.call_id)

    def wanted(self, event: ToolPreview) -> bool:
        """Whether ``event`` goes out."""
        call_id = event.call_id
        last = self._sent.get(call_id)
        size = preview_length(event)
        if call_id in self._ending:  # its last preview: the call is over
            self._ending.discard(call_id)
            self._sent.pop(call_id, None)
            return last is None or (last != _COMPLETE and (event.complete or size != last))
        if last == _COMPLETE:
            return False
        if last is None or event.complete or size - last >= max(PREVIEW_STEP, last // 4):
            self._sent[call_id] = _COMPLETE if event.complete else size
            return True
        return False
