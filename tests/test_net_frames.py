"""vrt._net.frames: every engine event to the message that carries it, without sockets."""

from __future__ import annotations

from typing import Any

import pytest

import vrt
from vrt._net.frames import message_of
from vrt._wire import codec
from vrt._wire import messages as m


async def _reply(approved: bool, reason: str | None) -> None:
    return None


P = vrt.Phase
EVENTS: list[tuple[Any, dict[str, Any]]] = [
    (
        vrt.ToolStream(
            call_id="c_1", turn_id="t_1", epoch=2, name="edit", kind="app", phase=P.START
        ),
        {
            "type": "tool.stream",
            "callId": "c_1",
            "turnId": "t_1",
            "epoch": 2,
            "name": "edit",
            "kind": "app",
            "phase": "start",
        },
    ),
    (
        vrt.ToolStream(
            call_id="c_1",
            turn_id="t_1",
            epoch=0,
            name="pay",
            kind="server",
            phase=P.SETTLED,
            ok=False,
            code=vrt.ResultCode.TIMEOUT,
            message="too slow",
        ),
        {
            "type": "tool.stream",
            "callId": "c_1",
            "turnId": "t_1",
            "epoch": 0,
            "name": "pay",
            "kind": "server",
            "phase": "settled",
            "ok": False,
            "code": "TIMEOUT",
            "message": "too slow",
        },
    ),
    (
        vrt.ToolPreview(
            call_id="c_1", turn_id="t_1", name="edit", arguments='{"a"', complete=False
        ),
        {
            "type": "tool.preview",
            "callId": "c_1",
            "turnId": "t_1",
            "name": "edit",
            "arguments": '{"a"',
            "complete": False,
        },
    ),
    (
        vrt.TextDelta(turn_id="t_1", text="hi"),
        {"type": "text.delta", "turnId": "t_1", "text": "hi"},
    ),
    (
        vrt.TurnStarted(turn_id="t_1", epoch=1),
        {"type": "turn.started", "turnId": "t_1", "epoch": 1},
    ),
    (
        vrt.TurnEnded(turn_id="t_1", epoch=1, reason="interrupted"),
        {"type": "turn.ended", "turnId": "t_1", "epoch": 1, "reason": "interrupted"},
    ),
    (
        vrt.ConfirmRequest(
            call_id="c_2", name="pay", arguments={"x": 1}, risk="high", prompt="Pay?", reply=_reply
        ),
        {
            "type": "confirm.request",
            "callId": "c_2",
            "name": "pay",
            "arguments": {"x": 1},
            "risk": "high",
            "prompt": "Pay?",
        },
    ),
]


@pytest.mark.parametrize(("event", "wire"), EVENTS)
def test_each_event_becomes_its_message(event: Any, wire: dict[str, Any]) -> None:
    made = message_of(event, tool_stream=True)
    assert made is not None
    cls, fields = made
    message = cls(seq=7, **fields)
    assert codec.to_dict(message) == {**wire, "seq": 7}
    # what the server sends, the client's codec takes back as the same message
    assert codec.decode(codec.encode(message), m.SERVER_TYPES) == message


def test_without_tool_stream_a_tool_stream_event_has_no_frame() -> None:
    stream, _ = EVENTS[0]
    preview, _ = EVENTS[2]
    assert message_of(stream, tool_stream=False) is None
    assert message_of(preview, tool_stream=False) is not None


@pytest.mark.parametrize(
    "event",
    [vrt.Closed(reason="client"), vrt.Reconnecting(session_id="s"), vrt.Resumed(session_id="s")],
)
def test_client_side_events_have_no_frame(event: Any) -> None:
    assert message_of(event, tool_stream=True) is None
