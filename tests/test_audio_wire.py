"""``audio-v1``: voice on the wire (PROTOCOL.md, "Audio").

First the sans-IO cores alone (no Trio): the codec of the new messages, negotiation, the
server's checks of the client's frames, the client's epoch gate, the books of each turn's
audio and the bounds (bytes a second, the unsent backlog). Then end to end on loopback
sockets: ``vrt.serve`` (and ``vrt.asgi`` under hypercorn) with an agent on
``vrt.testing.FakeRealtime``, by the Python client and by a client written by hand. Every
test with the fake asserts its ``violations`` empty, and no ERROR is logged.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
from trio_websocket import ConnectionClosed

import vrt
from tests.conftest import Log, until
from tests.test_asgi import hypercorn, raw
from vrt._net.options import make_options
from vrt._server.frames import message_of
from vrt._server.hub import Hub
from vrt._wire import codec
from vrt._wire import messages as m
from vrt._wire.audio import (
    AudioIn,
    AudioInfo,
    Backlog,
    ByteRate,
    Gate,
    Spans,
    frame_limit,
    refusal,
    split,
)
from vrt._wire.client import ClientProtocol, Welcomed
from vrt._wire.server import ServerProtocol
from vrt.testing import FakeRealtime, LoopbackProxy
from vrt.testing._realtime_core import tone

KEY = "sk-test-audio-0123456789"
RATES = AudioInfo(input_rate=24000, output_rate=24000)
MS = 48  # bytes a millisecond of PCM16 mono at 24 kHz


# -- the codec ----------------------------------------------------------------------------------


def test_the_new_messages_round_trip_in_camel_case() -> None:
    welcome = m.Welcome(
        seq=1,
        session_id="s",
        resume_token="t",
        epoch=0,
        capabilities=(m.AUDIO_V1,),
        resumed=False,
        last_seq=1,
        audio=RATES.spec(),
    )
    data = codec.to_dict(welcome)
    assert data["audio"] == {
        "input": {"format": "pcm16", "rate": 24000},
        "output": {"format": "pcm16", "rate": 24000},
    }
    assert "audio" not in codec.to_dict(attrs.evolve(welcome, audio=None))
    for message in (
        welcome,
        m.AudioStart(seq=2, turn_id="t_1", epoch=3),
        m.AudioEnd(seq=3, turn_id="t_1", sent_ms=2400),
        m.TranscriptMessage(seq=4, turn_id="t_1", role="agent", text="hi"),
    ):
        frame = codec.encode(message)
        assert "_" not in "".join(json.loads(frame)), frame
        assert codec.decode(frame, m.SERVER_TYPES) == message
    interrupt = m.Interrupt(seq=5, epoch=1, heard_ms=120)
    assert codec.to_dict(interrupt) == {"type": "interrupt", "seq": 5, "epoch": 1, "heardMs": 120}
    assert codec.decode(codec.encode(interrupt), m.CLIENT_TYPES) == interrupt
    assert "heardMs" not in codec.to_dict(m.Interrupt(seq=6, epoch=1))


@pytest.mark.parametrize(
    ("frame", "allowed"),
    [
        ({"type": "interrupt", "seq": 1, "epoch": 1, "heardMs": -1}, m.CLIENT_TYPES),
        ({"type": "interrupt", "seq": 1, "epoch": 1, "heardMs": 1.5}, m.CLIENT_TYPES),
        ({"type": "interrupt", "seq": 1, "epoch": 1, "heardMs": "10"}, m.CLIENT_TYPES),
        ({"type": "transcript", "seq": 1, "turnId": "t", "role": "it", "text": ""}, m.SERVER_TYPES),
        ({"type": "audio.end", "seq": 1, "turnId": "t", "sentMs": 1.5}, m.SERVER_TYPES),
        ({"type": "audio.start", "seq": 1, "turnId": "t"}, m.SERVER_TYPES),
    ],
)  # fmt: skip
def test_the_schemas_refuse_what_the_protocol_does_not_say(
    frame: dict[str, Any], allowed: tuple[type[Any], ...]
) -> None:
    with pytest.raises(codec.DecodeError) as refused:
        codec.decode(json.dumps(frame), allowed)
    assert refused.value.code == m.BAD_MESSAGE


# -- negotiation (sans-IO) ------------------------------------------------------------------------


def handshake(
    offer: tuple[str, ...], audio: AudioInfo | None
) -> tuple[ClientProtocol, ServerProtocol, dict[str, Any]]:
    """A client core offering ``offer`` and a server core offering ``audio``, after the
    handshake; and the welcome as it was on the wire."""
    client = ClientProtocol(capabilities=offer)
    server = ServerProtocol(
        session_id="s_1", resume_token="t" * 43, server_tools=(), capabilities=m.SUPPORTED,
        audio=audio,
    )  # fmt: skip
    client.hello()
    for frame in client.take_outbox():
        server.receive(frame)
    [welcome] = server.take_outbox()
    [welcomed] = client.receive(welcome)
    assert isinstance(welcomed, Welcomed)
    return client, server, json.loads(welcome)


def test_audio_is_negotiated_with_the_models_rates() -> None:
    rates = AudioInfo(input_rate=16000, output_rate=24000)
    client, server, welcome = handshake((*m.CAPABILITIES, m.AUDIO_V1), rates)
    assert m.AUDIO_V1 in welcome["capabilities"]
    assert welcome["audio"] == {
        "input": {"format": "pcm16", "rate": 16000},
        "output": {"format": "pcm16", "rate": 24000},
    }
    assert client.audio == server.audio == rates
    assert client.capabilities == server.capabilities == (*m.CAPABILITIES, m.AUDIO_V1)


@pytest.mark.parametrize(
    ("offer", "audio"),
    [(m.CAPABILITIES, RATES), ((*m.CAPABILITIES, m.AUDIO_V1), None), ((m.AUDIO_V1,), None)],
    ids=["client-without", "stepped-model", "only-audio-stepped"],
)
def test_without_audio_the_welcome_is_as_before(
    offer: tuple[str, ...], audio: AudioInfo | None
) -> None:
    client, server, welcome = handshake(offer, audio)
    assert "audio" not in welcome
    assert m.AUDIO_V1 not in welcome["capabilities"]
    assert client.audio is None and server.audio is None
    # a binary frame is BAD_MESSAGE, with no ref, as it always was
    assert server.receive(b"\x00\x00") == []
    [error] = [json.loads(f) for f in server.take_outbox()]
    assert (error["type"], error["code"], "ref" in error) == ("error", m.BAD_MESSAGE, False)
    assert server.state == "open"


def test_a_resumed_welcome_carries_the_audio_too() -> None:
    client, server, _ = handshake((*m.CAPABILITIES, m.AUDIO_V1), RATES)
    server.drop()
    client.lost()
    client.resume_hello()
    [hello] = client.take_outbox()
    server.resume(codec.decode(hello, m.CLIENT_TYPES), epoch=0)
    welcome = json.loads(server.take_outbox()[0])
    assert welcome["resumed"] is True
    assert welcome["audio"]["input"]["rate"] == 24000
    assert [type(item) for item in client.receive(json.dumps(welcome))] == [Welcomed]
    assert client.audio == RATES


# -- the client's frames, on the server (sans-IO) -------------------------------------------------


def test_the_servers_checks_of_audio_frames() -> None:
    _, server, _ = handshake((*m.CAPABILITIES, m.AUDIO_V1), RATES)
    limit = frame_limit(24000)
    assert limit == 4800  # 100 ms at 24 kHz
    assert server.receive(b"\x01\x00" * (limit // 2)) == [AudioIn(pcm=b"\x01\x00" * (limit // 2))]
    assert server.receive(b"") == [AudioIn(pcm=b"")]
    for frame, code in ((b"\x00" * 3, m.BAD_MESSAGE), (b"\x00" * (limit + 2), m.TOO_LARGE)):
        assert server.receive(frame) == []
        [error] = [json.loads(f) for f in server.take_outbox()]
        assert error["code"] == code and "ref" not in error, error
        assert error["seq"] > 0  # a message of the session (numbered), which goes on
        assert server.state == "open"
    assert refusal(4800, 24000) is None and refusal(3202, 16000) is not None


# -- the client's gate (sans-IO) ------------------------------------------------------------------


def server_says(client: ClientProtocol, *messages: Any) -> list[Any]:
    out: list[Any] = []
    for message in messages:
        out += client.receive(message if isinstance(message, bytes) else codec.encode(message))
    return out


def test_the_clients_epoch_gate_drops_audio_that_crossed_an_interrupt() -> None:
    client, _, _ = handshake((*m.CAPABILITIES, m.AUDIO_V1), RATES)
    voice = tone(0, 2400)
    events = server_says(
        client,
        m.TurnStartedMessage(seq=2, turn_id="t_1", epoch=0),
        m.AudioStart(seq=3, turn_id="t_1", epoch=0),
        voice,
        m.TranscriptMessage(seq=4, turn_id="t_1", role="agent", text="It "),
    )
    assert [type(e) for e in events] == [vrt.TurnStarted, vrt.AudioDelta, vrt.Transcript]
    assert events[1] == vrt.AudioDelta(turn_id="t_1", pcm=voice, sample_rate=24000)
    client.interrupt(heard_ms=42)
    sent = [json.loads(f) for f in client.take_outbox()]
    assert sent[-1] == {"type": "interrupt", "seq": sent[-1]["seq"], "epoch": 1, "heardMs": 42}
    late = server_says(
        client,
        voice,  # on the wire before the server read the interrupt
        m.TranscriptMessage(seq=5, turn_id="t_1", role="agent", text="is "),
        m.TranscriptMessage(seq=6, turn_id="t_1", role="user", text="stop"),
        m.AudioEnd(seq=7, turn_id="t_1", sent_ms=100),
        m.TurnEndedMessage(seq=8, turn_id="t_1", epoch=1, reason="interrupted"),
    )
    assert [type(e) for e in late] == [vrt.Transcript, vrt.TurnEnded]
    assert late[0].role == "user"
    # the next turn's audio plays; a frame outside any span is the server's error
    after = server_says(
        client,
        m.TurnStartedMessage(seq=9, turn_id="t_2", epoch=1),
        m.AudioStart(seq=10, turn_id="t_2", epoch=1),
        voice,
        m.AudioEnd(seq=11, turn_id="t_2", sent_ms=100),
        voice,
        b"\x00",
    )
    assert [type(e) for e in after] == [vrt.TurnStarted, vrt.AudioDelta, m.Error, m.Error]


def test_heard_ms_goes_only_where_audio_was_negotiated() -> None:
    client, _, _ = handshake(m.CAPABILITIES, RATES)
    client.interrupt(heard_ms=10)
    [sent] = [json.loads(f) for f in client.take_outbox()]
    assert "heardMs" not in sent  # a server without audio-v1 would refuse the interrupt
    assert client.receive(b"\x00\x00")[0].code == m.BAD_MESSAGE  # as before: not audio


def test_transcripts_are_frames_only_with_audio() -> None:
    event = vrt.Transcript(turn_id="t", role="user", text="hi")
    assert message_of(event, tool_stream=True) is None
    assert message_of(event, tool_stream=True, audio=True) == (
        m.TranscriptMessage,
        {"turn_id": "t", "role": "user", "text": "hi"},
    )
    assert message_of(vrt.AudioDelta(turn_id="t", pcm=b"", sample_rate=1), tool_stream=True,
                      audio=True) is None  # fmt: skip


# -- the books and the bounds (sans-IO) -----------------------------------------------------------


def test_split_keeps_every_byte_in_frames_of_100_ms() -> None:
    pcm = tone(0, 24000 * 3 // 10 + 5)  # 300 ms and 5 samples
    frames = list(split(pcm, 24000))
    assert [len(f) for f in frames] == [4800, 4800, 4800, 10]
    assert b"".join(frames) == pcm
    assert list(split(b"", 24000)) == [b""]


def test_byte_rate_is_a_bucket_of_the_window() -> None:
    rate = ByteRate.for_audio(24000, 4.0, now=0.0)
    assert (rate.rate, rate.burst) == (192_000, 384_000)
    assert rate.take(384_000, 0.0)  # 8 s of audio at once
    assert not rate.take(2, 0.0)
    assert rate.wait(4800, 0.0) == pytest.approx(4800 / 192_000)
    assert rate.take(4800, 0.025)
    rate.charge(1000, 0.025)
    assert rate.wait(100, 0.025) > 0


def test_the_backlog_drops_the_oldest_of_the_turn_and_never_another_turns() -> None:
    backlog = Backlog(limit=10)
    run1, dropped = backlog.add("t_1", b"aa")
    assert run1 is not None and dropped == 0
    assert backlog.add("t_1", b"bb") == (None, 0)  # joins the run
    backlog.cut()  # (audio.end of t_1 was queued)
    run2, _ = backlog.add("t_2", b"cccc")
    assert run2 is not None and run2 is not run1
    # over the bound by 2: t_2's oldest frame goes (whole), never t_1's
    assert backlog.add("t_2", b"dddd") == (None, 4)
    assert list(run1.frames) == [b"aa", b"bb"]
    assert list(run2.frames) == [b"dddd"]
    assert (backlog.bytes, backlog.dropped) == (8, 4)
    # the writer takes frames; a purge empties the rest of a turn
    assert run1.peek() == 2 and run1.take() == b"aa"
    assert backlog.purge("t_2") == 4
    assert run2.peek() is None and run2.done
    assert (backlog.bytes, backlog.dropped) == (2, 8)
    # runs the writer is done with are forgotten as new ones come
    assert run1.take() == b"bb" and run1.peek() is None and run2.peek() is None
    for _ in range(100):
        backlog.cut()
        run, _ = backlog.add("t_3", b"e")
        assert run is not None and run.take() == b"e" and run.peek() is None
    assert len(backlog._runs) <= 2
    # a frame bigger than the room left drops the turn's own newest when it is its only one
    tiny = Backlog(limit=3)
    run, dropped = tiny.add("t", b"abcd")
    assert run is not None and dropped == 4 and tiny.bytes == 0 and not run.frames


def test_the_spans_of_a_session() -> None:
    spans = Spans(24000)
    spans.started("t_1", 0)
    assert spans.admit("t_2", 0) is None  # never started
    assert spans.admit("t_1", 0) == Spans.START
    assert spans.admit("t_1", 0) == Spans.GO
    spans.sent("t_1", 4800)
    assert spans.sent_ms("t_1") == 100
    assert spans.heard("t_1", 250) == 100  # an H above sentMs counts as sentMs
    assert spans.heard("t_1", 40) == 40
    assert spans.heard(None, 40) is None  # no open turn: ignored
    assert spans.admit("t_1", 1) is None  # interrupted: behind the session's epoch
    spans.started("t_2", 1)
    assert spans.end("t_2") is None  # no audio, no audio.end
    spans.sent("t_1", -2400)
    assert spans.end("t_1") == 50
    assert spans.end("t_1") is None


def test_the_clients_gate_follows_the_audio_span_machine() -> None:
    """A frame plays only inside a speaking span of the client's epoch; audio.end (or
    turn.ended) ends the span, and a later frame is outside any (the server's error)."""
    gate = Gate()
    assert not gate.open and gate.admits(0) is None  # no span yet
    gate.start("t_1", 0)
    assert gate.span is not None and gate.span.state == "speaking"
    assert gate.admits(0) == "t_1"
    assert gate.admits(1) is None and gate.open  # the user interrupted: dropped, still open
    gate.end("t_2")  # another turn's end: this span goes on
    assert gate.open
    span = gate.span
    assert span is not None
    gate.end("t_1")
    assert span.state == "ended" and not gate.open and gate.admits(0) is None
    gate.start("t_2", 1)  # a new span with a new machine
    second = gate.span
    gate.start("t_3", 1)  # one still open is over: frames follow the new one
    assert second is not None and second.state == "ended"
    assert gate.admits(1) == "t_3"


# -- end to end ---------------------------------------------------------------------------------


def realtime_agent(fake: FakeRealtime, **options: Any) -> vrt.Agent:
    if fake.api == "openai":
        model: Any = vrt.models.OpenAIRealtime(url=fake.url, api_key=KEY, **options)
    else:
        model = vrt.models.GeminiLive("gemini-live", url=fake.url, api_key=KEY, **options)
    return vrt.define_agent(model=model)


@asynccontextmanager
async def served(agent: vrt.Agent, **options: Any) -> AsyncIterator[vrt.Server]:
    async with trio.open_nursery() as nursery:
        server: vrt.Server = await nursery.start(
            functools.partial(vrt.serve, agent, "127.0.0.1", 0, **options)
        )
        yield server
        nursery.cancel_scope.cancel()


def speech(rate: int) -> list[bytes]:
    """What the user says, in frames of 100 ms: 300 ms of voice then 700 ms of silence
    (the fake's detector hears a start, then an end)."""
    step = rate // 10
    return [tone(i * step, step) for i in range(3)] + [b"\x00\x00" * step] * 7


class Raw:
    """A client written by hand: the frames exactly as they come."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.seq = 0
        self.frames: list[Any] = []

    async def send(self, **message: Any) -> None:
        self.seq += 1
        await self.ws.send_message(json.dumps({"seq": self.seq, **message}))

    async def next(self) -> Any:
        with trio.fail_after(5):
            frame = await self.ws.get_message()
        item = frame if isinstance(frame, bytes) else json.loads(frame)
        self.frames.append(item)
        return item

    async def until(self, kind: str) -> dict[str, Any]:
        while True:
            item = await self.next()
            if isinstance(item, dict) and item["type"] == kind:
                return item


@asynccontextmanager
async def raw_session(
    server: vrt.Server, offer: list[str]
) -> AsyncIterator[tuple[Raw, dict[str, Any]]]:
    """A session opened by hand, offering ``offer``: its connection and welcome."""
    async with raw(server.port, "/") as ws:
        client = Raw(ws)
        await client.send(type="hello", protocol="vrt/1", capabilities=offer)
        welcome = await client.next()
        yield client, welcome


async def eventually(condition: Any, seconds: float = 5.0) -> None:
    """Wait until ``condition()`` holds, looking every 10 ms (AssertionError after
    ``seconds``)."""
    for _ in range(int(seconds * 100)):
        if condition():
            return
        await trio.sleep(0.01)
    raise AssertionError("the condition never held")


async def model_ready(fake: FakeRealtime) -> None:
    await eventually(lambda: fake.connections >= 1)


async def read_to_the_end(ws: Any) -> None:
    while True:
        await ws.get_message()


def audio_of(events: list[Any]) -> bytes:
    return b"".join(e.pcm for e in events if isinstance(e, vrt.AudioDelta))


@pytest.mark.parametrize("api", ["openai", "gemini"])
async def test_a_spoken_turn_over_the_wire(api: str, no_errors: None) -> None:
    """The client's voice reaches the model (its detector hears it), the model's answer
    comes back as binary frames between audio.start and audio.end, whose sentMs is the
    audio sent, before turn.ended; transcripts both ways."""
    async with FakeRealtime([[vrt.say("It is noon now.")]], api=api) as fake:
        agent = realtime_agent(fake)
        rates = (agent.model.input_rate, agent.model.output_rate)  # type: ignore[attr-defined]
        async with served(agent) as server:
            async with raw_session(server, ["tool-stream-v1", "audio-v1"]) as (peer, welcome):
                assert welcome["capabilities"] == ["tool-stream-v1", "audio-v1"]
                audio = welcome["audio"]
                assert (audio["input"]["rate"], audio["output"]["rate"]) == rates
                await model_ready(fake)
                for frame in speech(rates[0]):
                    await peer.ws.send_message(frame)
                ended = await peer.until("turn.ended")
    frames = peer.frames
    kinds = [f if isinstance(f, dict) and f["type"] != "transcript" else None for f in frames]
    start = next(i for i, f in enumerate(kinds) if f and f["type"] == "audio.start")
    end = next(i for i, f in enumerate(kinds) if f and f["type"] == "audio.end")
    binary = [f for f in frames if isinstance(f, bytes)]
    inside = [f for f in frames[start:end] if isinstance(f, bytes)]
    assert binary and inside == binary  # no binary frame outside the span
    assert start < end < len(frames) - 1 and frames[-1] is ended
    assert frames[start]["turnId"] == frames[end]["turnId"] == ended["turnId"]
    assert frames[start]["epoch"] == 0
    assert frames[end]["sentMs"] == sum(map(len, binary)) * 1000 // (2 * rates[1]) == 4 * 60
    assert max(map(len, binary)) <= frame_limit(rates[1])
    said = [f for f in frames if isinstance(f, dict) and f["type"] == "transcript"]
    assert "".join(f["text"] for f in said if f["role"] == "agent") == "It is noon now."
    assert [f["role"] for f in said].count("user") == 1
    assert ended["reason"] == "finished"
    assert fake.audio_received == sum(map(len, speech(rates[0])))
    assert fake.violations == []


async def test_the_python_client_interrupts_with_heard_ms(no_errors: None) -> None:
    """client.interrupt(heard_ms=...) reaches the model as a truncate to that point, and
    no audio of the interrupted turn reaches the app after the interrupt."""
    words = " ".join(f"word{i}" for i in range(40))
    async with FakeRealtime([[vrt.say(words)]], api="openai", delay=0.01) as fake:
        async with served(realtime_agent(fake)) as server:
            async with vrt.connect(server.url, audio=True) as client:
                assert client.audio == RATES
                async with client.subscribe() as channel:
                    events = Log(channel)
                    await client.send_text("talk")
                    heard = 0
                    async for event in events:
                        if isinstance(event, vrt.AudioDelta):
                            heard += len(event.pcm)
                            if heard >= 100 * MS:
                                break
                    client.interrupt(heard_ms=50)
                    cut = len(events.events)
                    ended = await until(events, lambda e: isinstance(e, vrt.TurnEnded))
                    await trio.sleep(0.3)  # anything still on its way
                    await client.send_text("again")  # the session goes on
                    again = await until(events, lambda e: isinstance(e, vrt.TurnEnded))
    assert ended.reason == "interrupted" and again.reason == "finished"
    after = events.events[cut:]
    first = after.index(ended)
    assert not [e for e in after[:first] if isinstance(e, vrt.AudioDelta | vrt.Transcript)]
    assert audio_of(after[first:])  # the next turn speaks
    truncates = [r for r in fake.received if r.get("type") == "conversation.item.truncate"]
    assert [t["audio_end_ms"] for t in truncates] == [50]
    assert len([r for r in fake.received if r.get("type") == "response.cancel"]) == 1
    assert fake.violations == []


async def test_an_interrupted_turn_on_the_wire(no_errors: None) -> None:
    """The server's side of an interrupt: a heardMs above what was sent counts as sentMs,
    the interrupted turn's audio.end comes before its turn.ended, and no audio frame
    follows that audio.end."""
    words = " ".join(f"w{i}" for i in range(40))
    async with FakeRealtime([[vrt.say(words)]], api="openai", delay=0.01) as fake:
        async with served(realtime_agent(fake)) as server:
            async with raw_session(server, ["tool-stream-v1", "audio-v1"]) as (peer, _):
                await peer.send(type="input", text="talk")
                while sum(len(f) for f in peer.frames if isinstance(f, bytes)) < 100 * MS:
                    await peer.next()
                await peer.send(type="interrupt", epoch=1, heardMs=10**6)
                ended = await peer.until("turn.ended")
                await peer.send(type="input", text="again")
                again = await peer.until("turn.ended")
    frames = peer.frames
    end = next(f for f in frames if isinstance(f, dict) and f["type"] == "audio.end")
    at = frames.index(end)
    assert frames.index(ended) > at
    assert not [f for f in frames[at : frames.index(ended)] if isinstance(f, bytes)]
    assert ended["reason"] == "interrupted" and again["reason"] == "finished"
    [truncate] = [r for r in fake.received if r.get("type") == "conversation.item.truncate"]
    received_ms = sum(len(f) for f in frames[:at] if isinstance(f, bytes)) // MS
    assert received_ms <= end["sentMs"] <= truncate["audio_end_ms"] < 40 * 60
    assert fake.violations == []


async def test_frames_against_the_rules_and_the_rate_bound(no_errors: None) -> None:
    """Odd and oversize frames are answered, no ref, and the session goes on; audio over
    audio_speed_limit is RATE_LIMITED and the session is closed (server)."""
    async with FakeRealtime([[vrt.say("fine")]], api="openai") as fake:
        async with served(realtime_agent(fake), audio_speed_limit=0.5) as server:
            async with raw_session(server, ["audio-v1"]) as (peer, _welcome):
                await peer.ws.send_message(b"\x00" * 7)
                odd = await peer.until("error")
                await peer.ws.send_message(b"\x00" * (4800 + 2))
                large = await peer.until("error")
                await peer.send(type="input", text="still there?")
                assert (await peer.until("turn.ended"))["reason"] == "finished"
                # 0.5x real time over 2 s: 48,000 bytes at once pass (the bucket is full
                # again a fifth of a second after the frames above), the next do not
                await trio.sleep(0.25)
                for _ in range(10):
                    await peer.ws.send_message(b"\x00" * 4800)
                await peer.ws.send_message(b"\x00" * 4800)
                limited = await peer.until("error")
                closed = await peer.until("closed")
                with trio.fail_after(5), pytest.raises(ConnectionClosed):
                    await read_to_the_end(peer.ws)
    assert (odd["code"], "ref" in odd) == (m.BAD_MESSAGE, False)
    assert (large["code"], "ref" in large) == (m.TOO_LARGE, False)
    assert limited["code"] == m.RATE_LIMITED and "closed" in limited["message"]
    assert closed["reason"] == "server"
    assert fake.violations == []


async def test_audio_still_coming_at_a_shutdown_is_dropped(no_errors: None) -> None:
    """Clients stream audio while the server shuts down (the bench saw it): frames read
    after their session closed are dropped; nothing escapes vrt.serve."""
    async with FakeRealtime([], api="openai") as fake:
        for _ in range(2):
            async with trio.open_nursery() as clients:
                async with served(realtime_agent(fake)) as server:
                    for _ in range(5):
                        peer = await clients.start(streaming, server)
                    await trio.sleep(0.2)
                clients.cancel_scope.cancel()
            del peer
    assert fake.violations == []


async def streaming(server: vrt.Server, *, task_status: trio.TaskStatus[Raw]) -> None:
    """A client that sends 10 ms frames of silence as fast as it can, until its
    connection ends."""
    try:
        async with raw_session(server, ["audio-v1"]) as (peer, _welcome):
            task_status.started(peer)
            while True:
                await peer.ws.send_message(b"\x00\x00" * 240)
    except* (ConnectionClosed, trio.BrokenResourceError):
        pass  # the server went away


async def test_a_client_without_audio_is_served_as_before(no_errors: None) -> None:
    async with FakeRealtime([[vrt.say("hello there")]], api="openai") as fake:
        async with served(realtime_agent(fake)) as server:
            async with raw_session(server, ["tool-stream-v1"]) as (peer, welcome):
                assert "audio" not in welcome and welcome["capabilities"] == ["tool-stream-v1"]
                await peer.ws.send_message(b"\x00\x00")
                error = await peer.until("error")
                await peer.send(type="input", text="hi")
                await peer.until("turn.ended")
            async with vrt.connect(server.url) as client:
                assert client.audio is None and m.AUDIO_V1 not in client.capabilities
                with pytest.raises(RuntimeError, match="audio=True"):
                    client.send_audio(b"\x00\x00")
    assert (error["code"], "ref" in error) == (m.BAD_MESSAGE, False)
    kinds = {f["type"] for f in peer.frames if isinstance(f, dict)}
    assert not any(isinstance(f, bytes) for f in peer.frames)
    assert kinds.isdisjoint({"audio.start", "audio.end", "transcript"})
    assert fake.violations == []


async def test_a_stepped_model_never_offers_audio(no_errors: None) -> None:
    agent = vrt.define_agent(model=vrt.ScriptedModel([[vrt.say("text only")]]))
    async with served(agent) as server, vrt.connect(server.url, audio=True) as client:
        assert client.audio is None
        assert m.AUDIO_V1 not in client.capabilities
        with pytest.raises(RuntimeError, match="not negotiated"):
            client.send_audio(b"\x00\x00")


async def test_a_resume_loses_audio_in_flight_and_nothing_else(no_errors: None) -> None:
    words = " ".join(f"w{i}" for i in range(20))
    async with FakeRealtime([[vrt.say(words)]], api="openai", delay=0.02, chunk_ms=60) as fake:
        async with served(realtime_agent(fake)) as server, trio.open_nursery() as nursery:
            proxy = LoopbackProxy(server.port)
            await nursery.start(proxy.run)
            async with vrt.connect(f"ws://127.0.0.1:{proxy.port}/", audio=True) as client:
                async with client.subscribe() as channel:
                    events = Log(channel)
                    await client.send_text("talk")
                    await until(events, lambda e: isinstance(e, vrt.AudioDelta))
                    proxy.misbehave = "close"  # no way back for 0.2 s: five words' time
                    proxy.cut()
                    await trio.sleep(0.2)
                    proxy.heal()
                    await until(events, lambda e: isinstance(e, vrt.Resumed))
                    ended = await until(events, lambda e: isinstance(e, vrt.TurnEnded))
            nursery.cancel_scope.cancel()
    assert ended.reason == "finished"
    said = [e.text for e in events.events if isinstance(e, vrt.Transcript) and e.role == "agent"]
    assert "".join(said) == words  # every message, replayed where it was lost
    assert [type(e) for e in events.events].count(vrt.TurnEnded) == 1
    assert 0 < len(audio_of(events.events)) < 20 * 60 * MS  # audio in flight is gone
    assert fake.violations == []


async def test_the_same_through_vrt_asgi_under_hypercorn(no_errors: None) -> None:
    import vrt.asgi

    async with FakeRealtime([[vrt.say("It is noon.")]], api="openai") as fake:
        app = vrt.asgi.app(realtime_agent(fake))
        async with hypercorn(app) as port:
            async with vrt.connect(f"ws://127.0.0.1:{port}/", audio=True) as client:
                assert client.audio == RATES
                async with client.subscribe() as channel:
                    events = Log(channel)
                    await model_ready(fake)
                    for frame in speech(24000):
                        client.send_audio(frame)
                    ended = await until(events, lambda e: isinstance(e, vrt.TurnEnded))
    assert ended.reason == "finished"
    assert len(audio_of(events.events)) == 3 * 60 * MS  # three words
    said = [e.text for e in events.events if isinstance(e, vrt.Transcript)]
    assert "".join(said[1:]) == "It is noon." and said[0] == "(speech)"
    assert fake.audio_received == sum(map(len, speech(24000)))
    assert fake.violations == []


class Deaf:
    """A connection whose peer never reads: after its first ``reads`` frames, every send
    waits for ever (as a socket whose peer's window is closed)."""

    def __init__(self, frames: list[str | bytes], reads: int) -> None:
        self.incoming = list(frames)
        self.reads = reads
        self.sent: list[Any] = []
        self.closed = None

    async def get_message(self) -> str | bytes:
        if self.incoming:
            await trio.lowlevel.checkpoint()
            return self.incoming.pop(0)
        await trio.sleep_forever()
        raise AssertionError

    async def send_message(self, message: str | bytes) -> None:
        if len(self.sent) >= self.reads:
            await trio.sleep_forever()
        self.sent.append(message)

    async def aclose(self, code: int = 1000, reason: str | None = None) -> None:
        await trio.lowlevel.checkpoint()


async def test_a_client_that_does_not_read_its_audio_costs_bounded_memory(
    no_errors: None,
) -> None:
    """The model says 15 s; the client reads nothing after the welcome: what is queued
    for it stays under the bound (the oldest of the turn dropped and counted), and the
    engine is never held: the turn ends."""
    words = " ".join(f"w{i}" for i in range(250))
    async with FakeRealtime([[vrt.say(words)]], api="openai", chunk_ms=100) as fake:
        agent = realtime_agent(fake)
        hello = {"type": "hello", "seq": 1, "protocol": "vrt/1", "capabilities": ["audio-v1"]}
        talk = {"type": "input", "seq": 2, "text": "talk"}
        deaf = Deaf([json.dumps(hello), json.dumps(talk)], reads=1)
        async with trio.open_nursery() as nursery:
            hub = Hub(agent, make_options({}), nursery)
            nursery.start_soon(hub.serve_connection, deaf)
            # the hub holds the actor before its session opens (seen under load in CI)
            await eventually(lambda: [a for a in hub.sessions.values() if a.session is not None])
            [actor] = hub.sessions.values()
            session = actor.session
            assert session is not None
            await eventually(lambda: session.turn is not None)
            assert session.turn is not None
            with trio.fail_after(10):
                result = await session.turn.wait()
            link, voice = actor.link, actor.voice
            assert link is not None and voice is not None
            queued, dropped = link.audio.bytes, voice.dropped
            nursery.cancel_scope.cancel()
    total = 250 * 60 * MS
    assert result.status == "finished"
    assert queued <= voice.backlog_limit == 10 * 1000 * MS
    assert dropped >= total - voice.backlog_limit - 100 * MS  # one frame may be in flight
    assert fake.violations == []


async def test_heard_ms_counts_from_the_turns_first_audio(no_errors: None) -> None:
    """A turn that spoke in two responses (words, a call, more words): heard_ms is counted
    from its first audio, so the truncate goes to the second response's item, at the point
    past the first's 180 ms."""

    @vrt.server_tool(risk="low", parameters={"type": "object"})
    async def clock(args: Any, ctx: vrt.ToolContext) -> Any:
        return "noon"

    words = " ".join(f"w{i}" for i in range(20))
    steps = [[vrt.say("one two three"), vrt.call("clock", {})], [vrt.say(words)]]
    async with FakeRealtime(steps, api="openai", delay=0.01) as fake:
        model = vrt.models.OpenAIRealtime(url=fake.url, api_key=KEY)
        agent = vrt.define_agent(model=model, tools=[clock])
        async with vrt.open_session(agent) as session, session.subscribe() as channel:
            events = Log(channel)
            turn = await session.start_turn("talk")
            spoken = 0
            async for event in events:
                if isinstance(event, vrt.AudioDelta):
                    spoken += len(event.pcm)
                    if spoken >= 300 * MS:
                        break
            session.interrupt(heard_ms=250)
            result = await turn.wait()
    assert result.status == "interrupted"
    truncates = [r for r in fake.received if r.get("type") == "conversation.item.truncate"]
    assert [t["audio_end_ms"] for t in truncates] == [250 - 180]
    assert fake.violations == []


async def test_the_clients_unsent_audio_is_bounded(no_errors: None) -> None:
    """send_audio never blocks: past 5 s unsent, the oldest is dropped and counted."""
    async with FakeRealtime([[vrt.say("ok")]], api="openai") as fake:
        async with served(realtime_agent(fake)) as server:
            async with vrt.connect(server.url, audio=True) as client:
                with pytest.raises(ValueError, match="even"):
                    client.send_audio(b"\x00")
                with pytest.raises(TypeError):
                    client.send_audio("loud")  # type: ignore[arg-type]
                with pytest.raises(ValueError, match="heard_ms"):
                    client.interrupt(heard_ms=-1)
                client.send_audio(b"\x00\x00" * 24000 * 8)  # 8 s at once, before any is sent
                assert client.audio_dropped == 3 * 1000 * MS
                await eventually(lambda: fake.audio_received == 5 * 1000 * MS)
    assert fake.violations == []
