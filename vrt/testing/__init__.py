"""Helpers for testing code built on vrt (public).

- :func:`assert_stream_valid` checks an app-facing event log against the lifecycle every
  call must follow. It runs the log through the CallView machine, the same rules the
  engine and the client are built on, so a user can check their own logs with it.
- :func:`open_pair` runs a server session and a client over an in-memory connection:
  the whole vrt/1 protocol, no sockets.
- pytest fixtures (``pytest_plugins = ["vrt.testing"]``): ``vrt_pair`` (the
  :func:`open_pair` factory) and ``vrt_serve`` (serve an agent on loopback port 0 in the
  test's nursery, return the :class:`~vrt.Server`).
- Hypothesis strategies (Hypothesis is needed only when one is built): :func:`scripts`
  (model steps of ``vrt.say``/``vrt.call``/``vrt.pause``; also :func:`script_steps`,
  :func:`tool_calls`, :func:`tool_arguments`) and :func:`interrupt_times`; the agent
  their calls run against, :func:`scripted_agent` (with :func:`scripted_app_tools` for the
  client), whose tools do what each call's arguments say, so :func:`expected_result`
  knows every call's result in advance (:func:`asks_confirmation`, :func:`truncated`);
  :class:`TurnScripts`, a model that plays one generated script per user input.
- Fake model servers on loopback, which play ``vrt.say``/``vrt.call`` scripts in a real
  API's wire format and quirks: :class:`FakeProvider` (HTTP: Chat Completions, Responses,
  Anthropic Messages) and :class:`FakeRealtime` (WebSocket: OpenAI Realtime, Gemini Live,
  with a voice detector on the audio it hears).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Unpack

import trio

from vrt._client.client import Client
from vrt._engine.agent import Agent
from vrt._server.option_types import ServerOptions
from vrt._server.serve import Server, serve
from vrt.testing._providers import FakeProvider
from vrt.testing._proxy import LoopbackProxy
from vrt.testing._realtime import FakeRealtime
from vrt.testing._scripted_agent import (
    TurnScripts,
    asks_confirmation,
    expected_result,
    scripted_agent,
    scripted_app_tools,
    truncated,
)
from vrt.testing._strategies import (
    interrupt_times,
    script_steps,
    scripts,
    tool_arguments,
    tool_calls,
)

__all__ = [
    "CuttingConnection",
    "FakeProvider",
    "FakeRealtime",
    "LoopbackProxy",
    "TurnScripts",
    "asks_confirmation",
    "assert_stream_valid",
    "expected_result",
    "interrupt_times",
    "open_pair",
    "script_steps",
    "scripted_agent",
    "scripted_app_tools",
    "scripts",
    "tool_arguments",
    "tool_calls",
    "truncated",
    "vrt_pair",
    "vrt_serve",
]

from vrt.testing._pair import CuttingConnection, open_pair
from vrt.testing._streams import assert_stream_valid

try:  # the fixtures need pytest; the rest of this module does not
    import pytest
except ImportError:  # pragma: no cover
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.fixture
    def vrt_pair() -> Callable[..., AbstractAsyncContextManager[Client]]:
        """The :func:`open_pair` factory: ``async with vrt_pair(agent, tools) as client``."""
        return open_pair

    @pytest.fixture
    def vrt_serve(nursery: trio.Nursery) -> Callable[..., Awaitable[Server]]:
        """Serve an agent on 127.0.0.1, port 0, in the test's nursery: ``await vrt_serve(agent)``,
        with any of ``vrt.serve``'s options (:class:`vrt.ServerOptions`) as keywords.

        Needs pytest-trio (its ``nursery`` fixture).
        """

        async def start(agent: Agent, **options: Unpack[ServerOptions]) -> Server:
            server: Server = await nursery.start(
                functools.partial(serve, agent, "127.0.0.1", 0, **options)
            )
            return server

        return start
