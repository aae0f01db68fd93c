"""The sans-IO protocol cores: no trio, codec, fast schema checks, core against core."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

import vrt
from vrt._core.events import ToolPreview
from vrt._core.fastcheck import compile_schema
from vrt._engine.tools import schema_validator
from vrt._wire import codec
from vrt._wire import messages as m
from vrt._wire.client import ANSWERS_KEPT, AbortApp, ClientProtocol, Welcomed
from vrt._wire.server import ServerProtocol

ROOT = Path(vrt.__file__).parent


def _vrt_imports(path: Path) -> set[str]:
    """Modules imported at run time (``if TYPE_CHECKING:`` blocks do not count)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            node.body = []
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_sans_io_core_never_imports_trio() -> None:
    """vrt._wire and every vrt module it reaches (transitively) are free of trio."""
    todo = [f"vrt._wire.{p.stem}" for p in (ROOT / "_wire").glob("*.py")]
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        path = ROOT.parent.joinpath(*parts).with_suffix(".py")
        if not path.exists():
            path = ROOT.parent.joinpath(*parts, "__init__.py")
        for name in _vrt_imports(path):
            assert not (name == "trio" or name.startswith(("trio.", "trio_websocket"))), (
                f"{module} imports {name}"
            )
            if name.startswith(("vrt.", "machines")) and name != "vrt":
                todo.append(name)
    assert "vrt._wire.client" in seen and "vrt._core.tables" in seen


ALL = (*m.CLIENT_TYPES, *m.SERVER_TYPES)


def test_every_type_has_a_shipped_schema() -> None:
    for cls in ALL:
        schema = codec.schema_of(cls.TYPE)
        Draft202012Validator.check_schema(schema)
        assert schema["properties"]["type"] == {"const": cls.TYPE}


EXAMPLES: list[Any] = [
    m.Hello(
        seq=1,
        protocol="vrt/1",
        capabilities=("tool-stream-v1",),
        tools=(m.ToolDecl(name="hi", description="", parameters={"type": "object"}),),
    ),
    m.Input(seq=2, text="hello"),
    m.Interrupt(seq=3, epoch=1),
    m.ToolResultMessage(seq=4, call_id="c", epoch=0, result=m.WireResult(ok=True)),
    m.ToolResultMessage(
        seq=5, call_id="c", epoch=0, result=m.WireResult(ok=False, code="FAILED", message="x")
    ),
    m.ConfirmReply(seq=6, call_id="c", approved=False, reason="no"),
    m.Close(seq=7),
    m.Ack(seq=9),
    m.Welcome(
        seq=1,
        session_id="s",
        resume_token="t" * 43,
        epoch=0,
        capabilities=(),
        resumed=False,
        last_seq=1,
    ),
    m.ToolStreamMessage(
        seq=2,
        call_id="c",
        turn_id="t",
        epoch=0,
        name="n",
        kind="app",
        phase="settled",
        ok=False,
        code="TIMEOUT",
        message="late",
    ),
    m.ToolPreviewMessage(seq=3, call_id="c", turn_id="t", name="n", arguments="{", complete=False),
    m.ToolCallMessage(seq=4, call_id="c", turn_id="t", epoch=2, name="n", arguments={"a": [1]}),
    m.ConfirmRequestMessage(seq=5, call_id="c", name="n", arguments={}, risk=None, prompt="ok?"),
    m.TurnEndedMessage(seq=6, turn_id="t", epoch=1, reason="interrupted"),
    m.Error(seq=0, code="BAD_JSON", message="nope"),
    m.ClosedMessage(seq=8, reason="client"),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda e: e.TYPE)
def test_codec_round_trip_and_camel_case(message: Any) -> None:
    frame = codec.encode(message)
    data = json.loads(frame)
    assert not [k for k in data if "_" in k]
    allowed = m.CLIENT_TYPES if type(message) in m.CLIENT_TYPES else m.SERVER_TYPES
    assert codec.decode(frame, allowed) == message


