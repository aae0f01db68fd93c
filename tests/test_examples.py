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


@pytest.mark.parametrize("dialect", ["openai", "ollama", "llamacpp"])
async def test_the_assistant_example_runs_against_a_chat_server(dialect: str) -> None:
    steps = [
        [vrt.say("Checking."), vrt.call("weather", {"city": "Paris"}, chunks=3)],
        [vrt.call("add_note", {"text": "Paris: 21 C, clear"})],
        [vrt.say("Noted: it is 21 degrees in Paris.")],
    ]
    async with FakeProvider(steps, dialect=dialect) as provider:
        env = {**os.environ, "VRT_BASE_URL": provider.base_url, "VRT_MODEL": "local"}
        env.pop("OPENAI_API_KEY", None)
        done = await trio.to_thread.run_sync(
            lambda: subprocess.run(
                [sys.executable, str(EXAMPLE), "weather in Paris, and note it"],
                capture_output=True,
                text=True,
                timeout=60,
                env=env,
                check=False,
            )
        )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "[server weather settled]" in out and "[app add_note settled]" in out, out
    assert "notes: ['Paris: 21 C, clear']" in out and "(turn finished)" in out, out
    assert len(provider.requests) == 3
    assert provider.requests[0]["model"] == "local"
    names = [t["function"]["name"] for t in provider.requests[0]["tools"]]
    assert names == ["weather", "add_note", "read_notes"]  # the app's tools offered too
