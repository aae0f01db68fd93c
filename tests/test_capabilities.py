"""batch-v1 and local-preview-v1 (PROTOCOL.md, "Capabilities"), both sides.

The protocol cores on their own (a batch's messages each handled as if alone, an error per
message referring to its seq), then real sessions: what the app sees is the same with the
capabilities and without, the server sends no ``tool.preview`` to a client that makes
its own, frames hold several messages, and a batch counts against the message rate.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import trio
import trio.testing

import vrt
from tests.test_wire_errors import connected, serving
from tests.test_wire_legacy import Recording, session_parts
from vrt._wire import messages as m
from vrt._wire.client import ClientProtocol
from vrt._wire.server import ServerProtocol
from vrt.testing import open_pair


def opened(offer: tuple[str, ...] = m.CAPABILITIES) -> tuple[ClientProtocol, ServerProtocol]:
    """A client core and a server core after the handshake."""
    client = ClientProtocol([], offer)
    server = ServerProtocol(session_id="s_1", resume_token="tok", server_tools=[])
    client.hello()
    for frame in client.take_outbox():
        server.receive(frame)
    for frame in server.take_outbox():
        client.receive(frame)
    return client, server


def sent(endpoint: Any) -> list[dict[str, Any]]:
    return [json.loads(f) for f in endpoint.take_outbox()]


# -- the cores -----------------------------------------------------------------------------------


def test_the_capabilities_are_the_intersection() -> None:
    client, server = opened()
    assert client.capabilities == server.capabilities == m.CAPABILITIES
    assert client.batching and server.batching and client.local_previews
    client, server = opened(m.LEGACY)
    assert client.capabilities == server.capabilities == m.LEGACY
    assert not (client.batching or server.batching or client.local_previews)
    client, server = opened((m.LOCAL_PREVIEW_V1,))  # only with tool-stream-v1
    assert not client.local_previews


def test_each_message_of_a_batch_is_handled_as_if_alone() -> None:
    _client, server = opened()
    frame = json.dumps(
        [
            {"type": "input", "seq": 2, "text": "one"},
            {"type": "dance", "seq": 3},
            {"type": "input", "seq": 4},  # text missing
            7,
            {"type": "input", "seq": 5, "text": "two"},
        ]
    )
    got = server.receive(frame)
    assert [g.text for g in got] == ["one", "two"]  # the others go on
    assert server.frame_messages == 5
    errors = [f for f in sent(server) if f["type"] == "error"]
    assert [(e["code"], e.get("ref")) for e in errors] == [
        ("UNKNOWN_TYPE", 3),
        ("BAD_MESSAGE", 4),
        ("BAD_MESSAGE", None),
    ]
    assert errors[2]["message"] == "a batch's message must be a JSON object"
    assert server.state == "open"


def test_an_empty_batch_and_a_batch_never_negotiated_are_errors() -> None:
    _client, server = opened()
    assert server.receive("[]") == []
    (error,) = sent(server)
    assert (error["code"], error["message"]) == (
        "BAD_MESSAGE",
        "a batch must hold at least one message",
    )
    _client, server = opened(m.LEGACY)
    assert server.receive(json.dumps([{"type": "input", "seq": 2, "text": "x"}])) == []
    (error,) = sent(server)
    assert (error["code"], error["message"]) == ("BAD_MESSAGE", "a frame must be a JSON object")
    assert server.state == "open"


def test_a_batch_that_closes_stops_there() -> None:
    _client, server = opened()
    frame = json.dumps([{"type": "close", "seq": 2}, {"type": "input", "seq": 3, "text": "after"}])
    assert [type(g) for g in server.receive(frame)] == [m.Close]
    assert server.state != "open"


def test_the_client_core_reads_batches_in_order() -> None:
    client, server = opened()
    server.send(m.TurnStartedMessage, turn_id="t_1", epoch=0)
    server.send(m.TextDeltaMessage, turn_id="t_1", text="a")
    server.send(m.TextDeltaMessage, turn_id="t_1", text="b")
    frames = server.take_outbox()
    events = client.receive("[" + ",".join(frames) + "]")
    assert [type(e).__name__ for e in events] == ["TurnStarted", "TextDelta", "TextDelta"]
    assert [e.text for e in events[1:]] == ["a", "b"]
    (error,) = client.receive("[]")
    assert error.code == m.BAD_MESSAGE and "empty batch" in error.message


def test_with_local_previews_the_client_ignores_wire_previews() -> None:
    client, server = opened()
    server.send(
        m.ToolPreviewMessage, call_id="c", turn_id="t", name="n", arguments="{", complete=False
    )
    assert [client.receive(f) for f in server.take_outbox()] == [[]]


# -- real sessions -------------------------------------------------------------------------------


async def session(offer: tuple[str, ...]) -> tuple[list[Any], list[str]]:
    """The scripted session of test_wire_legacy: the app's events and every frame."""
    agent, tools = session_parts()
    frames: list[str] = []
    with trio.fail_after(60):
        async with open_pair(
            agent, tools, capabilities=offer, transport=lambda ws: Recording(ws, frames)
        ) as client:
            async with client.subscribe() as channel:
                events: list[Any] = []
                for text in ("first", "second"):
                    await client.send_text(text)
                    async for event in channel:
                        events.append(event)
                        if isinstance(event, vrt.TurnEnded):
                            break
    return events, frames


