"""The browser client's files: machines.js is generated from machines/ and vrt/_wire/schemas/
and current; its tables, run by Node, accept exactly what the Python tables accept, and its
schema checker refuses exactly what the Python codec refuses, in the same words."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h11
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import vrt
from vrt._cli import main, webschemas, webtables
from vrt._core import fastcheck
from vrt._core.fastcheck import compile_schema
from vrt._core.results import ToolResult
from vrt._core.tables import Table
from vrt._net.web import WEB_FILES, respond
from vrt._wire import codec
from vrt._wire import messages as m
from vrt._wire.client import ClientProtocol

NODE = shutil.which("node")


def test_the_committed_machines_js_is_current() -> None:
    assert webtables.check() == []
    assert main(["diagrams", "--check", "--dir", "diagrams"]) == 0


def test_a_changed_machine_makes_machines_js_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    webtables.write(tmp_path)
    assert webtables.check(tmp_path) == []
    table = webtables.CALL_VIEW
    changed = dict(table.transitions)
    changed["issued", "progress"] = "settled"
    monkeypatch.setattr(table, "transitions", changed)
    assert webtables.check(tmp_path) == [STALE.format(tmp_path / "machines.js")]
    assert webtables.check(tmp_path / "nowhere") == [f"{tmp_path / 'nowhere/machines.js'}: missing"]


STALE = "{}: stale (a class in machines/ or a schema in vrt/_wire/schemas/ changed)"


def test_a_changed_schema_makes_machines_js_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    webtables.write(tmp_path)
    schemas = json.loads(json.dumps(webschemas.server_schemas()))  # the codec's own untouched
    schemas["turn.ended"]["properties"]["reason"]["enum"].append("abandoned")
    monkeypatch.setattr(webschemas, "server_schemas", lambda: schemas)
    assert webtables.check(tmp_path) == [STALE.format(tmp_path / "machines.js")]
    assert main(["diagrams", "--check", "--dir", "diagrams", "--web-dir", str(tmp_path)]) == 1
    assert STALE.format(tmp_path / "machines.js") in capsys.readouterr().err


def _python_answers(table: Table) -> dict[str, dict[str, str | None]]:
    return {
        state: {event: table.transitions.get((state, event)) for event in table.events}
        for state in table.states
    }


def test_node_runs_the_same_tables() -> None:
    """Every (state, event) pair of every exported machine, in Node: the same target, or
    InvalidTransition where Python refuses."""
    assert NODE is not None, "node is needed (.ci/run installs it)"
    script = f"""
    import * as m from {json.dumps((webtables.WEB / "machines.js").as_uri())};
    const out = {{}};
    for (const [name, events] of Object.entries({
        json.dumps({name: list(t.events) for name, t in webtables.EXPORTED})
    })) {{
      const table = m[name];
      out[name] = {{}};
      for (const state of Object.keys(table.transitions)) {{
        out[name][state] = {{}};
        for (const event of events) {{
          const machine = new m.Machine(table);
          machine.state = state;
          try {{ out[name][state][event] = machine.send(event); }}
          catch (e) {{
            if (!(e instanceof m.InvalidTransition)) throw e;
            out[name][state][event] = null;
          }}
        }}
      }}
      const fresh = new m.Machine(table);
      out[name].__initial = fresh.state;
      out[name].__finals = table.finals;
    }}
    console.log(JSON.stringify(out));
    """
    done = subprocess.run(
        [NODE, "--input-type=module", "-e", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    got = json.loads(done.stdout)
    for name, table in webtables.EXPORTED:
        answers = dict(got[name])
        assert answers.pop("__initial") == table.initial
        assert set(answers.pop("__finals")) == set(table.finals)
        assert answers == _python_answers(table), name


# -- the HTTP front --------------------------------------------------------------------------


async def http(
    server: Any, request: bytes, method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    """One raw HTTP/1.1 exchange with ``server``: status, headers, body (to the close)."""
    with trio.fail_after(10):
        async with await trio.open_tcp_stream(server.host, server.port) as stream:
            await stream.send_all(request)
            data = b""
            while chunk := await stream.receive_some(65536):
                data += chunk
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method=method, target="/", headers=[("host", "x")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(data)
    conn.receive_data(b"")
    response = conn.next_event()
    assert isinstance(response, h11.Response), response
    headers = {k.decode(): v.decode() for k, v in response.headers}
    body = b""
    while isinstance(event := conn.next_event(), h11.Data):
        body += event.data
    return response.status_code, headers, body


def get(path: str, *extra: str, method: str = "GET") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *extra, "", ""]
    return "\r\n".join(lines).encode()


AGENT = vrt.define_agent(model=vrt.ScriptedModel([[vrt.say("hi")]]))


async def test_the_front_serves_the_web_files_and_nothing_else(vrt_serve: Any) -> None:
    server = await vrt_serve(AGENT)
    status, headers, body = await http(server, get("/machines.js"))
    assert status == 200 and body == (webtables.WEB / "machines.js").read_bytes()
    assert headers["content-type"] == "text/javascript; charset=utf-8"
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["access-control-allow-origin"] == "*"  # a page of any origin imports it
    etag = headers["etag"]
    assert etag.startswith('"') and len(etag) == 34
    status, headers, body = await http(server, get("/machines.js", f"If-None-Match: {etag}"))
    assert (status, body, headers["etag"]) == (304, b"", etag)
    status, headers, body = await http(server, get("/machines.js?v=2", method="HEAD"), "HEAD")
    assert status == 200 and body == b"" and headers["etag"] == etag
    for path in ("/", "/web/", "/../machines.js", "/vrt/web/machines.js", "/index.html"):
        status, _, _ = await http(server, get(path))
        assert status == 404, path
    status, headers, _ = await http(server, get("/machines.js", method="POST"))
    assert (status, headers["allow"]) == (405, "GET, HEAD")
    status, _, _ = await http(server, get("/x" * 9000))  # a head over 16 KiB
    assert status == 431
    for path, (name, kind) in WEB_FILES.items():
        status, headers, body = await http(server, get(path))
        assert status == 200 and body == (webtables.WEB / name).read_bytes(), path
        assert headers["content-type"] == kind


@pytest.mark.parametrize(
    ("draining", "unreachable", "expected"),
    [
        (False, False, (200, b"ok\n")),
        (True, False, (503, b"draining\n")),
        (False, True, (503, b"store unreachable\n")),
        (True, True, (503, b"draining\n")),  # leaving matters more than why
    ],
)
def test_healthz_tells_the_balancer_to_send_nobody_new(
    draining: bool, unreachable: bool, expected: tuple[int, bytes]
) -> None:
    """``GET /healthz``: 503 while the node drains, and while its store does not answer
    (it could not save a new session, nor hand one over): a load balancer's health check
    takes it out until it says ``ok`` again."""
    response = respond(b"GET", "/healthz", {}, draining=draining, store_unreachable=unreachable)
    assert (response.status, response.body) == expected
    assert (b"cache-control", b"no-store") in response.headers


def test_every_module_vrt_js_imports_is_served() -> None:
    """vrt.js imports its modules by relative URL, so each is fetched from the front beside
    it: a module of vrt/web that is not in WEB_FILES would fail only in a browser. And every
    served script is one of them (nothing in WEB_FILES that vrt.js does not load). A module
    loaded by URL (the audio worklet: ``new URL("./...", import.meta.url)``) counts too."""
    imported = re.compile(r'^(?:import|export)\b[^;]*?\bfrom "\./([\w.-]+)";', re.M | re.S)
    loaded = re.compile(r'\bnew URL\("\./([\w.-]+)", import\.meta\.url\)')
    seen, todo = set(), ["vrt.js"]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            text = (webtables.WEB / name).read_text()
            todo += imported.findall(text) + loaded.findall(text)
    scripts = {path[1:] for path, (_, kind) in WEB_FILES.items() if "javascript" in kind}
    assert seen == scripts
    assert {"codec.js", "protocol.js", "runner.js", "views.js", "machines.js"} < seen
    assert {"audio.js", "audio-worklet.js"} < seen
    assert {p.name for p in webtables.WEB.glob("*.js")} == seen


async def test_upgrades_pass_the_front_and_its_checks_as_before(vrt_serve: Any) -> None:
    async def nobody(request: vrt.HandshakeRequest) -> Any:
        return None  # refuse every upgrade

    server = await vrt_serve(AGENT, authenticate=nobody)
    status, _, _ = await http(server, get("/machines.js"))
    assert status == 200  # the files are public: authenticate is about sessions
    with pytest.raises(vrt.RemoteProtocolError) as refused:
        async with vrt.connect(server.url):
            pass
    assert refused.value.code == "HTTP_401"
    open_server = await vrt_serve(AGENT)
    async with vrt.connect(open_server.url) as client:  # an upgrade still gets through
        assert client.capabilities


# -- the schema checker ----------------------------------------------------------------------


TYPES = (*m.CLIENT_TYPES, *m.SERVER_TYPES)
ALL_SCHEMAS = {cls.TYPE: codec.schema_of(cls.TYPE) for cls in TYPES}

DRIVER = """
import * as checker from %s;
import { createInterface } from "node:readline";
const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  const [name, text] = JSON.parse(line);
  const schema = typeof name === "string" ? checker.SCHEMAS[name] : name;
  let answer;
  try { answer = checker.explain(schema, JSON.parse(text)); }
  catch (error) { answer = {thrown: String(error)}; }
  process.stdout.write(JSON.stringify(answer) + "\\n");
}
"""


class Node:
    """One Node process running the generated checker on a line at a time."""

    def __init__(self, folder: Path, schemas: dict[str, Any]) -> None:
        assert NODE is not None, "node is needed (.ci/run installs it)"
        module = folder / "schemas.mjs"
        module.write_text(webschemas.schemas_js(schemas))
        driver = folder / "driver.mjs"
        driver.write_text(DRIVER % json.dumps(module.as_uri()))
        self.process = subprocess.Popen(
            [NODE, str(driver)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def explain(self, schema: str | dict[str, Any], text: str) -> Any:
        """The checker's answer for the JSON ``text``: None (valid), [path, message] or
        {"thrown": ...}."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps([schema, text]) + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self) -> None:
        self.process.kill()
        self.process.communicate()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """Every shipped schema, the client's too: the page only needs the server's, but the
    checker must agree with the codec on all of them (if/then/else, not, anyOf, pattern,
    uniqueItems are only in the client's)."""
    checker = Node(tmp_path_factory.mktemp("node"), ALL_SCHEMAS)
    yield checker
    checker.close()


