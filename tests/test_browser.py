"""vrt.js in a real browser: Debian's Chromium, headless, driven by Playwright for Python
(``executable_path``: no browser download), against ``vrt serve`` in a subprocess.

The page is any document of the server's origin (a 404 is one), so ``import("/vrt.js")``
loads the module the server's HTTP front serves.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

import vrt
from tests.web_bad_server import CASES, WELCOME, Case, frame
from tests.web_nodes import SCRIPTS, HandingOver, Nodes, handing_over, nodes
from vrt._cluster.store import session_key
from vrt._wire import messages as m
from vrt._wire.client import ClientProtocol

ROOT = Path(__file__).parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.network  # a real browser and a server process: the first pass only


@contextmanager
def serving(name: str, command: tuple[str, ...] = ()) -> Iterator[str]:
    """``vrt serve tests.web_agent:NAME --port 0`` (or ``vrt COMMAND``): its ws:// URL; no
    ERROR logged."""
    command = command or ("serve", f"tests.web_agent:{name}", "--port", "0")
    process = subprocess.Popen(
        [sys.executable, "-m", "vrt", *command],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        yield line.split(" on ")[1].strip()
    finally:
        process.send_signal(signal.SIGINT)
        try:
            _, err = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            _, err = process.communicate()
        errors = [x for x in err.decode().splitlines() if " ERROR " in x or "Traceback" in x]
        assert not errors, errors


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with serving("agent") as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's chromium, headless, for the module's tests."""
    from playwright.sync_api import sync_playwright

    assert CHROMIUM is not None, "Debian's chromium is needed (.ci/run installs it)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


def open_page(browser: Any, url: str) -> Any:
    """A page of the server's origin (its machines.js; https:// for a wss:// URL), its
    console kept on ``console``. ``browser`` may be a browser context."""
    page = browser.new_page()
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    # The browser asks for /favicon.ico, which the server rightly answers 404: answered
    # here instead, so its console error never lands late among the test's own (under
    # load it came after a fixed 200 ms wait).
    page.route("**/favicon.ico", lambda route: route.fulfill(status=204))
    page.goto("http" + url[2:] + "machines.js")
    console.clear()
    page.console = console
    return page


def run_js(page: Any, script: str, arg: Any, within: float = 30) -> Any:
    """``page.evaluate(script, arg)`` that fails after ``within`` seconds instead of
    hanging (Playwright's evaluate has no timeout of its own)."""
    wrapped = (
        f"async (arg) => Promise.race([({script})(arg), new Promise((_, no) => "
        f"setTimeout(() => no(new Error('no answer within {within:g} s')), {within * 1000:.0f}))])"
    )
    return page.evaluate(wrapped, arg)


@pytest.fixture(scope="module")
def page(browser: Any, server: str) -> Any:
    return open_page(browser, server)


RUN = """async ([url, capabilities]) => {
  const { connect } = await import("/vrt.js");
  const log = [];
  const events = [];
  const client = await connect(url, {
    capabilities,
    tools: [{
      name: "edit", description: "edit the document", parameters: {type: "object"},
      run: async (args, ctx) => {
        log.push(["begin", args.n, ctx.callId, ctx.signal instanceof AbortSignal]);
        await new Promise((r) => setTimeout(r, 30 * (4 - args.n)));
        log.push(["end", args.n]);
        return {edited: args.n};
      },
    }],
  });
  for (const type of ["tool.stream", "tool.preview", "turn.started", "text.delta", "turn.ended"]) {
    client.addEventListener(type, (e) => events.push([type, e.detail]));
  }
  const ended = new Promise((r) => client.addEventListener("turn.ended", r, {once: true}));
  await client.sendText("go");
  await ended;
  const caps = client.capabilities;
  await client.close();
  return {log, events, caps, closed: client.closed};
}"""


def python_events(
    url: str, capabilities: tuple[str, ...], ssl_context: ssl.SSLContext | None = None
) -> list[list[Any]]:
    """The same session with the Python client: its events in the browser's shape."""

    @vrt.app_tool(name="edit", parameters={"type": "object"})
    async def edit(args: Any, ctx: vrt.ToolContext) -> Any:
        await trio.sleep(0.03 * (4 - args["n"]))
        return {"edited": args["n"]}

    out: list[list[Any]] = []

    async def main() -> None:
        async with vrt.connect(
            url, tools=[edit], capabilities=capabilities, ssl_context=ssl_context
        ) as client:
            async with client.subscribe() as events:
                await client.send_text("go")
                async for event in events:
                    shown = as_page_event(event)
                    if shown is not None and shown[0] not in ("reconnecting", "resumed"):
                        out.append(shown)
                    if isinstance(event, vrt.TurnEnded):
                        break

    trio.run(main)
    return out


def as_page_event(event: Any) -> list[Any] | None:
    """A Python client's event as the page records it (``[type, detail]``), or None."""
    from vrt._server.frames import message_of

    if isinstance(event, vrt.Reconnecting | vrt.Resumed):
        return ["reconnecting" if isinstance(event, vrt.Reconnecting) else "resumed", {}]
    if isinstance(event, vrt.Closed):
        return ["closed", {"reason": event.reason}]
    message = message_of(event, tool_stream=True)
    if message is None:
        return None
    cls, fields = message
    data = json.loads(json.dumps({"type": cls.TYPE, **fields}))
    wire = {_camel(k): v for k, v in data.items() if v is not None}
    return [wire.pop("type"), wire]


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def test_vrt_js_offers_what_the_python_client_offers(page: Any) -> None:
    got = page.evaluate("async () => { const m = await import('/vrt.js'); "
                        "return [m.CAPABILITIES, m.LEGACY]; }")  # fmt: skip
    assert got == [list(m.CAPABILITIES), list(m.LEGACY)]


@pytest.mark.parametrize("offer", ["all", "legacy"])
def test_vrt_js_runs_a_turn_like_the_python_client(server: str, page: Any, offer: str) -> None:
    caps = list(m.CAPABILITIES) if offer == "all" else ["tool-stream-v1"]
    got = run_js(page, RUN, [server, caps])
    assert got["caps"] == caps and got["closed"] == "client"
    # serial, in arrival order, though the first is the slowest; ctx.signal an AbortSignal
    assert [x[:2] for x in got["log"]] == [
        ["begin", 1], ["end", 1], ["begin", 2], ["end", 2], ["begin", 3], ["end", 3]
    ]  # fmt: skip
    assert all(x[3] for x in got["log"] if x[0] == "begin")
    expected = python_events(server, tuple(caps))
    assert got["events"] == expected
    assert not [c for c in page.console if c.startswith(("error", "pageerror"))], page.console


