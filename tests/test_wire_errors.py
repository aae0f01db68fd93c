"""Every vrt/1 error a bad peer can trigger, sent by hand from a raw WebSocket client.

No test here uses ``vrt.connect``: each one speaks the wire itself (trio-websocket, JSON
written out), sends one bad frame, checks the ``error`` it gets (code, ``seq``, ``ref``),
and then shows the session still works: a valid ``input`` with the next seq runs a turn to
its end. Where PROTOCOL.md refuses the connection instead (a refused ``hello``, a frame
the WebSocket layer will not take), "still works" means the server takes a fresh
connection and runs a turn on it.

Every frame the server sends goes through :meth:`Peer.receive`, which checks it against its
shipped JSON Schema, refuses tracebacks and file paths in it, and checks PROTOCOL.md's
numbering: inside a session every message but ``ack`` is numbered 1, 2, 3...; outside one
(errors answering frames sent before ``hello``, a refused ``hello``) ``seq`` is 0.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from jsonschema import Draft202012Validator
from trio_websocket import ConnectionClosed, WebSocketConnection, wrap_client_stream

import vrt
from vrt._wire.codec import schema_of

FRAME_TIMEOUT = 1.0
"""The longest any awaited frame may take (they take milliseconds)."""

QUIET = 0.05
"""How long a test listens to show that nothing comes (a reply takes well under 1 ms)."""

LIMIT = 1024
"""``max_message_size`` of the servers in the oversize tests."""

#: What the server may send, and the error codes, as PROTOCOL.md lists them.
SERVER_TYPES = frozenset(
    {
        "welcome",
        "turn.started",
        "text.delta",
        "tool.stream",
        "tool.preview",
        "tool.call",
        "tool.abort",
        "confirm.request",
        "turn.ended",
        "error",
        "closed",
        "ack",
    }
)
ERROR_CODES = frozenset(
    {
        "BAD_JSON",
        "BAD_MESSAGE",
        "UNKNOWN_TYPE",
        "TOO_LARGE",
        "BAD_STATE",
        "UNKNOWN_CALL",
        "STALE_EPOCH",
        "DUPLICATE_RESULT",
        "UNSUPPORTED_PROTOCOL",
        "RESUME_FAILED",
        "TOOL_CONFLICT",
        "RATE_LIMITED",
        "INTERNAL",
    }
)

PACKAGE_DIR = str(Path(vrt.__file__).resolve().parent)

Frame = dict[str, Any]


# -- the checks every server frame passes --------------------------------------------------------


@functools.cache
def _validator(type_: str) -> Draft202012Validator:
    return Draft202012Validator(schema_of(type_))


def checked(frame: str | bytes) -> Frame:
    """Parse one server frame, asserting it is clean, known and valid against its schema."""
    assert isinstance(frame, str), f"the server sent a binary frame: {frame!r}"
    assert "Traceback" not in frame, frame
    assert 'File "' not in frame, frame
    assert PACKAGE_DIR not in frame, frame
    data = json.loads(frame)
    assert isinstance(data, dict), frame
    assert data.get("type") in SERVER_TYPES, frame
    problems = [e.message for e in _validator(data["type"]).iter_errors(data)]
    assert not problems, f"{frame} breaks its schema: {problems}"
    if data["type"] == "error":
        assert data["code"] in ERROR_CODES, frame
        # a short explanation, never the offending frame echoed back whole
        assert 0 < len(data["message"]) <= 500, frame
    return data


# -- a hand-driven client ------------------------------------------------------------------------


class Peer:
    """A vrt/1 client written by hand over a raw WebSocket.

    ``seq`` is the last seq this client numbered; :meth:`receive` checks every server
    frame (see :func:`checked`) and its numbering, and keeps it in :attr:`frames`.
    """

    def __init__(self, ws: WebSocketConnection) -> None:
        self.ws = ws
        self.seq = 0
        self.highest_sent = 0
        """The highest seq this client put in any frame (what an ``ack`` may acknowledge)."""
        self.server_seq = 0
        self.acked = 0
        self.in_session = False
        self.closed = False
        self.frames: list[Frame] = []

    @property
    def errors(self) -> list[Frame]:
        return [f for f in self.frames if f["type"] == "error"]

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    # -- sending ----------------------------------------------------------------------------------

    async def send_raw(self, frame: str | bytes) -> None:
        """Send one frame exactly as given (text for str, binary for bytes)."""
        try:
            data = json.loads(frame)
        except (ValueError, RecursionError):
            data = None
        if isinstance(data, dict) and type(data.get("seq")) is int:
            self.highest_sent = max(self.highest_sent, data["seq"])
        await self.ws.send_message(frame)

    async def send(self, type_: str, **fields: Any) -> int:
        """Send a message numbered with the next seq; return that seq."""
        seq = self.next_seq()
        await self.send_raw(json.dumps({"type": type_, "seq": seq, **fields}))
        return seq

    # -- receiving --------------------------------------------------------------------------------

    async def receive(self) -> Frame:
        """The next frame, acks included, checked."""
        with trio.fail_after(FRAME_TIMEOUT):
            frame = await self.ws.get_message()
        data = checked(frame)
        self._check_numbering(data)
        self.frames.append(data)
        return data

    def _check_numbering(self, data: Frame) -> None:
        assert not self.closed, f"{data} after closed"
        seq = data["seq"]
        if data["type"] == "ack":
            # An ack is not numbered: its seq is the highest client seq processed.
            assert self.in_session, f"{data} outside a session"
            assert self.acked < seq <= self.highest_sent, f"{data}: acked before {self.acked}"
            self.acked = seq
        elif self.in_session or data["type"] == "welcome":
            assert seq == self.server_seq + 1, f"{data} after server seq {self.server_seq}"
            self.server_seq = seq
            self.in_session = True
        else:
            assert seq == 0, f"{data}: outside a session seq is 0"
        if data["type"] == "closed":
            self.closed = True

    async def next_frame(self) -> Frame:
        """The next frame that is not an ack."""
        while True:
            data = await self.receive()
            if data["type"] != "ack":
                return data

    async def until(self, predicate: Callable[[Frame], bool]) -> Frame:
        """Receive until a frame matches ``predicate``; any other ``error`` fails the test."""
        while True:
            data = await self.receive()
            if predicate(data):
                return data
            assert data["type"] != "error", f"unexpected {data}"

    async def gather(self, *wanted: Callable[[Frame], bool]) -> list[Frame]:
        """Receive until every predicate matched a frame; return the frames (acks aside),
        errors included: the caller checks them."""
        frames: list[Frame] = []
        missing = list(wanted)
        while missing:
            data = await self.next_frame()
            frames.append(data)
            missing = [p for p in missing if not p(data)]
        return frames

    async def expect_error(self, code: str, ref: int | None) -> Frame:
        """The next frame (acks aside) is ``error`` ``code`` with ``ref`` (None: no ref)."""
        data = await self.next_frame()
        assert data["type"] == "error" and data["code"] == code, data
        assert data.get("ref") == ref, data
        assert ("ref" in data) == (ref is not None), data
        return data

    async def expect_rejected(self, code: str, ref: int | None = 1) -> None:
        """``error`` ``code`` then ``closed`` ``rejected``, both seq 0, then the socket closes."""
        error = await self.expect_error(code, ref)
        assert error["seq"] == 0, error
        closed = await self.next_frame()
        assert closed == {"type": "closed", "seq": 0, "reason": "rejected"}, closed
        await self.expect_disconnect()

    async def expect_disconnect(self) -> ConnectionClosed:
        """The server closes the connection (frames before that are still checked)."""
        with trio.fail_after(FRAME_TIMEOUT):
            while True:
                try:
                    frame = await self.ws.get_message()
                except ConnectionClosed as exc:
                    return exc
                data = checked(frame)
                self._check_numbering(data)
                self.frames.append(data)

    async def expect_silence(self) -> None:
        """Nothing but acks arrives for :data:`QUIET` seconds."""
        with trio.move_on_after(QUIET):
            while True:
                data = await self.receive()
                assert data["type"] == "ack", f"expected no reply, got {data}"

    # -- conversations ----------------------------------------------------------------------------

    async def hello(self, tools: Iterable[Frame] = ()) -> Frame:
        """A valid handshake; returns the ``welcome``."""
        seq = await self.send(
            "hello", protocol="vrt/1", capabilities=["tool-stream-v1"], tools=list(tools)
        )
        welcome = await self.next_frame()
        assert welcome["type"] == "welcome", welcome
        assert welcome["seq"] == 1 and welcome["lastSeq"] == seq, welcome
        assert welcome["epoch"] == 0 and welcome["resumed"] is False, welcome
        assert welcome["capabilities"] == ["tool-stream-v1"], welcome
        return welcome

    async def run_turn(self, text: str = "go", *, epoch: int | None = None) -> list[Frame]:
        """Send ``input``: the turn starts and finishes; return its frames (acks aside)."""
        errors = len(self.errors)
        await self.send("input", text=text)
        started = await self.until(lambda f: f["type"] == "turn.started")
        if epoch is not None:
            assert started["epoch"] == epoch, started
        turn: list[Frame] = [started]
        while True:
            data = await self.next_frame()
            turn.append(data)
            if data["type"] == "turn.ended":
                break
        assert data["turnId"] == started["turnId"] and data["reason"] == "finished", data
        assert len(self.errors) == errors, self.errors
        assert [f["type"] for f in turn].count("turn.started") == 1, turn
        return turn

    async def works(self) -> None:
        """The session still works: a turn runs to its end, twice."""
        await self.run_turn("still there?")
        await self.run_turn("and again?")


# -- servers and agents --------------------------------------------------------------------------


@vrt.server_tool(
    risk="low",
    description="Weather now",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)
async def weather(args: Any, ctx: vrt.ToolContext) -> Any:
    return {"temp_c": 21}


@vrt.server_tool(risk="high", description="Launch it", parameters={"type": "object"})
async def launch(args: Any, ctx: vrt.ToolContext) -> Any:
    return "launched"


HIGHLIGHT: Frame = {
    "name": "highlight",
    "description": "Highlight a word on screen",
    "parameters": {
        "type": "object",
        "properties": {"word": {"type": "string"}},
        "required": ["word"],
    },
}


def chat_agent() -> vrt.Agent:
    """Says "hi" in its first turn, nothing in later ones; hosts the server tool weather."""
    return vrt.define_agent(model=vrt.ScriptedModel([[vrt.say("hi")]]), tools=[weather])


def app_agent() -> vrt.Agent:
    """Calls the client's ``highlight`` in its first turn, then says "done"."""
    return vrt.define_agent(
        model=vrt.ScriptedModel([[vrt.call("highlight", {"word": "hi"})], [vrt.say("done")]]),
        tools=[weather],
        client_tools="accept",
    )


