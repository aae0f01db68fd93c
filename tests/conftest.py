"""Shared fixtures and helpers for the test suite."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

import vrt

pytest_plugins = ["vrt.testing"]  # the vrt_pair and vrt_serve fixtures


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The README runs the suite twice, the second time on real python-statemachine
    instances (VRT_STRICT_MACHINES=1). Tests marked ``network`` (hostile peers, bad
    networks: sockets and timing, not machines) run in the first pass only; tests marked
    ``once`` (the model checker's: they read the machine classes and their tables
    themselves, whatever the switch says) in the second only, unless their file is named
    on the command line. Deselected in the other pass, never skipped. Tests marked
    ``llamacpp`` run only with VRT_LLAMACPP=1."""
    strict = os.environ.get("VRT_STRICT_MACHINES") == "1"
    llamacpp = os.environ.get("VRT_LLAMACPP") == "1"
    named = {Path(str(arg).split("::")[0]).resolve() for arg in config.args}

    def wanted(item: pytest.Item) -> bool:
        if item.get_closest_marker("llamacpp") is not None and not llamacpp:
            return False  # opt-in: needs a llama.cpp server package and a model
        if strict:
            return item.get_closest_marker("network") is None
        return item.get_closest_marker("once") is None or item.path in named

    kept = [item for item in items if wanted(item)]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept


def stream_of(events: Sequence[Any], call_id: str) -> list[str]:
    """The phases of one call, in order."""
    return [e.phase for e in events if isinstance(e, vrt.ToolStream) and e.call_id == call_id]


async def run_turn(
    agent: vrt.Agent, text: str = "go"
) -> tuple[vrt.TurnResult, list[Any], vrt.Session]:
    """Run one turn to its end in a fresh session and return its result and events."""
    async with vrt.open_session(agent) as session, session.subscribe() as events:
        turn = await session.start_turn(text)
        result = await turn.wait()
        log = drain(events)
        return result, log, session


class Log:
    """A subscription that remembers every event it handed out."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.events: list[Any] = []

    def __aiter__(self) -> Log:
        return self

    async def __anext__(self) -> Any:
        try:
            event = await self.channel.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None
        self.events.append(event)
        return event


async def until(events: Log, predicate: Any) -> Any:
    """Receive events until one matches ``predicate``; return it."""
    with trio.fail_after(60):
        async for event in events:
            if predicate(event):
                return event
    raise AssertionError("stream ended")


def drain(events: Any) -> list[Any]:
    """Everything delivered to a subscription so far (including what ``until`` consumed);
    on a :class:`Log`, what is drained is remembered too."""
    log = events if isinstance(events, Log) else Log(events)
    while True:
        try:
            log.events.append(log.channel.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            return list(log.events)


@asynccontextmanager
async def subscribed(session: vrt.Session) -> AsyncIterator[Log]:
    """``session.subscribe()`` as a :class:`Log`."""
    async with session.subscribe() as channel:
        yield Log(channel)


@pytest.fixture
def no_errors(caplog: pytest.LogCaptureFixture) -> Any:
    """No ERROR (or worse) from vrt's loggers, and no traceback above DEBUG, during the test
    (no peer can make the server log one)."""
    with caplog.at_level(logging.DEBUG, logger="vrt"):
        yield
    records = every_record(caplog)
    bad = [r for r in records if r.name.startswith("vrt") and r.levelno >= logging.ERROR]
    assert not bad, [r.getMessage() for r in bad]
    traced = [r for r in records if r.exc_info and r.levelno > logging.DEBUG]
    assert not traced, [r.getMessage() for r in traced]


def every_record(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The records of the test's setup and call, and of its teardown so far: a fixture's
    teardown sees only its own phase's in ``caplog.records``."""
    return [*caplog.get_records("setup"), *caplog.get_records("call"), *caplog.records]
