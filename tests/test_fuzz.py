"""Fuzzing the sans-IO cores with generated and mutated frames, and what the fuzzing found.

The generator, the mutator, the checks and the oracle are :mod:`tests.fuzzing`'s, which
``python -m tests.fuzzing`` runs for 100,000 cases and more outside pytest. Here Hypothesis
makes every one of its choices (see :class:`Draws`), so a failure shrinks to a short
sequence of small frames, and a seeded slice checks that the generator still reaches every
outcome. For each frame a core may only return valid session actions (or, on the client,
events), queue ``error`` replies and a clean ``closed``, all valid against their schemas,
numbered right and free of tracebacks; nothing may escape ``receive``, no frame may take
long, and after each sequence the core must still work (see ``ServerDriver.probe``). With
``oracle=True`` every answer is also checked against the one ``json`` and jsonschema call
for.

The servers here take frames of at most ``LIMIT`` bytes, so frames near the limit stay
small. One known bug is kept out of the generator's way until ``vrt/_wire/server.py`` is
fixed: a raw lone surrogate in a ``str`` frame of more than ``max_message_size // 4``
characters makes ``ServerProtocol.receive`` raise UnicodeEncodeError (it encodes the frame
to measure it). ``python -m tests.fuzzing`` still finds it.
"""

from __future__ import annotations

import functools
import json
import random
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from tests.fuzzing.drivers import ClientDriver, ServerDriver, client_sequence, server_sequence
from tests.fuzzing.frames import Frames, RandomChooser
from tests.fuzzing.oracle import verdict
from vrt._core.fastcheck import compile_schema, unique
from vrt._wire import codec
from vrt._wire import messages as m
from vrt._wire.client import ClientProtocol
from vrt._wire.server import ServerProtocol

T = TypeVar("T")

LIMIT = 8192
"""``max_message_size`` of the fuzzed servers: room for a 5,000-digit number."""
FRAME_TIME = 2.0
"""The longest any one frame may take, in seconds (they take well under 10 ms)."""
HANG = 10.0
"""After this many seconds a frame is stopped (SIGALRM) and the test fails, not hangs."""


class Draws:
    """The generator's choices as Hypothesis draws: they shrink to the first option, the
    lowest integer and "no"."""

    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def integer(self, lo: int, hi: int) -> int:
        return self.data.draw(_integers(lo, hi))

    def pick(self, options: Sequence[T]) -> T:
        return options[self.data.draw(_integers(0, len(options) - 1))]

    def chance(self, percent: int) -> bool:
        return self.data.draw(_integers(0, 99)) >= 100 - percent


@functools.cache
def _integers(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.integers(lo, hi)


FUZZ = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,  # the same examples every run: no flaky test
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _ignore(outcome: str) -> None:
    pass


# -- the fuzzing slices --------------------------------------------------------------------------


@FUZZ
@given(st.data())
def test_server_core_survives_fuzzed_sequences(data: st.DataObject) -> None:
    draws = Draws(data)
    frames = Frames(draws, LIMIT)
    driver = ServerDriver(LIMIT, oracle=True, time_limit=FRAME_TIME, hang=HANG)
    server_sequence(draws, frames, driver, _ignore)


@FUZZ
@given(st.data())
def test_client_core_survives_fuzzed_sequences(data: st.DataObject) -> None:
    draws = Draws(data)
    frames = Frames(draws, LIMIT)
    driver = ClientDriver(oracle=True, time_limit=FRAME_TIME, hang=HANG)
    client_sequence(draws, frames, driver, _ignore)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.data(), st.sampled_from(m.CLIENT_TYPES + m.SERVER_TYPES))
def test_the_generators_valid_frames_are_valid(data: st.DataObject, cls: type[Any]) -> None:
    """The fuzzer starts from valid frames of every type (else its mutants test little)."""
    draws = Draws(data)
    frames = Frames(draws, LIMIT)
    if cls in m.CLIENT_TYPES:
        message = frames.client_message(cls.TYPE, 3, 1)
    else:
        message = frames.server_message(cls.TYPE, 3, 1, 1)
    expected = verdict(frames.valid(message), [cls.TYPE])
    assert expected.code is None, message


SERVER_OUTCOMES = {
    "accepted hello",
    "accepted input",
    "accepted interrupt",
    "accepted tool.result",
    "accepted confirm.reply",
    "closed client",
    "closed rejected",
    "error BAD_JSON",
    "error BAD_MESSAGE",
    "error BAD_STATE",
    "error TOO_LARGE",
    "error UNKNOWN_TYPE",
    "silent (after closed)",
    "silent (replay or ack)",
}