@asynccontextmanager
async def serving(agent: vrt.Agent, **options: Any) -> AsyncIterator[vrt.Server]:
    """``vrt.serve`` on a free loopback port, cancelled on exit."""
    async with trio.open_nursery() as nursery:
        server: vrt.Server = await nursery.start(
            functools.partial(vrt.serve, agent, "127.0.0.1", 0, **options)
        )
        yield server
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def connected(server: vrt.Server) -> AsyncIterator[Peer]:
    """A raw WebSocket connection to ``server``.

    The test owns the TCP stream: trio-websocket's client (0.12) never closes its socket
    when the server is the side that closes (a refused hello, code 1009), which would
    leak it (a ResourceWarning, an error under ``filterwarnings = error``).
    """
    async with (
        trio.open_nursery() as nursery,
        await trio.open_tcp_stream(server.host, server.port) as stream,
    ):
        ws = await wrap_client_stream(nursery, stream, server.host, "/")
        try:
            yield Peer(ws)
        finally:
            with trio.move_on_after(FRAME_TIMEOUT) as scope:
                scope.shield = True
                await ws.aclose()


@asynccontextmanager
async def session(server: vrt.Server, tools: Iterable[Frame] = ()) -> AsyncIterator[Peer]:
    """A connected peer past its handshake."""
    async with connected(server) as peer:
        await peer.hello(tools)
        yield peer


