"""FakeRealtime driven with raw trio-websocket JSON: the OpenAI Realtime (GA) and Gemini
Live event sequences, the refusals and the violations they record, the voice detector,
each quirk, dropped connections and the key check."""

from __future__ import annotations

import base64
import json
import logging
import math
from array import array
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    WebSocketConnection,
    wrap_client_stream,
)

import vrt
from vrt.testing import FakeRealtime
from vrt.testing._realtime_core import VoiceDetector, tone, utterance

KEY = "sk-test-0123456789"
SESSION = {
    "type": "realtime",
    "audio": {"input": {"transcription": {"model": "gpt-4o-transcribe"}}},
}


def loud(ms: int, rate: int = 24000) -> bytes:
    """A 300 Hz tone at about a third of full scale."""
    count = rate * ms // 1000
    return array(
        "h", (int(10000 * math.sin(2 * math.pi * 300 * i / rate)) for i in range(count))
    ).tobytes()


def silence(ms: int, rate: int = 24000) -> bytes:
    return bytes(2 * (rate * ms // 1000))


@asynccontextmanager
async def open_websocket_url(
    url: str, *, extra_headers: list[tuple[bytes, bytes]] | None = None
) -> AsyncIterator[WebSocketConnection]:
    """trio-websocket's client on a TCP stream of our own, always closed: its own
    ``open_websocket_url`` leaves the socket open when the server ends the connection."""
    host_port, _, resource = url.removeprefix("ws://").partition("/")
    host, _, port = host_port.partition(":")
    tcp = await trio.open_tcp_stream(host, int(port))
    try:
        async with trio.open_nursery() as nursery:  # trio-websocket's reader task
            ws = await wrap_client_stream(
                nursery, tcp, host, f"/{resource}", extra_headers=extra_headers
            )
            try:
                yield ws
            finally:
                if ws.closed is None:
                    with trio.move_on_after(1):
                        await ws.aclose()
                nursery.cancel_scope.cancel()
    except ExceptionGroup as group:  # the refusal, raised in the reader task
        refused, rest = group.split(ConnectionRejected)
        if refused is None or rest is not None:
            raise
        while isinstance(refused, BaseExceptionGroup):
            refused = refused.exceptions[0]
        raise refused from None
    finally:
        await tcp.aclose()


class Peer:
    """A raw client: JSON out, every message in kept in order."""

    def __init__(self, ws: WebSocketConnection) -> None:
        self.ws = ws
        self.log: list[Any] = []
        self.frames: list[str | bytes] = []

    async def send(self, message: Any) -> None:
        await self.ws.send_message(json.dumps(message))

    async def until(self, done: Callable[[Any], bool], seconds: float = 5.0) -> list[Any]:
        """The messages up to and including the first that ``done`` accepts."""
        got: list[Any] = []
        with trio.fail_after(seconds):
            while True:
                frame = await self.ws.get_message()
                self.frames.append(frame)
                message = json.loads(frame)
                self.log.append(message)
                got.append(message)
                if done(message):
                    return got

    async def until_type(self, kind: str) -> list[Any]:
        return await self.until(lambda m: m.get("type") == kind)

    async def nothing_for(self, seconds: float) -> list[Any]:
        """What arrives within ``seconds`` (expected: nothing)."""
        got: list[Any] = []
        with trio.move_on_after(seconds):
            while True:
                got.append(json.loads(await self.ws.get_message()))
        return got


@asynccontextmanager
async def openai(fake: FakeRealtime, *, session: Any = SESSION) -> AsyncIterator[Peer]:
    headers = [(b"authorization", f"Bearer {KEY}".encode())]
    async with open_websocket_url(f"{fake.url}?model=gpt-realtime", extra_headers=headers) as ws:
        peer = Peer(ws)
        created = await peer.until_type("session.created")
        assert created[0]["session"]["model"] == "gpt-realtime"
        if session is not None:
            await peer.send({"type": "session.update", "session": session})
            await peer.until_type("session.updated")
        yield peer


@asynccontextmanager
async def gemini(fake: FakeRealtime, **setup: Any) -> AsyncIterator[Peer]:
    async with open_websocket_url(
        fake.url, extra_headers=[(b"x-goog-api-key", KEY.encode())]
    ) as ws:
        peer = Peer(ws)
        await peer.send({"setup": {"model": "models/gemini-live-2.5-flash", **setup}})
        assert await peer.until(lambda m: "setupComplete" in m) == [{"setupComplete": {}}]
        yield peer


def types(messages: list[Any]) -> list[str]:
    return [m["type"] for m in messages]


def audio_of(messages: list[Any]) -> bytes:
    return b"".join(
        base64.b64decode(m["delta"]) for m in messages if m["type"] == "response.output_audio.delta"
    )


def append(pcm: bytes) -> dict[str, Any]:
    return {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}


def realtime_audio(pcm: bytes, rate: int = 16000) -> dict[str, Any]:
    blob = {"data": base64.b64encode(pcm).decode(), "mimeType": f"audio/pcm;rate={rate}"}
    return {"realtimeInput": {"audio": blob}}


def content(message: Any) -> dict[str, Any]:
    server: dict[str, Any] = message.get("serverContent", {})
    return server


# -- OpenAI ----------------------------------------------------------------------------------


async def test_openai_say_call_answer_and_next_step() -> None:
    steps = [
        [vrt.say("Let me look"), vrt.call("weather", {"city": "Paris"}, chunks=3)],
        [vrt.say("Sunny in Paris.")],
    ]
    async with FakeRealtime(steps, key=KEY) as fake, openai(fake) as peer:
        await peer.send({"type": "response.create"})
        first = await peer.until_type("response.done")
        assert types(first) == [
            "response.created",
            "response.output_item.added",
            "conversation.item.added",
            "response.content_part.added",
            *(["response.output_audio_transcript.delta"] + ["response.output_audio.delta"] * 3) * 3,
            "response.output_audio.done",
            "response.output_audio_transcript.done",
            "response.content_part.done",
            "response.output_item.done",
            "conversation.item.done",
            "response.output_item.added",
            "conversation.item.added",
            *["response.function_call_arguments.delta"] * 3,
            "response.function_call_arguments.done",
            "response.output_item.done",
            "conversation.item.done",
            "response.done",
        ]
        assert len({m["event_id"] for m in first}) == len(first)
        response_id = first[0]["response"]["id"]
        assert first[0]["response"]["status"] == "in_progress"
        assert all(m["response_id"] == response_id for m in first if "response_id" in m)
        pcm = audio_of(first)
        assert len(pcm) == 2 * 24000 * 180 // 1000  # 60 ms a word, PCM16 at 24 kHz
        assert max(abs(s) for s in array("h", pcm)) > 9000  # a tone, not silence
        said = "".join(
            m["delta"] for m in first if m["type"] == "response.output_audio_transcript.delta"
        )
        assert said == "Let me look"
        deltas = [m for m in first if m["type"] == "response.function_call_arguments.delta"]
        assert "".join(m["delta"] for m in deltas) == '{"city": "Paris"}'
        call = first[-3]["item"]
        assert call["type"] == "function_call" and call["status"] == "completed"
        assert call["arguments"] == '{"city": "Paris"}' and call["name"] == "weather"
        done = first[-1]["response"]
        assert done["status"] == "completed" and done["usage"]["total_tokens"] > 0
        assert [item["type"] for item in done["output"]] == ["message", "function_call"]

        output = {"type": "function_call_output", "call_id": call["call_id"], "output": '{"c": 21}'}
        await peer.send({"type": "conversation.item.create", "item": output})
        acked = await peer.until_type("conversation.item.done")
        assert types(acked) == ["conversation.item.added", "conversation.item.done"]
        assert acked[0]["previous_item_id"] == call["id"]
        await peer.send({"type": "response.create"})
        second = await peer.until_type("response.done")
        transcript = [m for m in second if m["type"] == "response.output_audio_transcript.done"]
        assert transcript[0]["transcript"] == "Sunny in Paris."
        await peer.send({"type": "response.create"})  # the script is over: "ok"
        third = await peer.until_type("response.done")
        assert third[-1]["response"]["output"][0]["content"][0]["transcript"] == "ok"
    assert fake.violations == []
    assert fake.responses == 3 and fake.connections == 1
    assert fake.headers[0]["authorization"] == f"Bearer {KEY}"
    assert [m["type"] for m in fake.received][:2] == ["session.update", "response.create"]


async def test_openai_text_output_follows_the_session() -> None:
    async with FakeRealtime([[vrt.say("Two words")]], audio=False) as fake:
        async with openai(fake, session=None) as peer:
            await peer.send({"type": "response.create"})
            got = await peer.until_type("response.done")
    assert "response.output_audio.delta" not in types(got)
    assert (
        "".join(m["delta"] for m in got if m["type"] == "response.output_text.delta") == "Two words"
    )
    part = next(m for m in got if m["type"] == "response.content_part.done")["part"]
    assert part == {"type": "text", "text": "Two words"}
    assert got[-1]["response"]["output"][0]["content"] == [
        {"type": "output_text", "text": "Two words"}
    ]
    assert fake.violations == []


async def test_openai_create_while_active_is_refused() -> None:
    async with FakeRealtime([[vrt.say("Hold on"), vrt.pause(0.3), vrt.say("there")]]) as fake:
        async with openai(fake) as peer:
            await peer.send({"type": "response.create"})
            await peer.until_type("response.output_item.done")
            await peer.send({"type": "response.create", "event_id": "mine_1"})
            got = await peer.until_type("response.done")
            errors = [m for m in got if m["type"] == "error"]
            assert len(errors) == 1
            assert errors[0]["error"]["code"] == "conversation_already_has_active_response"
            assert errors[0]["error"]["event_id"] == "mine_1"
            assert types(got).count("response.created") == 0  # nothing else started
            assert got[-1]["response"]["status"] == "completed"
            assert await peer.nothing_for(0.1) == []
    assert fake.responses == 1
    assert len(fake.violations) == 1 and "response.create while" in fake.violations[0]


async def test_openai_cancel_stops_the_response_where_it_is() -> None:
    steps = [[vrt.say("Hi"), vrt.call("search", {"q": "a long query text"}, chunks=8)]]
    async with FakeRealtime(steps, delay=0.05) as fake, openai(fake) as peer:
        await peer.send({"type": "response.cancel"})  # none active
        refused = await peer.until_type("error")
        assert refused[-1]["error"]["code"] == "response_cancel_not_active"
        await peer.send({"type": "response.create"})
        await peer.until_type("response.function_call_arguments.delta")
        await peer.send({"type": "response.cancel"})
        got = await peer.until_type("response.done")
        tail = types(got)[types(got).index("response.function_call_arguments.done") :]
        assert tail == [
            "response.function_call_arguments.done",
            "response.output_item.done",
            "conversation.item.done",
            "response.done",
        ]
        partial = got[-4]["arguments"]
        assert 0 < len(partial) < len('{"q": "a long query text"}')
        assert got[-3]["item"]["status"] == "incomplete"
        assert got[-3]["item"]["arguments"] == partial
        done = got[-1]["response"]
        assert done["status"] == "cancelled"
        assert done["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
        assert await peer.nothing_for(0.2) == []  # nothing more of it
    assert fake.violations == ["response.cancel with no active response"]


async def test_openai_cut_off_call_is_incomplete() -> None:
    steps = [[vrt.call("search", {"q": "x" * 20}, chunks=4, truncate=True), vrt.say("never")]]
    async with FakeRealtime(steps) as fake, openai(fake) as peer:
        await peer.send({"type": "response.create"})
        got = await peer.until_type("response.done")
    arguments = next(m for m in got if m["type"] == "response.function_call_arguments.done")
    with pytest.raises(ValueError, match=r"Unterminated|Expecting"):
        json.loads(arguments["arguments"])
    item = next(m for m in got if m["type"] == "response.output_item.done")["item"]
    assert item["status"] == "incomplete"
    assert got[-1]["response"]["status"] == "incomplete"
    assert got[-1]["response"]["status_details"]["reason"] == "max_output_tokens"
    assert "never" not in json.dumps(got)
    assert fake.violations == []


async def test_openai_outputs_for_unknown_and_answered_calls_are_refused() -> None:
    async with FakeRealtime([[vrt.call("ping")]]) as fake, openai(fake) as peer:
        await peer.send({"type": "response.create"})
        got = await peer.until_type("response.done")
        call_id = got[-1]["response"]["output"][0]["call_id"]
        stray = {"type": "function_call_output", "call_id": "call_nope", "output": "x"}
        await peer.send({"type": "conversation.item.create", "item": stray})
        error = (await peer.until_type("error"))[-1]["error"]
        assert error["code"] == "invalid_tool_call_id"
        assert error["message"] == "Tool call ID 'call_nope' not found in conversation."
        answer = {"type": "function_call_output", "call_id": call_id, "output": "{}"}
        await peer.send({"type": "conversation.item.create", "item": answer})
        await peer.until_type("conversation.item.done")
        await peer.send({"type": "conversation.item.create", "item": answer})
        assert (await peer.until_type("error"))[-1]["error"]["code"] == "invalid_tool_call_id"
    assert fake.violations == [
        "output for unknown call 'call_nope'",
        f"second output for {call_id!r}",
    ]


async def test_openai_truncate_past_the_audio_sent_is_refused() -> None:
    async with FakeRealtime([[vrt.say("one two three")]]) as fake, openai(fake) as peer:
        await peer.send({"type": "response.create"})
        got = await peer.until_type("response.done")
        item_id = got[-1]["response"]["output"][0]["id"]
        truncate = {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0}
        await peer.send({**truncate, "audio_end_ms": 100})
        truncated = (await peer.until_type("conversation.item.truncated"))[-1]
        assert truncated["audio_end_ms"] == 100 and truncated["item_id"] == item_id
        await peer.send({**truncate, "audio_end_ms": 500})
        error = (await peer.until_type("error"))[-1]["error"]
        assert error["message"] == "Audio content of 180ms is already shorter than 500ms"
    assert fake.violations == [f"truncate of {item_id} at 500 ms past its 180 ms"]


async def test_openai_session_update_must_be_ga_shaped() -> None:
    async with FakeRealtime([]) as fake, openai(fake, session=None) as peer:
        await peer.send({"type": "session.update", "session": {"instructions": "x"}})
        error = (await peer.until_type("error"))[-1]["error"]
        assert (error["code"], error["param"]) == ("missing_required_parameter", "session.type")
        beta = {"type": "realtime", "modalities": ["text"], "voice": "alloy"}
        await peer.send({"type": "session.update", "session": beta})
        error = (await peer.until_type("error"))[-1]["error"]
        assert error["code"] == "unknown_parameter"
        assert error["message"] == "Unknown parameter: 'session.modalities'."
        good = {"type": "realtime", "instructions": "Be brief.", "output_modalities": ["text"]}
        await peer.send({"type": "session.update", "session": good})
        session = (await peer.until_type("session.updated"))[-1]["session"]
        assert session["instructions"] == "Be brief." and session["output_modalities"] == ["text"]
        assert session["audio"]["input"]["turn_detection"]["type"] == "server_vad"
        await peer.ws.send_message("{not json")
        assert (await peer.until_type("error"))[-1]["error"]["code"] == "invalid_json"
    assert fake.violations == [
        "session.update without session.type",
        "session.modalities",
        "a frame that is not JSON",
    ]


async def test_openai_voice_detector_hears_loud_audio_not_silence() -> None:
    steps = [[vrt.say("Hello"), vrt.pause(5), vrt.say("never said")], [vrt.say("You spoke")]]
    async with FakeRealtime(steps) as fake, openai(fake) as peer:
        await peer.send(append(silence(1000)))
        assert await peer.nothing_for(0.1) == []
        await peer.send({"type": "response.create"})
        await peer.until_type("conversation.item.done")  # "Hello" said; now the pause
        fake.user_said("what about tomorrow")
        await peer.send(append(loud(300)))
        started = await peer.until_type("response.done")
        assert types(started)[0] == "input_audio_buffer.speech_started"
        assert started[0]["audio_start_ms"] == 1000 - 300  # speech at 1 s, minus the padding
        assert started[-1]["response"]["status"] == "cancelled"
        assert started[-1]["response"]["status_details"]["reason"] == "turn_detected"
        await peer.send(append(silence(600)))
        heard = await peer.until_type("response.done")
        assert types(heard)[:6] == [
            "input_audio_buffer.speech_stopped",
            "input_audio_buffer.committed",
            "conversation.item.added",
            "conversation.item.done",
            "response.created",
            "conversation.item.input_audio_transcription.completed",
        ]
        assert heard[0]["audio_end_ms"] == 1000 + 300 + 500
        assert heard[0]["item_id"] == started[0]["item_id"] == heard[2]["item"]["id"]
        assert heard[5]["transcript"] == "what about tomorrow"
        said = [m for m in heard if m["type"] == "response.output_audio_transcript.done"]
        assert said[0]["transcript"] == "You spoke"
        assert "never said" not in json.dumps(peer.log)
    assert fake.audio_received == len(silence(1000) + loud(300) + silence(600))
    assert fake.violations == []


async def test_openai_speak_without_audio_and_no_interrupt() -> None:
    steps = [[vrt.say("Still talking"), vrt.pause(0.2), vrt.say("here")], [vrt.say("Next")]]
    session = {
        "type": "realtime",
        "audio": {"input": {"turn_detection": {"type": "server_vad", "interrupt_response": False}}},
    }
    async with FakeRealtime(steps) as fake, openai(fake, session=session) as peer:
        await peer.send({"type": "response.create"})
        await peer.until_type("response.output_item.done")
        fake.speech_started()
        got = await peer.until_type("response.done")
        assert "input_audio_buffer.speech_started" in types(got)
        assert got[-1]["response"]["status"] == "completed"  # not interrupted
        await fake.speak()
        heard = await peer.until_type("response.done")
        assert "conversation.item.input_audio_transcription.completed" not in types(heard)
    assert fake.violations == [] and fake.responses == 2


@pytest.mark.parametrize("quirk", ["no-created", "duplicate-call", "late-done"])
async def test_openai_quirks(quirk: str) -> None:
    steps = [[vrt.call("lookup", {"id": 12345678}, chunks=6)]]
    delay = 0.05 if quirk == "late-done" else 0.0
    async with FakeRealtime(steps, quirks=[quirk], delay=delay) as fake, openai(fake) as peer:
        await peer.send({"type": "response.create"})
        if quirk == "late-done":
            await peer.until_type("response.function_call_arguments.delta")
            await peer.send({"type": "response.cancel"})
        got = await peer.until_type("response.done")
        late = await peer.nothing_for(0.3)
    if quirk == "no-created":
        assert types(got)[0] == "response.output_item.added"
        assert got[-1]["response"]["status"] == "completed"
    elif quirk == "duplicate-call":
        added = [m["item"] for m in got if m["type"] == "response.output_item.added"]
        assert len(added) == 2 and added[0]["call_id"] == added[1]["call_id"]
        assert added[0]["id"] != added[1]["id"]
    else:
        assert got[-1]["response"]["status"] == "cancelled"
        assert "response.output_item.done" not in types(got)
        assert types(late) == [
            "response.function_call_arguments.done",
            "response.output_item.done",
            "conversation.item.done",
        ]
        assert late[1]["response_id"] == got[-1]["response"]["id"]
    assert fake.violations == []


async def test_openai_drop_and_reconnect() -> None:
    steps = [[vrt.say("first")], [vrt.say("second")]]
    async with FakeRealtime(steps) as fake:
        async with openai(fake) as peer:
            await peer.send({"type": "response.create"})
            await peer.until_type("response.done")
            await fake.drop()
            with pytest.raises(ConnectionClosed):
                await peer.until_type("never")
            assert peer.ws.closed is not None and peer.ws.closed.code == 1006
        async with openai(fake) as peer:
            await peer.send({"type": "response.create"})
            got = await peer.until_type("response.done")
            assert got[-1]["response"]["output"][0]["content"][0]["transcript"] == "second"
    assert fake.connections == 2 and fake.violations == []


async def test_key_in_a_header_only() -> None:
    async with FakeRealtime([], key=KEY) as fake:
        with pytest.raises(ConnectionRejected) as refused:
            async with open_websocket_url(f"{fake.url}?model=m"):
                pass
        assert refused.value.status_code == 401
        with pytest.raises(ConnectionRejected):
            async with open_websocket_url(f"{fake.url}?model=m&key={KEY}"):
                pass
        async with openai(fake, session=None):
            pass
    assert fake.violations == ["a key in the URL (key)"]
    assert fake.connections == 1 and len(fake.headers) == 3
    async with FakeRealtime([], api="gemini", key=KEY) as fake:
        headers = [(b"authorization", f"Bearer {KEY}".encode())]  # OpenAI's header
        with pytest.raises(ConnectionRejected):
            async with open_websocket_url(fake.url, extra_headers=headers):
                pass
        async with gemini(fake):
            pass
    assert fake.violations == [] and fake.connections == 1


# -- Gemini ----------------------------------------------------------------------------------


async def test_gemini_turn_in_binary_frames() -> None:
    async with FakeRealtime([[vrt.say("Good morning")]], api="gemini") as fake:
        async with gemini(fake, outputAudioTranscription={}) as peer:
            turns = [{"role": "user", "parts": [{"text": "hello"}]}]
            await peer.send({"clientContent": {"turns": turns, "turnComplete": False}})
            assert await peer.nothing_for(0.1) == []  # history only
            await peer.send({"clientContent": {"turns": turns, "turnComplete": True}})
            got = await peer.until(lambda m: content(m).get("turnComplete", False))
    assert all(isinstance(frame, bytes) for frame in peer.frames)
    parts = [p for m in got for p in content(m).get("modelTurn", {}).get("parts", [])]
    assert {p["inlineData"]["mimeType"] for p in parts} == {"audio/pcm;rate=24000"}
    pcm = b"".join(base64.b64decode(p["inlineData"]["data"]) for p in parts)
    assert len(pcm) == 2 * 24000 * 120 // 1000
    said = "".join(
        content(m)["outputTranscription"]["text"]
        for m in got
        if "outputTranscription" in content(m)
    )
    assert said == "Good morning"
    assert content(got[-2]) == {"generationComplete": True}
    assert got[-1]["usageMetadata"]["totalTokenCount"] > 0
    assert fake.violations == []


async def test_gemini_tool_call_round() -> None:
    steps = [
        [vrt.say("Checking"), vrt.call("weather", {"city": "Oslo"}), vrt.call("clock")],
        [vrt.say("Cold")],
    ]
    async with FakeRealtime(steps, api="gemini", audio=False) as fake, gemini(fake) as peer:
        await peer.send({"clientContent": {"turns": [], "turnComplete": True}})
        got = await peer.until(lambda m: "toolCall" in m)
        assert [content(m)["modelTurn"]["parts"][0]["text"] for m in got[:-1]] == ["Checking"]
        calls = got[-1]["toolCall"]["functionCalls"]
        assert [(c["name"], c["args"]) for c in calls] == [
            ("weather", {"city": "Oslo"}),
            ("clock", {}),
        ]
        assert await peer.nothing_for(0.1) == []  # no turnComplete: it waits for the answers
        first = {"id": calls[0]["id"], "name": "weather", "response": {"output": "-3"}}
        await peer.send({"toolResponse": {"functionResponses": [first]}})
        assert await peer.nothing_for(0.1) == []  # one answer of two
        second = {"id": calls[1]["id"], "name": "clock", "response": {"output": "9:00"}}
        await peer.send({"tool_response": {"function_responses": [second]}})  # snake_case too
        after = await peer.until(lambda m: content(m).get("turnComplete", False))
        assert content(after[0])["modelTurn"]["parts"] == [{"text": "Cold"}]
    assert fake.violations == [] and fake.responses == 2


async def test_gemini_interrupted_call_is_cancelled() -> None:
    steps = [[vrt.call("book", {"seat": "12A"})], [vrt.say("Sure")]]
    async with FakeRealtime(steps, api="gemini") as fake, gemini(fake) as peer:
        await peer.send({"clientContent": {"turns": [], "turnComplete": True}})
        call = (await peer.until(lambda m: "toolCall" in m))[-1]["toolCall"]["functionCalls"][0]
        await peer.send(realtime_audio(silence(500, 16000)))
        assert await peer.nothing_for(0.1) == []
        await peer.send(realtime_audio(loud(300, 16000)))
        got = await peer.until(lambda m: content(m).get("turnComplete", False))
        assert got == [
            {"serverContent": {"interrupted": True}},
            {"toolCallCancellation": {"ids": [call["id"]]}},
            {"serverContent": {"turnComplete": True}},
        ]
        answer = {"id": call["id"], "name": "book", "response": {"error": "interrupted"}}
        await peer.send({"toolResponse": {"functionResponses": [answer]}})
        await peer.send(realtime_audio(silence(400, 16000)))  # the user stops: the next response
        after = await peer.until(lambda m: content(m).get("turnComplete", False))
        assert any("modelTurn" in content(m) for m in after)
    assert fake.violations == [f"an answer for cancelled call {call['id']!r}"]
    assert fake.audio_received == len(silence(500, 16000) + loud(300, 16000) + silence(400, 16000))


async def test_gemini_no_cancellation_and_duplicate_call() -> None:
    steps = [[vrt.call("book")]]
    async with FakeRealtime(
        steps, api="gemini", quirks=["no-cancellation", "duplicate-call"]
    ) as fake:
        async with gemini(fake) as peer:
            await peer.send({"realtimeInput": {"text": "book it"}})
            twice = await peer.until(lambda m: "toolCall" in m)
            twice += await peer.until(lambda m: "toolCall" in m)
            assert twice[0] == twice[1]
            await fake.speak()
            got = await peer.until(lambda m: content(m).get("turnComplete", False))
            assert all("toolCallCancellation" not in m for m in got)
            call_id = twice[0]["toolCall"]["functionCalls"][0]["id"]
            answer = {"id": call_id, "name": "book", "response": {}}
            await peer.send({"toolResponse": {"functionResponses": [answer]}})
            await peer.send({"toolResponse": {"functionResponses": [answer]}})
            await peer.until(lambda m: content(m).get("turnComplete", False))
    assert fake.violations == [f"a second answer for {call_id!r}"]


async def test_gemini_late_cancellation() -> None:
    """Quirk ``late-cancellation``: the cancellation and ``turnComplete`` come 0.3 s after
    ``interrupted``, still before the next response's content; an answer for the call in
    between is an answer to a call the model dropped."""
    steps = [[vrt.call("book")], [vrt.say("fine")]]
    async with FakeRealtime(steps, api="gemini", quirks=["late-cancellation"]) as fake:
        async with gemini(fake) as peer:
            await peer.send({"realtimeInput": {"text": "book it"}})
            [call] = (await peer.until(lambda m: "toolCall" in m))[-1]["toolCall"]["functionCalls"]
            start = trio.current_time()  # (the fake's pause starts within speak())
            await fake.speak()
            await peer.until(lambda m: content(m).get("interrupted", False))
            answer = {"id": call["id"], "name": "book", "response": {"error": "interrupted"}}
            await peer.send({"toolResponse": {"functionResponses": [answer]}})
            got = await peer.until(lambda m: content(m).get("turnComplete", False))
            assert trio.current_time() - start >= 0.3
            kinds = [next(iter(m)) for m in got]
            assert kinds[0] == "toolCallCancellation", kinds  # before anything else
            assert got[0]["toolCallCancellation"]["ids"] == [call["id"]]
    assert fake.violations == [f"an answer for cancelled call {call['id']!r}"]


async def test_gemini_setup_comes_first() -> None:
    async with FakeRealtime([], api="gemini") as fake:
        async with open_websocket_url(fake.url) as ws:
            await ws.send_message(json.dumps({"clientContent": {"turnComplete": True}}))
            with pytest.raises(ConnectionClosed) as closed, trio.fail_after(5):
                await ws.get_message()
            assert closed.value.reason.code == 1007
        async with open_websocket_url(fake.url) as ws:
            await ws.send_message(json.dumps({"setup": {"model": "models/m", "voice": "x"}}))
            with pytest.raises(ConnectionClosed) as closed, trio.fail_after(5):
                await ws.get_message()
            assert 'Unknown name "voice"' in (closed.value.reason.reason or "")
    assert fake.violations == ["clientContent before setup", "unknown setup field 'voice'"]


async def test_gemini_explicit_activity_when_detection_is_off() -> None:
    steps = [[vrt.say("Long answer"), vrt.pause(5)], [vrt.say("Short")]]
    config = {"automaticActivityDetection": {"disabled": True}}
    async with FakeRealtime(steps, api="gemini", audio=False) as fake:
        async with gemini(fake, realtimeInputConfig=config, inputAudioTranscription={}) as peer:
            await peer.send({"clientContent": {"turns": [], "turnComplete": True}})
            await peer.until(lambda m: "answer" in json.dumps(m))  # the pause now
            await peer.send(realtime_audio(loud(500, 16000)))  # no detector: no interruption
            assert await peer.nothing_for(0.1) == []
            await peer.send({"realtimeInput": {"activityStart": {}}})
            got = await peer.until(lambda m: content(m).get("turnComplete", False))
            assert got == [
                {"serverContent": {"interrupted": True}},
                {"serverContent": {"turnComplete": True}},
            ]
            fake.user_said("shorter please")
            await peer.send({"realtimeInput": {"activityEnd": {}}})
            after = await peer.until(lambda m: content(m).get("turnComplete", False))
            assert after[0] == {"serverContent": {"inputTranscription": {"text": "shorter please"}}}
    assert fake.violations == []


async def test_openai_cancel_right_after_create_still_announces() -> None:
    async with FakeRealtime([[vrt.say("Hi there")]]) as fake, openai(fake) as peer:
        await peer.ws.send_message(json.dumps({"type": "response.create"}))
        await peer.ws.send_message(json.dumps({"type": "response.cancel"}))
        got = await peer.until_type("response.done")
        assert types(got)[0] == "response.created"
        assert got[-1]["response"]["status"] == "cancelled"
        assert await peer.nothing_for(0.1) == []
    assert fake.violations == []


async def test_oversized_frames_are_refused() -> None:
    async with FakeRealtime([]) as fake, openai(fake, session=None) as peer:
        await peer.ws.send_message("x" * (16 * 1024 * 1024 + 1))
        with pytest.raises(ConnectionClosed), trio.fail_after(5):
            await peer.until_type("never")
        assert peer.ws.closed is not None and peer.ws.closed.code == 1009
    assert fake.violations == ["a frame over 16 MiB"]


async def test_gemini_setup_has_a_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("vrt.testing._realtime.HANDSHAKE_TIMEOUT", 0.2)
    async with FakeRealtime([], api="gemini") as fake, open_websocket_url(fake.url) as ws:
        with pytest.raises(ConnectionClosed) as closed, trio.fail_after(5):
            await ws.get_message()
        assert closed.value.reason is not None and closed.value.reason.code == 1008
    assert fake.violations == ["no setup within 0.2 s"]


async def test_stops_cleanly_with_a_client_still_connected(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    before = trio.lowlevel.current_statistics().tasks_living
    async with open_websocket_url_later() as later:
        async with FakeRealtime([[vrt.say("Hello"), vrt.pause(10)]]) as fake:
            peer = await later(f"{fake.url}?model=m")
            await peer.send({"type": "response.create"})
            await peer.until_type("response.output_item.done")
        with pytest.raises(ConnectionClosed):
            await peer.until_type("never")
        assert peer.ws.closed is not None and peer.ws.closed.code == 1001
    assert trio.lowlevel.current_statistics().tasks_living == before
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


@asynccontextmanager
async def open_websocket_url_later() -> AsyncIterator[Callable[[str], Any]]:
    """Connections opened later, in a nursery of the test that outlives the fake."""
    async with trio.open_nursery() as nursery:
        done = trio.Event()

        async def connect(url: str) -> Peer:
            ready: trio.Event = trio.Event()
            box: list[Peer] = []

            async def hold() -> None:
                async with open_websocket_url(url) as ws:
                    box.append(Peer(ws))
                    ready.set()
                    await done.wait()

            nursery.start_soon(hold)
            await ready.wait()
            return box[0]

        try:
            yield connect
        finally:
            done.set()


# -- the pieces, without sockets -------------------------------------------------------------


@pytest.mark.parametrize(
    ("pieces", "heard"),
    [
        ([silence(2000)], []),
        ([loud(80), silence(400), loud(80)], []),  # too short to be speech
        ([silence(100), loud(200), silence(400)], [(True, 100)]),  # not yet stopped
        ([silence(100), loud(200), silence(500)], [(True, 100), (False, 800)]),
        # the same, in pieces that cut windows in two (and a sample in two)
        (
            [
                silence(100)[:3],
                silence(100)[3:] + loud(200)[:1001],
                loud(200)[1001:] + silence(500),
            ],
            [(True, 100), (False, 800)],
        ),
    ],
)
def test_voice_detector(pieces: list[bytes], heard: list[tuple[bool, int]]) -> None:
    detector = VoiceDetector(24000, 0.02, stop_ms=500)
    got = [event for piece in pieces for event in detector.feed(piece)]
    assert [(event.started, event.at_ms) for event in got] == heard


def test_the_fake_speaks_a_tone_a_word_at_a_time() -> None:
    chunks = utterance(" one two  three ", 50)
    assert "".join(chunk.transcript for chunk in chunks) == " one two  three "
    assert sum(chunk.samples for chunk in chunks) == 3 * 24000 * 60 // 1000
    assert [chunk.transcript for chunk in chunks] == [" one ", "two  ", "three ", ""]
    pcm = b"".join(tone(chunk.start, chunk.samples) for chunk in chunks)
    samples = array("h", pcm)
    assert len(samples) == 3 * 1440 and max(samples) == round(0.3 * 32767)
    assert pcm == tone(0, len(samples))  # in phase from chunk to chunk
