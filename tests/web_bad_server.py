"""A hand-written vrt/1 server that sends a client broken frames, for tests/test_browser.py.

Each connection's path names a case of :data:`CASES`: the server welcomes the client
(granting the case's capabilities), sends the case's frames in order, then a
``text.delta`` of turn ``end`` (seq 0: outside the numbering, so always read) that tells
the page the case is over; it answers the page's ``close`` with ``closed``. It prints
every message a client sends, one JSON line ``[case, message]`` each. The same frames go
to the Python client's core in the test, so both clients' events can be compared.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Iterator
from typing import Any

import attrs
import trio
from trio_websocket import ConnectionClosed, WebSocketRequest, serve_websocket

ALL = ("tool-stream-v1", "batch-v1", "local-preview-v1")
LIMIT = 1 << 20  # both clients' default maxMessageSize / max_message_size


@attrs.frozen
class Case:
    frames: tuple[str | bytes, ...]
    capabilities: tuple[str, ...] = ALL
    """What the welcome grants (the client offers all three)."""
    acks: bool = False
    """Whether the server acks what the client sends (else it never does)."""
    go: bool = False
    """Whether the frames wait for the client's first ``input`` (a Python client can
    subscribe only once connected: what comes before it would be missed)."""


def frame(**fields: Any) -> str:
    return json.dumps(fields)


def delta(seq: Any, text: Any = "x", **extra: Any) -> str:
    """A ``text.delta`` (any seq and text: they may be the broken part)."""
    return frame(type="text.delta", seq=seq, turnId="t_1", text=text, **extra)


def stream(seq: int, phase: str, call: str = "c1", **fields: Any) -> str:
    head = {"callId": call, "turnId": "t_1", "epoch": 0, "name": "lookup", "kind": "server"}
    return frame(type="tool.stream", seq=seq, **head, phase=phase, **fields)


def started(seq: int, **fields: Any) -> str:
    return frame(type="turn.started", seq=seq, **{"turnId": "t_1", "epoch": 0, **fields})


def batch(*frames: str) -> str:
    return "[" + ",".join(frames) + "]"


CALL = {"turnId": "t_1", "epoch": 0, "name": "edit", "arguments": {}}
CONFIRM = {"name": "pay", "arguments": {}, "risk": "high", "prompt": "Pay?"}
WELCOME = {"sessionId": "s_bad", "resumeToken": "k" * 32, "epoch": 0, "resumed": False}

CASES: dict[str, Case] = {
    # the frame
    "truncated": Case(('{"type": "text.delta", "seq": 2, "turnId": "t_1", "text": "x"',)),
    "nan": Case(('{"type": "text.delta", "seq": 2, "turnId": "t_1", "text": NaN}',)),
    "empty-frame": Case(("",)),
    "trailing-data": Case((delta(2) + " {}",)),
    "nested-too-deep": Case(("[" * 2000 + "]" * 2000,)),
    "an-integer-of-4301-digits": Case((delta(2)[:-1] + ', "n": ' + "1" * 4301 + "}",)),
    "a-float-of-5000-digits": Case((delta(2)[:-1] + ', "n": ' + "1" * 5000 + ".5}",)),
    "string": Case(('"text.delta"',)),
    "number": Case(("42",)),
    "null": Case(("null",)),
    "array-without-batch": Case((batch(delta(2)),), ("tool-stream-v1",)),
    "binary": Case((delta(2).encode(),)),
    "utf-16-le": Case((delta(2).encode("utf-16-le").decode(),)),
    "utf-16-be": Case((delta(2).encode("utf-16-be").decode(),)),
    "utf-32-le": Case((delta(2).encode("utf-32-le").decode(),)),
    "utf-16-as-binary": Case((delta(2).encode("utf-16"),)),
    "duplicate-keys": Case((delta(2, "a")[:-1] + ', "text": "b"}',)),
    "lone-surrogate": Case((delta(2, "\ud800"),)),
    # the batch
    "empty-batch": Case(("[]",)),
    "batch-with-non-objects": Case((batch(delta(2, "a"), "3", "null", delta(3, "b")),)),
    "batch-of-good-and-bad": Case(
        (batch(frame(type="dance", seq=2), delta(3, "a"), delta(4, 3), delta(5, "b")),)
    ),
    "batch-stops-at-closed": Case(
        (batch(frame(type="closed", seq=2, reason="server"), delta(3, "after")),)
    ),
    "nested-batch": Case((batch(batch(delta(2))),)),
    # the type
    "unknown-type": Case((frame(type="dance", seq=2),)),
    "client-type": Case((frame(type="input", seq=2, text="x"),)),
    "type-missing": Case((frame(seq=2, turnId="t_1", text="x"),)),
    "type-not-a-string": Case((frame(type=["text.delta"], seq=2),)),
    "type-constructor": Case((frame(type="constructor", seq=2), frame(type="__proto__", seq=3))),
    "type-very-long": Case((frame(type="x" * 500, seq=2),)),
    # the schema
    "missing-field": Case((frame(type="text.delta", seq=2, turnId="t_1"),)),
    "wrong-type": Case((delta(2, 3),)),
    "extra-field": Case((delta(2, lang="fr"),)),
    "extra-proto-field": Case((delta(2)[:-1] + ', "__proto__": {"seq": 0}}',)),
    "bool-for-int": Case((started(2, epoch=True),)),
    "float-for-int": Case((started(2, epoch=1.5),)),
    "whole-float-for-int": Case((started(2, epoch=1.0), delta(3.0))),
    "negative-epoch": Case((started(2, epoch=-1),)),
    "seq-missing": Case((frame(type="text.delta", turnId="t_1", text="x"),)),
    "seq-a-string": Case((delta("2"),)),
    "seq-below-0": Case((delta(-1),)),
    "seq-over-2-53": Case((delta(2**53 + 2),)),
    "seq-2-64": Case((delta(2**64),)),
    "seq-2-53": Case((delta(2**53), delta(5, "dropped: not above 2**53"))),
    "a-long-error-is-cut": Case((delta(2, ["\U0001f600" * 300]),)),
    "arguments-delta-without-delta": Case((stream(2, "arguments-delta"),)),
    "settled-without-ok": Case((stream(2, "settled"),)),
    "settled-not-ok-without-code": Case((stream(2, "settled", ok=False),)),
    "unknown-phase": Case((stream(2, "finished"),)),
    "unknown-code": Case((stream(2, "settled", ok=False, code="OOPS"),)),
    "empty-call-id": Case(
        (
            frame(type="tool.call", seq=2, callId="", **CALL),
            frame(type="confirm.request", seq=3, callId="", **CONFIRM),
            frame(type="tool.abort", seq=4, callId=""),
        )
    ),
    "bad-risk": Case(
        (frame(type="confirm.request", seq=2, callId="c1", **{**CONFIRM, "risk": 3}),)
    ),
    "closed-with-a-local-reason": Case((frame(type="closed", seq=2, reason="too_large"),)),
    # the session
    "ack-above-what-was-sent": Case((frame(type="ack", seq=5), frame(type="ack", seq=1))),
    "second-welcome": Case(
        (frame(type="welcome", seq=2, **WELCOME, capabilities=list(ALL), lastSeq=1),)
    ),
    "a-replay-is-dropped": Case((delta(2, "a"), delta(2, "a again"), delta(3, "b"))),
    "a-refused-message-is-not-processed": Case((delta(2, 7), delta(2, "a"))),
    "a-transition-the-view-refuses": Case(
        (
            started(2),
            stream(3, "start"),
            stream(4, "arguments-complete", arguments={"q": "x"}),
            stream(5, "arguments-complete", arguments={"q": "x"}),
            stream(6, "progress", progress={"page": 1}),
            stream(7, "arguments-delta", delta="{"),
            stream(8, "settled", ok=True),
            stream(9, "settled", ok=True),
        )
    ),
    "an-error-from-the-server": Case(
        (frame(type="error", seq=2, code="RATE_LIMITED", message="slow down", ref=1),)
    ),
    "closed-by-the-server": Case((frame(type="closed", seq=2, reason="server"), delta(3))),
    # the frame's size: the limit counts code points (trio-websocket's len), not UTF-16 units
    "over-max-message-size": Case((delta(2, "a"), delta(3, "x" * LIMIT), delta(4, "b")), go=True),
    "wide-characters-under-the-limit": Case(
        (
            json.dumps(
                {**json.loads(delta(2)), "text": "\U0001f600" * (LIMIT // 2 + 9)},
                ensure_ascii=False,
            ),
        )
    ),
    # what the client sends
    "no-acks": Case(()),
    "acks": Case((), acks=True),
    "big-output": Case((frame(type="tool.call", seq=2, callId="c1", **{**CALL, "name": "big"}),)),
    "plain": Case((delta(2, "a"), delta(3, "b"))),
}

# A deep confirm.request: arguments nested 100 levels (both parsers take it)
_deep: Any = 0
for _ in range(100):
    _deep = [_deep]
CASES["nested-100-deep"] = Case(
    (frame(type="confirm.request", seq=2, callId="c1", **{**CONFIRM, "arguments": _deep}),)
)


# -- generated frames ----------------------------------------------------------------------------

_VALUES: tuple[Any, ...] = (
    None, True, False, 0, 1, -1, 1.5, 2**53, 2**53 + 2, 1e-7, "", "x", "c1", "t_1", "app",
    "server", "start", "arguments-delta", "arguments-complete", "progress", "settled",
    "cancelled", "failed", "FAILED", "TIMEOUT", "high", "it's \"odd\"\n", "\u00e9\u2028",
    [], [1, "a"], {}, {"q": "x"}, {"0": 1, "a": [None]},
)  # fmt: skip


_NEXT = {
    None: ["start"],
    "start": ["arguments-delta", "arguments-complete", "cancelled", "failed"],
    "arguments-delta": ["arguments-delta", "arguments-delta", "arguments-complete", "failed"],
    "arguments-complete": ["progress", "settled", "cancelled"],
    "progress": ["progress", "settled", "cancelled"],
}
"""The next phase of a call, mostly as a server would send it (its view's lifecycle)."""
_PHASES = ("start", "arguments-delta", "arguments-complete", "progress", "settled", "cancelled")


class _State:
    """What the generated server has said so far: its calls' phases, its epoch."""

    def __init__(self) -> None:
        self.calls: dict[str, str | None] = {"c1": None, "c2": None, "c3": None}
        self.epoch = 0
        self.made = 3


def _streamed(rng: random.Random, state: _State) -> dict[str, Any]:
    call = rng.choice(sorted(state.calls))
    choices = _NEXT.get(state.calls[call])
    phase = rng.choice(choices) if choices and rng.random() < 0.85 else rng.choice(_PHASES)
    state.calls[call] = phase
    if phase in ("settled", "cancelled", "failed"):
        del state.calls[call]
        state.made += 1
        state.calls[f"c{state.made}"] = None  # a new call takes its place
    streamed: dict[str, Any] = {"type": "tool.stream", "callId": call, "turnId": "t_1",
                                "epoch": state.epoch, "name": "lookup",
                                "kind": rng.choice(["server", "app"]), "phase": phase}  # fmt: skip
    if phase == "arguments-delta":
        streamed["delta"] = rng.choice(['{"q": ', '"x"', "}", "é" * 70])
    elif phase == "arguments-complete":
        streamed["arguments"] = rng.choice([{"q": "x"}, '{"q": "x"}', "1", "{", 2.5, [1e-7]])
    elif phase == "progress":
        streamed["progress"] = {"page": rng.randint(1, 8), "of": 8}
    elif phase == "settled":
        streamed.update(rng.choice([{"ok": True}, {"ok": False, "code": "FAILED"}]))
    elif phase == "failed":
        streamed["message"] = "the model stopped"
    return streamed


def _valid(rng: random.Random, seq: int, state: _State) -> dict[str, Any]:
    call = rng.choice(sorted(state.calls))
    kind = rng.choice(["stream"] * 5 + ["delta", "started", "ended", "preview", "confirm",
                                         "abort", "error", "ack"])  # fmt: skip
    message: dict[str, Any]
    if kind == "stream":
        message = _streamed(rng, state)
    elif kind == "started":
        state.epoch += rng.random() < 0.1  # a server-side interrupt, sometimes
        message = {"type": "turn.started", "turnId": "t_1", "epoch": state.epoch}
    else:
        messages: dict[str, dict[str, Any]] = {
            "delta": {"type": "text.delta", "turnId": "t_1", "text": rng.choice(["Hi.", "é"])},
            "ended": {"type": "turn.ended", "turnId": "t_1", "epoch": state.epoch,
                      "reason": "finished"},
            "preview": {"type": "tool.preview", "callId": call, "turnId": "t_1", "name": "lookup",
                        "arguments": '{"q"', "complete": rng.random() < 0.3},
            "confirm": {"type": "confirm.request", "callId": call, **CONFIRM},
            "abort": {"type": "tool.abort", "callId": call},
            "error": {"type": "error", "code": "RATE_LIMITED", "message": "oops"},
            "ack": {"type": "ack", "seq": rng.choice([0, 1, 2])},
        }  # fmt: skip
        message = messages[kind]
    if kind == "ack":
        return message  # its seq is what it acknowledges
    return message | ({"seq": seq} if rng.random() < 0.95 else {"seq": rng.choice([0, 1, seq - 1])})


def _mutated(rng: random.Random, message: dict[str, Any]) -> dict[str, Any]:
    message = dict(message)
    roll = rng.random()
    if roll < 0.15:
        message.pop(rng.choice(sorted(message)))
    elif roll < 0.35:
        message[rng.choice(sorted(message))] = rng.choice(_VALUES)
    elif roll < 0.45:
        message[rng.choice(["x", "ok", "code", "delta", "__proto__", "constructor"])] = rng.choice(
            _VALUES
        )
    return message


def generated(seed: int, count: int = 400) -> Iterator[str]:
    """``count`` frames of server messages, one in three changed (a field dropped, given
    another value, one added), some in batches: the same for a given seed in every
    process."""
    rng = random.Random(seed)
    state = _State()
    seq = 2
    left = count
    while left > 0:
        size = rng.choice([1, 1, 1, 2, 3])
        items = []
        for _ in range(min(size, left)):
            message = _valid(rng, seq, state)
            seq += 1
            items.append(_mutated(rng, message) if rng.random() < 0.35 else message)
        left -= size
        texts = [json.dumps(item) for item in items]
        yield texts[0] if len(texts) == 1 else batch(*texts)


for _seed in range(4):
    CASES[f"generated-{_seed}"] = Case(tuple(generated(_seed)))


# -- the server --------------------------------------------------------------------------------


async def handler(request: WebSocketRequest) -> None:
    name = request.path.strip("/")
    case = CASES[name]
    ws = await request.accept()

    async def receive() -> dict[str, Any]:
        while True:
            data = json.loads(await ws.get_message())
            for message in data if isinstance(data, list) else [data]:
                print(json.dumps([name, message]), flush=True)
                if message["type"] != "ack":
                    if case.acks and message["seq"]:
                        await ws.send_message(frame(type="ack", seq=message["seq"]))
                    return dict(message)

    try:
        hello = await receive()
        granted = [c for c in hello["capabilities"] if c in case.capabilities]
        await ws.send_message(frame(type="welcome", seq=1, **WELCOME, capabilities=granted,
                                    lastSeq=hello["seq"]))  # fmt: skip
        if case.go:
            while (await receive())["type"] != "input":
                pass
        for text in case.frames:
            await ws.send_message(text)
        await ws.send_message(frame(type="text.delta", seq=0, turnId="end", text="end"))
        while (await receive())["type"] != "close":
            pass
        await ws.send_message(frame(type="closed", seq=0, reason="client"))
        await ws.aclose()
    except ConnectionClosed:
        pass


async def main() -> None:
    async with trio.open_nursery() as nursery:
        serve = functools.partial(serve_websocket, max_message_size=16 << 20)
        server = await nursery.start(serve, handler, "127.0.0.1", 0, None)
        print(server.port, flush=True)


if __name__ == "__main__":
    trio.run(main)