def test_ok_result_carries_output_null() -> None:
    frame = codec.encode(EXAMPLES[3])
    assert json.loads(frame)["result"] == {"ok": True, "output": None}


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.floats(allow_nan=False)
    | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def _mutations(example: Any) -> Any:
    base = codec.to_dict(example)
    keys = sorted(base)
    return st.builds(
        lambda drop, key, value, extra: _mutate(base, drop, key, value, extra),
        st.sampled_from([None, *keys]),
        st.sampled_from(keys),
        json_values,
        st.one_of(st.none(), st.tuples(st.text(max_size=8), json_values)),
    )


def _mutate(
    base: dict[str, Any], drop: str | None, key: str, value: Any, extra: tuple[str, Any] | None
) -> dict[str, Any]:
    data = json.loads(json.dumps(base))
    if drop is not None:
        data.pop(drop, None)
    data[key] = value
    if extra is not None:
        data[extra[0]] = extra[1]
    return data


@settings(max_examples=600, deadline=None)
@given(st.sampled_from(EXAMPLES).flatmap(_mutations))
def test_fast_checks_agree_with_jsonschema(data: dict[str, Any]) -> None:
    for cls in ALL:
        schema = codec.schema_of(cls.TYPE)
        assert compile_schema(schema)(data) == Draft202012Validator(schema).is_valid(data)


def pump(a: Any, b: Any) -> list[Any]:
    """Deliver a's outbox to b; return what b made of it."""
    out: list[Any] = []
    for frame in a.take_outbox():
        out.extend(b.receive(frame))
    return out


def pump_calls(a: Any, b: Any) -> list[Any]:
    """``pump``, without the previews the client makes itself (``local-preview-v1``)."""
    return [e for e in pump(a, b) if not isinstance(e, ToolPreview)]


def pair(**server: Any) -> tuple[ClientProtocol, ServerProtocol]:
    client = ClientProtocol([m.ToolDecl(name="hi", description="", parameters={"type": "object"})])
    server.setdefault("server_tools", ["weather"])
    return client, ServerProtocol(session_id="s_1", resume_token="tok", **server)


def test_core_pair_handshake_seq_and_acks() -> None:
    client, server = pair()
    client.hello()
    (hello,) = pump(client, server)
    assert isinstance(hello, m.Hello) and server.state == "open"
    (welcomed,) = pump(server, client)
    assert welcomed == Welcomed(session_id="s_1", capabilities=m.CAPABILITIES)
    assert client.connection.state == "open"
    for i in range(120):
        client.send_input(f"hi {i}")
    got = pump(client, server)
    assert [g.text for g in got] == [f"hi {i}" for i in range(120)]
    assert server.received_seq == 121
    # the server acked every 50 messages; the client's replay buffer shrinks accordingly
    pump(server, client)
    assert client.acked_by_peer == 100 and len(client.replay) == 21
    server.send_ack()
    pump(server, client)
    assert len(client.replay) == 0


def test_core_server_sends_no_ack_after_closed() -> None:
    """``closed`` is the last frame, whoever asks for an ack later (the shared ack timer)."""
    client, server = pair()
    client.hello()
    pump(client, server)
    client.send_input("hi")
    pump(client, server)
    assert server.ack_due
    server.close("client")
    server.take_outbox()
    assert not server.send_ack()
    assert server.take_outbox() == []


def test_core_pair_replays_are_dropped() -> None:
    client, server = pair()
    client.hello()
    pump(client, server)
    pump(server, client)
    client.send_input("once")
    frame = client.take_outbox()[0]
    assert len(server.receive(frame)) == 1
    assert server.receive(frame) == []  # same seq again: silently dropped
    assert server.take_outbox() == []


