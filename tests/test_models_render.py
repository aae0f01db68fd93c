"""History rendering for the three APIs: golden request bodies, and the validity rule
checked on 200 generated histories (the providers answer HTTP 400 to a history that
breaks it, so a barge-in must never make the next request invalid)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import vrt
from vrt.models import AgentText, TurnInterrupted, UserInput
from vrt.models._anthropic import anthropic_body
from vrt.models._chat import chat_body
from vrt.models._responses import responses_body

GOLDEN = Path(__file__).parent / "golden"
OK = vrt.ToolResult.success({"temp_c": 21})
R = vrt.ResultCode


def record(call_id: str, name: str, arguments: Any, result: vrt.ToolResult) -> vrt.CallRecord:
    return vrt.CallRecord(
        call_id=call_id, name=name, kind="server", arguments=arguments, result=result
    )


HISTORY = (
    UserInput(turn_id="t_1", text="weather in Paris and Oslo?"),
    AgentText(turn_id="t_1", text="Checking both."),
    record("call_1", "weather", {"city": "Paris"}, OK),
    record(
        "call_2", "weather", '{"city": 7', vrt.ToolResult.failure(R.INVALID, "city: not a string")
    ),
    AgentText(turn_id="t_1", text="Paris is 21 degrees."),
    UserInput(turn_id="t_2", text="now book it"),
    record("call_3", "book", {"flight": "AF1"}, vrt.ToolResult.failure(R.INTERRUPTED)),
    record("call_4", "book", '{"flight": ', vrt.ToolResult.failure(R.FAILED, "the model stopped")),
    TurnInterrupted(turn_id="t_2"),
    UserInput(turn_id="t_3", text="wait, no"),
    record("call_5", "charge", [1, 2], vrt.ToolResult.failure(R.REJECTED, "the user declined")),
    record("call_6", "show", {}, vrt.ToolResult.failure(R.TIMEOUT, "no result within 30 s")),
)
TOOLS = (vrt.ToolSpec(name="weather", description="Weather now", parameters={"type": "object"}),)
REQUEST = vrt.ModelRequest(
    instructions="Be brief.", tools=TOOLS, history=HISTORY, session_id="s", turn_id="t_3", step=2
)
BODIES = {
    "openai-chat": lambda request: chat_body(request, "gpt-test"),
    "openai-responses": lambda request: responses_body(request, "gpt-test"),
    "anthropic": lambda request: anthropic_body(request, "claude-test", 1024),
}


def test_golden_request_bodies() -> None:
    """The three bodies for one history with every result code and an interrupted turn
    (rewrite them with VRT_GOLDEN=write after a deliberate change, and read the diff)."""
    for api, build in BODIES.items():
        body = build(REQUEST)
        path = GOLDEN / f"{api}.json"
        if os.environ.get("VRT_GOLDEN") == "write":
            path.write_text(json.dumps(body, indent=2, ensure_ascii=False) + "\n")
        assert body == json.loads(path.read_text()), api
        assert_valid(api, body)


def test_no_tools_key_when_the_agent_offers_none() -> None:
    bare = vrt.ModelRequest(
        instructions="", tools=(), history=HISTORY[:1], session_id="s", turn_id="t_1", step=1
    )
    for api, build in BODIES.items():
        body = build(bare)
        assert "tools" not in body and "system" not in body and "instructions" not in body, api


# -- the validity rule, on generated histories --------------------------------------------------

CODES = [None, *vrt.ResultCode]
TEXTS = st.text(max_size=8) | st.sampled_from(["", " ", "\n", " \t "])  # the API refuses blank

arguments = st.one_of(
    st.fixed_dictionaries({"x": st.integers()}),
    st.just({}),
    st.just('{"x": '),  # never completed
    st.just("not json"),
    st.just([1, 2]),  # JSON, not an object
    st.just('{"x": 1}'),
)


@st.composite
def histories(draw: st.DrawFn) -> tuple[Any, ...]:
    """Turns as the engine records them: the input; steps of (text?, calls with results);
    an interrupted turn ends with its mark (its last step's calls INTERRUPTED)."""
    items: list[Any] = []
    number = 0
    for turn in range(draw(st.integers(1, 4))):
        turn_id = f"t_{turn + 1}"
        items.append(UserInput(turn_id=turn_id, text=draw(TEXTS)))
        interrupted = draw(st.booleans())
        for _ in range(draw(st.integers(0, 3))):
            if draw(st.booleans()):
                items.append(AgentText(turn_id=turn_id, text=draw(TEXTS)))
            for _ in range(draw(st.integers(0, 3))):
                number += 1
                code = draw(st.sampled_from(CODES))
                result = (
                    vrt.ToolResult.success(draw(st.none() | st.integers()))
                    if code is None
                    else vrt.ToolResult.failure(code, draw(st.none() | st.text(max_size=5)))
                )
                items.append(record(f"call_{number}", "tool", draw(arguments), result))
        if interrupted:
            items.append(TurnInterrupted(turn_id=turn_id))
    return tuple(items)


@settings(max_examples=200, deadline=None)
@given(histories())
def test_every_rendering_keeps_the_rule(history: tuple[Any, ...]) -> None:
    request = vrt.ModelRequest(
        instructions="x", tools=TOOLS, history=history, session_id="s", turn_id="t", step=1
    )
    calls = [item.call_id for item in history if isinstance(item, vrt.CallRecord)]
    interrupted = sum(isinstance(item, TurnInterrupted) for item in history)
    for api, build in BODIES.items():
        body = build(request)
        assert_valid(api, body)
        text = json.dumps(body)
        assert text.count("interrupted") >= interrupted, api  # every interrupted turn marked
        assert _call_ids(api, body) == calls, api  # every call, once, in order


def _call_ids(api: str, body: dict[str, Any]) -> list[str]:
    if api == "openai-chat":
        return [c["id"] for m in body["messages"] for c in m.get("tool_calls", [])]
    if api == "anthropic":
        return [b["id"] for m in body["messages"] for b in m["content"] if b["type"] == "tool_use"]
    return [i["call_id"] for i in body["input"] if i["type"] == "function_call"]


def assert_valid(api: str, body: dict[str, Any]) -> None:
    """What each provider requires of a history (it answers HTTP 400 otherwise)."""
    {
        "openai-chat": _chat_valid,
        "anthropic": _anthropic_valid,
        "openai-responses": _responses_valid,
    }[api](body)


def _object_text(text: Any) -> None:
    assert isinstance(text, str) and isinstance(json.loads(text), dict), text


def _result(text: Any) -> None:
    result = json.loads(text)
    assert result["ok"] in (True, False)
    if result["ok"]:
        assert set(result) == {"ok", "output"}
    else:
        assert set(result) == {"ok", "code", "message"} and result["code"] in R.__members__


def _chat_valid(body: dict[str, Any]) -> None:
    messages = body["messages"]
    i = 0
    while i < len(messages):
        message = messages[i]
        assert message["role"] in ("system", "user", "assistant", "tool"), message
        if message["role"] == "tool":
            raise AssertionError(f"a tool message not right after its call: {i}")
        i += 1
        for call in message.get("tool_calls", []):
            _object_text(call["function"]["arguments"])
            answer = messages[i]
            assert answer["role"] == "tool" and answer["tool_call_id"] == call["id"], answer
            _result(answer["content"])
            i += 1
        if message["role"] == "assistant":
            assert isinstance(message["content"], str) or message.get("tool_calls"), message


def _anthropic_valid(body: dict[str, Any]) -> None:
    messages = body["messages"]
    assert messages and messages[0]["role"] == "user"
    for i, message in enumerate(messages):
        assert message["role"] == ("user" if i % 2 == 0 else "assistant"), [
            m["role"] for m in messages
        ]
        assert message["content"], message
        for part in message["content"]:
            if part["type"] == "text":
                assert part["text"].strip(), "an empty or whitespace-only text block"
        uses = [b for b in message["content"] if b["type"] == "tool_use"]
        if uses:
            answer = messages[i + 1]["content"]
            results = [b for b in answer if b["type"] == "tool_result"]
            assert [r["tool_use_id"] for r in results] == [u["id"] for u in uses]
            assert answer[: len(results)] == results  # the results come first
            for use, result in zip(uses, results, strict=True):
                assert isinstance(use["input"], dict)
                _result(result["content"])
        if message["role"] == "user" and i > 0:
            previous = {b["id"] for b in messages[i - 1]["content"] if b["type"] == "tool_use"}
            answered = {b["tool_use_id"] for b in message["content"] if b["type"] == "tool_result"}
            assert answered == previous


def _responses_valid(body: dict[str, Any]) -> None:
    items = body["input"]
    open_calls: list[str] = []
    for item in items:
        if item["type"] == "function_call":
            _object_text(item["arguments"])
            open_calls.append(item["call_id"])
        elif item["type"] == "function_call_output":
            assert open_calls and open_calls[0] == item["call_id"], (open_calls, item)
            open_calls.pop(0)
            _result(item["output"])
        else:
            assert not open_calls, f"a message before the results of {open_calls}"
            assert item["type"] == "message" and item["role"] in ("user", "assistant")
    assert not open_calls