def python_explains(name: str, data: Any) -> str | None:
    """The codec's refusal of ``data`` as a ``name`` message (None: valid)."""
    valid = compile_schema(ALL_SCHEMAS[name])(data)
    try:
        codec.structure(json.loads(json.dumps(data)), TYPES)
    except codec.DecodeError as exc:
        refused: str | None = exc.message
    else:
        refused = None
    assert valid == (refused is None), refused
    return refused


def same_words(name: str, js: Any) -> str | None:
    """The checker's answer as the codec words its refusal."""
    if js is None:
        return None
    path, message = js
    return f"{name}: {'/'.join(str(p) for p in path) or '(message)'}: {codec.shorten(message)}"


def readable(value: Any) -> bool:
    """Whether JavaScript can quote ``value`` as Python does: no float that is a whole
    number (JavaScript reads 1.0 as 1), no integer it cannot hold, ASCII strings (both
    sides' Unicode tables need not be the same version), no key that looks like an array
    index (a JavaScript object lists those first)."""
    if isinstance(value, float):
        return not value.is_integer()
    if isinstance(value, bool) or value is None:
        return True
    if isinstance(value, int):
        return abs(value) <= 2**53
    if isinstance(value, str):
        return value.isascii()
    if isinstance(value, list):
        return all(readable(v) for v in value)
    return all(
        readable(k) and readable(v) and not re.fullmatch(r"0|[1-9][0-9]*", k)
        for k, v in value.items()
    )