def test_core_pair_epoch_gate_and_serial_queue() -> None:
    client, server = pair()
    client.hello()
    pump(client, server)
    pump(server, client)
    for i in (1, 2, 3):
        server.send(
            m.ToolCallMessage, call_id=f"c{i}", turn_id="t", epoch=0, name="hi", arguments={"i": i}
        )
    pump(server, client)
    first = client.next_app_call()
    assert first is not None and first.call_id == "c1"
    assert client.next_app_call() is None  # one at a time
    assert client.answer("c1", vrt.ToolResult.success("ok"))
    (result,) = pump(client, server)
    assert result.call_id == "c1" and result.result == m.WireResult(ok=True, output="ok")
    second = client.next_app_call()
    assert second is not None and second.call_id == "c2"
    # the user interrupts: the running call aborts, the queued one is dropped
    out = client.interrupt()
    assert out == [AbortApp(call_id="c2", reason="interrupted")]
    assert client.epoch == 1 and client.next_app_call() is None
    assert not client.answer("c2", vrt.ToolResult.success("late"))  # never sent
    (interrupt,) = pump(client, server)
    assert interrupt == m.Interrupt(seq=interrupt.seq, epoch=1)
    # a call of the old epoch arriving now never runs: answered INTERRUPTED at once
    server.send(m.ToolCallMessage, call_id="c4", turn_id="t", epoch=0, name="hi", arguments={})
    pump(server, client)
    assert client.next_app_call() is None
    (stale,) = pump(client, server)
    assert (stale.call_id, stale.result.code) == ("c4", "INTERRUPTED")


def test_core_a_tool_call_sent_again_gets_its_stored_result() -> None:
    """callId is the idempotency key: a ``tool.call`` for a call that ran already (under a
    new seq) is answered with the stored result, never run again; the client keeps the
    last ANSWERS_KEPT results."""
    client, server = pair()
    client.hello()
    pump(client, server)
    pump(server, client)

    def call(call_id: str) -> None:
        server.send(
            m.ToolCallMessage, call_id=call_id, turn_id="t", epoch=0, name="hi", arguments={}
        )
        pump(server, client)

    for i in range(ANSWERS_KEPT + 1):
        call(f"c{i}")
        ticket = client.next_app_call()
        assert ticket is not None and ticket.call_id == f"c{i}"
        assert client.answer(f"c{i}", vrt.ToolResult.success(i))
        pump(client, server)
    call("c1")  # again: the stored result, nothing runs
    assert client.next_app_call() is None
    (again,) = pump(client, server)
    assert (again.call_id, again.result) == ("c1", m.WireResult(ok=True, output=1))
    call("c0")  # the oldest is forgotten past the bound: it would run again
    ticket = client.next_app_call()
    assert ticket is not None and ticket.call_id == "c0"


def test_core_local_cancel_drops_the_servers_late_terminal() -> None:
    client, server = pair()
    client.hello()
    pump(client, server)
    pump(server, client)
    base = {"call_id": "c1", "turn_id": "t", "epoch": 0, "name": "weather", "kind": "server"}
    server.send(m.ToolStreamMessage, phase="start", **base)
    server.send(m.ToolStreamMessage, phase="arguments-complete", arguments={}, **base)
    events = pump_calls(server, client)
    assert [e.phase for e in events] == ["start", "arguments-complete"]
    (cancelled,) = client.interrupt()
    assert cancelled.phase == "cancelled" and cancelled.call_id == "c1"
    server.send(m.ToolStreamMessage, phase="cancelled", **base)
    server.send(m.ToolStreamMessage, phase="start", **{**base, "call_id": "c2"})  # old turn
    assert pump(server, client) == []


def _queued_pair() -> tuple[ClientProtocol, ServerProtocol]:
    """c1 running in the client, c2 queued behind it (both streamed, both sent)."""
    client, server = pair()
    client.hello()
    pump(client, server)
    pump(server, client)
    for call_id in ("c1", "c2"):
        base = {"call_id": call_id, "turn_id": "t", "epoch": 0, "name": "edit", "kind": "app"}
        server.send(m.ToolStreamMessage, phase="start", **base)
        server.send(m.ToolStreamMessage, phase="arguments-complete", arguments={}, **base)
        server.send(
            m.ToolCallMessage, call_id=call_id, turn_id="t", epoch=0, name="edit", arguments={}
        )
    pump(server, client)
    running = client.next_app_call()
    assert running is not None and running.call_id == "c1"
    return client, server