async def fresh_session_works(server: vrt.Server) -> None:
    """The server still takes a new connection and runs a turn on it."""
    async with session(server) as peer:
        await peer.run_turn()


async def open_app_call(peer: Peer) -> Frame:
    """Start a turn whose model calls ``highlight``; return the ``tool.call`` once the call
    is waiting for its result (its arguments complete, nothing else in flight)."""
    await peer.send("input", text="highlight hi")
    call: Frame | None = None
    complete = False
    while call is None or not complete:
        data = await peer.until(lambda f: f["type"] in ("tool.call", "tool.preview"))
        if data["type"] == "tool.call":
            call = data
        else:
            complete = data["complete"]
    assert call["name"] == "highlight" and call["arguments"] == {"word": "hi"}, call
    return call


def ok_result(call: Frame, **changes: Any) -> Frame:
    """The right ``tool.result`` fields for ``call`` (``changes`` override them)."""
    fields: Frame = {
        "callId": call["callId"],
        "epoch": call["epoch"],
        "result": {"ok": True, "output": {"highlighted": True}},
    }
    return {**fields, **changes}


async def finish_app_turn(peer: Peer, call: Frame) -> None:
    """Answer ``call`` correctly: it settles ok and the turn finishes."""
    await peer.send("tool.result", **ok_result(call))
    settled = await peer.until(
        lambda f: f["type"] == "tool.stream" and f["phase"] in ("settled", "cancelled", "failed")
    )
    assert settled["callId"] == call["callId"], settled
    assert settled["phase"] == "settled" and settled["ok"] is True, settled
    ended = await peer.until(lambda f: f["type"] == "turn.ended")
    assert ended["turnId"] == call["turnId"] and ended["reason"] == "finished", ended


