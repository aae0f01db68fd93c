"""The voice demo's server with its fake model in reach, for tests/test_browser_voice.py.

``python -m tests.voice_server`` serves what ``vrt demo --web --voice`` serves (the same
agent, :mod:`vrt._cli.voice_agent`, on the same fake, with the demo pages), prints
``on WS_URL`` and, when its standard input closes, one JSON line: what the fake model was
sent that a test measures (the truncates, the cancels, the calls' answers) and its
violations.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Any

import trio

import vrt
from vrt._cli import voice_agent
from vrt.testing import FakeRealtime

WANTED = ("conversation.item.truncate", "response.cancel", "conversation.item.create")


def report(fake: FakeRealtime) -> dict[str, Any]:
    """What the fake was sent that the test reads, in order."""
    sent = [m for m in fake.received if isinstance(m, dict) and m.get("type") in WANTED]
    return {"sent": sent, "violations": fake.violations, "responses": fake.responses}


async def main() -> None:
    async with FakeRealtime(voice_agent.steps(), api="openai") as fake:
        model = vrt.models.OpenAIRealtime(url=fake.url, api_key="demo")
        agent = voice_agent.agent_on(model)
        async with trio.open_nursery() as nursery:
            serve = functools.partial(vrt.serve, agent, "127.0.0.1", 0, web_demo=True)
            server = await nursery.start(serve)
            print(f"voice demo on {server.url}", flush=True)
            stdin = trio.lowlevel.FdStream(sys.stdin.fileno())
            while await stdin.receive_some():
                pass
            nursery.cancel_scope.cancel()
        print(json.dumps(report(fake)), flush=True)


if __name__ == "__main__":
    trio.run(main)
