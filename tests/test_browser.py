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
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.network  # a real browser and a server process: the first pass only


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """``vrt serve tests.web_agent:agent --port 0``: its ws:// URL."""
    process = subprocess.Popen(
        [sys.executable, "-m", "vrt", "serve", "tests.web_agent:agent", "--port", "0"],
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
def page(server: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    assert CHROMIUM is not None, "Debian's chromium is needed (.ci/run installs it)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        console: list[str] = []
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
        page.goto(server.replace("ws://", "http://") + "machines.js")
        page.wait_for_timeout(200)  # its favicon request is a 404, rightly: not counted
        console.clear()
        page.console = console  # type: ignore[attr-defined]
        yield page
        browser.close()


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
    got = page.evaluate(RUN, [server, caps])
    assert got["caps"] == caps and got["closed"] == "client"
    # serial, in arrival order, though the first is the slowest; ctx.signal an AbortSignal
    assert [x[:2] for x in got["log"]] == [
        ["begin", 1], ["end", 1], ["begin", 2], ["end", 2], ["begin", 3], ["end", 3]
    ]  # fmt: skip
    assert all(x[3] for x in got["log"] if x[0] == "begin")
    expected = python_events(server, tuple(caps))
    assert got["events"] == expected
    assert not [c for c in page.console if c.startswith(("error", "pageerror"))], page.console
