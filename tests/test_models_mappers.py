"""The providers' streams, sans-IO: plain bytes of each quirk through the SSE decoder and the
mapper, to vrt.models events. Each quirk is one table row (what real servers send)."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest

import vrt
from vrt.models import CallDelta, CallEnd, CallStart, Text, Usage
from vrt.models._adapters import AnthropicMessages, CallIds, OpenAIChat, OpenAIResponses
from vrt.models._sse import SSEDecoder

REQUEST = vrt.ModelRequest(
    instructions="", tools=(), history=(), session_id="s", turn_id="t_1", step=1
)


def play(adapter: Any, body: bytes, request: vrt.ModelRequest = REQUEST) -> list[Any]:
    """The events ``adapter`` makes of ``body``, as its stream would (then the end)."""
    feed = adapter._mapper(CallIds().maker(request))
    decoder = SSEDecoder()
    events = [out for event in decoder.feed(body) for out in feed(event)]
    return [*events, *feed(None)]


def chat(*chunks: Any, done: bool = True) -> bytes:
    """A Chat Completions stream: each chunk is a delta (or a whole choice with a
    finish_reason: a tuple), or a raw object (a dict with 'raw')."""
    lines = []
    for chunk in chunks:
        if isinstance(chunk, dict) and "raw" in chunk:
            data = chunk["raw"]
        else:
            delta, finish = chunk if isinstance(chunk, tuple) else (chunk, None)
            data = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        lines.append(f"data: {json.dumps(data)}\n\n")
    if done:
        lines.append("data: [DONE]\n\n")
    return "".join(lines).encode()


def tc(
    index: int | None = None, id: str | None = None, name: str | None = None, args: Any = None
) -> dict[str, Any]:
    part: dict[str, Any] = {}
    if index is not None:
        part["index"] = index
    if id is not None:
        part["id"] = id
    function: dict[str, Any] = {}
    if name is not None:
        function["name"] = name
    if args is not None:
        function["arguments"] = args
    part["function"] = function
    return {"tool_calls": [part]}


CHAT = OpenAIChat("m", base_url="http://localhost")

CHAT_CASES = {
    "text and a streamed call": (
        chat(
            {"role": "assistant", "content": "Hi"},
            tc(0, "call_a", "weather", ""),
            tc(0, args='{"city"'),
            tc(0, args=': "Paris"}'),
            ({}, "tool_calls"),
        ),
        [
            Text(text="Hi"),
            CallStart(call_id="call_a", name="weather"),
            CallDelta(call_id="call_a", delta='{"city"'),
            CallDelta(call_id="call_a", delta=': "Paris"}'),
            CallEnd(call_id="call_a"),
        ],
    ),
    "a new id at a used index is a new call (Ollama)": (
        chat(
            tc(0, "c1", "a", '{"x": 1}'),
            tc(0, "c2", "b", '{"y": 2}'),
            ({}, "stop"),
        ),
        [
            CallStart(call_id="c1", name="a"),
            CallDelta(call_id="c1", delta='{"x": 1}'),
            CallStart(call_id="c2", name="b"),
            CallDelta(call_id="c2", delta='{"y": 2}'),
            CallEnd(call_id="c1"),
            CallEnd(call_id="c2"),
        ],
    ),
    "no id: a stable one is made": (
        chat(tc(0, None, "a", '{"x": 1}'), ({}, "tool_calls")),
        [
            CallStart(call_id="call_t_1_1_1", name="a"),
            CallDelta(call_id="call_t_1_1_1", delta='{"x": 1}'),
            CallEnd(call_id="call_t_1_1_1"),
        ],
    ),
    "indexes start at 1 and skip; the next index does not end a call": (
        chat(
            tc(1, "c1", "a", '{"x"'),
            tc(3, "c2", "b", "{}"),
            tc(1, args=": 1}"),
            ({}, "tool_calls"),
        ),
        [
            CallStart(call_id="c1", name="a"),
            CallDelta(call_id="c1", delta='{"x"'),
            CallStart(call_id="c2", name="b"),
            CallDelta(call_id="c2", delta="{}"),
            CallDelta(call_id="c1", delta=": 1}"),
            CallEnd(call_id="c1"),
            CallEnd(call_id="c2"),
        ],
    ),
    "the name is set once, never concatenated (LM Studio, old llama.cpp)": (
        chat(
            tc(0, "c1", "weather", ""),
            tc(0, None, "", '{"a"'),
            tc(0, None, "weather", ": 1}"),
            ({}, "tool_calls"),
        ),
        [
            CallStart(call_id="c1", name="weather"),
            CallDelta(call_id="c1", delta='{"a"'),
            CallDelta(call_id="c1", delta=": 1}"),
            CallEnd(call_id="c1"),
        ],
    ),
    "arguments as an object (some servers)": (
        chat(tc(0, "c1", "a", {"x": 1}), ({}, "stop")),
        [CallStart(call_id="c1", name="a"), CallEnd(call_id="c1", arguments={"x": 1})],
    ),
    "a whole call in the chunk with the finish reason (vLLM)": (
        chat(
            (
                {
                    "tool_calls": [
                        {"index": 0, "id": "c1", "function": {"name": "a", "arguments": "{}"}}
                    ]
                },
                "tool_calls",
            )
        ),
        [
            CallStart(call_id="c1", name="a"),
            CallDelta(call_id="c1", delta="{}"),
            CallEnd(call_id="c1"),
        ],
    ),
    "empty arguments are {}": (
        chat(tc(0, "c1", "a", ""), ({}, "tool_calls")),
        [CallStart(call_id="c1", name="a"), CallEnd(call_id="c1", arguments={})],
    ),
    "finish_reason length: the call was cut off, no CallEnd (it fails)": (
        chat(tc(0, "c1", "a", '{"x": '), ({}, "length")),
        [CallStart(call_id="c1", name="a"), CallDelta(call_id="c1", delta='{"x": ')],
    ),
    "[DONE] ends a call without a finish reason": (
        chat(tc(0, "c1", "a", "{}")),
        [
            CallStart(call_id="c1", name="a"),
            CallDelta(call_id="c1", delta="{}"),
            CallEnd(call_id="c1"),
        ],
    ),
    "the end of the stream ends it too": (
        chat(tc(0, "c1", "a", "{}"), done=False),
        [
            CallStart(call_id="c1", name="a"),
            CallDelta(call_id="c1", delta="{}"),
            CallEnd(call_id="c1"),
        ],
    ),
    "arguments before the name wait for it": (
        chat(tc(0, "c1", None, '{"x"'), tc(0, None, "a", ": 1}"), ({}, "tool_calls")),
        [
            CallStart(call_id="c1", name="a"),
            CallDelta(call_id="c1", delta='{"x"'),
            CallDelta(call_id="c1", delta=": 1}"),
            CallEnd(call_id="c1"),
        ],
    ),
    "an id unsafe as a vrt id is replaced": (
        chat(tc(0, "x" * 100, "a", "{}"), ({}, "tool_calls")),
        [
            CallStart(call_id="call_t_1_1_1", name="a"),
            CallDelta(call_id="call_t_1_1_1", delta="{}"),
            CallEnd(call_id="call_t_1_1_1"),
        ],
    ),
}


@pytest.mark.parametrize("case", list(CHAT_CASES))
def test_chat_completions(case: str) -> None:
    body, expected = CHAT_CASES[case]
    assert play(CHAT, body) == expected


def test_chat_an_error_object_mid_stream_is_a_model_error() -> None:
    body = chat(tc(0, "c1", "a", "{"), {"raw": {"error": {"message": "overloaded"}}})
    with pytest.raises(vrt.ModelError, match="overloaded") as info:
        play(CHAT, body)
    assert info.value.status is None


@pytest.mark.parametrize(
    "body",
    [
        b'error: {"code": 500, "message": "overloaded", "type": "server_error"}\n\n',  # llama.cpp
        b"error: overloaded\n\n",
        b'event: error\ndata: {"error": {"message": "overloaded"}}\n\n',
        b'data: {"object": "error", "message": "overloaded", "code": 400}\n\n',  # vLLM, older
    ],
)
def test_chat_an_error_event_is_a_model_error(body: bytes) -> None:
    with pytest.raises(vrt.ModelError, match="reported an error: overloaded"):
        play(CHAT, chat(tc(0, "c1", "a", "{"), done=False) + body)


@pytest.mark.parametrize("data", [b"{nope", b'{"choices": NaN}', b"[Infinity]"])
def test_chat_data_that_is_not_json_is_a_model_error(data: bytes) -> None:
    with pytest.raises(vrt.ModelError, match="not JSON"):
        play(CHAT, b"data: " + data + b"\n\n")


def test_chat_a_nameless_calls_arguments_are_bounded() -> None:
    part = {"index": 0, "id": "c1", "function": {"arguments": "x" * 65536}}
    body = chat(*[{"tool_calls": [part]}] * 17, done=False)
    with pytest.raises(vrt.ModelError, match="before its name"):
        play(CHAT, body)


def test_a_providers_id_reused_in_the_session_is_made_unique() -> None:
    ids = CallIds()
    first = ids.maker(REQUEST)
    second = ids.maker(attrs.evolve(REQUEST, step=2))
    assert [first("call_1"), second("call_1"), second("call_1")] == [
        "call_1",
        "call_1_2",
        "call_1_3",
    ]
    ids.forget("s")
    assert ids.maker(REQUEST)("call_1") == "call_1"


def anthropic(*events: tuple[str, dict[str, Any]]) -> bytes:
    return "".join(
        f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n" for name, data in events
    ).encode()


def block(index: int, block: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return "content_block_start", {"index": index, "content_block": block}


def delta(index: int, delta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return "content_block_delta", {"index": index, "delta": delta}


def stop(index: int) -> tuple[str, dict[str, Any]]:
    return "content_block_stop", {"index": index}


ANTHROPIC = AnthropicMessages("m", base_url="http://localhost")
START = ("message_start", {"message": {"id": "msg", "content": []}})
PING = ("ping", {})

ANTHROPIC_CASES = {
    "text, then a tool_use with input_json_delta; ping ignored": (
        anthropic(
            START,
            PING,
            block(0, {"type": "text", "text": ""}),
            delta(0, {"type": "text_delta", "text": "Hi"}),
            stop(0),
            block(1, {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}),
            PING,
            delta(1, {"type": "input_json_delta", "partial_json": '{"city": '}),
            delta(1, {"type": "input_json_delta", "partial_json": '"Paris"}'}),
            stop(1),
            ("message_delta", {"delta": {"stop_reason": "tool_use"}}),
            ("message_stop", {}),
        ),
        [
            Text(text="Hi"),
            CallStart(call_id="toolu_1", name="weather"),
            CallDelta(call_id="toolu_1", delta='{"city": '),
            CallDelta(call_id="toolu_1", delta='"Paris"}'),
            CallEnd(call_id="toolu_1"),
        ],
    ),
    "a tool_use without input deltas takes its start input, or {}": (
        anthropic(
            START,
            block(0, {"type": "tool_use", "id": "toolu_1", "name": "a", "input": {}}),
            stop(0),
            block(1, {"type": "tool_use", "id": "toolu_2", "name": "b", "input": {"x": 1}}),
            stop(1),
            ("message_stop", {}),
        ),
        [
            CallStart(call_id="toolu_1", name="a"),
            CallEnd(call_id="toolu_1", arguments={}),
            CallStart(call_id="toolu_2", name="b"),
            CallEnd(call_id="toolu_2", arguments={"x": 1}),
        ],
    ),
    "max_tokens with a tool block open: cut off, no CallEnd": (
        anthropic(
            START,
            block(0, {"type": "tool_use", "id": "toolu_1", "name": "a", "input": {}}),
            delta(0, {"type": "input_json_delta", "partial_json": '{"x": '}),
            ("message_delta", {"delta": {"stop_reason": "max_tokens"}}),
            ("message_stop", {}),
        ),
        [CallStart(call_id="toolu_1", name="a"), CallDelta(call_id="toolu_1", delta='{"x": ')],
    ),
    "max_tokens after the block stopped (the API's order): the held end is dropped": (
        anthropic(
            START,
            block(0, {"type": "tool_use", "id": "toolu_1", "name": "a", "input": {}}),
            delta(0, {"type": "input_json_delta", "partial_json": '{"x": '}),
            stop(0),
            ("message_delta", {"delta": {"stop_reason": "max_tokens"}}),
            ("message_stop", {}),
        ),
        [CallStart(call_id="toolu_1", name="a"), CallDelta(call_id="toolu_1", delta='{"x": ')],
    ),
    "max_tokens in a later text block: the calls before it stand": (
        anthropic(
            START,
            block(0, {"type": "tool_use", "id": "toolu_1", "name": "a", "input": {}}),
            stop(0),
            block(1, {"type": "text", "text": "and"}),
            stop(1),
            ("message_delta", {"delta": {"stop_reason": "max_tokens"}}),
            ("message_stop", {}),
        ),
        [
            CallStart(call_id="toolu_1", name="a"),
            CallEnd(call_id="toolu_1", arguments={}),
            Text(text="and"),
        ],
    ),
}


@pytest.mark.parametrize("case", list(ANTHROPIC_CASES))
def test_anthropic_messages(case: str) -> None:
    body, expected = ANTHROPIC_CASES[case]
    assert play(ANTHROPIC, body) == expected


def test_anthropic_an_error_event_is_a_model_error() -> None:
    body = anthropic(START, ("error", {"error": {"type": "overloaded_error", "message": "busy"}}))
    with pytest.raises(vrt.ModelError, match="busy"):
        play(ANTHROPIC, body)


@pytest.mark.parametrize(
    "events",
    [
        [START, block(0, {"type": "tool_use", "id": "toolu_1", "name": "a", "input": {}})],
        [START, block(0, {"type": "tool_use", "id": "toolu_1", "name": "a", "input": {}}), stop(0)],
        [],
    ],
)
def test_anthropic_a_stream_that_ends_before_message_stop_is_a_model_error(
    events: list[tuple[str, dict[str, Any]]],
) -> None:
    with pytest.raises(vrt.ModelError, match="ended before its last event"):
        play(ANTHROPIC, anthropic(*events))


def responses(*events: dict[str, Any]) -> bytes:
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


RESPONSES = OpenAIResponses("m", base_url="http://localhost")
CALL_ITEM = {
    "type": "function_call",
    "id": "fc_1",
    "call_id": "call_1",
    "name": "a",
    "arguments": "",
}

RESPONSES_CASES = {
    "text and a call: deltas by item id, output_item.done authoritative": (
        responses(
            {"type": "response.created", "response": {}},
            {"type": "response.output_text.delta", "item_id": "msg", "delta": "Hi"},
            {"type": "response.output_item.added", "output_index": 1, "item": CALL_ITEM},
            {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "delta": '{"x"'},
            {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "delta": ": 1}"},
            {
                "type": "response.function_call_arguments.done",
                "item_id": "fc_1",
                "arguments": '{"x": 1}',
            },
            {
                "type": "response.output_item.done",
                "output_index": 1,
                "item": {**CALL_ITEM, "arguments": '{"x": 1}'},
            },
            {"type": "response.completed", "response": {}},
        ),
        [
            Text(text="Hi"),
            CallStart(call_id="call_1", name="a"),
            CallDelta(call_id="call_1", delta='{"x"'),
            CallDelta(call_id="call_1", delta=": 1}"),
            CallEnd(call_id="call_1", arguments='{"x": 1}'),
        ],
    ),
    "no arguments: {}": (
        responses(
            {"type": "response.output_item.added", "output_index": 0, "item": CALL_ITEM},
            {"type": "response.output_item.done", "output_index": 0, "item": CALL_ITEM},
            {"type": "response.completed", "response": {}},
        ),
        [CallStart(call_id="call_1", name="a"), CallEnd(call_id="call_1", arguments={})],
    ),
    "an item done incomplete (the API's order at max_output_tokens): cut off": (
        responses(
            {"type": "response.output_item.added", "output_index": 0, "item": CALL_ITEM},
            {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "delta": '{"x"'},
            {
                "type": "response.output_item.done",
                "output_index": 0,
                "item": {**CALL_ITEM, "arguments": '{"x"', "status": "incomplete"},
            },
            {"type": "response.incomplete", "response": {"status": "incomplete"}},
        ),
        [CallStart(call_id="call_1", name="a"), CallDelta(call_id="call_1", delta='{"x"')],
    ),
    "incomplete: the open call is cut off": (
        responses(
            {"type": "response.output_item.added", "output_index": 0, "item": CALL_ITEM},
            {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "delta": '{"x"'},
            {"type": "response.incomplete", "response": {"status": "incomplete"}},
            {"type": "response.output_item.done", "output_index": 0, "item": CALL_ITEM},
        ),
        [CallStart(call_id="call_1", name="a"), CallDelta(call_id="call_1", delta='{"x"')],
    ),
}


@pytest.mark.parametrize("case", list(RESPONSES_CASES))
def test_openai_responses(case: str) -> None:
    body, expected = RESPONSES_CASES[case]
    assert play(RESPONSES, body) == expected


@pytest.mark.parametrize(
    "event",
    [
        {"type": "error", "code": "server_error", "message": "boom"},
        {"type": "response.failed", "response": {"error": {"message": "boom"}}},
    ],
)
def test_responses_errors_are_model_errors(event: dict[str, Any]) -> None:
    with pytest.raises(vrt.ModelError, match="boom"):
        play(RESPONSES, responses(event))


def test_responses_a_stream_that_ends_before_the_response_is_a_model_error() -> None:
    body = responses({"type": "response.output_item.added", "output_index": 0, "item": CALL_ITEM})
    with pytest.raises(vrt.ModelError, match="ended before its last event"):
        play(RESPONSES, body)


# -- token usage (only traces show it) ------------------------------------------------------------


def test_usage_of_each_api() -> None:
    """Each provider's token counts become ``Usage``: Chat Completions' last chunk (with
    ``stream_options.include_usage``), Anthropic's ``message_start`` then each
    ``message_delta`` (output so far, input from the start), the Responses API's
    ``response.completed``; a count that is not a whole number is left out."""
    chat_usage = {"raw": {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}}}
    assert play(CHAT, chat({"content": "Hi"}, ({}, "stop"), chat_usage)) == [
        Text(text="Hi"),
        Usage(input_tokens=9, output_tokens=4),
    ]
    odd = {"raw": {"choices": [], "usage": {"prompt_tokens": "9", "completion_tokens": True}}}
    assert play(CHAT, chat(({}, "stop"), odd)) == []
    started = ("message_start", {"message": {"usage": {"input_tokens": 25, "output_tokens": 1}}})
    assert play(
        ANTHROPIC,
        anthropic(
            started,
            (
                "message_delta",
                {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 7}},
            ),
            ("message_stop", {}),
        ),
    ) == [Usage(input_tokens=25, output_tokens=1), Usage(input_tokens=25, output_tokens=7)]
    completed = {
        "type": "response.completed",
        "response": {"usage": {"input_tokens": 30, "output_tokens": 5, "total_tokens": 35}},
    }
    assert play(RESPONSES, responses(completed)) == [Usage(input_tokens=30, output_tokens=5)]
