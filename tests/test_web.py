"""The browser client's files: machines.js is generated from machines/ and current, and its
tables, run by Node, accept exactly what the Python tables accept."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import h11
import pytest
import trio

import vrt
from vrt._cli import main, webtables
from vrt._core.tables import Table

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
    assert webtables.check(tmp_path) == [f"{tmp_path / 'machines.js'}: stale (a class in "
                                         "machines/ changed)"]  # fmt: skip
    assert webtables.check(tmp_path / "nowhere") == [f"{tmp_path / 'nowhere/machines.js'}: missing"]


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
    for path, kind in (("/vrt.js", "text/javascript"), ("/vrt.d.ts", "text/plain")):
        status, headers, body = await http(server, get(path))
        assert status == 200 and body == (webtables.WEB / path[1:]).read_bytes(), path
        assert headers["content-type"] == f"{kind}; charset=utf-8"


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
