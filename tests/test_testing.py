"""assert_stream_valid names the call and the rule for every broken lifecycle."""

from __future__ import annotations

from typing import Any

import pytest

import vrt
from vrt.testing import assert_stream_valid

P = vrt.Phase


def ev(phase: vrt.Phase, call_id: str = "c1", **kw: Any) -> vrt.ToolStream:
    fields: dict[str, Any] = {
        "call_id": call_id,
        "turn_id": "t_1",
        "epoch": 0,
        "name": "w",
        "kind": "server",
        "phase": phase,
    }
    if phase == P.ARGUMENTS_DELTA:
        fields["delta"] = "{"
    if phase == P.SETTLED:
        fields["ok"] = True
    fields.update(kw)
    return vrt.ToolStream(**fields)


GOOD = [
    ev(P.START),
    ev(P.ARGUMENTS_DELTA),
    ev(P.ARGUMENTS_COMPLETE, arguments={}),
    ev(P.PROGRESS, progress=1),
    ev(P.SETTLED),
]


def test_good_streams_pass() -> None:
    assert_stream_valid(GOOD)
    assert_stream_valid([ev(P.START), ev(P.ARGUMENTS_COMPLETE), ev(P.CANCELLED)])
    assert_stream_valid([ev(P.START), ev(P.FAILED, message="stopped")])
    assert_stream_valid([ev(P.START), ev(P.CANCELLED)])
    # interleaved calls
    assert_stream_valid(
        [
            ev(P.START),
            ev(P.START, "c2"),
            ev(P.ARGUMENTS_COMPLETE, "c2"),
            ev(P.CANCELLED),
            ev(P.SETTLED, "c2", ok=False, code="FAILED"),
        ]
    )
    # a session close leaves calls open
    assert_stream_valid([ev(P.START), ev(P.ARGUMENTS_COMPLETE), vrt.Closed(reason="client")])
    # a partial log
    assert_stream_valid([ev(P.START)], complete=False)


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ([ev(P.ARGUMENTS_DELTA)], "call c1 .*: the first phase of a call must be start"),
        ([ev(P.START), ev(P.START)], "call c1 .*: a second start"),
        ([*GOOD, ev(P.PROGRESS)], "call c1 .*: progress after the terminal phase settled"),
        ([*GOOD, ev(P.CANCELLED)], "call c1 .*: cancelled after the terminal phase settled"),
        (
            [ev(P.START), ev(P.CANCELLED), ev(P.SETTLED)],
            "cancelled after|settled after the terminal phase cancelled",
        ),
        (
            [ev(P.START), ev(P.ARGUMENTS_COMPLETE), ev(P.ARGUMENTS_DELTA)],
            "arguments-delta after arguments-complete",
        ),
        ([ev(P.START), ev(P.PROGRESS)], "progress before arguments-complete"),
        ([ev(P.START), ev(P.SETTLED)], "settled before arguments-complete"),
        ([ev(P.START), ev(P.ARGUMENTS_COMPLETE), ev(P.FAILED)], "failed after arguments-complete"),
        (
            [ev(P.START), ev(P.ARGUMENTS_COMPLETE), ev(P.ARGUMENTS_COMPLETE)],
            "a second arguments-complete",
        ),
        ([ev(P.START), ev(P.ARGUMENTS_DELTA, delta=None)], "arguments-delta carries no delta"),
        ([ev(P.START), ev(P.ARGUMENTS_COMPLETE), ev(P.SETTLED, ok=None)], "settled carries no ok"),
        (
            [ev(P.START), ev(P.ARGUMENTS_COMPLETE), ev(P.SETTLED, ok=False)],
            "settled with ok=false carries no code",
        ),
        ([ev(P.START), ev(P.CANCELLED, turn_id="t_2")], "turn_id changed"),
        ([ev(P.START), ev(P.CANCELLED, epoch=1)], "epoch changed"),
        ([ev(P.START), ev(P.ARGUMENTS_COMPLETE)], "call c1: no terminal phase"),
        (
            [ev(P.START), vrt.TurnEnded(turn_id="t_1", epoch=0, reason="finished")],
            "call c1: turn t_1 ended while the call was started",
        ),
        ([vrt.Closed(reason="client"), ev(P.START)], "after Closed"),
    ],
)
def test_broken_streams_name_the_call_and_rule(events: list[Any], message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        assert_stream_valid(events)