@pytest.mark.parametrize(("phase", "code"), [("cancelled", None), ("settled", "TIMEOUT")])
def test_core_terminal_phase_drops_a_queued_app_call(phase: str, code: str | None) -> None:
    """Found by vrt check (run-after-cancel): the app was shown c2's end, yet c2 stayed
    queued and ran once c1 returned, if tool.abort had not arrived by then."""
    client, server = _queued_pair()
    base = {"call_id": "c2", "turn_id": "t", "epoch": 0, "name": "edit", "kind": "app"}
    server.send(m.ToolStreamMessage, phase=phase, code=code, ok=code and False, **base)
    (shown,) = pump_calls(server, client)
    assert shown.phase == phase
    assert client.answer("c1", vrt.ToolResult.success("ok"))
    assert client.next_app_call() is None  # c2 never runs
    server.send(m.ToolAbort, call_id="c2")  # the abort that follows is a no-op
    assert pump(server, client) == []


@pytest.mark.parametrize(
    ("phase", "code", "reason"),
    [("cancelled", None, "interrupted"), ("settled", "TIMEOUT", "timeout")],
)
def test_core_terminal_phase_stops_the_running_app_call(
    phase: str, code: str | None, reason: str
) -> None:
    client, server = _queued_pair()
    base = {"call_id": "c1", "turn_id": "t", "epoch": 0, "name": "edit", "kind": "app"}
    server.send(m.ToolStreamMessage, phase=phase, code=code, ok=code and False, **base)
    shown, abort = pump_calls(server, client)
    assert shown.phase == phase
    assert abort == AbortApp(call_id="c1", reason=reason)  # the tool learns why it stops
    assert not client.answer("c1", vrt.ToolResult.success("late"))  # never sent
    assert client.take_outbox() == []
    ticket = client.next_app_call()
    assert ticket is not None and ticket.call_id == "c2"


def test_core_closed_aborts_the_running_app_call() -> None:
    client, server = _queued_pair()
    server.close("server")
    *aborts, closed = pump(server, client)
    assert aborts == [AbortApp(call_id="c1", reason="closed")]
    assert closed == vrt.Closed(reason="server")
    assert not client.answer("c1", vrt.ToolResult.success("late"))  # nothing after closed
    assert client.next_app_call() is None and client.take_outbox() == []


@pytest.mark.parametrize(
    ("hello", "code"),
    [
        ({"protocol": "vrt/9"}, m.UNSUPPORTED_PROTOCOL),
        (
            {"tools": [{"name": "weather", "description": "", "parameters": {"type": "object"}}]},
            m.TOOL_CONFLICT,
        ),
        (
            {"tools": [{"name": "a", "description": "", "parameters": {"type": "object"}}] * 2},
            m.TOOL_CONFLICT,
        ),
        (
            {"tools": [{"name": "a", "description": "", "parameters": {"type": "nope"}}]},
            m.BAD_MESSAGE,
        ),
    ],
)
def test_core_refused_hello(hello: dict[str, Any], code: str) -> None:
    _, server = pair()
    frame = json.dumps({"type": "hello", "seq": 1, "protocol": "vrt/1", **hello})
    assert server.receive(frame) == []
    error, closed = (json.loads(f) for f in server.take_outbox())
    assert (error["type"], error["code"], error["seq"]) == ("error", code, 0)
    assert closed == {"type": "closed", "seq": 0, "reason": "rejected"}
    assert server.state == "closed"


TOOL_SCHEMAS = [
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 0, "maximum": 3},
            "tags": {"type": "array", "items": {"type": "string", "minLength": 1}},
            "mode": {"enum": ["a", "b", None]},
        },
        "additionalProperties": False,
    },
    {"type": "object", "anyOf": [{"required": ["a"]}, {"required": ["b"]}]},
]


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(TOOL_SCHEMAS),
    st.dictionaries(st.sampled_from(["city", "n", "tags", "mode", "a", "b", "x"]), json_values),
)
def test_tool_argument_checks_agree_with_jsonschema(schema: Any, args: dict[str, Any]) -> None:
    """schema_validator's compiled fast path accepts exactly what jsonschema accepts."""
    try:
        schema_validator(schema)(args)
    except vrt.InvalidArguments:
        accepted = False
    else:
        accepted = True
    assert accepted == Draft202012Validator(schema).is_valid(args)
