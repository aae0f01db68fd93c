"""The server core's books of app calls, without Trio: which ``tool.result`` is awaited, and
the error every other one gets (vrt/_wire/server.py: ``send_call``, ``take_result``,
``end_call``, ``lose_call``), and the calls and turns a replay ends (``ended_since``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vrt._wire import messages as m
from vrt._wire.endpoint import FrameTooLarge
from vrt._wire.server import REMEMBERED_CALLS, ServerProtocol


def _open() -> ServerProtocol:
    """A server core with its session open (the client's hello taken)."""
    proto = ServerProtocol(session_id="s_1", resume_token="tok", server_tools=["weather"])
    hello = {"type": "hello", "seq": 1, "protocol": m.PROTOCOL, "capabilities": [], "tools": []}
    assert proto.receive(json.dumps(hello))
    proto.take_outbox()
    return proto


def _result(call_id: str, epoch: int, seq: int = 2, ok: bool = True) -> m.ToolResultMessage:
    return m.ToolResultMessage(
        seq=seq, call_id=call_id, epoch=epoch, result=m.WireResult(ok=ok, output=None)
    )


def _errors(proto: ServerProtocol) -> list[tuple[str, int | None]]:
    """The ``error`` frames queued: (code, ref)."""
    out = []
    for frame in proto.take_outbox():
        data = json.loads(frame)
        if data["type"] == "error":
            out.append((data["code"], data.get("ref")))
    return out


def _sent(proto: ServerProtocol) -> list[dict[str, Any]]:
    return [json.loads(frame) for frame in proto.take_outbox()]


def test_the_awaited_result_is_taken_once() -> None:
    proto = _open()
    proto.send_call("c1", "t_1", 0, "hi", {"x": 1})
    (call,) = _sent(proto)
    assert call["type"] == "tool.call" and call["callId"] == "c1" and call["epoch"] == 0
    assert proto.take_result(_result("c1", 0), epoch=0)
    assert _errors(proto) == []
    assert not proto.take_result(_result("c1", 0, seq=3), epoch=0)
    assert _errors(proto) == [(m.DUPLICATE_RESULT, 3)]


def test_a_result_of_another_epoch_is_stale_and_the_call_still_waits() -> None:
    proto = _open()
    proto.send_call("c1", "t_1", 2, "hi", {})
    proto.take_outbox()
    assert not proto.take_result(_result("c1", 1, seq=5), epoch=2)
    assert _errors(proto) == [(m.STALE_EPOCH, 5)]
    assert proto.take_result(_result("c1", 2, seq=6), epoch=2)  # the right one still counts


def test_a_result_after_the_call_ended_is_stale_or_unknown() -> None:
    """An interrupted (or timed out) call is sent ``tool.abort`` after its terminal phase;
    its result, late, is ``STALE_EPOCH`` once the session's epoch moved on, else
    ``UNKNOWN_CALL``; an id never sent is ``UNKNOWN_CALL``."""
    proto = _open()
    proto.send_call("c1", "t_1", 0, "hi", {})
    proto.send_call("c2", "t_1", 0, "hi", {})
    proto.take_outbox()
    proto.end_call("c1")
    (abort,) = _sent(proto)
    assert abort["type"] == "tool.abort" and abort["callId"] == "c1"
    assert not proto.take_result(_result("c1", 0, seq=7), epoch=1)
    assert _errors(proto) == [(m.STALE_EPOCH, 7)]
    proto.end_call("c2")
    assert [frame["type"] for frame in _sent(proto)] == ["tool.abort"]
    assert not proto.take_result(_result("c2", 0, seq=8), epoch=0)  # a timeout: same epoch
    assert not proto.take_result(_result("nope", 0, seq=9), epoch=0)
    assert _errors(proto) == [(m.UNKNOWN_CALL, 8), (m.UNKNOWN_CALL, 9)]


def test_ending_a_call_that_has_its_result_sends_no_abort() -> None:
    proto = _open()
    proto.send_call("c1", "t_1", 0, "hi", {})
    proto.take_outbox()
    assert proto.take_result(_result("c1", 0), epoch=0)
    proto.end_call("c1")
    proto.end_call("never-sent")
    assert _sent(proto) == []


def test_a_lost_calls_result_is_dropped_quietly() -> None:
    """A call lost with a crashed node (``handover-v1``): its replayed result gets no
    error (nor does its confirmation, see the actor)."""
    proto = _open()
    proto.lose_call("c9")
    assert proto.lost("c9") and not proto.lost("c1")
    assert not proto.take_result(_result("c9", 0), epoch=1)
    assert _sent(proto) == []


def test_a_call_too_large_to_send_is_not_awaited() -> None:
    proto = _open()
    proto.max_frame = 1024
    with pytest.raises(FrameTooLarge, match=r"a tool\.call frame of"):
        proto.send_call("big", "t_1", 0, "hi", {"x": "y" * 4096})
    assert not proto.take_result(_result("big", 0), epoch=0)
    assert _errors(proto) == [(m.UNKNOWN_CALL, 2)]


def test_the_books_forget_the_oldest_calls() -> None:
    """A session that runs for days does not grow by each call: past REMEMBERED_CALLS,
    a very old call's second result is only ``UNKNOWN_CALL``."""
    proto = _open()
    for i in range(REMEMBERED_CALLS + 1):
        proto.send_call(f"c{i}", "t_1", 0, "hi", {})
        assert proto.take_result(_result(f"c{i}", 0), epoch=0)
    proto.take_outbox()
    assert not proto.take_result(_result("c0", 0, seq=3), epoch=0)
    assert not proto.take_result(_result(f"c{REMEMBERED_CALLS}", 0, seq=4), epoch=0)
    assert _errors(proto) == [(m.UNKNOWN_CALL, 3), (m.DUPLICATE_RESULT, 4)]


def test_ended_since_reads_the_replay() -> None:
    """The calls (a terminal phase) and turns (``turn.ended``) that the replay buffer's
    messages above a seq end, whatever the frames' text holds elsewhere."""
    proto = _open()
    stream: dict[str, Any] = {"turn_id": "t_1", "epoch": 0, "name": "hi", "kind": "app"}
    proto.send(m.ToolStreamMessage, call_id="c1", phase="start", **stream)
    proto.send(m.ToolStreamMessage, call_id="c1", phase="settled", ok=True, **stream)
    first = proto.sent_seq
    # text that only looks like an end: an argument holding the words
    proto.send(
        m.ToolStreamMessage,
        call_id="c2",
        phase="arguments-complete",
        arguments={"note": '"turn.ended" "tool.stream" "cancelled"'},
        **stream,
    )
    proto.send(m.ToolStreamMessage, call_id="c3", phase="cancelled", **stream)
    proto.send(m.TurnEndedMessage, turn_id="t_1", epoch=1, reason="interrupted")
    assert proto.ended_since(0) == ({"c1", "c3"}, {"t_1"})
    assert proto.ended_since(first) == ({"c3"}, {"t_1"})
    assert proto.ended_since(proto.sent_seq) == (set(), set())
    proto.peer_acked(first)  # what the client acked leaves the buffer: ended no more
    assert proto.ended_since(0) == ({"c3"}, {"t_1"})
