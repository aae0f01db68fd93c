"""vrt.js in a real browser: Debian's Chromium, headless, driven by Playwright for Python
(``executable_path``: no browser download), against ``vrt serve`` in a subprocess.

The page is any document of the server's origin (a 404 is one), so ``import("/vrt.js")``
loads the module the server's HTTP front serves.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

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
    """A page of the server's origin (its machines.js), its console kept on ``console``."""
    page = browser.new_page()
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    page.goto(url.replace("ws://", "http://") + "machines.js")
    page.wait_for_timeout(200)  # its favicon request is a 404, rightly: not counted
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


def python_events(url: str, capabilities: tuple[str, ...]) -> list[list[Any]]:
    """The same session with the Python client: its events in the browser's shape."""
    import trio

    import vrt
    from vrt._net.frames import message_of

    @vrt.app_tool(name="edit", parameters={"type": "object"})
    async def edit(args: Any, ctx: vrt.ToolContext) -> Any:
        await trio.sleep(0.03 * (4 - args["n"]))
        return {"edited": args["n"]}

    out: list[list[Any]] = []

    async def main() -> None:
        async with vrt.connect(url, tools=[edit], capabilities=capabilities) as client:
            async with client.subscribe() as events:
                await client.send_text("go")
                async for event in events:
                    message = message_of(event, tool_stream=True)
                    if message is not None:
                        cls, fields = message
                        data = json.loads(json.dumps({"type": cls.TYPE, **fields}))
                        wire = {_camel(k): v for k, v in data.items() if v is not None}
                        out.append([wire.pop("type"), wire])
                    if isinstance(event, vrt.TurnEnded):
                        break

    trio.run(main)
    return out


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


@pytest.mark.parametrize("offer", ["all", "legacy"])
def test_vrt_js_runs_a_turn_like_the_python_client(server: str, page: Any, offer: str) -> None:
    caps = (
        ["tool-stream-v1", "batch-v1", "local-preview-v1"] if offer == "all" else ["tool-stream-v1"]
    )
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
  let running;
  const runningNow = new Promise((r) => (running = r));
  const client = await connect(url, {
    resume: {backoff: 50},
    tools: [{
      name: "edit", description: "", parameters: {type: "object"},
      run: async (args, ctx) => {
        state.log.push(["begin", args.n]);
        running();
        await new Promise((r) => setTimeout(r, 300));
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
    expected = python_events(server, ("tool-stream-v1", "batch-v1", "local-preview-v1"))
    assert got["events"] == expected  # the app saw what an uncut session shows
    assert not [c for c in page.console if c.startswith(("error", "pageerror"))], page.console


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
    """``vrt demo --web``: the page hosts the demo's app tools, answers its confirmations
    and interrupts the last turn while the map draws, with no console error."""
    with serving("", ("demo", "--web", "--port", "0", "--fast")) as url:
        page = open_page(browser, url)
        page.goto(url.replace("ws://", "http://") + "?autorun&scale=0.1")
        page.wait_for_function("window.demoResult && window.demoResult.done", timeout=60_000)
        got = page.evaluate("window.demoResult")
        text = page.inner_text("body")
        assert not [c for c in page.console if c.startswith(("error", "pageerror"))], page.console
        page.close()
    assert got["turns"] == ["finished"] * 4 + ["interrupted"]
    assert [r["name"] for r in got["runs"]] == [
        "open_panel", "highlight", "scroll_to", "show_map"
    ]  # fmt: skip
    assert got["runs"][-1]["outcome"] == "aborted (interrupted)"
    assert "REJECTED" in text and "INVALID" in text  # the denied insurance, the bad seat


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