async def test_the_app_sees_the_same_events_with_and_without_the_capabilities(
    autojump_clock: trio.testing.MockClock,
) -> None:
    legacy, legacy_frames = await session(m.LEGACY)
    events, frames = await session(m.CAPABILITIES)
    assert events == legacy  # local previews: same fields, same moments
    previews = [e for e in events if isinstance(e, vrt.ToolPreview)]
    assert len(previews) > 4 and previews[-1].complete
    received = [json.loads(f[2:]) for f in frames if f.startswith("<")]
    messages = [
        x for r in received for x in (r if isinstance(r, list) else [r]) if x["type"] != "ack"
    ]
    assert not [x for x in messages if x["type"] == "tool.preview"]  # none on the wire
    assert received[0]["type"] == "welcome"  # never in a batch
    assert any(isinstance(r, list) for r in received)  # what was queued went together
    assert len(received) < len(messages)
    # the same messages, previews aside, in the same order, numbered without gaps
    seqs = [x["seq"] for x in messages]
    assert seqs == list(range(1, len(seqs) + 1))
    assert len(legacy_frames) > len(frames)


@pytest.mark.network
async def test_a_batch_counts_against_the_message_rate() -> None:
    """Forty messages in one frame spend a bucket of twenty as forty frames would: the
    next frame waits about a second for its token."""
    async with (
        serving(vrt.define_agent(model=vrt.ScriptedModel([])), max_messages_per_second=20) as srv,
        connected(srv) as peer,
    ):
        await peer.send("hello", protocol="vrt/1", capabilities=["batch-v1"], tools=[])
        welcome = json.loads(await peer.ws.get_message())
        assert welcome["capabilities"] == ["batch-v1"]
        batch = [{"type": "dance", "seq": peer.next_seq()} for _ in range(40)]
        await peer.ws.send_message(json.dumps(batch))
        start = trio.current_time()
        last = await peer.send("dance")
        refs: list[int] = []
        with trio.fail_after(10):
            while last not in refs:
                data = json.loads(await peer.ws.get_message())
                for x in data if isinstance(data, list) else [data]:
                    if x["type"] == "error" and x["code"] == "UNKNOWN_TYPE":
                        refs.append(x["ref"])
        assert refs == [b["seq"] for b in batch] + [last]  # every one answered, in order
        assert trio.current_time() - start > 0.7


def test_a_big_batch_is_acked_once() -> None:
    """Reaching ACK_EVERY several times in one frame queues one ack, the highest."""
    from vrt._wire.endpoint import ACK_EVERY

    client, server = opened()
    for i in range(3 * ACK_EVERY + 5):
        server.send(m.TextDeltaMessage, turn_id="t_1", text=str(i))
    client.receive("[" + ",".join(server.take_outbox()) + "]")
    acks = [f for f in sent(client) if f["type"] == "ack"]
    assert acks == [{"type": "ack", "seq": 3 * ACK_EVERY}]  # one, not three


def test_a_batch_over_the_limit_is_not_read() -> None:
    """A frame of tens of thousands of tiny messages would hold the server's thread: past
    BATCH_MESSAGES the batch is refused whole, with one error, and the session goes on."""
    _client, server = opened()
    items = [{"type": "dance", "seq": 2 + i} for i in range(m.BATCH_MESSAGES + 1)]
    assert server.receive(json.dumps(items)) == []
    (error,) = sent(server)
    assert error["code"] == "BAD_MESSAGE" and "at most 100 messages" in error["message"]
    assert error["ref"] == 2  # PROTOCOL.md: the seq of the batch's first message
    fits = [{"type": "input", "seq": 2 + i, "text": "x"} for i in range(m.BATCH_MESSAGES)]
    assert len(server.receive(json.dumps(fits))) == m.BATCH_MESSAGES
    assert server.state == "open"