SCENARIO = """async ([url, scenario]) => {
  const { connect } = await import("/vrt.js");
  const seen = [];
  const aborted = [];
  const client = await connect(url, {
    tools: [{
      name: "edit", description: "", parameters: {type: "object"},
      run: (args, ctx) => new Promise((resolve) => {
        seen.push(["run", args.n]);
        ctx.signal.addEventListener("abort", () => aborted.push([args.n, ctx.signal.reason]));
        setTimeout(() => resolve({n: args.n}), scenario === "timeout" ? 1500 : 5000);
        if (scenario === "interrupt") {
          queueMicrotask(() => {
            client.interrupt();
            seen.push(["interrupted, epoch", client.epoch]);
          });
        }
      }),
    }],
  });
  for (const type of ["tool.stream", "turn.ended", "confirm.request", "error"]) {
    client.addEventListener(type, (e) => {
      const d = e.detail;
      seen.push([type, d.phase ?? d.reason ?? d.code ?? d.name, d.code ?? null]);
      if (type === "confirm.request") d.deny("not today");
    });
  }
  const ended = new Promise((r) => client.addEventListener("turn.ended", r, {once: true}));
  await client.sendText("go");
  await ended;
  await new Promise((r) => setTimeout(r, scenario === "timeout" ? 1600 : 100));
  await client.close();
  return {seen, aborted, closed: client.closed};
}"""


def scenario(browser: Any, agent: str, name: str) -> dict[str, Any]:
    with serving(agent) as url:
        page = open_page(browser, url)
        result: dict[str, Any] = run_js(page, SCENARIO, [url, name])
        assert not [c for c in page.console if c.startswith(("error", "pageerror"))], page.console
        page.close()
    return result


def test_interrupt_cancels_every_open_call_locally_at_once(browser: Any) -> None:
    got = scenario(browser, "slow", "interrupt")
    seen = got["seen"]
    # the running call and the streamed second one are cancelled before anything from the
    # server comes back; the second never runs; the running tool's signal says why
    cut = seen.index(["interrupted, epoch", 1])
    cancelled = [s for s in seen[:cut] if s[:2] == ["tool.stream", "cancelled"]]
    assert len(cancelled) == 2, seen
    assert [s for s in seen if s[0] == "run"] == [["run", 1]]
    assert got["aborted"] == [[1, "interrupted"]]
    assert ["turn.ended", "interrupted", None] in seen
    assert not [s for s in seen if s[0] == "error"], seen
    assert got["closed"] == "client"


def test_a_confirmation_is_asked_and_denied_in_the_page(browser: Any) -> None:
    seen = scenario(browser, "confirming", "confirm")["seen"]
    assert ["confirm.request", "delete", None] in seen
    settled = [s for s in seen if s[:2] == ["tool.stream", "settled"]]
    assert settled == [["tool.stream", "settled", "REJECTED"]]


def test_an_app_call_over_its_timeout_is_aborted_in_the_page(browser: Any) -> None:
    got = scenario(browser, "timing_out", "timeout")
    settled = [s for s in got["seen"] if s[:2] == ["tool.stream", "settled"]]
    assert settled == [["tool.stream", "settled", "TIMEOUT"]]
    assert got["aborted"] == [[9, "timeout"]]  # tool.abort reached the page's tool
    assert not [s for s in got["seen"] if s[0] == "error"], got["seen"]  # no late result


START = """async ([url]) => {
  const { connect } = await import("/vrt.js");
  const state = (window.vrtTest = {log: [], events: [], lifecycle: []});
  // A fixed wait here raced the cut on a loaded machine (the turn could end first)
  state.cut = new Promise((r) => (state.wasCut = r));
  let running;
  const runningNow = new Promise((r) => (running = r));
  const client = await connect(url, {
    resume: {backoff: 50},
    tools: [{
      name: "edit", description: "", parameters: {type: "object"},
      run: async (args, ctx) => {
        state.log.push(["begin", args.n]);
        running();
        await state.cut;  // answered only once the page has lost the connection
        state.log.push(["end", args.n]);
        return {edited: args.n};
      },
    }],
  });
  for (const type of ["tool.stream", "tool.preview", "turn.started", "text.delta", "turn.ended"]) {
    client.addEventListener(type, (e) => state.events.push([type, e.detail]));
  }
  for (const type of ["reconnecting", "resumed", "closed"]) {
    client.addEventListener(type, () => state.lifecycle.push(type));
  }
  client.addEventListener("reconnecting", () => state.wasCut(), {once: true});
  state.ended = new Promise((r) => client.addEventListener("turn.ended", r, {once: true}));
  state.client = client;
  await client.sendText("go");
  await runningNow;  // the first app tool runs: the test cuts the connection now
}"""

FINISH = """async () => {
  const state = window.vrtTest;
  await state.ended;
  await state.client.close();
  return {log: state.log, events: state.events, lifecycle: state.lifecycle};
}"""


