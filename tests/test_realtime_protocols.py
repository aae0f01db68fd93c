"""The realtime models' protocols, sans-IO: real-shaped server messages of OpenAI Realtime
(GA) and Gemini Live in, generic events out; the engine's decisions in, the exact JSON
messages out. Each quirk of a server is one table row."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import vrt
import vrt.models
from vrt.models import (
    AgentText,
    CallDelta,
    CallEnd,
    CallStart,
    GeminiLive,
    OpenAIRealtime,
    RealtimeModel,
    RealtimeSeed,
    Text,
    TurnInterrupted,
    Usage,
    UserInput,
)
from vrt.models._realtime import (
    AudioOut,
    CallsCancelled,
    Ready,
    ResponseDone,
    ResponseOutput,
    ResponseStarted,
    Settled,
    SpeechStarted,
    TranscriptOut,
    UpstreamError,
    UserTranscript,
)

KEY = "sk-test-0123456789abcdefSECRET"
R = vrt.ResultCode
NOTE = TurnInterrupted(turn_id="t_2").note
PCM = bytes(range(256)) * 4
PCM64 = base64.b64encode(PCM).decode()
TOOLS = (
    vrt.ToolSpec(
        name="weather",
        description="Weather now",
        parameters={
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "additionalProperties": False,
        },
    ),
)


def record(call_id: str, name: str, arguments: Any, result: vrt.ToolResult) -> vrt.CallRecord:
    return vrt.CallRecord(
        call_id=call_id, name=name, kind="server", arguments=arguments, result=result
    )


OK_CALL = record("call_1", "weather", {"city": "Paris"}, vrt.ToolResult.success({"temp_c": 21}))
CUT_CALL = record("call_2", "book", '{"flight": ', vrt.ToolResult.failure(R.INTERRUPTED))
HISTORY = (
    UserInput(turn_id="t_1", text="weather in Paris?"),
    AgentText(turn_id="t_1", text="Checking."),
    OK_CALL,
    AgentText(turn_id="t_1", text="It is 21 degrees."),
    UserInput(turn_id="t_2", text="book it"),
    CUT_CALL,
    TurnInterrupted(turn_id="t_2"),
    UserInput(turn_id="t_3", text="never mind"),
)
SEED = RealtimeSeed(instructions="Be brief.", tools=TOOLS, history=HISTORY)


def decode(protocol: Any, messages: list[Any]) -> list[Any]:
    return [event for message in messages for event in protocol.receive(message)]


def out(response_id: str, event: Any) -> ResponseOutput:
    return ResponseOutput(response_id=response_id, event=event)


# -- OpenAI Realtime: what the server says ---------------------------------------------------------


def oa(kind: str, **fields: Any) -> dict[str, Any]:
    """A server event as the GA API sends one (every event has an event_id)."""
    return {"type": kind, "event_id": "event_1", **fields}


def oa_call_item(status: str, arguments: str = "") -> dict[str, Any]:
    return {
        "id": "item_c",
        "object": "realtime.item",
        "type": "function_call",
        "status": status,
        "call_id": "call_a",
        "name": "weather",
        "arguments": arguments,
    }


def oa_done(status: str, **response: Any) -> dict[str, Any]:
    return oa(
        "response.done",
        response={"id": "resp_1", "object": "realtime.response", "status": status, **response},
    )


IN_RESPONSE = {"response_id": "resp_1", "output_index": 0}
AUDIO_PART = {"item_id": "item_m", "content_index": 0, **IN_RESPONSE}

OPENAI_CASES: dict[str, tuple[list[dict[str, Any]], list[Any]]] = {
    "session.created is not Ready; the first session.updated is, once": (
        [oa("session.created", session={}), *[oa("session.updated", session={})] * 2],
        [Ready()],
    ),
    "a spoken answer: audio decoded, its transcript, usage, then done": (
        [
            oa("response.created", response={"id": "resp_1", "status": "in_progress"}),
            oa(
                "response.output_item.added",
                item={"id": "item_m", "type": "message"},
                **IN_RESPONSE,
            ),
            oa("response.output_audio.delta", delta=PCM64, **AUDIO_PART),
            oa("response.output_audio_transcript.delta", delta="Hello", **AUDIO_PART),
            oa("response.output_audio.done", **AUDIO_PART),
            oa(
                "response.output_item.done", item={"id": "item_m", "type": "message"}, **IN_RESPONSE
            ),
            oa_done("completed", usage={"input_tokens": 120, "output_tokens": 34}),
        ],
        [
            ResponseStarted(response_id="resp_1"),
            AudioOut(response_id="resp_1", item_id="item_m", pcm=PCM),
            TranscriptOut(response_id="resp_1", text="Hello"),
            out("resp_1", Usage(input_tokens=120, output_tokens=34)),
            ResponseDone(response_id="resp_1", status="completed"),
        ],
    ),
    "a text answer (output text)": (
        [oa("response.output_text.delta", delta="Hi", **AUDIO_PART), oa_done("completed")],
        [out("resp_1", Text(text="Hi")), ResponseDone(response_id="resp_1", status="completed")],
    ),
    "a call: its start, argument deltas, and the completed item's whole arguments": (
        [
            oa("response.output_item.added", item=oa_call_item("in_progress"), **IN_RESPONSE),
            oa(
                "response.function_call_arguments.delta",
                item_id="item_c",
                call_id="call_a",
                delta='{"city"',
                **IN_RESPONSE,
            ),
            oa(
                "response.function_call_arguments.delta",
                item_id="item_c",
                call_id="call_a",
                delta=': "Paris"}',
                **IN_RESPONSE,
            ),
            oa(
                "response.function_call_arguments.done",
                item_id="item_c",
                call_id="call_a",
                name="weather",
                arguments='{"city": "Paris"}',
                **IN_RESPONSE,
            ),
            oa(
                "response.output_item.done",
                item=oa_call_item("completed", '{"city": "Paris"}'),
                **IN_RESPONSE,
            ),
        ],
        [
            out("resp_1", CallStart(call_id="call_a", name="weather")),
            out("resp_1", CallDelta(call_id="call_a", delta='{"city"')),
            out("resp_1", CallDelta(call_id="call_a", delta=': "Paris"}')),
            out("resp_1", CallEnd(call_id="call_a", arguments='{"city": "Paris"}')),
        ],
    ),
    "a call item cut off (incomplete) gets no CallEnd; the response is cancelled": (
        [
            oa("response.output_item.added", item=oa_call_item("in_progress"), **IN_RESPONSE),
            oa(
                "response.function_call_arguments.done",
                item_id="item_c",
                call_id="call_a",
                name="weather",
                arguments='{"ci',
                **IN_RESPONSE,
            ),
            oa("response.output_item.done", item=oa_call_item("incomplete", '{"ci'), **IN_RESPONSE),
            oa_done("cancelled", status_details={"type": "cancelled", "reason": "turn_detected"}),
        ],
        [
            out("resp_1", CallStart(call_id="call_a", name="weather")),
            ResponseDone(response_id="resp_1", status="cancelled"),
        ],
    ),
    "a completed call with empty arguments ends with an empty object": (
        [oa("response.output_item.done", item=oa_call_item("completed", ""), **IN_RESPONSE)],
        [out("resp_1", CallEnd(call_id="call_a", arguments={}))],
    ),
    "incomplete (a length limit) and failed (with why)": (
        [
            oa_done(
                "incomplete", status_details={"type": "incomplete", "reason": "max_output_tokens"}
            ),
            oa_done(
                "failed",
                status_details={
                    "type": "failed",
                    "error": {"type": "server_error", "code": "rate_limit_exceeded"},
                },
            ),
        ],
        [
            ResponseDone(response_id="resp_1", status="incomplete"),
            ResponseDone(response_id="resp_1", status="failed", message="rate_limit_exceeded"),
        ],
    ),
    "the user's voice: speech started, then their transcript": (
        [
            oa("input_audio_buffer.speech_started", audio_start_ms=1500, item_id="item_u"),
            oa("input_audio_buffer.speech_stopped", audio_end_ms=2500, item_id="item_u"),
            oa("input_audio_buffer.committed", item_id="item_u", previous_item_id=None),
            oa(
                "conversation.item.input_audio_transcription.delta",
                item_id="item_u",
                content_index=0,
                delta="What's",
            ),
            oa(
                "conversation.item.input_audio_transcription.completed",
                item_id="item_u",
                content_index=0,
                transcript="What's the weather?",
                usage={"type": "duration", "seconds": 1.2},
            ),
        ],
        [SpeechStarted(audio_ms=1500), UserTranscript(text="What's the weather?")],
    ),
    "an error (the session stays open)": (
        [
            oa(
                "error",
                error={
                    "type": "invalid_request_error",
                    "code": "response_cancel_not_active",
                    "message": "Cancellation failed: no active response found",
                    "event_id": None,
                    "param": None,
                },
            )
        ],
        [
            UpstreamError(
                message="Cancellation failed: no active response found",
                code="response_cancel_not_active",
            )
        ],
    ),
    "types the engine does not need, and unknown ones, give nothing": (
        [
            oa("conversation.item.added", item={"id": "x", "type": "message"}),
            oa("conversation.item.done", item={"id": "x", "type": "message"}),
            oa("response.content_part.added", part={"type": "audio"}, **AUDIO_PART),
            oa("output_audio_buffer.started", response_id="resp_1"),
            oa("rate_limits.updated", rate_limits=[]),
            oa("response.mcp_call.in_progress", item_id="m", output_index=0),
            oa("something.new", whatever=[1, 2]),
        ],
        [],
    ),
}


@pytest.mark.parametrize("case", list(OPENAI_CASES))
def test_openai_server_messages(case: str) -> None:
    messages, expected = OPENAI_CASES[case]
    assert decode(OpenAIRealtime(api_key=KEY).protocol(), messages) == expected


OPENAI_MALFORMED = {
    "not an object": ["response.done"],
    "no type": {"response": {"id": "r"}},
    "a type that is not a string": {"type": 7},
    "response.created without its response": oa("response.created"),
    "response.created without an id": oa("response.created", response={"status": "x"}),
    "a call item without its call_id": oa(
        "response.output_item.added",
        item={"type": "function_call", "name": "weather"},
        **IN_RESPONSE,
    ),
    "an arguments delta without its call_id": oa(
        "response.function_call_arguments.delta", delta="{", **IN_RESPONSE
    ),
    "audio without its response_id": oa("response.output_audio.delta", delta=PCM64),
    "audio that is not base64": oa("response.output_audio.delta", delta="%%%", **AUDIO_PART),
    "response.done without a final status": oa_done("in_progress"),
    "speech started without its time": oa("input_audio_buffer.speech_started"),
    "an error that is not an object": oa("error", error="boom"),
    "a transcript that is not text": oa(
        "conversation.item.input_audio_transcription.completed", transcript=None
    ),
}


@pytest.mark.parametrize("case", list(OPENAI_MALFORMED))
def test_openai_malformed_messages_raise_a_short_value_error(case: str) -> None:
    message = OPENAI_MALFORMED[case]
    if isinstance(message, dict):
        message = {**message, "payload": "USER-TEXT-" * 50}
    with pytest.raises(ValueError, match=r"^.{5,100}$") as info:
        OpenAIRealtime(api_key=KEY).protocol().receive(message)
    assert "USER-TEXT" not in str(info.value)


# -- OpenAI Realtime: what is sent -----------------------------------------------------------------


def test_openai_session_update() -> None:
    model = OpenAIRealtime(
        api_key=KEY, voice="marin", extra_session={"max_output_tokens": 800, "audio": {"x": 1}}
    )
    assert model.protocol().setup(SEED) == [
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "model": "gpt-realtime",
                "instructions": "Be brief.",
                "output_modalities": ["audio"],
                "audio": {"x": 1},  # extra_session merges at the top, replacing
                "tools": [
                    {
                        "type": "function",
                        "name": "weather",
                        "description": "Weather now",
                        "parameters": TOOLS[0].parameters,
                    }
                ],
                "max_output_tokens": 800,
            },
        }
    ]
    [update] = OpenAIRealtime(api_key=KEY, voice="marin").protocol().setup(SEED)
    assert update["session"]["audio"] == {
        "input": {
            "format": {"type": "audio/pcm", "rate": 24000},
            "transcription": {"model": "gpt-4o-mini-transcribe"},
            "turn_detection": {
                "type": "server_vad",
                "create_response": True,
                "interrupt_response": True,
            },
        },
        "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "marin"},
    }


def test_openai_session_update_text_semantic_vad_none_and_bare() -> None:
    bare = RealtimeSeed(instructions="", tools=())
    [update] = (
        OpenAIRealtime(api_key=KEY, output="text", turn_detection="semantic_vad")
        .protocol()
        .setup(bare)
    )
    session = update["session"]
    assert session["output_modalities"] == ["text"]
    assert "output" not in session["audio"]
    assert session["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
    assert "tools" not in session and "instructions" not in session
    [update] = OpenAIRealtime(api_key=KEY, turn_detection=None).protocol().setup(bare)
    assert update["session"]["audio"]["input"]["turn_detection"] is None  # null: switched off
    assert "voice" not in update["session"]["audio"]["output"]


def test_openai_seed_renders_the_history_as_items() -> None:
    protocol = OpenAIRealtime(api_key=KEY).protocol()
    items = [message["item"] for message in protocol.seed(SEED)]
    assert {m["type"] for m in protocol.seed(SEED)} == {"conversation.item.create"}
    assert items == [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "weather in Paris?"}],
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Checking."}],
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "weather",
            "arguments": '{"city": "Paris"}',
        },
        {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": '{"ok": true, "output": {"temp_c": 21}}',
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "It is 21 degrees."}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "book it"}]},
        {"type": "function_call", "call_id": "call_2", "name": "book", "arguments": "{}"},
        {
            "type": "function_call_output",
            "call_id": "call_2",
            "output": '{"ok": false, "code": "INTERRUPTED", "message": ""}',
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": f"[{NOTE}]\n\nnever mind"}],
        },
    ]
    assert "interrupted" in items[-1]["content"][0]["text"]
    assert protocol.seed(RealtimeSeed(instructions="x", tools=TOOLS)) == []
    # an interrupted turn that nothing followed: the note alone, as a user message
    [last] = protocol.seed(RealtimeSeed(instructions="", tools=(), history=HISTORY[:7]))[-1:]
    assert last["item"]["content"] == [{"type": "input_text", "text": f"[{NOTE}]"}]


def test_openai_answers_and_the_other_messages() -> None:
    protocol = OpenAIRealtime(api_key=KEY).protocol()
    answers = protocol.answers([OK_CALL, CUT_CALL], respond=True)
    assert answers == [
        {
            "type": "conversation.item.create",
            "item": {
                "type": "function_call_output",
                "call_id": "call_1",
                "output": '{"ok": true, "output": {"temp_c": 21}}',
            },
        },
        {
            "type": "conversation.item.create",
            "item": {
                "type": "function_call_output",
                "call_id": "call_2",
                "output": '{"ok": false, "code": "INTERRUPTED", "message": ""}',
            },
        },
        {"type": "response.create"},
    ]
    assert protocol.answers([OK_CALL, CUT_CALL], respond=False) == answers[:2]
    assert protocol.answers([], respond=False) == []
    assert protocol.answers([], respond=True) == [{"type": "response.create"}]
    assert protocol.respond() == [{"type": "response.create"}]
    assert protocol.cancel() == [{"type": "response.cancel"}]
    assert protocol.truncate("item_m", 1234) == [
        {
            "type": "conversation.item.truncate",
            "item_id": "item_m",
            "content_index": 0,
            "audio_end_ms": 1234,
        }
    ]
    assert protocol.audio(PCM) == [{"type": "input_audio_buffer.append", "audio": PCM64}]
    assert protocol.audio(b"") == []
    assert protocol.user_text("hi") == [
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "hi"}],
            },
        },
        {"type": "response.create"},
    ]
    assert protocol.answers_wait_for_settled is False


# -- OpenAI Realtime: the model class and its key --------------------------------------------------


def test_openai_endpoint_and_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    model = OpenAIRealtime(api_key=KEY)
    assert isinstance(model, RealtimeModel)
    assert (model.realtime, model.input_rate, model.output_rate, model.timeout) == (
        True,
        24000,
        24000,
        30.0,
    )
    url, headers = model.endpoint()
    assert url == "wss://api.openai.com/v1/realtime?model=gpt-realtime"
    assert headers == [("Authorization", f"Bearer {KEY}")]
    assert KEY not in repr(model) and "gpt-realtime" in repr(model)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    env = OpenAIRealtime("gpt-realtime-mini", url="ws://127.0.0.1:9/rt?x=1")
    assert env.endpoint() == (
        "ws://127.0.0.1:9/rt?x=1&model=gpt-realtime-mini",
        [("Authorization", "Bearer sk-from-env")],
    )
    monkeypatch.delenv("OPENAI_API_KEY")
    assert OpenAIRealtime().endpoint()[1] == []  # no key known: no header


def test_openai_an_echoed_key_is_redacted() -> None:
    protocol = OpenAIRealtime(api_key=KEY).protocol()
    [error] = protocol.receive(
        oa(
            "error",
            error={
                "type": "invalid_request_error",
                "code": "invalid_api_key",
                "message": f"Incorrect API key provided: {KEY}.",
            },
        )
    )
    assert isinstance(error, UpstreamError)
    assert error.message == "Incorrect API key provided: ***." and not error.fatal
    assert error.code == "invalid_api_key"
    # redacted before it is cut: the cut would otherwise leave the key's first characters
    [error] = protocol.receive(oa("error", error={"type": "x", "message": "y" * 230 + KEY}))
    assert KEY[:6] not in error.message and len(error.message) <= 240
    failed = oa_done(
        "failed", status_details={"error": {"type": "x", "code": "c", "message": f"bad {KEY}"}}
    )
    [done] = protocol.receive(failed)
    assert done == ResponseDone(response_id="resp_1", status="failed", message="bad ***")


def test_openai_settings_are_checked() -> None:
    for bad in (
        {"output": "video"},
        {"turn_detection": "always"},
        {"url": "https://api.openai.com/v1/realtime"},
        {"input_rate": 0},
        {"timeout": 0},
        {"extra_session": ["x"]},
        {"voice": ""},
        {"api_key": "sk-\nx"},
    ):
        with pytest.raises(ValueError, match=r"^.{5,120}$"):
            OpenAIRealtime(**bad)


# -- Gemini Live: what the server says -------------------------------------------------------------


def audio_part(pcm: bytes = PCM) -> dict[str, Any]:
    return {
        "inlineData": {"mimeType": "audio/pcm;rate=24000", "data": base64.b64encode(pcm).decode()}
    }


def content(**fields: Any) -> dict[str, Any]:
    return {"serverContent": fields}


def turn(*parts: dict[str, Any]) -> dict[str, Any]:
    return content(modelTurn={"parts": list(parts)})


GEMINI_CASES: dict[str, tuple[str, list[dict[str, Any]], list[Any]]] = {
    "setupComplete is Ready, once": (
        "audio",
        [{"setupComplete": {"sessionId": "s"}}, {"setupComplete": {}}],
        [Ready()],
    ),
    "a spoken answer: ids made, audio, transcripts, usage, turnComplete (no Settled)": (
        "audio",
        [
            content(inputTranscription={"text": "What's the"}),
            turn(audio_part()),
            content(outputTranscription={"text": "Hello"}),
            turn(audio_part(b"\x01\x02")),
            content(generationComplete=True),
            {
                "serverContent": {"turnComplete": True},
                "usageMetadata": {"promptTokenCount": 90, "responseTokenCount": 12},
            },
            turn(audio_part(b"\x03\x04")),
            content(turnComplete=True),
        ],
        [
            UserTranscript(text="What's the"),
            ResponseStarted(response_id="g1"),
            AudioOut(response_id="g1", item_id="", pcm=PCM),
            TranscriptOut(response_id="g1", text="Hello"),
            AudioOut(response_id="g1", item_id="", pcm=b"\x01\x02"),
            out("g1", Usage(input_tokens=90, output_tokens=12)),
            ResponseDone(response_id="g1", status="completed"),
            ResponseStarted(response_id="g2"),
            AudioOut(response_id="g2", item_id="", pcm=b"\x03\x04"),
            ResponseDone(response_id="g2", status="completed"),
        ],
    ),
    "with audio output, text parts (thoughts) are not said": (
        "audio",
        [turn({"text": "**Thinking** about it", "thought": True}, {"text": "plan"})],
        [],
    ),
    "with text output, text parts are the answer (thoughts are not)": (
        "text",
        [
            turn({"text": "thinking", "thought": True}),
            turn({"text": "Hi "}, {"text": "there"}),
            content(turnComplete=True),
        ],
        [
            ResponseStarted(response_id="g1"),
            out("g1", Text(text="Hi ")),
            out("g1", Text(text="there")),
            ResponseDone(response_id="g1", status="completed"),
        ],
    ),
    "a toolCall ends its response; the answer's reply is the next one": (
        "audio",
        [
            turn(audio_part(b"\x01\x00")),
            {
                "toolCall": {
                    "functionCalls": [
                        {"id": "fc_1", "name": "weather", "args": {"city": "Paris"}},
                        {"id": "fc_2", "name": "clock"},
                    ]
                }
            },
            turn(audio_part(b"\x02\x00")),
            content(turnComplete=True),
        ],
        [
            ResponseStarted(response_id="g1"),
            AudioOut(response_id="g1", item_id="", pcm=b"\x01\x00"),
            out("g1", CallStart(call_id="fc_1", name="weather")),
            out("g1", CallEnd(call_id="fc_1", arguments={"city": "Paris"})),
            out("g1", CallStart(call_id="fc_2", name="clock")),
            out("g1", CallEnd(call_id="fc_2", arguments={})),
            ResponseDone(response_id="g1", status="completed"),
            ResponseStarted(response_id="g2"),
            AudioOut(response_id="g2", item_id="", pcm=b"\x02\x00"),
            ResponseDone(response_id="g2", status="completed"),
        ],
    ),
    "a toolCall with no response active starts one": (
        "audio",
        [{"toolCall": {"functionCalls": [{"id": "fc_1", "name": "clock", "args": {}}]}}],
        [
            ResponseStarted(response_id="g1"),
            out("g1", CallStart(call_id="fc_1", name="clock")),
            out("g1", CallEnd(call_id="fc_1", arguments={})),
            ResponseDone(response_id="g1", status="completed"),
        ],
    ),
    "interrupted: speech, the response cancelled; what is left is dropped; then Settled": (
        "audio",
        [
            turn(audio_part(b"\x01\x00")),
            content(interrupted=True),
            content(outputTranscription={"text": "left over"}),
            {"usageMetadata": {"promptTokenCount": 5}},
            {"toolCallCancellation": {"ids": ["fc_1"]}},
            content(turnComplete=True),
            content(turnComplete=True),
        ],
        [
            ResponseStarted(response_id="g1"),
            AudioOut(response_id="g1", item_id="", pcm=b"\x01\x00"),
            SpeechStarted(),
            ResponseDone(response_id="g1", status="cancelled"),
            CallsCancelled(call_ids=("fc_1",)),
            Settled(),
        ],
    ),
    "a cancellation while the calls run (no response active) settles at turnComplete": (
        "audio",
        [
            {"toolCall": {"functionCalls": [{"id": "fc_1", "name": "book", "args": {}}]}},
            {"toolCallCancellation": {"ids": ["fc_1"]}},
            content(interrupted=True),
            content(turnComplete=True),
        ],
        [
            ResponseStarted(response_id="g1"),
            out("g1", CallStart(call_id="fc_1", name="book")),
            out("g1", CallEnd(call_id="fc_1", arguments={})),
            ResponseDone(response_id="g1", status="completed"),
            CallsCancelled(call_ids=("fc_1",)),
            SpeechStarted(),
            Settled(),
        ],
    ),
    "goAway: the server will close": (
        "audio",
        [{"goAway": {"timeLeft": "10s"}}, {"goAway": {}}],
        [
            UpstreamError(message="the server will close the connection in 10s"),
            UpstreamError(message="the server will close the connection soon"),
        ],
    ),
    "what the engine does not need, and unknown messages, give nothing": (
        "audio",
        [
            {"sessionResumptionUpdate": {"newHandle": "h", "resumable": True}},
            {"usageMetadata": {"promptTokenCount": 5}},  # no response active
            content(generationComplete=True),
            turn({"executableCode": {"code": "1"}}),
            turn({"inlineData": {"mimeType": "image/png", "data": "AAAA"}}),
            {"voiceActivity": {"voiceActivityType": "ACTIVITY_START"}},
            {"somethingNew": {}},
            {},
        ],
        [],
    ),
}


@pytest.mark.parametrize("case", list(GEMINI_CASES))
def test_gemini_server_messages(case: str) -> None:
    output, messages, expected = GEMINI_CASES[case]
    protocol = GeminiLive("gemini-live", api_key=KEY, output=output).protocol()
    assert decode(protocol, messages) == expected


GEMINI_MALFORMED: dict[str, Any] = {
    "not an object": "setupComplete",
    "serverContent that is not an object": {"serverContent": []},
    "modelTurn parts that are not a list": content(modelTurn={"parts": 1}),
    "inlineData without data": turn({"inlineData": {"mimeType": "audio/pcm"}}),
    "audio that is not base64": turn({"inlineData": {"mimeType": "audio/pcm", "data": "%%"}}),
    "a toolCall without calls": {"toolCall": {}},
    "a call without its id": {"toolCall": {"functionCalls": [{"name": "a", "args": {}}]}},
    "a call without its name": {"toolCall": {"functionCalls": [{"id": "a"}]}},
    "args that are not an object": {
        "toolCall": {"functionCalls": [{"id": "a", "name": "b", "args": "{}"}]}
    },
    "cancelled ids that are not a list": {"toolCallCancellation": {"ids": "fc_1"}},
    "a transcription that is not an object": content(inputTranscription="hi"),
    "goAway that is not an object": {"goAway": "10s"},
}


@pytest.mark.parametrize("case", list(GEMINI_MALFORMED))
def test_gemini_malformed_messages_raise_a_short_value_error(case: str) -> None:
    message = GEMINI_MALFORMED[case]
    if isinstance(message, dict):
        message = {**message, "payload": "USER-TEXT-" * 50}
    with pytest.raises(ValueError, match=r"^.{5,100}$") as info:
        GeminiLive("gemini-live", api_key=KEY).protocol().receive(message)
    assert "USER-TEXT" not in str(info.value)


# -- Gemini Live: what is sent ---------------------------------------------------------------------


def test_gemini_setup() -> None:
    protocol = GeminiLive("gemini-live-2.5-flash", api_key=KEY, voice="Kore").protocol()
    assert protocol.setup(SEED) == [
        {
            "setup": {
                "model": "models/gemini-live-2.5-flash",
                "generationConfig": {
                    "responseModalities": ["AUDIO"],
                    "speechConfig": {"voiceConfig": {"prebuiltVoiceConfig": {"voiceName": "Kore"}}},
                },
                "systemInstruction": {"parts": [{"text": "Be brief."}]},
                "tools": [
                    {
                        "functionDeclarations": [
                            {
                                "name": "weather",
                                "description": "Weather now",
                                "parametersJsonSchema": TOOLS[0].parameters,
                            }
                        ]
                    }
                ],
                "inputAudioTranscription": {},
                "outputAudioTranscription": {},
            }
        }
    ]
    text = GeminiLive("models/gemini-x", api_key=KEY, output="text").protocol()
    assert text.setup(RealtimeSeed(instructions="", tools=())) == [
        {
            "setup": {
                "model": "models/gemini-x",
                "generationConfig": {"responseModalities": ["TEXT"]},
                "inputAudioTranscription": {},
            }
        }
    ]


def test_gemini_seed_renders_the_history_as_one_client_content() -> None:
    protocol = GeminiLive("gemini-live", api_key=KEY).protocol()
    assert protocol.seed(SEED) == [
        {
            "clientContent": {
                "turns": [
                    {"role": "user", "parts": [{"text": "weather in Paris?"}]},
                    {
                        "role": "model",
                        "parts": [
                            {"text": "Checking."},
                            {
                                "functionCall": {
                                    "id": "call_1",
                                    "name": "weather",
                                    "args": {"city": "Paris"},
                                }
                            },
                        ],
                    },
                    {
                        "role": "user",
                        "parts": [
                            {
                                "functionResponse": {
                                    "id": "call_1",
                                    "name": "weather",
                                    "response": {"output": {"temp_c": 21}},
                                }
                            }
                        ],
                    },
                    {"role": "model", "parts": [{"text": "It is 21 degrees."}]},
                    {"role": "user", "parts": [{"text": "book it"}]},
                    {
                        "role": "model",
                        "parts": [{"functionCall": {"id": "call_2", "name": "book", "args": {}}}],
                    },
                    {
                        "role": "user",
                        "parts": [
                            {
                                "functionResponse": {
                                    "id": "call_2",
                                    "name": "book",
                                    "response": {"error": "INTERRUPTED", "code": "INTERRUPTED"},
                                }
                            }
                        ],
                    },
                    {"role": "user", "parts": [{"text": f"[{NOTE}]\n\nnever mind"}]},
                ],
                "turnComplete": False,
            }
        }
    ]
    assert "interrupted" in NOTE
    assert protocol.seed(RealtimeSeed(instructions="x", tools=TOOLS)) == []


def test_gemini_answers_and_the_other_messages() -> None:
    protocol = GeminiLive("gemini-live", api_key=KEY, input_rate=16000).protocol()
    failed = record("c3", "pay", {}, vrt.ToolResult.failure(R.REJECTED, "the user declined"))
    odd = record("c4", "odd", {}, vrt.ToolResult.success({"n": float("nan"), "o": object}))
    answer = [
        {
            "toolResponse": {
                "functionResponses": [
                    {"id": "call_1", "name": "weather", "response": {"output": {"temp_c": 21}}},
                    {
                        "id": "c3",
                        "name": "pay",
                        "response": {"error": "the user declined", "code": "REJECTED"},
                    },
                    {
                        "id": "c4",
                        "name": "odd",
                        "response": {"output": {"n": None, "o": str(object)}},
                    },
                ]
            }
        }
    ]
    assert protocol.answers([OK_CALL, failed, odd], respond=True) == answer
    assert protocol.answers([OK_CALL, failed, odd], respond=False) == answer
    assert protocol.answers([], respond=True) == []
    assert protocol.respond() == protocol.cancel() == protocol.truncate("x", 10) == []
    assert protocol.audio(PCM) == [
        {"realtimeInput": {"audio": {"data": PCM64, "mimeType": "audio/pcm;rate=16000"}}}
    ]
    assert protocol.audio(b"") == []
    assert GeminiLive("g", input_rate=8000).protocol().audio(b"\x00\x00") == [
        {"realtimeInput": {"audio": {"data": "AAA=", "mimeType": "audio/pcm;rate=8000"}}}
    ]
    assert protocol.user_text("hi") == [
        {
            "clientContent": {
                "turns": [{"role": "user", "parts": [{"text": "hi"}]}],
                "turnComplete": True,
            }
        }
    ]
    assert protocol.answers_wait_for_settled is True


# -- Gemini Live: the model class and its key ------------------------------------------------------


def test_gemini_endpoint_and_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    model = GeminiLive("gemini-live", api_key=KEY)
    assert isinstance(model, RealtimeModel)
    assert (model.realtime, model.input_rate, model.output_rate, model.timeout) == (
        True,
        16000,
        24000,
        30.0,
    )
    url, headers = model.endpoint()
    assert url == (
        "wss://generativelanguage.googleapis.com/ws/"
        "google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent"
    )
    assert headers == [("x-goog-api-key", KEY)] and KEY not in url
    assert KEY not in repr(model) and "gemini-live" in repr(model)
    monkeypatch.setenv("GOOGLE_API_KEY", "google-key")
    assert GeminiLive("g").endpoint()[1] == [("x-goog-api-key", "google-key")]
    monkeypatch.setenv("GEMINI_API_KEY", "gemini-key")
    assert GeminiLive("g").endpoint()[1] == [("x-goog-api-key", "gemini-key")]
    monkeypatch.delenv("GEMINI_API_KEY")
    monkeypatch.delenv("GOOGLE_API_KEY")
    assert GeminiLive("g").endpoint()[1] == []


def test_gemini_an_echoed_key_is_redacted() -> None:
    protocol = GeminiLive("g", api_key=KEY).protocol()
    [error] = protocol.receive({"goAway": {"timeLeft": f"{KEY}s"}})
    assert isinstance(error, UpstreamError) and KEY not in error.message
    assert "***" in error.message


def test_gemini_settings_are_checked() -> None:
    for args, kwargs in (
        (("",), {}),
        (("g",), {"output": "both"}),
        (("g",), {"url": "http://x"}),
        (("g",), {"input_rate": 16000.0}),
        (("g",), {"timeout": -1}),
        (("g",), {"voice": 3}),
    ):
        with pytest.raises(ValueError, match=r"^.{5,120}$"):
            GeminiLive(*args, **kwargs)


# -- anything a server may send: events or a ValueError, never another exception -------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
REAL = [
    *(("openai", m) for messages, _ in OPENAI_CASES.values() for m in messages),
    *(("gemini", m) for _, messages, _ in GEMINI_CASES.values() for m in messages),
]


def mutated(message: Any, path: list[int], value: Any) -> Any:
    """``message`` with the value at a path (indexes into sorted keys) replaced."""
    if not path or not isinstance(message, dict) or not message:
        return value
    key = sorted(message)[path[0] % len(message)]
    return {**message, key: mutated(message[key], path[1:], value)}


@settings(max_examples=300, deadline=None)
@given(
    real=st.sampled_from(REAL),
    path=st.lists(st.integers(min_value=0, max_value=9), max_size=4),
    value=JSON,
)
def test_a_mutated_message_decodes_or_raises_a_short_value_error(
    real: tuple[str, Any], path: list[int], value: Any
) -> None:
    api, message = real
    model = OpenAIRealtime(api_key=KEY) if api == "openai" else GeminiLive("g", api_key=KEY)
    reason = ""
    try:
        events = model.protocol().receive(mutated(message, path, value))
    except ValueError as exc:
        reason = str(exc)  # short, and never the message itself
        events = []
    assert isinstance(events, list) and len(reason) <= 100


# -- the public door -------------------------------------------------------------------------------


def test_exports() -> None:
    for name in ("OpenAIRealtime", "GeminiLive", "RealtimeModel", "RealtimeSeed"):
        assert name in vrt.models.__all__ and hasattr(vrt.models, name)