def valid_examples() -> dict[str, dict[str, Any]]:
    """One valid message of every type."""
    tool = {"name": "edit", "description": "", "parameters": {"type": "object"}}
    base = {"seq": 3}
    call = {"callId": "c1", "turnId": "t_1", "epoch": 0, "name": "edit"}
    examples: dict[str, dict[str, Any]] = {
        "hello": {"seq": 1, "protocol": "vrt/1", "capabilities": ["batch-v1"], "tools": [tool],
                  "resume": {"sessionId": "s", "token": "k", "lastSeq": 4}},
        "input": {**base, "text": "hi"},
        "interrupt": {**base, "epoch": 1, "heardMs": 120},
        "tool.result": {**base, "callId": "c1", "epoch": 0, "result": {"ok": True, "output": 1}},
        "confirm.reply": {**base, "callId": "c1", "approved": False, "reason": "no"},
        "close": base,
        "ack": base,
        "welcome": {"seq": 1, "sessionId": "s", "resumeToken": "k", "epoch": 0,
                    "capabilities": ["tool-stream-v1", "audio-v1"], "resumed": False,
                    "lastSeq": 1, "audio": {"input": {"format": "pcm16", "rate": 16000},
                                            "output": {"format": "pcm16", "rate": 24000}}},
        "turn.started": {**base, "turnId": "t_1", "epoch": 0},
        "text.delta": {**base, "turnId": "t_1", "text": "Hello"},
        "tool.stream": {**base, **call, "kind": "app", "phase": "settled", "ok": False,
                        "code": "TIMEOUT", "message": "late"},
        "tool.preview": {**base, "callId": "c1", "turnId": "t_1", "name": "edit",
                         "arguments": "{", "complete": False},
        "tool.call": {**base, **call, "arguments": {"n": [1, 2.5, None]}},
        "tool.abort": {**base, "callId": "c1"},
        "confirm.request": {**base, "callId": "c1", "name": "pay", "arguments": {},
                            "risk": None, "prompt": "Pay?"},
        "turn.ended": {**base, "turnId": "t_1", "epoch": 1, "reason": "interrupted"},
        "audio.start": {**base, "turnId": "t_1", "epoch": 2},
        "audio.end": {**base, "turnId": "t_1", "sentMs": 2400},
        "transcript": {**base, "turnId": "t_1", "role": "agent", "text": "Hi"},
        "error": {**base, "code": "BAD_JSON", "message": "nope", "ref": 2},
        "closed": {**base, "reason": "overflow"},
    }  # fmt: skip
    assert examples.keys() == ALL_SCHEMAS.keys()
    return {name: {"type": name, **fields} for name, fields in examples.items()}