def assert_settled_once(frames: list[Frame], call_id: str, *, ok: bool) -> None:
    """``call_id`` has exactly one terminal ``tool.stream`` in ``frames``: settled ``ok``."""
    terminal = [
        f
        for f in frames
        if f["type"] == "tool.stream"
        and f["callId"] == call_id
        and f["phase"] in ("settled", "cancelled", "failed")
    ]
    assert len(terminal) == 1, terminal
    assert terminal[0]["phase"] == "settled" and terminal[0]["ok"] is ok, terminal


# -- bad frames inside a session -----------------------------------------------------------------

DEEP = 5000
"""Nesting deeper than Python's recursion limit."""

SEQ = "<seq>"
"""In a frame of :data:`BAD_FRAMES`: replaced by the seq the frame is sent with."""


def _deep(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def _result(result: Any) -> Frame:
    return {"type": "tool.result", "seq": SEQ, "callId": "call_1", "epoch": 0, "result": result}


def _fill(frame: Frame | str | bytes, seq: int) -> str | bytes:
    """The frame to send: :data:`SEQ` replaced by ``seq``; a dict as JSON."""
    if isinstance(frame, dict):
        return json.dumps({k: seq if v == SEQ else v for k, v in frame.items()})
    if isinstance(frame, str):
        return frame.replace(SEQ, str(seq))
    return frame


#: (the frame, the error code, whether the error carries ``ref``, the frame's seq).
BAD_FRAMES = [
    # not JSON
    pytest.param('{"type": "input", "seq": <seq>, "text": "x"', "BAD_JSON", False, id="truncated"),
    pytest.param('{"type": "input", "seq": <seq>, "text": NaN}', "BAD_JSON", False, id="nan"),
    pytest.param("", "BAD_JSON", False, id="empty-frame"),
    # a binary frame (PROTOCOL.md: text frames, UTF-8), whatever it holds
    pytest.param(b'\xc3\x28{"type": "input"}', "BAD_MESSAGE", False, id="binary-not-utf8"),
    pytest.param(b'{"type": "input", "seq": 9, "text": "x"}', "BAD_MESSAGE", False, id="binary"),
    pytest.param(
        '{"type": "input", "seq": 9, "text": "x"}'.encode("utf-16"),
        "BAD_MESSAGE",
        False,
        id="binary-utf16",
    ),
    pytest.param(
        '{"type": "input", "seq": 9, "text": "x"}'.encode("utf-32-le"),
        "BAD_MESSAGE",
        False,
        id="binary-utf32",
    ),
    pytest.param("[" * DEEP + "]" * DEEP, "BAD_JSON", False, id="nested-too-deep"),
    # JSON, not an object
    pytest.param('[{"type": "input", "seq": <seq>}]', "BAD_MESSAGE", False, id="array"),
    pytest.param('"input"', "BAD_MESSAGE", False, id="string"),
    pytest.param("42", "BAD_MESSAGE", False, id="number"),
    pytest.param("null", "BAD_MESSAGE", False, id="null"),
    # unknown type
    pytest.param({"type": "dance", "seq": SEQ}, "UNKNOWN_TYPE", True, id="unknown-type"),
    pytest.param({"type": "turn.started", "seq": SEQ}, "UNKNOWN_TYPE", True, id="server-type"),
    pytest.param({"seq": SEQ, "text": "x"}, "UNKNOWN_TYPE", True, id="type-missing"),
    pytest.param({"type": ["input"], "seq": SEQ}, "UNKNOWN_TYPE", True, id="type-not-a-string"),
    # schema: missing field, wrong type, extra field
    pytest.param({"type": "input", "seq": SEQ}, "BAD_MESSAGE", True, id="missing-field"),
    pytest.param({"type": "input", "seq": SEQ, "text": 3}, "BAD_MESSAGE", True, id="wrong-type"),
    pytest.param(
        {"type": "input", "seq": SEQ, "text": "x", "mood": "cross"},
        "BAD_MESSAGE",
        True,
        id="extra-field",
    ),
    pytest.param(
        {"type": "interrupt", "seq": SEQ, "epoch": True}, "BAD_MESSAGE", True, id="bool-for-int"
    ),
    pytest.param(
        {"type": "interrupt", "seq": SEQ, "epoch": 1.5}, "BAD_MESSAGE", True, id="float-for-int"
    ),
    pytest.param(
        {"type": "interrupt", "seq": SEQ, "epoch": -1}, "BAD_MESSAGE", True, id="negative-epoch"
    ),
    pytest.param({"type": "input", "text": "x"}, "BAD_MESSAGE", False, id="seq-missing"),
    pytest.param({"type": "input", "seq": "7", "text": "x"}, "BAD_MESSAGE", False, id="seq-str"),
    pytest.param({"type": "input", "seq": -1, "text": "x"}, "BAD_MESSAGE", False, id="seq-below-0"),
    pytest.param(
        {"type": "confirm.reply", "seq": SEQ, "call_id": "c", "approved": True},
        "BAD_MESSAGE",
        True,
        id="snake-case-field",
    ),
    pytest.param(
        {"type": "confirm.reply", "seq": SEQ, "callId": "c", "approved": "yes"},
        "BAD_MESSAGE",
        True,
        id="approved-not-a-bool",
    ),
    pytest.param(
        {**_result({"ok": True, "output": 1}), "callId": ""},
        "BAD_MESSAGE",
        True,
        id="empty-call-id",
    ),
    # schema, inside tool.result's result
    pytest.param(_result({"ok": False}), "BAD_MESSAGE", True, id="failure-without-code"),
    pytest.param(
        _result({"ok": False, "code": "FAILED", "output": 1}),
        "BAD_MESSAGE",
        True,
        id="failure-with-output",
    ),
    pytest.param(_result({"ok": True, "code": "FAILED"}), "BAD_MESSAGE", True, id="ok-with-code"),
    pytest.param(_result({"ok": False, "code": "OOPS"}), "BAD_MESSAGE", True, id="unknown-code"),
    pytest.param(_result({"ok": True, "why": "x"}), "BAD_MESSAGE", True, id="result-extra-field"),
    pytest.param(_result({"output": 1}), "BAD_MESSAGE", True, id="ok-missing"),
    pytest.param(_result("ok"), "BAD_MESSAGE", True, id="result-not-an-object"),
    # state (and a schema violation deep enough to exhaust a recursive validator)
    pytest.param(
        {"type": "hello", "seq": SEQ, "protocol": "vrt/1"}, "BAD_STATE", True, id="hello-again"
    ),
    pytest.param(
        {"type": "hello", "seq": SEQ, "protocol": "vrt/1", "capabilities": [_deep(300)] * 2},
        "BAD_MESSAGE",
        True,
        id="hello-again-deep-capabilities",
    ),
]


@pytest.mark.parametrize(("frame", "code", "has_ref"), BAD_FRAMES)
async def test_bad_frame_in_session_is_answered_and_the_session_goes_on(
    frame: Frame | str | bytes, code: str, has_ref: bool
) -> None:
    async with serving(chat_agent()) as server, session(server) as peer:
        await peer.run_turn()
        numbered = peer.server_seq
        seq = peer.next_seq()
        await peer.send_raw(_fill(frame, seq))
        error = await peer.expect_error(code, seq if has_ref else None)
        assert error["seq"] == numbered + 1  # inside a session errors are numbered
        await peer.works()
        assert [e["code"] for e in peer.errors] == [code]


@pytest.mark.parametrize(
    ("frame", "code", "has_ref"),
    [p for p in BAD_FRAMES if not str(p.id).startswith("hello")],
)
async def test_bad_frame_before_hello_gets_seq_0_and_hello_still_works(
    frame: Frame | str | bytes, code: str, has_ref: bool
) -> None:
    async with serving(chat_agent()) as server, connected(server) as peer:
        await peer.send_raw(_fill(frame, 1))
        error = await peer.expect_error(code, 1 if has_ref else None)
        assert error["seq"] == 0
        await peer.hello()
        await peer.works()
        assert [e["code"] for e in peer.errors] == [code]


# -- state: messages before hello ----------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        {"type": "input", "text": "hi"},
        {"type": "interrupt", "epoch": 1},
        {"type": "tool.result", "callId": "call_1", "epoch": 0, "result": {"ok": True}},
        {"type": "confirm.reply", "callId": "call_1", "approved": True},
        {"type": "close"},
    ],
    ids=lambda message: message["type"],
)
async def test_message_before_hello_is_bad_state_and_hello_still_works(message: Frame) -> None:
    async with serving(chat_agent()) as server, connected(server) as peer:
        await peer.send_raw(json.dumps({**message, "seq": 1}))
        error = await peer.expect_error("BAD_STATE", 1)
        assert error["seq"] == 0
        # an ack before hello acknowledges nothing and gets no reply either
        await peer.send_raw(json.dumps({"type": "ack", "seq": 0}))
        await peer.hello()  # the next frame is the welcome: numbered from 1
        await peer.works()
        assert [e["code"] for e in peer.errors] == ["BAD_STATE"]


