"""examples/assistant.py runs as a user runs it, against FakeProvider (the real adapter,
over real HTTP), configured by the environment alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

import vrt
from vrt.testing import FakeProvider

pytestmark = pytest.mark.network

EXAMPLE = Path(__file__).parent.parent / "examples" / "assistant.py"


async def run_example(
    path: Path, text: str, provider: FakeProvider, extra: dict[str, str] | None = None
) -> str:
    """Run an example as a user would, its model ``provider`` (by the environment alone):
    what it printed; it must exit 0."""
    env = {**os.environ, "VRT_BASE_URL": provider.base_url, "VRT_MODEL": "local", **(extra or {})}
    env.pop("OPENAI_API_KEY", None)
    done = await trio.to_thread.run_sync(
        lambda: subprocess.run(
            [sys.executable, str(path), text],
            capture_output=True,
            text=True,
            timeout=90,
            env=env,
            check=False,
        )
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.parametrize("dialect", ["openai", "ollama", "llamacpp"])
async def test_the_assistant_example_runs_against_a_chat_server(dialect: str) -> None:
    steps = [
        [vrt.say("Checking."), vrt.call("weather", {"city": "Paris"}, chunks=3)],
        [vrt.call("add_note", {"text": "Paris: 21 C, clear"})],
        [vrt.say("Noted: it is 21 degrees in Paris.")],
    ]
    async with FakeProvider(steps, dialect=dialect) as provider:
        out = await run_example(EXAMPLE, "weather in Paris, and note it", provider)
    assert "[server weather settled]" in out and "[app add_note settled]" in out, out
    assert "notes: ['Paris: 21 C, clear']" in out and "(turn finished)" in out, out
    assert len(provider.requests) == 3
    assert provider.requests[0]["model"] == "local"
    names = [t["function"]["name"] for t in provider.requests[0]["tools"]]
    assert names == ["weather", "add_note", "read_notes"]  # the app's tools offered too


MCP_EXAMPLE = Path(__file__).parent.parent / "examples" / "mcp_assistant.py"
EVERYTHING = (
    Path(__file__).parent.parent
    / "node_modules"
    / "@modelcontextprotocol"
    / "server-everything"
    / "dist"
    / "index.js"
)


async def test_the_mcp_assistant_example_runs_against_a_chat_server() -> None:
    """examples/mcp_assistant.py with both MCP servers started for real (the time server
    from PyPI, the everything server from npm) and the model a FakeProvider: a call to
    each MCP server, to the server tool and to the app tool; their results reach the
    model's next request."""
    steps = [
        [
            vrt.say("Let me check."),
            vrt.call("time_get_current_time", {"timezone": "Asia/Tokyo"}),
            vrt.call("ev_get-sum", {"a": 2, "b": 3}),
            vrt.call("weather", {"city": "Tokyo"}),
        ],
        [vrt.call("add_note", {"text": "2 + 3 = 5"})],
        [vrt.say("It is evening in Tokyo, and 2 and 3 make 5. Noted.")],
    ]
    async with FakeProvider(steps) as provider:
        everything = {"VRT_EVERYTHING": f"node {EVERYTHING} stdio"}
        out = await run_example(MCP_EXAMPLE, "time in Tokyo, 2 + 3, note it", provider, everything)
    for shown in (
        "[server time_get_current_time settled]",
        "[server ev_get-sum settled]",
        "[server weather settled]",
        "[app add_note settled]",
        "notes: ['2 + 3 = 5']",
        "(turn finished)",
    ):
        assert shown in out, out
    names = {t["function"]["name"] for t in provider.requests[0]["tools"]}
    assert {"time_get_current_time", "ev_get-sum", "weather", "add_note"} <= names
    answers = {
        m["tool_call_id"]: m["content"]
        for m in provider.requests[1]["messages"]
        if m["role"] == "tool"
    }
    assert len(answers) == 3 and any("Asia/Tokyo" in text for text in answers.values())
    assert any("5" in text for text in answers.values())