async def test_the_writer_puts_at_most_batch_messages_in_a_frame() -> None:
    from vrt._net.pumps import send_frames

    class Socket:
        def __init__(self) -> None:
            self.frames: list[str] = []

        async def send_message(self, frame: str) -> None:
            self.frames.append(frame)

    send, receive = trio.open_memory_channel[str](math.inf)
    for i in range(250):
        send.send_nowait(json.dumps({"type": "text.delta", "seq": i + 1}))
    send.close()
    ws = Socket()
    assert await send_frames(receive, ws, batch=1 << 20)
    assert [len(json.loads(f)) for f in ws.frames] == [100, 100, 50]


def test_the_client_keeps_only_what_it_offered() -> None:
    """A (broken) server granting batch-v1 to a client that never offered it: not used."""
    client = ClientProtocol([], m.LEGACY)
    client.hello()
    client.take_outbox()
    welcome = {"type": "welcome", "seq": 1, "sessionId": "s", "resumeToken": "t", "epoch": 0,
               "capabilities": list(m.CAPABILITIES), "resumed": False, "lastSeq": 1}  # fmt: skip
    (welcomed,) = client.receive(json.dumps(welcome))
    assert welcomed.capabilities == client.capabilities == m.LEGACY
    assert not client.batching and not client.local_previews
    (error,) = client.receive(json.dumps([{"type": "text.delta", "seq": 2, "turnId": "t",
                                           "text": "x"}]))  # fmt: skip
    assert error.code == m.BAD_MESSAGE and "must be a JSON object" in error.message


def test_nothing_after_closed_in_a_batch_is_read() -> None:
    client, _server = opened()
    frame = [
        {"type": "closed", "seq": 2, "reason": "server"},
        {"type": "text.delta", "seq": 3, "turnId": "t", "text": "after"},
        {"type": "tool.call", "seq": 4, "callId": "c1", "turnId": "t", "epoch": 1,
         "name": "edit", "arguments": {}},
    ]  # fmt: skip
    events = client.receive(json.dumps(frame))
    assert [type(e).__name__ for e in events] == ["Closed"]
    assert client.received_seq == 2 and client.take_outbox() == []


def test_a_refused_frame_counts_as_one_message() -> None:
    server = ServerProtocol(session_id="s", resume_token="t", server_tools=[], max_message_size=100)
    server.receive('{"type":"hello","seq":1,"protocol":"vrt/1","capabilities":["batch-v1"]}')
    server.receive('[{"type":"input","seq":2,"text":"a"},{"type":"input","seq":3,"text":"b"}]')
    assert server.frame_messages == 2
    server.receive('{"type":"input","seq":4,"text":"' + "x" * 100 + '"}')  # TOO_LARGE
    assert server.frame_messages == 1


@pytest.mark.parametrize(
    "frame",
    [
        b'{"type":"text.delta","seq":2,"turnId":"t_1","text":"x"}',
        '{"type":"text.delta","seq":2,"turnId":"t_1","text":"x"}'.encode("utf-16"),
        '{"type":"text.delta","seq":2,"turnId":"t_1","text":"x"}'.encode("utf-32"),
    ],
    ids=["utf-8", "utf-16", "utf-32"],
)
def test_the_client_refuses_a_binary_frame(frame: bytes) -> None:
    """PROTOCOL.md: a binary frame, or JSON in another encoding, is BAD_MESSAGE (json.loads
    read UTF-16 and UTF-32 bytes as JSON); the session goes on."""
    client, server = opened()
    (error,) = client.receive(frame)
    assert isinstance(error, m.Error) and error.code == m.BAD_MESSAGE, error
    assert "binary" in error.message
    server.send(m.TextDeltaMessage, turn_id="t_1", text="y")
    (event,) = client.receive(server.take_outbox()[0])
    assert event.text == "y"


def test_the_codec_never_writes_nan_or_infinity() -> None:
    from vrt._wire import codec

    for bad in (float("nan"), float("inf"), -float("inf")):
        call = m.ToolCallMessage(
            seq=1, call_id="c", turn_id="t", epoch=0, name="n", arguments={"x": bad}
        )
        with pytest.raises(ValueError, match="JSON"):
            codec.encode(call)