# -- refused hellos ------------------------------------------------------------------------------


def _tool(name: str = "highlight", parameters: Any = None) -> Frame:
    return {
        "name": name,
        "description": "an app tool",
        "parameters": {"type": "object"} if parameters is None else parameters,
    }


def _deep_schema(depth: int) -> Frame:
    inner: Frame = {}
    node = inner
    for _ in range(depth):
        node["not"] = {}
        node = node["not"]
    return {"type": "object", "properties": {"a": inner}}


@pytest.mark.parametrize(
    ("hello", "code"),
    [
        pytest.param({"protocol": "vrt/9"}, "UNSUPPORTED_PROTOCOL", id="protocol-vrt/9"),
        pytest.param({"protocol": "VRT/1"}, "UNSUPPORTED_PROTOCOL", id="protocol-case"),
        pytest.param({"tools": [_tool("weather")]}, "TOOL_CONFLICT", id="clashes-server-tool"),
        pytest.param({"tools": [_tool(), _tool()]}, "TOOL_CONFLICT", id="two-app-tools-same-name"),
        pytest.param(
            {"resume": {"sessionId": "s_0", "token": "guess", "lastSeq": 0}},
            "RESUME_FAILED",
            id="resume-unknown-session",
        ),
        pytest.param(
            {"tools": [_tool(parameters={"type": "object", "properties": {"a": {"type": 1}}})]},
            "BAD_MESSAGE",
            id="parameters-not-a-schema",
        ),
        pytest.param(
            {"tools": [_tool(parameters={"type": "array"})]},
            "BAD_MESSAGE",
            id="parameters-not-an-object-schema",
        ),
        pytest.param(
            {"tools": [_tool(parameters={"type": "object", "$ref": "https://example.com/s"})]},
            "BAD_MESSAGE",
            id="parameters-remote-ref",
        ),
        pytest.param(
            {"tools": [_tool(parameters=_deep_schema(300))]},
            "BAD_MESSAGE",
            id="parameters-nested-too-deep",
        ),
        # A hello breaking its own schema is an invalid hello too (PROTOCOL.md: "A hello
        # that is invalid (bad protocol, ..., bad schema in a tool) gets error then closed
        # with reason rejected").
        pytest.param({"tools": [_tool("high light")]}, "BAD_MESSAGE", id="tool-name-pattern"),
        pytest.param(
            {"tools": [{"name": "highlight", "parameters": {"type": "object"}}]},
            "BAD_MESSAGE",
            id="tool-without-description",
        ),
        pytest.param({"protocol": None}, "BAD_MESSAGE", id="protocol-not-a-string"),
        pytest.param({"capabilities": ["a", "a"]}, "BAD_MESSAGE", id="capabilities-repeated"),
        pytest.param({"lang": "fr"}, "BAD_MESSAGE", id="extra-field"),
    ],
)
async def test_invalid_hello_is_rejected_and_the_server_goes_on(hello: Frame, code: str) -> None:
    async with serving(chat_agent()) as server:
        async with connected(server) as peer:
            frame = {"type": "hello", "seq": 1, "protocol": "vrt/1", **hello}
            await peer.send_raw(json.dumps(frame))
            await peer.expect_rejected(code, ref=1)
            assert not peer.in_session
        await fresh_session_works(server)