@pytest.mark.parametrize("core", ["server", "client"])
def test_a_seeded_slice_reaches_every_outcome(core: str) -> None:
    chooser = RandomChooser(random.Random(0))
    frames = Frames(chooser, LIMIT)
    outcomes: Counter[str] = Counter()

    def count(outcome: str) -> None:
        outcomes[outcome] += 1

    for _ in range(150):
        if core == "server":
            server = ServerDriver(LIMIT, oracle=True, time_limit=FRAME_TIME, hang=HANG)
            server_sequence(chooser, frames, server, count)
        else:
            client = ClientDriver(oracle=True, time_limit=FRAME_TIME, hang=HANG)
            client_sequence(chooser, frames, client, count)
    if core == "server":
        assert set(outcomes) >= SERVER_OUTCOMES, outcomes
    else:
        assert {o.split()[0] for o in outcomes} >= {"event", "local", "closed", "silent"}


# -- what the fuzzer found -----------------------------------------------------------------------


def _server(*, open_: bool = True) -> ServerProtocol:
    server = ServerProtocol(session_id="s_1", resume_token="tok", server_tools=["weather"])
    if open_:
        server.receive(json.dumps({"type": "hello", "seq": 1, "protocol": "vrt/1"}))
        server.take_outbox()
    return server


def _timed_decode(data: dict[str, Any]) -> tuple[float, str]:
    frame = json.dumps(data)
    started = time.perf_counter()
    with pytest.raises(codec.DecodeError) as info:
        codec.decode(frame, m.CLIENT_TYPES)
    return time.perf_counter() - started, info.value.message


def test_unique_items_takes_linear_time() -> None:
    """uniqueItems compared every pair of items: a hello of 100,000 distinct capabilities
    (about 1 MiB) took hours to pass. Now a set of canonical keys."""
    hello = {"type": "hello", "seq": 1, "protocol": "vrt/1"}
    frame = json.dumps({**hello, "capabilities": [f"c{i}" for i in range(100_000)]})
    started = time.perf_counter()
    assert isinstance(codec.decode(frame, m.CLIENT_TYPES), m.Hello)
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize(
    "items",
    [
        [1, 1.0],
        [1, True],
        [0, False, None, ""],
        [{"a": 1}, {"a": 1.0}],
        [{"a": 1}, {"b": 1}],
        [[1], [True]],
        [[1, [2]], [1, [2.0]]],
        ["a", "b", "a"],
        [{"a": [1, {"b": None}]}, {"a": [1, {"b": None}]}],
        [1.5, 3 / 2],
        [[], {}],
    ],
)
def test_unique_items_agrees_with_jsonschema(items: list[Any]) -> None:
    expected = Draft202012Validator({"uniqueItems": True}).is_valid(items)
    assert unique(items) == expected
    assert compile_schema({"uniqueItems": True})(items) == expected


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        pytest.param("capabilities", ["c"] * 400_000, "has non-unique elements", id="duplicates"),
        pytest.param("capabilities", [1] * 400_000, "is not of type 'string'", id="wrong-items"),
        pytest.param(
            "capabilities", [*map(str, range(200_000)), 1, [], {}], "is not", id="mixed-items"
        ),
        pytest.param("tools", [{}] * 200_000, "is a required property", id="empty-tools"),
    ],
)
def test_the_error_of_a_huge_array_takes_little_time(
    field: str, value: list[Any], problem: str
) -> None:
    """jsonschema, asked for the error message, descended into every one of 400,000 valid
    items, built an error for every invalid one, and compared every pair of unsortable ones:
    seconds to minutes a frame. It now skips the items the compiled check passes, stops at
    the first error and checks uniqueness in linear time."""
    elapsed, message = _timed_decode({"type": "hello", "seq": 1, "protocol": "vrt/1", field: value})
    assert problem in message and len(message) <= 300, message
    assert elapsed < 1.0


def test_an_ack_beyond_what_was_sent_is_ignored_and_answered() -> None:
    """An ack of a seq never sent was taken: every later, true ack was below it, so the
    replay buffer was never trimmed again (the session overflowed 10,000 messages later).
    It is ignored, and answered as the protocol error it is (BAD_MESSAGE)."""
    server = _server()  # it sent the welcome, seq 1
    for bogus in (3, 10**9):
        assert server.receive(json.dumps({"type": "ack", "seq": bogus})) == []
        assert server.acked_by_peer == 0
        (error,) = server.take_outbox()
        assert json.loads(error)["code"] == "BAD_MESSAGE" and "above" in error
    assert len(server.replay) == 3  # the welcome and the two errors
    server.receive(json.dumps({"type": "ack", "seq": 3}))
    assert server.acked_by_peer == 3 and not server.replay
    assert server.take_outbox() == []
    # before hello as well, and on the client
    fresh = _server(open_=False)
    fresh.receive(json.dumps({"type": "ack", "seq": 5}))
    assert fresh.acked_by_peer == 0
    client = ClientProtocol()
    client.hello()
    client.receive(json.dumps({"type": "ack", "seq": 7}))
    assert client.acked_by_peer == 0 and len(client.replay) == 1


