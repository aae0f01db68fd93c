"""vrt._server.frames: every engine event to the message that carries it, without sockets."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

import vrt
from vrt._core.bounded import RecentSet
from vrt._core.events import TextSoFar, preview_length
from vrt._core.previews import Previews
from vrt._server.frames import message_of, messages_of
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


# -- cutting long texts and fragments; coalescing legacy previews -------------------------------


def test_long_text_and_fragments_are_cut_into_frames_that_fit() -> None:
    text = vrt.TextDelta(turn_id="t_1", text="a" * 2500)
    pieces = list(messages_of(text, tool_stream=True, piece=1000))
    assert [len(fields["text"]) for _, fields in pieces] == [1000, 1000, 500]
    assert "".join(fields["text"] for _, fields in pieces) == text.text
    delta = vrt.ToolStream(
        call_id="c",
        turn_id="t",
        epoch=0,
        name="n",
        kind="server",
        phase=P.ARGUMENTS_DELTA,
        delta="b" * 1500,
    )
    pieces = list(messages_of(delta, tool_stream=True, piece=1000))
    assert [len(f["delta"]) for _, f in pieces] == [1000, 500]
    assert all(f["phase"] == "arguments-delta" for _, f in pieces)
    short = vrt.TextDelta(turn_id="t_1", text="hi")
    assert list(messages_of(short, tool_stream=True, piece=1000)) == [
        message_of(short, tool_stream=True)
    ]


def _stream(phase: vrt.Phase) -> vrt.ToolStream:
    return vrt.ToolStream(call_id="c", turn_id="t", epoch=0, name="n", kind="app", phase=phase)


def _preview(text: str, complete: bool = False) -> vrt.ToolPreview:
    return vrt.ToolPreview(call_id="c", turn_id="t", name="n", arguments=text, complete=complete)


@pytest.mark.parametrize("length", [10, 1000, 65536])
@pytest.mark.parametrize("deltas", [1, 7, 1000])
def test_previews_of_a_call_add_up_to_a_few_times_its_arguments(length: int, deltas: int) -> None:
    previews = Previews()
    text = '{"t": "' + "x" * length + '"}'
    step = max(1, len(text) // deltas)
    sent = [""] if previews.wanted(_preview("")) else []
    for end in range(step, len(text), step):
        if previews.wanted(_preview(text[:end])):
            sent.append(text[:end])
    previews.stream(_stream(P.ARGUMENTS_COMPLETE))
    assert previews.wanted(_preview(text, complete=True))  # the complete one, always
    sent.append(text)
    previews.stream(_stream(P.SETTLED))
    assert not previews.wanted(_preview(text, complete=True))  # the same text again: no
    assert sum(len(s) for s in sent) <= 6 * len(text) + 1024
    assert sent[0] == "" and sent[-1] == text
    assert previews._sent == {} and previews._ending == set()  # forgotten at the end


def test_a_call_that_fails_sends_its_last_text() -> None:
    previews = Previews()
    assert previews.wanted(_preview(""))
    assert not previews.wanted(_preview('{"a'))  # grew too little
    previews.stream(_stream(P.FAILED))
    assert previews.wanted(_preview('{"a'))  # the last text, before the call is forgotten
    assert previews._sent == {}


def test_recent_set_keeps_the_newest() -> None:
    recent: RecentSet[int] = RecentSet(3)
    for i in range(5):
        recent.add(i)
    assert len(recent) == 3 and 1 not in recent and all(i in recent for i in (2, 3, 4))
    recent.add(2)  # the newest again: 3 is now the oldest
    recent.add(5)
    assert 3 not in recent and 2 in recent


def test_an_engine_preview_is_joined_only_when_read() -> None:
    """The engine's previews hold their fragments, not a copy of the text each (a preview
    per fragment with all the text so far cost the square of the arguments)."""
    fragments = ["{", '"a"', ": 1", "}"]
    lazy = vrt.ToolPreview(
        call_id="c", turn_id="t", name="n", arguments=TextSoFar(fragments, 2, 4), complete=False
    )
    fragments.append("more")  # the list only grows; a preview is a prefix of it
    assert preview_length(lazy) == 4
    assert lazy.arguments == '{"a"'
    eager = vrt.ToolPreview(call_id="c", turn_id="t", name="n", arguments='{"a"', complete=False)
    assert lazy == eager and hash(lazy) == hash(eager)
    assert repr(lazy) == repr(eager) and "'{\"a\"'" in repr(lazy)
    assert attrs.evolve(lazy, arguments="x").arguments == "x"


def test_the_engines_tool_stream_builder_makes_the_same_record() -> None:
    """vrt._core.events.tool_stream sets ToolStream's slots directly: the same fields, the
    same values, equal and hashing alike (a field added to ToolStream fails here)."""
    import inspect

    import attrs

    from vrt._core.events import tool_stream

    fields = [f.name for f in attrs.fields(vrt.ToolStream)]
    assert list(inspect.signature(tool_stream).parameters) == fields
    values = ["c", "t", 3, "n", "app", vrt.Phase.SETTLED, "d", {"a": 1}, [1], False]
    values += [vrt.ResultCode.TIMEOUT, "m"]
    fast, slow = tool_stream(*values), vrt.ToolStream(**dict(zip(fields, values, strict=True)))
    assert fast == slow and repr(fast) == repr(slow)
    assert tool_stream("c", "t", 0, "n", "server", vrt.Phase.START) == vrt.ToolStream(
        call_id="c", turn_id="t", epoch=0, name="n", kind="server", phase=vrt.Phase.START
    )
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        fast.ok = True  # type: ignore[misc]