async def test_tool_conflict_leaves_other_sessions_alone() -> None:
    async with serving(chat_agent()) as server, session(server) as bystander:
        async with connected(server) as peer:
            await peer.send(
                "hello", protocol="vrt/1", capabilities=["tool-stream-v1"], tools=[_tool("weather")]
            )
            await peer.expect_rejected("TOOL_CONFLICT", ref=1)
        await bystander.works()
        await fresh_session_works(server)
        assert bystander.errors == []


# -- app calls: unknown call, stale epoch, duplicate result --------------------------------------


async def test_result_for_an_unknown_call_changes_nothing() -> None:
    async with serving(app_agent()) as server, session(server, [HIGHLIGHT]) as peer:
        call = await open_app_call(peer)
        seq = await peer.send("tool.result", **ok_result(call, callId="call_nope"))
        await peer.expect_error("UNKNOWN_CALL", seq)
        await peer.expect_silence()  # the call is still waiting: nothing settled
        await finish_app_turn(peer, call)
        await peer.works()
        assert [e["code"] for e in peer.errors] == ["UNKNOWN_CALL"]


@pytest.mark.parametrize("epoch", [1, 7])
async def test_result_with_a_stale_epoch_changes_nothing(epoch: int) -> None:
    async with serving(app_agent()) as server, session(server, [HIGHLIGHT]) as peer:
        call = await open_app_call(peer)
        assert call["epoch"] == 0
        seq = await peer.send("tool.result", **ok_result(call, epoch=epoch))
        await peer.expect_error("STALE_EPOCH", seq)
        await peer.expect_silence()
        await finish_app_turn(peer, call)
        await peer.works()
        assert [e["code"] for e in peer.errors] == ["STALE_EPOCH"]