VALID = valid_examples()

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4)
    | st.sampled_from(["", "start", "settled", "FAILED", "low", "vrt/1", "a b"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def _mutated(name: str) -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
    base = VALID[name]
    keys = sorted(base)
    return st.builds(
        lambda drop, key, value, extra: (name, _mutate(base, drop, key, value, extra)),
        st.sampled_from([None, *keys]),
        st.sampled_from([k for k in keys if k != "type"]),
        json_values,
        st.one_of(st.none(), st.tuples(st.sampled_from(["x", "ok", *keys]), json_values)),
    )


def _mutate(
    base: dict[str, Any], drop: str | None, key: str, value: Any, extra: tuple[str, Any] | None
) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(json.dumps(base))
    if drop is not None and drop != "type":
        data.pop(drop)
    data[key] = value
    if extra is not None and extra[0] != "type":
        data[extra[0]] = extra[1]
    return data


@settings(max_examples=1000, deadline=None)
@given(st.sampled_from(sorted(VALID)).flatmap(_mutated))
def test_the_checker_refuses_what_the_codec_refuses(
    node: Node, case: tuple[str, dict[str, Any]]
) -> None:
    """Generated mutations of a valid message of each type (a field dropped, changed to
    any JSON value, one added): valid for both or refused by both, at the same path, in
    the same words wherever JavaScript can quote the values as Python does."""
    name, data = case
    js = node.explain(name, json.dumps(data))
    python = python_explains(name, data)
    assert (js is None) == (python is None), (js, python)
    if python is None:
        return
    words = same_words(name, js)
    assert words is not None
    if readable(data):
        assert words == python
    else:
        assert words.split(": ")[:2] == python.split(": ")[:2]  # the type and the path


def _stream(**fields: Any) -> tuple[str, dict[str, Any]]:
    data = {k: v for k, v in {**VALID["tool.stream"], **fields}.items() if v is not None}
    return "tool.stream", data


TOOL = {"name": "edit", "description": "", "parameters": {}}
FAILURE = {"ok": False, "code": "FAILED"}
PCM16 = {"format": "pcm16", "rate": 16000}
HAND_CASES = [
    ("turn.started", {**VALID["turn.started"], "epoch": "0"}),  # wrong type
    ("turn.started", {**VALID["turn.started"], "epoch": True}),  # a bool is no integer
    ("turn.started", {**VALID["turn.started"], "epoch": 1.5}),
    ("turn.started", {**VALID["turn.started"], "epoch": 1.0}),  # an integer in JSON Schema
    ("turn.started", {**VALID["turn.started"], "seq": -1}),
    ("turn.started", {**VALID["turn.started"], "seq": 2**53}),  # the largest allowed
    ("turn.started", {**VALID["turn.started"], "seq": 2**53 + 2}),
    ("turn.started", {**VALID["turn.started"], "seq": 2**64}),
    ("turn.started", {"type": "turn.started", "seq": 1}),  # missing required
    ("turn.started", {**VALID["turn.started"], "extra": 1, "more": 2}),  # extra keys
    ("turn.started", {**VALID["turn.started"], "constructor": 1, "__proto__": 2}),
    ("welcome", {**VALID["welcome"], "capabilities": ["a", 3]}),
    ("welcome", {**VALID["welcome"], "audio": {"input": PCM16}}),
    ("welcome", {**VALID["welcome"], "audio": {"input": {**PCM16, "format": "opus"}}}),
    ("welcome", {**VALID["welcome"], "audio": {"input": {**PCM16, "rate": 0}, "output": PCM16}}),
    ("audio.end", {**VALID["audio.end"], "sentMs": 12.5}),
    ("transcript", {**VALID["transcript"], "role": "system"}),
    ("interrupt", {**VALID["interrupt"], "heardMs": -1}),
    ("tool.call", {**VALID["tool.call"], "callId": ""}),
    ("tool.abort", {**VALID["tool.abort"], "callId": "\U0001f600"}),  # one code point
    ("confirm.request", {**VALID["confirm.request"], "risk": "extreme"}),
    ("closed", {**VALID["closed"], "reason": "too_large"}),  # local, never on the wire
    ("text.delta", {**VALID["text.delta"], "text": 'it\'s "quoted" \n\x00\x7f'}),
    ("text.delta", {**VALID["text.delta"], "text": {"it's": [1, None, True]}}),
    _stream(phase="arguments-delta", ok=None, code=None, message=None),  # delta missing
    _stream(phase="arguments-delta", delta="{", ok=None, code=None, message=None),
    _stream(ok=None, code=None),  # settled without ok
    _stream(ok=False, code=None),  # settled, not ok, without code
    _stream(ok=True, code=None, message=None),
    _stream(phase="start", ok=None, code=None, message=None),
    _stream(phase="finished"),
    _stream(kind="tool"),
    ("hello", {**VALID["hello"], "tools": [{**TOOL, "name": "high light"}]}),
    ("hello", {**VALID["hello"], "tools": [{**TOOL, "name": "ok\n"}]}),  # Python's $
    ("hello", {**VALID["hello"], "capabilities": ["a", "b", "a"]}),
    ("hello", {**VALID["hello"], "capabilities": list("abcdefghijkla")}),
    ("hello", {**VALID["hello"], "capabilities": [{"a": 1, "b": 2}, {"b": 2, "a": 1}]}),
    ("hello", {**VALID["hello"], "capabilities": [1, 1.0]}),
    ("hello", {**VALID["hello"], "capabilities": [1, True]}),
    ("hello", {**VALID["hello"], "resume": {"sessionId": "s", "token": "k"}}),
    ("tool.result", {**VALID["tool.result"], "result": {"ok": False}}),
    ("tool.result", {**VALID["tool.result"], "result": {**FAILURE, "output": 1}}),
    ("tool.result", {**VALID["tool.result"], "result": {"ok": True, "code": "FAILED"}}),
    ("tool.result", {**VALID["tool.result"], "result": {"ok": False, "code": "OOPS"}}),
    ("tool.result", {**VALID["tool.result"], "result": "ok"}),
    ("ack", {"type": "ack", "seq": 1e-5}),
    ("ack", {"type": "ack", "seq": 0.5}),
]


@pytest.mark.parametrize(("name", "data"), HAND_CASES)
def test_the_checker_words_its_refusals_as_the_codec(
    node: Node, name: str, data: dict[str, Any]
) -> None:
    assert same_words(name, node.explain(name, json.dumps(data))) == python_explains(name, data)


def test_every_valid_example_passes(node: Node) -> None:
    for name, data in VALID.items():
        assert node.explain(name, json.dumps(data)) is None, name


def test_the_differences_json_parse_leaves(node: Node) -> None:
    """What JavaScript's numbers cannot tell apart: 2**53 + 1 reads as 2**53 (the nearest
    double), so a seq of 9007199254740993 passes in the page and is refused in Python;
    1.0 reads as 1, so a message quoting it says 1 where Python says 1.0; an integer too
    big for a double is Infinity, refused as no integer rather than as over the maximum."""
    big = {**VALID["turn.started"], "seq": 2**53 + 1}
    assert node.explain("turn.started", json.dumps(big)) is None
    assert python_explains("turn.started", big) is not None
    one = {**VALID["turn.started"], "epoch": [1.0]}
    assert same_words("turn.started", node.explain("turn.started", json.dumps(one))) == (
        "turn.started: epoch: [1] is not of type 'integer'"
    )
    assert python_explains("turn.started", one) == (
        "turn.started: epoch: [1.0] is not of type 'integer'"
    )
    huge = {**VALID["turn.started"], "seq": 10**400}  # Infinity in JavaScript
    assert same_words("turn.started", node.explain("turn.started", json.dumps(huge))) == (
        "turn.started: seq: inf is not of type 'integer'"
    )
    assert "seq: 1000000" in str(python_explains("turn.started", huge))


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ({"type": "string", "format": "email"}, "unsupported keyword 'format'"),
        ({"type": "object", "additionalProperties": {"type": "string"}}, "true or false"),
        ({"properties": {"0": {}}}, "looks like an array index"),
        ({"items": {"minItems": 2}}, "unsupported keyword 'minItems'"),
        ({"propertyNames": {}}, "unsupported keyword 'propertyNames'"),
        ({"pattern": "^\\d+$"}, "reads differently"),
    ],
)
def test_the_generator_refuses_what_fastcheck_does_not_compile(
    schema: dict[str, Any], why: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        webschemas.schemas_js({"x": schema})


def test_the_checker_reads_exactly_fastchecks_keywords(node: Node) -> None:
    """If fastcheck learns a keyword, the generator refuses it until the checker reads it
    too; and the checker reads every keyword it claims to."""
    compiled = {
        *fastcheck._IGNORED,
        *fastcheck._KEYWORDS,
        *("properties", "required", "additionalProperties", "if", "then", "else"),
        "uniqueItems",
    }
    assert compiled == webschemas.KEYWORDS
    pattern = ALL_SCHEMAS["hello"]["properties"]["tools"]["items"]["properties"]["name"]
    samples: dict[str, Any] = {"type": "string", "const": 0, "enum": [0], "minimum": 0,
                               "maximum": 0, "minLength": 0, "pattern": pattern["pattern"],
                               "items": {}, "uniqueItems": True, "properties": {},
                               "required": [], "additionalProperties": False, "allOf": [{}],
                               "anyOf": [{}], "not": False, "if": {}, "then": {}, "else": {},
                               **dict.fromkeys(webschemas.IGNORED, "")}  # fmt: skip
    assert samples.keys() == compiled
    for keyword, value in samples.items():
        assert not isinstance(node.explain({keyword: value}, "0"), dict), keyword


def test_the_checker_throws_on_a_keyword_it_does_not_know(node: Node) -> None:
    assert node.explain({"type": "string", "format": "email"}, '"a"') == {
        "thrown": "Error: unsupported keyword format"
    }


PATTERNS = [
    "^[A-Za-z0-9_-]{1,64}$",
    "^a.b$",
    "a|b$",
    "^(?:ab)+c?$",
    "[\\]\\-x]",
    "^x{2,}$",
    "\\.\\$",
]
SUBJECTS = [
    *("", "a", "ab", "abc", "ab\n", "ab\n\n", "a\nb", "a\rb", "a\u2028b", "xx", "xxx\n"),
    *("b\n", "ababc", "ababc\n", "]", "-", ".$", "a_b-C9", "a" * 65, "\U0001f600"),
]


def test_patterns_match_what_python_re_search_matches(tmp_path: Path) -> None:
    checker = Node(tmp_path, {pattern: {"pattern": pattern} for pattern in PATTERNS})
    try:
        for pattern, subject in itertools.product(PATTERNS, SUBJECTS):
            matched = checker.explain(pattern, json.dumps(subject)) is None
            assert matched == (re.search(pattern, subject) is not None), (pattern, subject)
    finally:
        checker.close()


@pytest.mark.parametrize(
    "pattern", ["\\d", "\\w+", "(?i)a", "(?P<x>a)", "a*+", "a{2}+", "[]a]", "a{", "a}", "\\-"]
)
def test_patterns_that_read_differently_are_refused(pattern: str) -> None:
    with pytest.raises(ValueError, match="pattern"):
        webschemas.js_pattern(pattern)


def test_vrt_d_ts_declares_what_vrt_js_exports() -> None:
    """The declarations are written by hand: every export of vrt.js has one, and nothing
    else is declared (the types themselves are checked by tsc against tests/web/usage.ts)."""
    assert NODE is not None, "node is needed (.ci/run installs it)"
    script = f"""
    const module = await import({json.dumps((webtables.WEB / "vrt.js").as_uri())});
    console.log(JSON.stringify(Object.keys(module)));
    """
    done = subprocess.run(
        [NODE, "--input-type=module", "-e", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    declared = re.findall(
        r"^export declare (?:const|function|class) (\w+)",
        (webtables.WEB / "vrt.d.ts").read_text(),
        re.MULTILINE,
    )
    assert sorted(json.loads(done.stdout)) == sorted(declared)


CORE = """
import {{ Protocol, CAPABILITIES }} from {protocol};
import {{ Runner }} from {runner};
const [before, after] = {frames};
const events = [];
const hooks = [];
const tools = new Map([["edit", {{ name: "edit", parameters: {{ type: "object" }},
                                  run: async (args) => ({{ edited: args.n }}) }}]]);
let proto;
const runner = new Runner(tools, {{
  send: (fields) => proto.send(fields), over: () => proto.connection.final, maxMessageSize: 1 << 20,
}});
proto = new Protocol(
  {{ tools, capabilities: CAPABILITIES, maxMessageSize: 1 << 20, replayLimit: 100,
     replayLimitBytes: 1 << 21 }},
  {{
    emit: (type, d) => events.push([type, d.callId ?? d.turnId, d.phase ?? d.code ?? null]),
    queued: () => hooks.push("queued"),
    welcomed: (resumed) => hooks.push(["welcomed", resumed]),
    refusal: (error) => hooks.push(["refusal", error.code]),
    closed: (reason) => {{ hooks.push(["closed", reason]); proto.end(); }},
    finish: (reason) => hooks.push(["finish", reason]),
  }},
  runner,
);
const written = [proto.hello()];
for (const frame of before) proto.receive(frame);
runner.next();
await new Promise((resolve) => setTimeout(resolve, 10)); // the app tool answers
proto.interrupt();
for (const frame of after) proto.receive(frame);
written.push(...proto.outbox);
console.log(JSON.stringify({{ written, events, hooks, state: proto.connection.state }}));
"""


def test_the_js_core_runs_without_a_socket_and_writes_what_python_writes() -> None:
    """vrt.js's protocol core (protocol.js) and app-tool runner (runner.js) are sans-IO:
    Node drives them with frames and no WebSocket, through the client's hooks. Given the
    same frames as Python's ClientProtocol, they write the same messages (as JSON: the keys'
    order differs): the hello, an app call's result, an interrupt, and INTERRUPTED for a
    call of the old epoch; the server's late phase of a cancelled call is dropped."""
    assert NODE is not None, "node is needed (.ci/run installs it)"

    def stream(seq: int, call: str, phase: str, **more: Any) -> str:
        kind = "app" if call == "a" else "server"
        return codec.encode(
            m.ToolStreamMessage(
                seq=seq,
                call_id=call,
                turn_id="t1",
                epoch=0,
                name="edit",
                kind=kind,
                phase=phase,
                **more,
            )
        )

    before = [
        codec.encode(
            m.Welcome(
                seq=1,
                session_id="s1",
                resume_token="k",
                epoch=0,
                capabilities=tuple(m.CAPABILITIES),
                resumed=False,
                last_seq=1,
            )
        ),
        codec.encode(m.TurnStartedMessage(seq=2, turn_id="t1", epoch=0)),
        stream(3, "a", "start"),
        codec.encode(
            m.ToolCallMessage(
                seq=4, call_id="a", turn_id="t1", epoch=0, name="edit", arguments={"n": 1}
            )
        ),
        stream(5, "b", "start"),
    ]
    after = [
        stream(6, "b", "settled", ok=True),  # late: cancelled here already
        codec.encode(
            m.ToolCallMessage(seq=7, call_id="c", turn_id="t1", epoch=0, name="edit", arguments={})
        ),  # of epoch 0, after the interrupt: never runs
        codec.encode(m.ClosedMessage(seq=8, reason="server")),
    ]
    script = CORE.format(
        protocol=json.dumps((webtables.WEB / "protocol.js").as_uri()),
        runner=json.dumps((webtables.WEB / "runner.js").as_uri()),
        frames=json.dumps([before, after]),
    )
    done = subprocess.run(
        [NODE, "--input-type=module", "-e", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    got = json.loads(done.stdout)

    proto = ClientProtocol(
        [m.ToolDecl(name="edit", description="", parameters={"type": "object"})], m.CAPABILITIES
    )
    proto.hello()
    seen: list[Any] = []
    for frame in before:
        seen += proto.receive(frame)
    ticket = proto.next_app_call()
    assert ticket is not None and ticket.arguments == {"n": 1}
    proto.answer(ticket.call_id, ToolResult.success({"edited": 1}))
    seen += proto.interrupt()
    for frame in after:
        seen += proto.receive(frame)
    written = [json.loads(text) for text in got["written"]]
    assert written == [json.loads(text) for text in proto.take_outbox()]
    assert [message["type"] for message in written] == [
        "hello",
        "tool.result",
        "interrupt",
        "tool.result",
    ]

    def shown(event: Any) -> list[Any]:  # as the script writes each event down
        if isinstance(event, vrt.TurnStarted):
            return ["turn.started", event.turn_id, None]
        if isinstance(event, vrt.ToolStream):
            return ["tool.stream", event.call_id, str(event.phase)]
        return ["tool.preview", event.call_id, None]

    kinds = (vrt.TurnStarted, vrt.ToolStream, vrt.ToolPreview)
    assert got["events"] == [shown(e) for e in seen if isinstance(e, kinds)]
    assert [e[2] for e in got["events"] if e[0] == "tool.stream"] == [
        "start",
        "start",
        "cancelled",
        "cancelled",
    ]
    assert got["hooks"] == [["welcomed", False], "queued", "queued", "queued", ["closed", "server"]]
    assert got["state"] == "closed"


AUDIO_CORE = """
import {{ Protocol, CAPABILITIES }} from {protocol};
const [offer, frames] = {frames};
const got = [];
const speaker = {{
  begin: (turnId, epoch, fresh) => got.push(["begin", turnId, epoch, fresh]),
  play: (turnId, pcm, fresh) => got.push(["play", turnId, pcm.byteLength, fresh]),
  end: (turnId, sentMs) => got.push(["end", turnId, sentMs]),
  flush: (turnId, server) => got.push(["flush", turnId, server]),
  interrupted: () => {{ got.push(["interrupted"]); return 480; }},
}};
const runner = {{ admit() {{}}, abort() {{}}, abortAll() {{}} }};
const proto = new Protocol(
  {{ tools: new Map(), capabilities: CAPABILITIES, audio: offer, maxMessageSize: 1 << 20,
     replayLimit: 100, replayLimitBytes: 1 << 21 }},
  {{
    emit: (type, d) => got.push([type, d.code ?? d.turnId, d.message ?? d.text ?? null]),
    queued() {{}}, welcomed() {{}}, refusal() {{}}, closed() {{}}, finish() {{}},
    speaker: () => speaker,
  }},
  runner,
);
const written = [proto.hello()];
for (const frame of frames) {{
  if (frame === "interrupt") proto.interrupt();
  else proto.receive(typeof frame === "number" ? new ArrayBuffer(frame) : frame);
}}
written.push(...proto.outbox);
console.log(JSON.stringify({{ written, got, caps: proto.capabilities, audio: proto.audio }}));
"""


def audio_core(offer: bool, frames: list[str | int]) -> dict[str, Any]:
    """vrt.js's protocol core driven by Node: ``frames`` from the server (an int: a binary
    frame of that many bytes; "interrupt": the user's), what it wrote and what its speaker
    and the app were told."""
    assert NODE is not None, "node is needed (.ci/run installs it)"
    script = AUDIO_CORE.format(
        protocol=json.dumps((webtables.WEB / "protocol.js").as_uri()),
        frames=json.dumps([offer, frames]),
    )
    done = subprocess.run(
        [NODE, "--input-type=module", "-e", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


FORMATS = {"input": PCM16, "output": {**PCM16, "rate": 24000}}


def server_frame(type_: str, seq: int, **fields: Any) -> str:
    return json.dumps({"type": type_, "seq": seq, **fields})


def audio_welcome(**more: Any) -> str:
    welcome = {k: v for k, v in VALID["welcome"].items() if k not in ("type", "seq", "audio")}
    return server_frame("welcome", 1, **{**welcome, "capabilities": ["audio-v1"], **more})


def test_the_js_core_gates_audio_by_epoch() -> None:
    """audio-v1 in vrt.js's sans-IO core: offered with ``audio``; binary frames checked (a
    whole number of samples, at most 100 ms, inside a span) and handed to the speaker
    with the epoch gate's verdict (a span of the epoch the user interrupted, or of an
    older one, is never played); the interrupt carries the speaker's heardMs; the agent's
    words of the interrupted turn are dropped with its audio; the server's turn.ended
    ``interrupted`` flushes it."""
    started = server_frame("turn.started", 2, turnId="t1", epoch=0)
    got = audio_core(True, [
        audio_welcome(audio=FORMATS),
        started,
        server_frame("audio.start", 3, turnId="t1", epoch=0),
        960,  # 20 ms at 24 kHz
        4800,  # 100 ms: the most a frame holds
        4802,
        961,
        "interrupt",
        960,  # crossed the interrupt: of epoch 0, now stale
        server_frame("audio.end", 4, turnId="t1", sentMs=260),
        960,  # outside a span
        server_frame("transcript", 5, turnId="t1", role="user", text="Stop"),
        server_frame("transcript", 6, turnId="t1", role="agent", text="Hello"),  # not heard
        server_frame("turn.ended", 7, turnId="t1", epoch=1, reason="interrupted"),
        server_frame("audio.start", 8, turnId="t0", epoch=0),  # behind: dropped whole
        960,
        server_frame("audio.end", 9, turnId="t0", sentMs=20),
        server_frame("turn.started", 10, turnId="t2", epoch=1),
        server_frame("audio.start", 11, turnId="t2", epoch=1),
        960,
        server_frame("transcript", 12, turnId="t2", role="agent", text="Hi"),
        server_frame("audio.end", 13, turnId="t2", sentMs=20),
        server_frame("turn.ended", 14, turnId="t2", epoch=2, reason="interrupted"),
    ])  # fmt: skip
    assert "audio-v1" in json.loads(got["written"][0])["capabilities"]
    assert got["caps"] == ["audio-v1"] and got["audio"] == FORMATS
    assert json.loads(got["written"][1]) == {"type": "interrupt", "epoch": 1, "heardMs": 480,
                                             "seq": 2}  # fmt: skip
    assert [g for g in got["got"] if g[0] != "turn.started"] == [
        ["begin", "t1", 0, True],
        ["play", "t1", 960, True],
        ["play", "t1", 4800, True],
        ["error", "TOO_LARGE", "from the server: an audio frame of 4802 bytes is over 100 ms "
                               "(4800 bytes at 24000 Hz)"],
        ["error", "BAD_MESSAGE", "from the server: an audio frame of 961 bytes: PCM16 takes a "
                                 "whole number of 2-byte samples"],
        ["interrupted"],
        ["play", "t1", 960, False],
        ["end", "t1", 260],
        ["error", "BAD_MESSAGE", "from the server: an audio frame outside an "
                                 "audio.start/audio.end span"],
        ["transcript", "t1", "Stop"],
        ["flush", "t1", True],  # (audio.js: t1 was cut by the user's interrupt already)
        ["turn.ended", "t1", None],
        ["begin", "t0", 0, False],
        ["play", "t0", 960, False],
        ["end", "t0", 20],
        ["begin", "t2", 1, True],
        ["play", "t2", 960, True],
        ["transcript", "t2", "Hi"],
        ["end", "t2", 20],
        ["flush", "t2", True],  # the server's interrupt
        ["turn.ended", "t2", None],
    ]  # fmt: skip


def test_without_audio_v1_the_js_core_refuses_audio_as_the_python_client() -> None:
    """Not offered, or granted without its rates: binary frames are BAD_MESSAGE and the
    audio messages unknown types, in the Python client's words; the interrupt has no
    heardMs."""
    frames = [
        server_frame("audio.start", 2, turnId="t1", epoch=0),
        960,
        server_frame("transcript", 3, turnId="t1", role="user", text="hi"),
    ]
    python = ClientProtocol([])
    python.hello()
    expected = []
    for frame in [audio_welcome(audio=FORMATS), *frames]:
        for item in python.receive(frame if frame != 960 else bytes(960)):
            if isinstance(item, m.Error):
                expected.append(["error", item.code, item.message])
    assert len(expected) == 3
    for offer, welcome in [(False, audio_welcome(audio=FORMATS)), (True, audio_welcome())]:
        got = audio_core(offer, [welcome, *frames, "interrupt"])
        assert got["caps"] == [] and got["audio"] is None
        errors = [g for g in got["got"] if g[0] == "error"]
        if offer:  # granted without its rates: not granted
            rates = "from the server: audio-v1 without the audio rates"
            assert errors.pop(0) == ["error", "BAD_MESSAGE", rates]
        assert errors == expected
        assert json.loads(got["written"][-1]) == {"type": "interrupt", "epoch": 1, "seq": 2}


WORKLETS = """
globalThis.sampleRate = 48000;
globalThis.currentTime = 0;
const registered = {{}};
globalThis.AudioWorkletProcessor = class {{
  constructor() {{ this.port = {{ posted: [], postMessage(m) {{ this.posted.push(m); }} }}; }}
}};
globalThis.registerProcessor = (name, cls) => {{ registered[name] = cls; }};
await import({worklet});
const pcm = (n, value) => {{
  const view = new DataView(new ArrayBuffer(n * 2));
  for (let i = 0; i < n; i++) view.setInt16(i * 2, value, true);
  return view.buffer;
}};
const round = (xs) => Array.from(xs, (x) => Math.round(x * 1e4) / 1e4);
const out = {{}};

// the speaker: 24 kHz chunks played at 48 kHz, flushed, a new turn after the flush
const p = new registered["vrt-playback"]({{ processorOptions: {{ rate: 24000, limit: 24000 }} }});
const send = (data) => p.port.onmessage({{ data }});
const quantum = () => {{
  const channel = new Float32Array(128);
  p.process([], [[channel]]);
  currentTime += 128 / sampleRate;
  return channel;
}};
send({{ type: "pcm", turn: "a", pcm: pcm(480, 16384) }});  // 20 ms of 0.5
send({{ type: "pcm", turn: "a", pcm: pcm(4800, 16384) }});  // 100 ms more
const first = quantum();
out.first = [first[0], first[127]];
quantum();
send({{ type: "flush" }});
send({{ type: "pcm", turn: "b", pcm: pcm(480, -8192) }});  // after the flush: played
const flushedAt = currentTime;
const cut = quantum();
out.cut = round([cut[0], cut[1], cut[63], cut[64], cut[127]]);
out.flushed = p.port.posted.at(-1);
out.flushedAt = flushedAt;
let rest = 0;
for (let q = 0; q < 10; q++) rest += quantum().filter((x) => x !== 0).length;
out.rest = rest;
send({{ type: "pcm", turn: "c", pcm: pcm(24001, 1) }});  // over the limit: refused
send({{ type: "stats", id: 7 }});
out.stats = p.port.posted.at(-1);

// the microphone: 48 kHz in, 16 kHz PCM16 frames of 320 samples out
const c = new registered["vrt-capture"]({{ processorOptions: {{ rate: 16000, frame: 320 }} }});
const block = new Float32Array(128).fill(0.5);
for (let b = 0; b < 30; b++) c.process([[block]]);
const sample = (pcm) => new DataView(pcm).getInt16(0, true);
out.frames = c.port.posted.map(({{ pcm, level }}) => [pcm.byteLength, sample(pcm), level]);
c.process([[]]);  // no input connected: nothing
c.port.onmessage({{ data: "stop" }});
out.stopped = c.process([[block]]);
console.log(JSON.stringify(out));
"""


def test_the_audio_worklets_flush_within_a_quantum_and_resample() -> None:
    """audio-worklet.js's processors, run by Node in a stand-in AudioWorkletGlobalScope:
    the speaker plays 24 kHz at 48 kHz; a flush fades out over 64 frames of the next render
    quantum and drops what was queued before it (not what came after it: a new turn plays
    on), and reports where it is; a flood over its bound is refused. The microphone sends
    frames of exactly 320 samples at 16 kHz from 48 kHz input, with their level."""
    assert NODE is not None, "node is needed (.ci/run installs it)"
    script = WORKLETS.format(worklet=json.dumps((webtables.WEB / "audio-worklet.js").as_uri()))
    done = subprocess.run(
        [NODE, "--input-type=module", "-e", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    got = json.loads(done.stdout)
    assert got["first"] == [0.5, 0.5]
    # the fade: full at the flush, 1/64 of it on frame 63; then turn b, after the flush
    assert got["cut"] == [0.5, round(0.5 * 63 / 64, 4), round(0.5 / 64, 4), -0.25, -0.25]
    flushed = got["flushed"]
    assert flushed["type"] == "report" and flushed["flushTime"] == got["flushedAt"]
    assert flushed["played"] == {"a": 2 * 128 + 64, "b": 64}
    assert flushed["head"] == "b" and flushed["queued"] == 480 - 32
    assert got["rest"] == 960 - 64  # b's 20 ms, then silence
    stats = got["stats"]
    assert stats["id"] == 7 and stats["dropped"] == 24001 and stats["queued"] == 0
    assert stats["played"] == {"a": 320, "b": 960} and stats["lastSound"] is not None
    assert got["frames"] == [[640, 16383, 0.5]] * 4  # 30 blocks of 128: 1280 samples at 16 kHz
    assert got["stopped"] is False