def test_a_cut_while_an_app_tool_runs_resumes_with_nothing_lost_or_run_twice(
    browser: Any, server: str
) -> None:
    port = server.rsplit(":", 1)[1].strip("/")
    proxy = subprocess.Popen(
        [sys.executable, "tests/web_proxy.py", port],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert proxy.stdin is not None and proxy.stdout is not None
        through = f"ws://127.0.0.1:{int(proxy.stdout.readline())}/"
        page = open_page(browser, server)
        run_js(page, START, [through])
        proxy.stdin.write(b"cut\n")
        proxy.stdin.flush()
        assert proxy.stdout.readline().decode().strip() == "cut 1"
        got = run_js(page, FINISH, None)
    finally:
        proxy.kill()
        proxy.communicate()
    assert got["lifecycle"] == ["reconnecting", "resumed", "closed"]
    ran = [x[1] for x in got["log"] if x[0] == "begin"]
    assert ran == [1, 2, 3]  # each app tool exactly once, in order, across the cut
    expected = python_events(server, m.CAPABILITIES)
    assert got["events"] == expected  # the app saw what an uncut session shows
    assert not [c for c in page.console if c.startswith(("error", "pageerror"))], page.console


def test_vrt_js_runs_a_turn_over_wss(browser: Any, tmp_path: Path) -> None:
    """TLS: ``vrt serve --certfile --keyfile`` with a certificate of a trustme CA (which
    the browser context is told to accept): the page loads vrt.js from the HTTPS front and
    runs a turn over wss://, with the Python client's events over wss://."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    certfile, keyfile = tmp_path / "cert.pem", tmp_path / "key.pem"
    certfile.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    cert.private_key_pem.write_to_path(str(keyfile))
    command = ("serve", "tests.web_agent:agent", "--port", "0",
               "--certfile", str(certfile), "--keyfile", str(keyfile))  # fmt: skip
    with serving("", command) as url:
        assert url.startswith("wss://127.0.0.1:"), url
        context = browser.new_context(ignore_https_errors=True)
        page = open_page(context, url)
        assert page.url.startswith("https://127.0.0.1:"), page.url
        caps = list(m.CAPABILITIES)
        got = run_js(page, RUN, [url, caps])
        console = page.console
        context.close()
        client_context = ssl.create_default_context()
        ca.configure_trust(client_context)
        expected = python_events(url, tuple(caps), client_context)
    assert got["closed"] == "client" and got["events"][-1][0] == "turn.ended", got
    assert got["events"] == expected
    assert not [c for c in console if c.startswith(("error", "pageerror"))], console


def test_a_page_of_another_origin_imports_the_client(browser: Any, server: str) -> None:
    page = browser.new_page()
    # localhost and 127.0.0.1 are two origins: the module is fetched cross-origin (CORS)
    page.goto(server.replace("ws://127.0.0.1", "http://localhost") + "machines.js")
    url = server.replace("ws://", "http://") + "vrt.js"
    kinds = page.evaluate(
        "async (url) => { const m = await import(url); return [typeof m.connect, m.PROTOCOL]; }",
        url,
    )
    assert kinds == ["function", "vrt/1"]
    page.close()


def test_the_web_demo_page_completes_its_script(browser: Any) -> None:
    """``vrt demo --web``: the page says what it is and what to try; it hosts the demo's
    app tools, answers its confirmations and interrupts the last turn while the map draws,
    with no console error (no 404 for its icon either: a fresh context, so nothing cached);
    the agent's text of two model steps reads with a space between them, and progress
    reads as words, not JSON."""
    with serving("", ("demo", "--web", "--port", "0", "--fast")) as url:
        context = browser.new_context()
        page = context.new_page()
        console: list[str] = []
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
        page.goto(url.replace("ws://", "http://") + "?autorun&scale=0.1")
        page.wait_for_function("window.demoResult && window.demoResult.done", timeout=60_000)
        page.wait_for_timeout(200)  # anything the page would still log
        got = page.evaluate("window.demoResult")
        text = page.inner_text("body")
        transcript = page.inner_text("#transcript")
        reports = [e.inner_text() for e in page.query_selector_all("#calls .report")]
        context.close()
        # GET /metrics while the demo serves (trio-vrt[metrics]): the calls by result code
        metrics_url = url.replace("ws://", "http://") + "metrics"
        with urllib.request.urlopen(metrics_url, timeout=5) as answer:
            exposition = answer.read().decode()
    assert console == []
    calls = [x for x in exposition.splitlines() if x.startswith("vrt_tool_calls_total{")]
    for code in ("OK", "REJECTED", "INVALID", "INTERRUPTED"):
        assert any(f'vrt_result_code="{code}"' in x for x in calls), (code, calls)
    assert got["turns"] == ["finished"] * 4 + ["interrupted"]
    assert [r["name"] for r in got["runs"]] == [
        "open_panel", "highlight", "scroll_to", "show_map"
    ]  # fmt: skip
    assert got["runs"][-1]["outcome"] == "aborted (interrupted)"
    assert "REJECTED" in text and "INVALID" in text  # the denied insurance, the bad seat
    assert "whatever you type" in text and "Try:" in text  # the page says what it is
    assert "Let me look for flights. I found 3 flights" in transcript
    assert not re.search(r"[.?!;][A-Za-z]", transcript), transcript  # no step runs on
    assert "checked Norwegian, 3 of 3" in reports and "paying 189 EUR" in reports
    assert [r for r in reports if re.fullmatch(r"page [1-8] of 8", r)], reports
    assert not [r for r in reports if "{" in r or '"' in r], reports


TWO_TURNS = """async ([url]) => {
  const { connect } = await import("/vrt.js");
  const log = [], events = [], lifecycle = [];
  const client = await connect(url, {
    resume: {backoff: 20, maxBackoff: 200},
    tools: [{
      name: "edit", description: "", parameters: {type: "object"},
      run: async (args, ctx) => {
        log.push(args.n);
        await new Promise((r) => setTimeout(r, 10));
        return {edited: args.n};
      },
    }],
  });
  for (const type of ["tool.stream", "tool.preview", "turn.started", "text.delta", "turn.ended"]) {
    client.addEventListener(type, (e) => events.push([type, e.detail]));
  }
  for (const type of ["reconnecting", "resumed"]) {
    client.addEventListener(type, () => lifecycle.push(type));
  }
  for (const text of ["first", "second"]) {
    const ended = new Promise((r) => client.addEventListener("turn.ended", r, {once: true}));
    await client.sendText(text);
    await ended;
  }
  await client.close();
  return {log, events, lifecycle, closed: client.closed};
}"""


def through_cutter(
    page: Any, server: str, direction: str, n: int, before: bool, drop: int = 0
) -> Any:
    """The two-turn session through tests/web_cutter.py; its result and the counts."""
    cutter = subprocess.Popen(
        [
            sys.executable,
            "tests/web_cutter.py",
            server,
            direction,
            str(n),
            str(int(before)),
            str(drop),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert cutter.stdout is not None
        port = int(cutter.stdout.readline())
        got = run_js(page, TWO_TURNS, [f"ws://127.0.0.1:{port}/"])
        line = cutter.stdout.readline().decode().split()
        frames = {k: int(v) for k, v in (x.split("=") for x in line[1:])}
    finally:
        cutter.kill()
        cutter.communicate()
    return got, frames


def test_a_cut_at_every_message_gives_the_page_the_same_session(browser: Any, server: str) -> None:
    """Fault injection in the browser: the two-turn session cut before and after every
    message in each direction resumes to the same app-facing events as the uncut run,
    each app tool run exactly once."""
    page = open_page(browser, server)
    uncut, frames = through_cutter(page, server, "send", 10**6, False)
    assert uncut["lifecycle"] == [] and uncut["closed"] == "client"
    assert sorted(uncut["log"]) == [1, 2, 3]
    assert frames["send"] >= 4 and frames["receive"] >= 4, frames
    runs = 0
    for direction in ("send", "receive"):
        for n in range(1, frames[direction] + 1):
            for before in (True, False):
                where = f"cut {'before' if before else 'after'} {direction} message {n}"
                got, _ = through_cutter(page, server, direction, n, before)
                assert got["events"] == uncut["events"], where
                assert sorted(got["log"]) == [1, 2, 3], where  # each ran exactly once
                assert got["closed"] == "client", where
                runs += 1
    assert runs == 2 * (frames["send"] + frames["receive"])
    assert not [c for c in page.console if c.startswith(("error", "pageerror"))], page.console


STALE = """async ([url]) => {
  const { connect } = await import("/vrt.js");
  const ran = [];
  const client = await connect(url, {
    tools: [{
      name: "edit", description: "", parameters: {type: "object"},
      run: (args, ctx) => new Promise((resolve) => {
        ran.push(args.n);
        ctx.signal.addEventListener("abort", () => resolve(null));
        if (args.n === 1) queueMicrotask(() => client.interrupt());  // epoch 0 -> 1
      }),
    }],
  });
  const ended = new Promise((r) => client.addEventListener("turn.ended", r, {once: true}));
  await client.sendText("go");
  await ended;
  await client.close();
  return {ran, epoch: client.epoch};
}"""


def test_a_call_of_an_older_epoch_never_runs_in_the_page(browser: Any, server: str) -> None:
    """The epoch gate: after interrupt() (epoch 1) a tool.call of epoch 0 is answered
    INTERRUPTED at once and its tool never runs (a hand-written server sends it)."""
    raw = subprocess.Popen(
        [sys.executable, "tests/web_stale_server.py"], cwd=ROOT, stdout=subprocess.PIPE
    )
    try:
        assert raw.stdout is not None
        port = int(raw.stdout.readline())
        page = open_page(browser, server)
        got = run_js(page, STALE, [f"ws://127.0.0.1:{port}/"])
    finally:
        raw.kill()
        out, _ = raw.communicate()
    sent = [json.loads(line) for line in out.decode().splitlines()]
    assert got == {"ran": [1], "epoch": 1}
    results = {m["callId"]: m for m in sent if m["type"] == "tool.result"}
    assert results["c2"]["result"] == {
        "ok": False,
        "code": "INTERRUPTED",
        "message": "the call's turn was interrupted",
    }
    assert results["c2"]["epoch"] == 0
    assert "c1" not in results  # aborted by the interrupt: its late answer is never sent
    assert [m["epoch"] for m in sent if m["type"] == "interrupt"] == [1]


def test_a_server_shutdown_reaches_the_page_as_closed(browser: Any) -> None:
    """closed is final: the server's shutdown ends the session in the page (no resume)."""
    with serving("agent") as url:
        page = open_page(browser, url)
        page.evaluate(
            """async ([url]) => {
              const { connect } = await import("/vrt.js");
              const client = await connect(url);
              window.shut = new Promise((r) => client.addEventListener("closed", (e) =>
                r([e.detail.reason, client.closed]), {once: true}));
            }""",
            [url],
        )
    # leaving serving() sent SIGINT: vrt serve closes every session with reason shutdown
    assert run_js(page, "async () => window.shut", None) == ["shutdown", "shutdown"]
    page.close()


FAILURES = """async ([url]) => {
  const { connect, VrtError } = await import("/vrt.js");
  let refused = null;
  try {
    await connect(url, {tools: [{name: "lookup", parameters: {type: "object"}, run: () => 1}]});
  } catch (error) {
    refused = [error instanceof VrtError, error.code];
  }
  const client = await connect(url, {
    tools: [{
      name: "edit", parameters: {type: "object"},
      run: (args) => { if (args.n === 1) throw new TypeError("boom"); },  // undefined: null
    }],
  });
  const settled = [];
  client.addEventListener("tool.stream", (e) => {
    if (e.detail.phase === "settled") settled.push([e.detail.ok, e.detail.code ?? null,
                                                    e.detail.message ?? null]);
  });
  const ended = new Promise((r) => client.addEventListener("turn.ended", r, {once: true}));
  await client.sendText("go");
  await ended;
  await client.close();
  return {refused, settled};
}"""


def test_a_tool_conflict_is_refused_and_a_throwing_tool_is_failed(browser: Any) -> None:
    with serving("slow_with_lookup") as url:
        page = open_page(browser, url)
        got = run_js(page, FAILURES, [url])
        page.close()
    assert got["refused"] == [True, "TOOL_CONFLICT"]
    assert got["settled"] == [[False, "FAILED", "TypeError: boom"], [True, None, None]]


def test_a_resume_attempt_that_drops_is_followed_by_another(browser: Any, server: str) -> None:
    """The first two resume attempts connect and are closed at once: the third gets the
    session back, and the page sees the uncut session's events."""
    page = open_page(browser, server)
    uncut, _ = through_cutter(page, server, "send", 10**6, False)
    got, _ = through_cutter(page, server, "receive", 6, True, drop=2)
    assert got["lifecycle"] == ["reconnecting", "resumed"]
    assert got["events"] == uncut["events"] and sorted(got["log"]) == [1, 2, 3]
    assert not [c for c in page.console if c.startswith(("error", "pageerror"))], page.console


# -- a broken server -------------------------------------------------------------------------


@attrs.frozen
class BadServer:
    url: str
    received: list[list[Any]]
    """``[case, message]`` for every message a client sent, as the server printed them."""


@pytest.fixture(scope="module")
def bad_server() -> Iterator[BadServer]:
    """tests/web_bad_server.py: each path a case of broken frames."""
    process = subprocess.Popen(
        [sys.executable, "tests/web_bad_server.py"], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        received: list[list[Any]] = []
        lines = process.stdout
        reader = threading.Thread(
            target=lambda: received.extend(json.loads(line) for line in lines), daemon=True
        )
        reader.start()
        yield BadServer(f"ws://127.0.0.1:{port}/", received)
    finally:
        process.kill()
        process.communicate()


BROKEN = """async ([url, patch, go]) => {
  const { connect } = await import("/vrt.js");
  const events = [];
  const short = (text) => (typeof text === "string" && [...text].length > 80 ?
                           `${[...text].length} characters` : text);
  const client = await connect(url, {
    resume: { timeout: 3000 },
    tools: [{ name: "edit", parameters: { type: "object" }, run: () => ({ edited: true }) },
            { name: "big", parameters: { type: "object" }, run: () => "y".repeat(2 << 20) }],
  });
  if (patch) {  // a bug in the client, once: the frame's handling throws
    client._frame = () => { delete client._frame; throw new TypeError("boom"); };
  }
  let ended = false;  // the case's last frame: what follows (the page's close) is not its
  const over = new Promise((resolve) => {
    const seen = (type, shape) => client.addEventListener(type, (e) => {
      const d = e.detail;
      if (ended) return;
      if (type === "text.delta" && d.turnId === "end") ended = true;
      else events.push([type, ...shape(d)]);
      if (ended || type === "closed") resolve();
    });
    seen("error", (d) => [d.code, d.message]);
    seen("turn.started", (d) => [d.turnId, d.epoch]);
    seen("text.delta", (d) => [short(d.text)]);
    seen("tool.stream", (d) => [d.callId, d.phase]);
    seen("tool.preview", (d) => [d.callId, short(d.arguments), d.complete]);
    seen("confirm.request", (d) => [d.callId]);
    seen("turn.ended", (d) => [d.turnId, d.reason]);
    seen("reconnecting", () => []);
    seen("closed", (d) => [d.reason]);
  });
  if (go) await client.sendText("go");
  await over;
  if (client.closed === null) await client.close();
  return JSON.stringify(events);
}"""


def _short(text: str) -> str:
    return f"{len(text)} characters" if len(text) > 80 else text


def _shape(item: Any) -> list[Any] | None:
    """A Python client core's output as the page records its event (None: no event)."""
    if isinstance(item, m.Error):
        return ["error", item.code, item.message]
    if isinstance(item, vrt.TurnStarted):
        return ["turn.started", item.turn_id, item.epoch]
    if isinstance(item, vrt.TextDelta):
        return ["text.delta", _short(item.text)]
    if isinstance(item, vrt.ToolStream):
        return ["tool.stream", item.call_id, str(item.phase)]
    if isinstance(item, vrt.ToolPreview):
        return ["tool.preview", item.call_id, _short(str(item.arguments)), item.complete]
    if isinstance(item, m.ConfirmRequestMessage):
        return ["confirm.request", item.call_id]
    if isinstance(item, vrt.TurnEnded):
        return ["turn.ended", item.turn_id, item.reason]
    if isinstance(item, vrt.Closed):
        return ["closed", item.reason]
    return None  # Welcomed, AbortApp: no event


def python_sees(case: Case) -> list[list[Any]]:
    """What the Python client's core makes of the case's frames, after the same hello and
    welcome, in the page's shape."""
    client = ClientProtocol([m.ToolDecl(name="edit", description="", parameters={})])
    client.hello()
    hello = json.loads(client.take_outbox()[0])
    granted = [c for c in hello["capabilities"] if c in case.capabilities]
    welcome = frame(type="welcome", seq=1, **WELCOME, capabilities=granted, lastSeq=1)
    out: list[list[Any]] = []
    for text in (welcome, *case.frames):
        for item in client.receive(text):
            shown = _shape(item)
            if shown is not None:
                out.append(shown)
        if client.connection.final:
            break  # closed: the Python client reads nothing more
    return out


def _gist(events: list[list[Any]]) -> list[list[Any]]:
    """The events, with a BAD_JSON message cut to what both parsers say alike (the rest is
    the parser's own explanation)."""
    return [
        [*e[:2], e[2].split(": ")[0] + ": " + e[2].split(": ")[1]]
        if e[:2] == ["error", "BAD_JSON"]
        else e
        for e in events
    ]


def page_sees(page: Any, server: BadServer, name: str, patch: bool = False) -> list[list[Any]]:
    arg = [server.url + name, patch, CASES[name].go]
    events: list[list[Any]] = json.loads(run_js(page, BROKEN, arg))
    assert not [c for c in page.console if c.startswith(("error", "pageerror"))], page.console
    return events


@pytest.fixture(scope="module")
def bad_page(browser: Any, server: str) -> Any:
    return open_page(browser, server)


TRANSPORT = {"over-max-message-size", "no-acks", "acks", "big-output", "plain"}
"""Cases the Python client's transport decides (its core never sees the frame)."""


@pytest.mark.parametrize("name", [n for n in CASES if n not in TRANSPORT])
def test_the_page_takes_broken_frames_as_the_python_client_does(
    bad_page: Any, bad_server: BadServer, name: str
) -> None:
    """Every kind of broken frame the Python client's tests send, and generated ones: the
    page's events (errors with their codes and messages, and everything else) are the
    Python client's for the same frames, and the session goes on or ends as it does."""
    got = page_sees(bad_page, bad_server, name)
    assert not [e for e in got if e[:2] == ["error", "INTERNAL"]], got
    assert _gist(got) == _gist(python_sees(CASES[name]))


def test_a_frame_over_max_message_size_ends_the_session_as_in_python(
    bad_page: Any, bad_server: BadServer
) -> None:
    """No resume (it would replay the same frame), what came before it shown, nothing
    after: the page and vrt.connect alike."""
    import trio

    got = page_sees(bad_page, bad_server, "over-max-message-size")

    async def python() -> list[list[Any]]:
        async with vrt.connect(bad_server.url + "over-max-message-size") as client:
            async with client.subscribe() as events:
                await client.send_text("go")
                with trio.fail_after(10):
                    return [e for e in map(_shape, [x async for x in events]) if e is not None]

    assert got == trio.run(python) == [["text.delta", "a"], ["closed", "too_large"]]


def test_an_exception_in_the_client_is_an_error_event_and_the_session_goes_on(
    bad_page: Any, bad_server: BadServer
) -> None:
    """The frame whose handling threw is dropped; the next one is read as usual."""
    got = page_sees(bad_page, bad_server, "plain", patch=True)
    assert got == [
        ["error", "INTERNAL", "vrt.js failed on a frame from the server: TypeError: boom"],
        ["text.delta", "b"],
    ]


OVERFLOW = """async ([url, options, texts, pause]) => {
  const { connect, VrtError } = await import("/vrt.js");
  const client = await connect(url, options);
  const closed = [];
  client.addEventListener("closed", (e) => closed.push(e.detail.reason));
  let sent = 0, refused = null;
  try {
    for (const text of texts) {
      await client.sendText(text);
      sent += 1;
      await new Promise((r) => setTimeout(r, pause));
    }
  } catch (error) {
    refused = [error instanceof VrtError, error.code];
  }
  if (client.closed === null) await client.close();
  return {sent, refused, closed, replay: client.proto.replay.length};
}"""


def _sent(server: BadServer, name: str) -> list[str]:
    return [x[1]["type"] for x in server.received if x[0] == name and x[1]["type"] != "ack"]


@pytest.mark.parametrize(
    ("options", "size", "sent"),
    [
        # inputs of about 735 bytes (the welcome acked the hello): the third is over 2,048
        ({"maxMessageSize": 1024, "replayLimitBytes": 2048}, 700, 3),
        ({"replayLimit": 3}, 10, 4),  # three messages fit, the fourth is one too many
    ],
)
def test_a_replay_buffer_over_its_bound_closes_the_session_overflow(
    bad_page: Any, bad_server: BadServer, options: dict[str, int], size: int, sent: int
) -> None:
    """A server that never acks: the unacked messages pass the bound (in bytes or in
    messages) with the last one sent; the page ends the session, ``overflow``, tells the
    server (``close``), and sends nothing more."""
    before = len(_sent(bad_server, "no-acks"))
    texts = ["z" * size] * 6
    got = run_js(bad_page, OVERFLOW, [bad_server.url + "no-acks", options, texts, 0])
    assert got == {"sent": sent, "refused": [True, "CLOSED"], "closed": ["overflow"],
                   "replay": sent}  # fmt: skip
    time.sleep(0.2)
    assert _sent(bad_server, "no-acks")[before:] == ["hello", *["input"] * sent, "close"]


def test_acks_keep_the_replay_buffer_within_its_bounds(
    bad_page: Any, bad_server: BadServer
) -> None:
    options = {"maxMessageSize": 1024, "replayLimitBytes": 2048, "replayLimit": 3}
    got = run_js(bad_page, OVERFLOW, [bad_server.url + "acks", options, ["z" * 500] * 10, 30])
    assert got == {"sent": 10, "refused": None, "closed": ["client"], "replay": 0}


OUTGOING = """async ([url]) => {
  const { connect, VrtError } = await import("/vrt.js");
  const client = await connect(url, {
    tools: [{ name: "big", parameters: { type: "object" }, run: () => "y".repeat(2 << 20) }],
  });
  let refused = null;
  try { await client.sendText("z".repeat(2 << 20)); }
  catch (error) { refused = [error instanceof VrtError, error.code, error.message]; }
  await new Promise((r) => setTimeout(r, 300));  // the tool.call, run, answered
  const open = client.closed;
  await client.close();
  return {refused, open};
}"""


def test_the_page_sends_no_frame_over_max_message_size(
    bad_page: Any, bad_server: BadServer
) -> None:
    """The server would close 1009 and a resume replay the frame forever: sendText
    refuses (VrtError TOO_LARGE) and an oversize output is answered FAILED, in the Python
    client's words."""
    got = run_js(bad_page, OUTGOING, [bad_server.url + "big-output"])
    assert got["open"] is None
    assert got["refused"][:2] == [True, "TOO_LARGE"] and "maxMessageSize" in got["refused"][2]
    time.sleep(0.2)
    (result,) = [x[1] for x in bad_server.received if x == ["big-output", x[1]]
                 and x[1]["type"] == "tool.result"]  # fmt: skip
    client = ClientProtocol()
    client.max_frame = 1 << 20
    client.hello()
    client.receive(frame(type="welcome", seq=1, **WELCOME, capabilities=[], lastSeq=1))
    client.receive(CASES["big-output"].frames[0])
    ticket = client.next_app_call()
    assert ticket is not None
    client.take_outbox()
    client.answer(ticket.call_id, vrt.ToolResult.success("y" * (2 << 20)))
    (expected,) = (json.loads(f) for f in client.take_outbox())
    assert result["result"] == expected["result"]
    assert result["result"]["code"] == "FAILED"


OPTIONS = """async ([url, options]) => {
  const { connect } = await import("/vrt.js");
  try {
    const client = await connect(url, options);
    await client.close();
    return [client.maxMessageSize, client.replayLimit, client.replayLimitBytes];
  } catch (error) {
    return [error.name, error.message];
  }
}"""


def _range(name: str, least: int, value: int) -> list[str]:
    return ["RangeError", f"{name} must be a whole number of at least {least}, not {value}"]


@pytest.mark.parametrize(
    ("options", "got"),
    [
        ({}, [1 << 20, 10_000, 2 << 20]),
        ({"maxMessageSize": 4 << 20}, [4 << 20, 10_000, 8 << 20]),  # room for two frames
        ({"maxMessageSize": 1000}, _range("maxMessageSize", 1024, 1000)),
        ({"replayLimit": 0}, _range("replayLimit", 1, 0)),
        ({"replayLimitBytes": 1 << 20}, _range("replayLimitBytes", 2 << 20, 1 << 20)),
    ],
)
def test_the_limits_default_to_the_python_clients(
    bad_page: Any, bad_server: BadServer, options: dict[str, int], got: list[Any]
) -> None:
    assert run_js(bad_page, OPTIONS, [bad_server.url + "plain", options]) == got


# -- handover-v1 ---------------------------------------------------------------------------


HARNESS = """async ([url, options]) => {
  const { connect } = await import("/vrt.js");
  const state = (window.vrtTest = {events: [], cursor: 0, waiters: new Set(), aborted: []});
  const push = (event) => {
    state.events.push(event);
    for (const look of [...state.waiters]) look();
  };
  // the next event (after the last one found) that passes `test`
  state.until = (test) => new Promise((resolve) => {
    const look = () => {
      if (!state.waiters.has(look)) return;
      for (let i = state.cursor; i < state.events.length; i++) {
        if (test(state.events[i])) {
          state.cursor = i + 1;
          state.waiters.delete(look);
          resolve(state.events[i]);
          return;
        }
      }
    };
    state.waiters.add(look);
    look();
  });
  const client = await connect(url, {
    ...options,
    tools: [{
      name: "hold", description: "", parameters: {type: "object", properties: {}},
      run: (args, ctx) => new Promise(() => {  // never returns
        ctx.signal.addEventListener("abort", () => state.aborted.push([ctx.callId,
                                                                       ctx.signal.reason]));
        push(["run", {callId: ctx.callId}]);
      }),
    }],
  });
  for (const type of ["tool.stream", "turn.started", "text.delta", "turn.ended", "error",
                      "reconnecting", "resumed", "closed"]) {
    client.addEventListener(type, (e) => push([type, e.detail]));
  }
  state.client = client;
}"""


def page_until(page: Any, test: str) -> Any:
    """The page's next event that passes the JS function ``test`` (of ``[type, detail]``)."""
    return run_js(page, f"async () => window.vrtTest.until({test})", None, within=20)


def page_send(page: Any, text: str) -> None:
    run_js(page, "async (text) => window.vrtTest.client.sendText(text)", text)


def page_close(page: Any) -> dict[str, Any]:
    """Close the page's session: every event it saw, and its tools' aborts."""
    got: dict[str, Any] = run_js(
        page,
        """async () => {
          const state = window.vrtTest;
          await state.client.close();
          return {events: state.events, aborted: state.aborted, closed: state.client.closed};
        }""",
        None,
    )
    assert not [c for c in page.console if c.startswith(("error", "pageerror"))], page.console
    return got


ENDED = '([type]) => type === "turn.ended"'


def story(events: list[list[Any]]) -> list[list[Any]]:
    """What happened, ids named by order of appearance (two runs' ids differ)."""
    names: dict[str, str] = {}

    def named(x: str) -> str:
        return names.setdefault(x, f"#{len(names) + 1}")

    out: list[list[Any]] = []
    for kind, d in events:
        if kind in ("reconnecting", "resumed"):
            out.append([kind])
        elif kind == "closed":
            out.append([kind, d["reason"]])
        elif kind == "error":
            out.append([kind, d["code"]])
        elif kind == "turn.started":
            out.append([kind, named(d["turnId"]), d["epoch"]])
        elif kind == "turn.ended":
            out.append([kind, named(d["turnId"]), d["epoch"], d["reason"]])
        elif kind == "text.delta":
            out.append([kind, named(d["turnId"]), d["text"]])
        elif kind == "tool.stream":
            call = [named(d["callId"]), named(d["turnId"]), d["epoch"], d["name"], d["kind"]]
            out.append([kind, *call, d["phase"]])
    return out


def text_of(events: list[list[Any]], turn_id: str) -> str:
    return "".join(d["text"] for k, d in events if k == "text.delta" and d["turnId"] == turn_id)


def no_errors_logged(caplog: pytest.LogCaptureFixture) -> None:
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors


async def python_drain(n: Nodes) -> list[list[Any]]:
    """The drain test's steps with vrt.connect: its events in the page's shape."""
    from tests.conftest import Log, until

    async with vrt.connect(n.url) as client, client.subscribe(previews=False) as channel:
        log = Log(channel)
        await client.send_text("slow one")
        await until(log, lambda e: isinstance(e, vrt.TextDelta))
        await n.move_now(1)
        await n.drain_now(0)
        await until(log, lambda e: isinstance(e, vrt.TurnEnded))
        await until(log, lambda e: isinstance(e, vrt.Resumed))
        await n.nodes[0].done.wait()
        await client.send_text("and now?")
        await until(log, lambda e: isinstance(e, vrt.TurnEnded))
    return [e for e in map(as_page_event, log.events) if e is not None]


def test_a_drain_moves_the_page_s_session_to_the_other_node(
    browser: Any, server: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``Server.drain()`` while the page's turn runs: the turn ends where it began, the
    server closes 1012 at that boundary, the page resumes on the other node (reconnecting,
    resumed, never closed) and its next turn runs there, the model seeing both inputs;
    the page's events are the Python client's in the same steps."""
    page = open_page(browser, server)
    with nodes() as n:
        run_js(page, HARNESS, [n.url, {"resume": {"backoff": 50}}])
        page_send(page, "slow one")
        page_until(page, '([type]) => type === "text.delta"')
        n.move(1)  # the load balancer takes n0 out...
        n.drain(0)  # ...and it drains
        first = page_until(page, ENDED)
        page_until(page, '([type]) => type === "resumed"')
        n.drained(0)  # every session handed over: n0's serve returned
        page_send(page, "and now?")
        second = page_until(page, ENDED)
        got = page_close(page)
        a, b = (node.model.requests for node in n.nodes)
    page.close()
    assert first[1]["reason"] == second[1]["reason"] == "finished"
    events = got["events"]
    assert text_of(events, second[1]["turnId"]) == "seen 2 inputs, 0 interrupted"
    assert [k for k, _ in events if k in ("reconnecting", "resumed", "closed")] == [
        "reconnecting", "resumed", "closed"
    ]  # fmt: skip
    assert got["closed"] == "client"
    assert len(a) == 1 and len(b) == 1  # the second turn ran on n1, with the whole history
    inputs = [h.text for h in b[0].history if isinstance(h, vrt.models.UserInput)]
    assert inputs == ["slow one", "and now?"]
    with nodes() as n:
        expected = n.loop.call(python_drain, n)
    assert story(events) == [*story(expected), ["closed", "client"]]
    no_errors_logged(caplog)


async def python_crash(n: Nodes) -> tuple[list[list[Any]], list[str]]:
    """The crash test's steps with vrt.connect: its events, and its tool's aborts."""
    from tests.conftest import Log, until

    running = trio.Event()
    aborted: list[str] = []

    @vrt.app_tool(parameters={"type": "object", "properties": {}})
    async def hold(args: Any, ctx: vrt.ToolContext) -> None:
        running.set()
        try:
            await trio.sleep_forever()
        finally:
            if ctx.signal.aborted:
                aborted.append(str(ctx.signal.reason))

    async with (
        vrt.connect(n.url, tools=[hold]) as client,
        client.subscribe(previews=False) as channel,
    ):
        log = Log(channel)
        await client.send_text("hi")
        await until(log, lambda e: isinstance(e, vrt.TurnEnded))
        await client.send_text("app please")
        await running.wait()
        await n.crash_now(0, to=1)
        await until(log, lambda e: isinstance(e, vrt.TurnEnded))
        await client.send_text("what happened?")
        await until(log, lambda e: isinstance(e, vrt.TurnEnded))
    return [e for e in map(as_page_event, log.events) if e is not None], aborted


def test_a_crash_ends_the_page_s_open_call_and_turn_once(
    browser: Any, server: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The page's app tool runs (never returning) when its node's network and process go,
    and the node's lease ends: the page resumes on the other node, which adopts the
    session from its last save and ends what the page reported open: one ``cancelled``
    for the call (its AbortSignal aborted), one ``turn.ended`` ``interrupted``; the next
    turn works, the model seeing the turn marked. As the Python client sees it."""
    page = open_page(browser, server)
    with nodes() as n:
        run_js(page, HARNESS, [n.url, {"resume": {"backoff": 50}}])
        page_send(page, "hi")
        page_until(page, ENDED)
        page_send(page, "app please")
        page_until(page, '([type, d]) => type === "tool.stream" && d.phase === '
                   '"arguments-complete"')  # fmt: skip
        page_until(page, '([type]) => type === "run"')
        crashed_at = time.monotonic()
        n.crash(0, to=1)
        lost = page_until(page, ENDED)
        took = time.monotonic() - crashed_at
        page_send(page, "what happened?")
        after = page_until(page, ENDED)
        got = page_close(page)
        history = n.nodes[1].model.requests[-1].history
    page.close()
    assert lost[1]["reason"] == "interrupted" and took < 3, took
    events = got["events"]
    (call_id,) = {d["callId"] for k, d in events if k == "run"}
    phases = [d["phase"] for k, d in events if k == "tool.stream" and d["callId"] == call_id]
    assert phases == ["start", "arguments-complete", "cancelled"]
    assert got["aborted"] == [[call_id, "interrupted"]]
    ends = [d for k, d in events if k == "turn.ended" and d["turnId"] == lost[1]["turnId"]]
    assert len(ends) == 1
    assert text_of(events, after[1]["turnId"]) == "seen 3 inputs, 1 interrupted"
    assert [type(h).__name__ for h in history][:4] == [
        "UserInput", "AgentText", "UserInput", "TurnInterrupted"
    ]  # fmt: skip
    assert [k for k, _ in events if k in ("reconnecting", "resumed", "closed")] == [
        "reconnecting", "resumed", "closed"
    ]  # fmt: skip
    with nodes() as n:
        expected, aborted = n.loop.call(python_crash, n)
    assert aborted == ["interrupted"]
    assert story(events) == [*story(expected), ["closed", "client"]]
    no_errors_logged(caplog)


HANDED = """async ([url, options]) => {
  const { connect } = await import("/vrt.js");
  const events = [];
  const client = await connect(url, options);
  const over = new Promise((resolve) => {
    for (const type of ["tool.stream", "turn.started", "text.delta", "turn.ended", "error",
                        "reconnecting", "resumed", "closed"]) {
      client.addEventListener(type, (e) => {
        if (type === "text.delta" && e.detail.turnId === "end") resolve();
        else events.push([type, e.detail]);
      });
    }
  });
  await client.sendText("go");
  await over;
  await client.close();
  return events;
}"""


async def python_handed(url: str) -> list[list[Any]]:
    """A script of the hand-written server with vrt.connect: its events."""
    from tests.conftest import Log, until

    async with vrt.connect(url) as client, client.subscribe(previews=False) as channel:
        log = Log(channel)
        await client.send_text("go")
        await until(log, lambda e: isinstance(e, vrt.TextDelta) and e.turn_id == "end")
    return [e for e in map(as_page_event, log.events[:-1]) if e is not None]


def _held(*entries: tuple[str, ...]) -> list[dict[str, str]]:
    keys = ("turnId", "callId", "name", "kind")
    return [dict(zip(keys, entry, strict=False)) for entry in entries]


HELD = {
    "calls": _held(("t_1", "s1", "lookup", "server"), ("t_1", "a2", "edit", "app")),
    "turn": _held(("t_2",)),
    "many": [*_held(*(("t_1", f"s{i}", "lookup", "server") for i in range(255))), *_held(("t_2",))],
    "idle": None,
    "no-handover": None,
}
"""What the resume hello's ``open`` holds for each script (None: no ``open``)."""


@pytest.fixture(scope="module")
def handing() -> Iterator[HandingOver]:
    with handing_over() as server:
        yield server


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_the_page_resumes_at_once_after_1012_saying_what_it_holds_open(
    browser: Any, server: str, handing: HandingOver, name: str
) -> None:
    """A hand-written server closes 1012 after a script's frames: the page resumes at
    once (though its backoff is a second), its resume hello holds each call without a
    terminal phase and the open turn if none of them is of it (at most 256 entries; none
    without handover-v1), byte for byte the Python client's; a second ``turn.ended`` of
    a turn is dropped, in both."""
    assert set(HELD) == set(SCRIPTS)
    page = open_page(browser, server)
    got = run_js(page, HANDED, [handing.url + name, {"resume": {"backoff": 1000}}])
    assert not [c for c in page.console if c.startswith(("error", "pageerror"))], page.console
    page.close()
    expected = handing.loop.call(python_handed, handing.url + name)
    page_hello, python_hello = handing.hellos.pop(name)
    assert page_hello == python_hello
    hello = json.loads(page_hello)
    assert hello.get("open") == HELD[name]
    assert "tools" not in hello and hello["resume"]["sessionId"] == "s_moving"
    assert all(delay < 0.4 for delay in handing.delays.pop(name)), name  # no backoff
    assert story(got) == [*story(expected), ["closed", "client"]]
    ended = [d["turnId"] for k, d in got if k == "turn.ended"]
    assert len(ended) == len(set(ended)), ended


def test_an_ordinary_close_is_resumed_after_the_backoff(browser: Any, server: str) -> None:
    """The same session closed 1001 (going away) instead: the page waits its first
    backoff (1 s, jittered to 0.5-1.5 s) before the resume, as the Python client does."""
    page = open_page(browser, server)
    with handing_over(code=1001) as handing:
        got = run_js(page, HANDED, [handing.url + "calls", {"resume": {"backoff": 1000}}])
        (delay,) = handing.delays["calls"]
    page.close()
    assert 0.45 < delay < 3, delay
    assert [k for k, _ in got if k in ("reconnecting", "resumed")] == ["reconnecting", "resumed"]


def test_the_web_demo_survives_a_sigterm_of_its_worker(browser: Any) -> None:
    """Issue 19: ``vrt serve --web --workers 2 --store redis://...`` serves the demo page;
    the worker running the page's session is sent SIGTERM mid-script: it drains, the page
    shows ``resumed`` and finishes its script on the other worker, as without the kill."""
    from tests.servers import free_port, redis_server

    port = free_port()
    with redis_server() as store:
        command = ("serve", "vrt._cli.demo_agent:fast", "--web", "--port", str(port),
                   "--store", store, "--workers", "2")  # fmt: skip
        with serving("", command):
            context = browser.new_context()
            page = context.new_page()
            console: list[str] = []
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
            page.goto(f"http://127.0.0.1:{port}/?autorun&scale=0.1")
            page.wait_for_function("window.demoResult.turns.length >= 1", timeout=30_000)
            session = page.evaluate("document.getElementById('status').textContent").split()[1]
            owner = subprocess.run(
                ["redis-cli", "-u", store, "HGET", session_key(session.rstrip(",:")), "owner"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            os.kill(int(owner.split(":")[1]), signal.SIGTERM)
            # the script may end before the drain hands the session over (a loaded machine
            # is slow to act on the signal): then the resume comes after it
            page.wait_for_function(
                "window.demoResult.done && window.demoResult.resumes >= 1", timeout=60_000
            )
            got = page.evaluate("window.demoResult")
            status = page.inner_text("#status")
            context.close()
    assert got["turns"] == ["finished"] * 4 + ["interrupted"]
    assert got["resumes"] >= 1 and "resumed" in status, status
    assert "closed" not in status
    assert console == [], console