async def test_a_second_result_for_a_call_is_a_duplicate() -> None:
    async with serving(app_agent()) as server, session(server, [HIGHLIGHT]) as peer:
        call = await open_app_call(peer)
        await peer.send("tool.result", **ok_result(call))
        # at once, while the turn goes on; a failure this time, so it would show if taken
        seq = await peer.send(
            "tool.result", **ok_result(call, result={"ok": False, "code": "FAILED"})
        )
        frames = await peer.gather(
            lambda f: f["type"] == "error", lambda f: f["type"] == "turn.ended"
        )
        (error,) = [f for f in frames if f["type"] == "error"]
        assert error["code"] == "DUPLICATE_RESULT" and error["ref"] == seq, error
        assert_settled_once(frames, call["callId"], ok=True)  # the first result stands
        (ended,) = [f for f in frames if f["type"] == "turn.ended"]
        assert ended["reason"] == "finished", ended
        # and once the turn is over
        seq = await peer.send("tool.result", **ok_result(call))
        await peer.expect_error("DUPLICATE_RESULT", seq)
        await peer.works()
        assert [e["code"] for e in peer.errors] == ["DUPLICATE_RESULT"] * 2


async def test_result_for_a_server_call_is_an_unknown_call() -> None:
    agent = vrt.define_agent(
        model=vrt.ScriptedModel([[vrt.call("weather", {"city": "Paris"})]]), tools=[weather]
    )
    async with serving(agent) as server, session(server) as peer:
        turn = await peer.run_turn("weather?")
        (call_id,) = {f["callId"] for f in turn if f["type"] == "tool.stream"}
        seq = await peer.send(
            "tool.result", callId=call_id, epoch=0, result={"ok": True, "output": None}
        )
        await peer.expect_error("UNKNOWN_CALL", seq)
        await peer.works()


# -- interrupt and confirmation ------------------------------------------------------------------


async def test_an_interrupt_is_never_lost_even_with_an_old_epoch() -> None:
    """An ``interrupt`` whose epoch is not above the server's (its own barge-in raised it)
    still interrupts: the server moves to the next epoch, which the client adopts from
    ``turn.started``/``turn.ended``; nothing is answered with an error."""
    async with serving(chat_agent()) as server, session(server) as peer:
        await peer.send("interrupt", epoch=0)  # the current epoch: 0 -> 1
        await peer.send("interrupt", epoch=3)  # above it: adopted, 3
        await peer.send("interrupt", epoch=3)  # again: 4
        await peer.send("interrupt", epoch=1)  # below: 5
        await peer.run_turn(epoch=5)
        await peer.run_turn(epoch=5)
        assert peer.errors == []


async def test_confirm_reply_for_an_unknown_call() -> None:
    async with serving(chat_agent()) as server, session(server) as peer:
        seq = await peer.send("confirm.reply", callId="call_1", approved=True)
        await peer.expect_error("UNKNOWN_CALL", seq)
        await peer.works()


async def test_a_second_confirm_reply_is_an_unknown_call() -> None:
    agent = vrt.define_agent(
        model=vrt.ScriptedModel([[vrt.call("launch", {})], [vrt.say("launched")]]),
        tools=[launch],
        before_tool_call=vrt.require_confirmation("high"),
    )
    async with serving(agent) as server, session(server) as peer:
        await peer.send("input", text="launch it")
        request = await peer.until(lambda f: f["type"] == "confirm.request")
        wrong = await peer.send("confirm.reply", callId="call_nope", approved=True)
        await peer.expect_error("UNKNOWN_CALL", wrong)
        await peer.send("confirm.reply", callId=request["callId"], approved=True)
        again = await peer.send("confirm.reply", callId=request["callId"], approved=False)
        frames = await peer.gather(
            lambda f: f["type"] == "error", lambda f: f["type"] == "turn.ended"
        )
        (error,) = [f for f in frames if f["type"] == "error"]
        assert error["code"] == "UNKNOWN_CALL" and error["ref"] == again, error
        assert_settled_once(frames, request["callId"], ok=True)  # the first answer stands
        (ended,) = [f for f in frames if f["type"] == "turn.ended"]
        assert ended["reason"] == "finished", ended
        await peer.works()
        assert [e["code"] for e in peer.errors] == ["UNKNOWN_CALL"] * 2


# -- replays -------------------------------------------------------------------------------------


async def test_replayed_messages_are_dropped_silently() -> None:
    async with serving(chat_agent()) as server, session(server) as peer:
        await peer.run_turn()  # input seq 2
        await peer.send_raw(json.dumps({"type": "input", "seq": 2, "text": "go"}))
        await peer.send_raw(json.dumps({"type": "hello", "seq": 1, "protocol": "vrt/1"}))
        await peer.send_raw(json.dumps({"type": "input", "seq": 0, "text": "zero"}))
        # a message answered with error counts as processed: its replay is dropped too
        bad = await peer.send("dance")
        await peer.expect_error("UNKNOWN_TYPE", bad)
        await peer.send_raw(json.dumps({"type": "dance", "seq": bad}))
        await peer.send_raw(json.dumps({"type": "input", "seq": bad}))  # a bad replay as well
        # the next reply answers the next new message: nothing answered the replays
        probe = await peer.send("confirm.reply", callId="call_9", approved=True)
        await peer.expect_error("UNKNOWN_CALL", probe)
        await peer.expect_silence()  # no turn started for a replayed input
        # seqs may skip; one below the highest processed is a replay
        peer.seq += 10
        await peer.run_turn()
        await peer.send_raw(json.dumps({"type": "input", "seq": peer.seq - 1, "text": "old"}))
        await peer.expect_silence()
        await peer.works()
        assert [e["code"] for e in peer.errors] == ["UNKNOWN_TYPE", "UNKNOWN_CALL"]