def test_an_error_message_is_short_even_when_it_quotes_the_peer() -> None:
    """A refused hello quoted the JSON Schema error about a tool's parameters whole, and
    the schema with it: a 25 KB error message."""
    server = _server(open_=False)
    tool = {
        "name": "edit",
        "description": "",
        "parameters": {"type": "object", "properties": {"a": {"type": ["x"] * 5000}}},
    }
    hello = {"type": "hello", "seq": 1, "protocol": "vrt/1", "tools": [tool]}
    assert server.receive(json.dumps(hello)) == []
    error, closed = (json.loads(f) for f in server.take_outbox())
    assert error["code"] == "BAD_MESSAGE" and 0 < len(error["message"]) <= 300, error
    assert closed["reason"] == "rejected"


def test_an_error_answering_seq_3_0_refers_to_3() -> None:
    """JSON Schema counts 3.0 as an integer and a valid frame with seq 3.0 is numbered 3, but
    an invalid one got an error without ``ref`` and did not count as processed: its replay
    was answered again."""
    server = _server()
    bad = json.dumps({"type": "input", "seq": 3.0, "text": 1})
    assert server.receive(bad) == []
    (error,) = (json.loads(f) for f in server.take_outbox())
    assert (error["code"], error["ref"]) == ("BAD_MESSAGE", 3)
    assert server.received_seq == 3
    assert server.receive(bad) == [] and server.take_outbox() == []  # a replay: dropped
    assert server.receive(json.dumps({"type": "input", "seq": 3, "text": "x"})) == []
    assert server.receive(json.dumps({"type": "input", "seq": 4.0, "text": "x"})) == [
        m.Input(seq=4, text="x")
    ]


def test_an_oversize_frame_with_a_lone_surrogate_is_too_large() -> None:
    """Measuring an oversize str frame raised UnicodeEncodeError on a lone surrogate (a
    memory connection can carry one) and escaped receive()."""
    server = _server()
    frame = json.dumps({"type": "input", "seq": 2, "text": "x"})[:-2] + "\ud800" * 400_000 + '"}'
    assert server.receive(frame) == []
    (error,) = (json.loads(f) for f in server.take_outbox())
    assert error["code"] == "TOO_LARGE"


def test_a_hello_numbered_50_gets_its_welcome_before_any_ack() -> None:
    server = _server(open_=False)
    server.receive(json.dumps({"type": "hello", "seq": 60, "protocol": "vrt/1"}))
    frames = [json.loads(f) for f in server.take_outbox()]
    assert frames[0]["type"] == "welcome" and frames[-1]["type"] == "ack"


@pytest.mark.parametrize("kind", ["tool.call", "confirm.request", "tool.abort"])
def test_an_empty_call_id_is_a_broken_frame(kind: str) -> None:
    """tool.call allowed callId "" but tool.result did not: the answer was refused."""
    fields = {
        "tool.call": {"turnId": "t", "epoch": 0, "name": "x", "arguments": {}},
        "confirm.request": {"name": "x", "arguments": {}, "risk": "low", "prompt": "?"},
        "tool.abort": {},
    }[kind]
    client = ClientProtocol()
    client.hello()
    out = client.receive(json.dumps({"type": kind, "seq": 1, "callId": "", **fields}))
    assert [type(e).__name__ for e in out] == ["Error"] and out[0].code == "BAD_MESSAGE"


def test_a_hello_with_too_many_app_tools_is_refused() -> None:
    """Each app tool's schema costs ~0.25 ms to check: 15,000 in 1 MiB held the loop 4 s."""
    server = _server(open_=False)
    tools = [
        {"name": f"t{i}", "description": "", "parameters": {"type": "object"}} for i in range(129)
    ]
    server.receive(json.dumps({"type": "hello", "seq": 1, "protocol": "vrt/1", "tools": tools}))
    error, closed = (json.loads(f) for f in server.take_outbox())
    assert error["code"] == "BAD_MESSAGE" and "at most 128" in error["message"]
    assert closed["reason"] == "rejected"