async def test_errors_count_as_processed_and_are_acked() -> None:
    async with serving(chat_agent()) as server, session(server) as peer:
        sent = [await peer.send("dance") for _ in range(60)]  # more than one ack's worth
        errors = [await peer.next_frame() for _ in sent]
        assert [(e["code"], e["ref"]) for e in errors] == [("UNKNOWN_TYPE", s) for s in sent]
        await peer.until(lambda f: f["type"] == "ack" and f["seq"] == sent[-1])
        await peer.works()


# -- oversize ------------------------------------------------------------------------------------


def _input_of_size(seq: int, size: int, char: str = "x") -> str:
    """An ``input`` frame of exactly ``size`` UTF-8 bytes (``char`` is 1 or 2 bytes)."""
    head = f'{{"type":"input","seq":{seq},"text":"'
    room = size - len(head.encode()) - len(b'"}')
    width = len(char.encode())
    assert room >= 0 and room % width == 0
    frame = head + char * (room // width) + '"}'
    assert len(frame.encode()) == size
    return frame


async def test_frame_over_the_limit_in_bytes_is_too_large_and_the_session_goes_on() -> None:
    """The limit counts UTF-8 bytes: a frame within it in characters (what the WebSocket
    layer measures) but over it in bytes is answered TOO_LARGE, and the session goes on."""
    async with serving(chat_agent(), max_message_size=LIMIT) as server, session(server) as peer:
        # 2-byte characters put these over
        for size in (LIMIT + 2, 2 * LIMIT - 200):
            frame = _input_of_size(peer.next_seq(), size, "é")
            assert len(frame) <= LIMIT
            await peer.send_raw(frame)
            await peer.expect_error("TOO_LARGE", None)
        assert peer.errors[0]["seq"] == peer.server_seq - 1 == 2
        # exactly the limit is fine
        await peer.send_raw(_input_of_size(peer.next_seq(), LIMIT))
        started = await peer.until(lambda f: f["type"] == "turn.started")
        ended = await peer.until(lambda f: f["type"] == "turn.ended")
        assert ended["turnId"] == started["turnId"] and ended["reason"] == "finished"
        await peer.works()
        assert [e["code"] for e in peer.errors] == ["TOO_LARGE"] * 2


async def test_frame_over_the_limit_before_hello_gets_seq_0() -> None:
    async with serving(chat_agent(), max_message_size=LIMIT) as server, connected(server) as peer:
        await peer.send_raw(_input_of_size(1, LIMIT + 2, "é"))
        error = await peer.expect_error("TOO_LARGE", None)
        assert error["seq"] == 0
        await peer.hello()
        await peer.works()


@pytest.mark.parametrize(
    "size",
    [
        pytest.param(LIMIT + 1, id="one-over"),
        pytest.param(4 * LIMIT + 1000, id="just-over-4x"),
        pytest.param(100 * LIMIT, id="100x"),
    ],
)
@pytest.mark.parametrize("when", ["in-session", "before-hello"])
async def test_frame_over_the_limit_in_characters_closes_with_1009_and_the_server_goes_on(
    size: int, when: str
) -> None:
    """The WebSocket layer buffers no frame over the limit: it closes the connection with
    1009 (an unfinished frame holds at most the limit)."""
    async with serving(chat_agent(), max_message_size=LIMIT) as server:
        async with session(server) as bystander:
            async with connected(server) as peer:
                if when == "in-session":
                    await peer.hello()
                await peer.send_raw(_input_of_size(peer.next_seq(), size))
                closed = await peer.expect_disconnect()
                assert closed.reason is not None and closed.reason.code == 1009, closed.reason
                assert peer.errors == [], peer.errors
            await bystander.works()
            assert bystander.errors == []
        await fresh_session_works(server)


async def test_frame_nested_too_deep_leaves_other_sessions_alone() -> None:
    async with serving(chat_agent()) as server, session(server) as bystander:
        async with session(server) as peer:
            await peer.send_raw("[" * 100_000 + "]" * 100_000)
            await peer.expect_error("BAD_JSON", None)
            await peer.works()
        await bystander.works()
        await fresh_session_works(server)
