"""Fuzzing the sans-IO protocol cores: generated and mutated frames, every outcome counted.

Run it as ``python bench/fuzz.py`` (``--cases N`` per core, 100,000 by default; ``--seed``;
``--quick`` for a smoke run; ``--oracle`` to check every verdict against jsonschema;
``--help`` for the rest). It drives :class:`vrt._wire.server.ServerProtocol` and
:class:`vrt._wire.client.ClientProtocol` directly (no socket, no trio) with frames from its
own generator and mutator, fed by ``random.Random(seed)``: a run is reproducible, and fast
(Hypothesis's ``.example()`` takes milliseconds a value). The same generator, fed by
Hypothesis draws instead (:class:`Chooser`), is the fuzzing slice of the test suite,
``tests/test_fuzz.py``, which then shrinks whatever it finds.

* **Frames.** Valid frames of every message type (client messages for the server core,
  server messages for the client core), and mutants of them: fields dropped, added,
  renamed or given the wrong type; huge, negative, fractional and non-JSON numbers
  (``NaN``, ``Infinity``, ``1e400``, 5,000 digits); values nested 2 to 100,000 deep; lone
  surrogates, escaped and raw; invalid UTF-8 and other encodings in binary frames;
  truncated JSON, duplicated keys, garbage around the object, no object at all; lists
  grown and frames padded to just under, at and over ``max_message_size``; and seq games
  (replays, 0, negative, gaps, huge).
* **Cases.** A case is one frame delivered to a core. Cases come in sequences of up to 11
  frames to a fresh core: for the server, a few frames before ``hello``, a ``hello``
  (mostly valid), then frames inside the session; for the client, after its own
  ``hello``, a ``welcome`` (mostly valid) and server frames, with the app's own actions
  (run and answer the next app call, interrupt, input) in between.
* **Checks.** Every frame a core queues must decode against its type's schema (the codec
  itself; also jsonschema with ``--oracle``), carry no traceback, and be numbered as
  PROTOCOL.md says; an ``error`` has a known code and a message of at most 500
  characters; the server returns at most one message, of a type its state allows, and
  nothing after ``closed``; neither core's acks ever claim more than was sent. After each
  sequence the core must still work: a valid ``input`` (server) or ``text.delta``
  (client) with the next seq is accepted, and an ack of everything sent empties the
  replay buffer. With ``--oracle`` each frame's expected verdict (``TOO_LARGE``,
  ``BAD_JSON``, ``BAD_MESSAGE``, ``UNKNOWN_TYPE``, silently dropped, accepted) is worked out
  independently, from ``json`` and jsonschema, and compared.

It prints how many cases ended in each outcome, how many escaped with an exception or broke
a check (both should be 0, with the first examples shown otherwise), how many took over
100 ms, and cases per second.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import platform
import random
import re
import signal
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from bench_common import version
from jsonschema import Draft202012Validator

import vrt
from vrt._wire import codec
from vrt._wire import messages as m
from vrt._wire.client import AbortApp, ClientProtocol, Welcomed
from vrt._wire.server import MAX_MESSAGE_SIZE, ServerProtocol

T = TypeVar("T")
Frame = str | bytes
Data = dict[str, Any]

SLOW = 0.1
"""A frame that takes longer than this many seconds is counted as slow."""
SERVER_TOOLS = ("weather", "lookup")
ERROR_LIMIT = 500
"""The longest error message any check allows (PROTOCOL.md: a short explanation)."""
ERROR_CODES = frozenset(
    {
        m.BAD_JSON,
        m.BAD_MESSAGE,
        m.UNKNOWN_TYPE,
        m.TOO_LARGE,
        m.BAD_STATE,
        m.UNKNOWN_CALL,
        m.STALE_EPOCH,
        m.DUPLICATE_RESULT,
        m.UNSUPPORTED_PROTOCOL,
        m.RESUME_FAILED,
        m.TOOL_CONFLICT,
        m.RATE_LIMITED,
        m.INTERNAL,
    }
)
DECODE_CODES = frozenset({m.TOO_LARGE, m.BAD_JSON, m.BAD_MESSAGE, m.UNKNOWN_TYPE})
"""The codes the codec and the frame checks answer, before any state is looked at."""
HELLO_REFUSALS = frozenset(
    {m.UNSUPPORTED_PROTOCOL, m.TOOL_CONFLICT, m.BAD_MESSAGE, m.RESUME_FAILED}
)
CLIENT_TYPE_NAMES = tuple(cls.TYPE for cls in m.CLIENT_TYPES)
SERVER_TYPE_NAMES = tuple(cls.TYPE for cls in m.SERVER_TYPES)
SESSION_ACTIONS = (m.Input, m.Interrupt, m.ToolResultMessage, m.ConfirmReply, m.Close)
"""What the server core may hand its session once the handshake is over."""
CLIENT_EVENTS = (
    vrt.TurnStarted,
    vrt.TurnEnded,
    vrt.TextDelta,
    vrt.ToolStream,
    vrt.ToolPreview,
    vrt.Closed,
    Welcomed,
    AbortApp,
    m.ConfirmRequestMessage,
    m.Error,
)
"""What the client core may hand the app."""
TRACEBACK_MARKS = ("Traceback", 'File "')


# -- choices -------------------------------------------------------------------------------------


class Chooser(Protocol):
    """Where every choice of the generator comes from: a seeded ``random.Random`` here, and
    Hypothesis draws in the test suite (which then shrinks towards the first option, the
    lowest integer and "no")."""

    def integer(self, lo: int, hi: int) -> int:
        """An integer from ``lo`` to ``hi``, both included."""
        ...

    def pick(self, options: Sequence[T]) -> T:
        """One of ``options`` (the first is the simplest)."""
        ...

    def chance(self, percent: int) -> bool:
        """True about ``percent`` times in a hundred."""
        ...


class RandomChooser:
    """A :class:`Chooser` from a seeded ``random.Random``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def pick(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]

    def chance(self, percent: int) -> bool:
        return self.rng.randrange(100) < percent


# -- values --------------------------------------------------------------------------------------

TEXTS = (
    "",
    "go",
    "hello there",
    "é",
    "日本語",
    "😀",
    "a\x00b",
    "line\nbreak",
    '"quoted"',
    "back\\slash",
    "\u2028",
    "null",
    "{}",
    "tool-stream-v1",
)
CHARS = (
    "a",
    "Z",
    " ",
    "é",
    "€",
    "😀",
    "\x00",
    "\x1f",
    '"',
    "\\",
    "/",
    "\n",
    "{",
    "\ud800",
    "\udfff",
)
"""Characters of generated strings: 1 to 4 UTF-8 bytes, controls, JSON's specials and lone
surrogates (escaped as ``\\ud800`` in a frame, or raw in a ``str`` frame)."""
INTEGERS = (0, 1, -1, 2, 3, 49, 50, 51, 2**31, 2**53 + 1, 2**63, -(2**63), 10**30, 10**4000)
FLOATS = (0.5, 1.0, -0.0, 3.0, 1e300, 1e-300, -2.5)
RAW_NUMBERS = (
    "NaN",
    "Infinity",
    "-Infinity",
    "1e400",
    "-1e400",
    "9" * 5000,  # over Python's 4,300-digit limit for int()
    "01",
    "+1",
    ".5",
    "1.",
    "0x1F",
    "1e",
    "-",
    "True",
    "nul",
    "1_000",
)
"""Tokens json.dumps never writes: not JSON, or JSON that is no Python int or float."""
RAW_STRINGS = (
    '"\\ud800"',
    '"\\udc00\\ud800"',
    '"\\ud83d\\ude00"',
    '"\\x41"',
    '"\\u12"',
    '"tab\tin"',
    '"\x00"',
    "'single'",
    '"unterminated',
)
TOOL_NAMES = ("highlight", "edit", "note_1", "a-b", "Z", "x" * 64)
BAD_TOOL_NAMES = ("", "high light", "x" * 65, "é", "a.b", "weather", "lookup")
PARAMETERS: tuple[Data, ...] = (
    {"type": "object"},
    {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    {
        "type": "object",
        "$defs": {"n": {"type": "integer"}},
        "properties": {"n": {"$ref": "#/$defs/n"}},
    },
)
BAD_PARAMETERS: tuple[Any, ...] = (
    {},
    {"type": "array"},
    {"type": 1},
    {"type": "object", "$ref": "https://example.com/schema"},
    {"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}},
    {"type": "object", "pattern": "("},
    {"type": "object", "minimum": "x"},
    {"type": "object", "properties": {"a": {"type": ["x"] * 50}}},
    [],
    "object",
)
CALL_IDS = ("call_1", "call_2", "call_3")
TURN_IDS = ("turn_1", "turn_2")
RESULT_CODES = ("INTERRUPTED", "REJECTED", "INVALID", "TIMEOUT", "FAILED")
PHASES = ("start", "arguments-delta", "arguments-complete", "progress", "settled", "cancelled")
SEQ_PLANS = ("next", "next", "next", "next", "next", "replay", "zero", "old", "gap", "huge")


# -- the generator -------------------------------------------------------------------------------


class Frames:
    """Frames for the cores: valid ones of every type, and mutants of them.

    ``raw_surrogates=False`` keeps raw lone surrogates out of ``str`` frames longer than a
    quarter of ``max_message_size`` (they are replaced with U+FFFD): there, the server
    core's size check raises UnicodeEncodeError, a known bug in ``server.py``, which the test
    suite keeps out of its way until that file is fixed.
    """

    def __init__(
        self, choose: Chooser, max_message_size: int, *, raw_surrogates: bool = True
    ) -> None:
        self.c = choose
        self.max_size = max_message_size
        self.raw_surrogates = raw_surrogates
        self.ascii = False
        """Whether the frame being rendered escapes every non-ASCII character."""

    # -- values -----------------------------------------------------------------------------------

    def text(self) -> str:
        c = self.c
        if c.chance(75):
            return c.pick(TEXTS)
        return "".join(c.pick(CHARS) for _ in range(c.integer(0, 8)))

    def number(self) -> int | float:
        c = self.c
        if c.chance(50):
            return c.integer(-3, 60)
        return c.pick(FLOATS) if c.chance(25) else c.pick(INTEGERS)

    def value(self, depth: int = 0) -> Any:
        """Any JSON value (containers at most 2 deep)."""
        c = self.c
        kind = c.integer(0, 6 if depth < 2 else 3)
        if kind == 0:
            return None
        if kind == 1:
            return c.chance(50)
        if kind == 2:
            return self.number()
        if kind == 3:
            return self.text()
        if kind == 4:
            return [self.value(depth + 1) for _ in range(c.integer(0, 3))]
        if kind == 5:
            return {self.text(): self.value(depth + 1) for _ in range(c.integer(0, 3))}
        return c.pick(([], {}, [[]], {"": {}}))

    # -- valid messages ---------------------------------------------------------------------------

    def hello(self, seq: int) -> Data:
        """A valid ``hello``; rarely one the server must refuse (resume, wrong protocol)."""
        c = self.c
        data: Data = {"type": "hello", "seq": seq, "protocol": "vrt/1"}
        if c.chance(70):
            offered = ("tool-stream-v1", "tool-stream-v2", "x-future")
            data["capabilities"] = [o for o in offered if c.chance(50)]
        if c.chance(60):
            names = [n for n in TOOL_NAMES if c.chance(30)]
            data["tools"] = [
                {"name": n, "description": self.text(), "parameters": c.pick(PARAMETERS)}
                for n in names
            ]
        if c.chance(5):
            data["resume"] = {"sessionId": "s_fuzz", "token": "guess", "lastSeq": c.integer(0, 3)}
        if c.chance(3):
            data["protocol"] = c.pick(("vrt/2", "VRT/1", "", "vrt/1 "))
        return data

    def client_message(self, type_: str, seq: int, acked: int) -> Data:
        """A valid client message of ``type_`` (an ``ack`` acknowledges about ``acked``)."""
        c = self.c
        data: Data = {"type": type_, "seq": seq}
        if type_ == "hello":
            return self.hello(seq)
        if type_ == "input":
            data["text"] = self.text()
        elif type_ == "interrupt":
            data["epoch"] = c.integer(0, 5)
        elif type_ == "tool.result":
            data["callId"] = c.pick(CALL_IDS)
            data["epoch"] = c.integer(0, 3)
            if c.chance(60):
                data["result"] = {"ok": True, "output": self.value()}
            else:
                data["result"] = {"ok": False, "code": c.pick(RESULT_CODES)}
                if c.chance(50):
                    data["result"]["message"] = self.text()
        elif type_ == "confirm.reply":
            data["callId"] = c.pick(CALL_IDS)
            data["approved"] = c.chance(50)
            if c.chance(30):
                data["reason"] = self.text()
        elif type_ == "ack":
            data["seq"] = max(0, acked + c.pick((0, 0, -1, -2, 1, 5)))
        return data

    def server_message(self, type_: str, seq: int, epoch: int, acked: int) -> Data:
        """A valid server message of ``type_`` (calls and turns from small pools, so that
        their phases meet)."""
        c = self.c
        data: Data = {"type": type_, "seq": seq}
        epoch = max(0, epoch + c.pick((0, 0, 0, 1, -1)))
        if type_ == "welcome":
            data.update(
                sessionId="s_fuzz",
                resumeToken="tok",
                epoch=epoch,
                capabilities=["tool-stream-v1"] if c.chance(80) else [],
                resumed=c.chance(5),
                lastSeq=c.integer(0, 2),
            )
        elif type_ in ("turn.started", "turn.ended"):
            data.update(turnId=c.pick(TURN_IDS), epoch=epoch)
            if type_ == "turn.ended":
                data["reason"] = c.pick(("finished", "interrupted", "failed"))
        elif type_ == "text.delta":
            data.update(turnId=c.pick(TURN_IDS), text=self.text())
        elif type_ == "tool.stream":
            data.update(self._stream(epoch))
        elif type_ == "tool.preview":
            data.update(
                callId=c.pick(CALL_IDS),
                turnId=c.pick(TURN_IDS),
                name=c.pick(TOOL_NAMES),
                arguments=c.pick(("", "{", '{"a": 1}')),
                complete=c.chance(50),
            )
        elif type_ == "tool.call":
            data.update(
                callId=c.pick(CALL_IDS),
                turnId=c.pick(TURN_IDS),
                epoch=epoch,
                name=c.pick(("edit", "highlight")),
                arguments=self.value(),
            )
        elif type_ == "tool.abort":
            data["callId"] = c.pick(CALL_IDS)
        elif type_ == "confirm.request":
            data.update(
                callId=c.pick(CALL_IDS),
                name=c.pick(TOOL_NAMES),
                arguments=self.value(),
                risk=c.pick(("high", "low", "medium", None)),
                prompt=self.text(),
            )
        elif type_ == "error":
            data.update(code=c.pick(sorted(ERROR_CODES)), message=self.text() or "no")
            if c.chance(50):
                data["ref"] = c.integer(0, 9)
        elif type_ == "closed":
            data["reason"] = c.pick(("server", "client", "expired", "rejected", "overflow"))
        elif type_ == "ack":
            data["seq"] = max(0, acked + c.pick((0, 0, -1, 1, 5)))
        return data

    def _stream(self, epoch: int) -> Data:
        c = self.c
        phase = c.pick(PHASES)
        data: Data = {
            "callId": c.pick(CALL_IDS),
            "turnId": c.pick(TURN_IDS),
            "epoch": epoch,
            "name": c.pick(("weather", "edit")),
            "kind": c.pick(("server", "app")),
            "phase": phase,
        }
        if phase == "arguments-delta":
            data["delta"] = self.text()
        elif phase == "arguments-complete":
            data["arguments"] = self.value()
        elif phase == "progress":
            data["progress"] = self.value()
        elif phase == "settled":
            data["ok"] = c.chance(60)
            if not data["ok"]:
                data["code"] = c.pick(RESULT_CODES)
        elif phase == "failed":
            data["message"] = self.text()
        return data

    # -- rendering --------------------------------------------------------------------------------

    def render(self, data: Data, raw: dict[str, str] | None = None) -> str:
        """``data`` as JSON text, with the raw tokens substituted (non-ASCII characters
        escaped or not, as :attr:`ascii` says)."""
        text = json.dumps(data, ensure_ascii=self.ascii, separators=(",", ":"))
        for placeholder, token in (raw or {}).items():
            text = text.replace(json.dumps(placeholder), token, 1)
        return text

    def valid(self, data: Data) -> str:
        """``data`` as a valid frame."""
        self.ascii = self.c.chance(40)
        return self.render(data)

    def frame(self, data: Data) -> Frame:
        """``data`` as a valid frame, or a mutant of it (about half the time)."""
        if self.c.chance(50):
            return self.valid(data)
        return self.mutant(data)

    # -- mutants ----------------------------------------------------------------------------------

    def mutant(self, data: Data) -> Frame:
        """``data`` changed by one to four mutations: of the object, then of its text, then
        of its bytes."""
        c = self.c
        self.ascii = c.chance(40)
        data = copy.deepcopy(data)
        raw: dict[str, str] = {}
        changes = c.pick((1, 1, 0, 2))
        for _ in range(changes):
            c.pick(_OBJECT_OPS)(self, data, raw)
        text = self.render(data, raw)
        if changes == 0 or c.chance(25):
            text = c.pick(_TEXT_OPS)(self, text)
        frame: Frame = text
        if c.chance(15):
            frame = c.pick(_BYTE_OPS)(self, text)
        if not self.raw_surrogates and isinstance(frame, str) and len(frame) > self.max_size // 4:
            frame = frame.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        return frame

    def _placeholder(self, raw: dict[str, str], token: str) -> str:
        key = f"\x00raw{len(raw)}\x00"
        raw[key] = token
        return key

    def _field(self, data: Data) -> str:
        return self.c.pick(sorted(data)) if data else "type"

    # object mutations: each changes ``data`` in place (raw tokens go to ``raw``)

    def drop(self, data: Data, raw: dict[str, str]) -> None:
        data.pop(self._field(data), None)

    def add(self, data: Data, raw: dict[str, str]) -> None:
        name = self.c.pick(("extra", "Type", "seq ", "callId", "ref", "__proto__", "", "text"))
        data[name if name not in data else name + "2"] = self.value()

    def rename(self, data: Data, raw: dict[str, str]) -> None:
        name = self._field(data)
        value = data.pop(name)
        snake = re.sub(r"([A-Z])", lambda x: "_" + x.group(1).lower(), name)
        data[self.c.pick((snake, name.upper(), name + "_", name.capitalize()))] = value

    def retype(self, data: Data, raw: dict[str, str]) -> None:
        data[self._field(data)] = self.value()

    def numbers(self, data: Data, raw: dict[str, str]) -> None:
        c = self.c
        numeric = [k for k in ("seq", "epoch", "lastSeq", "ref") if k in data] or ["seq"]
        name = c.pick(numeric)
        if c.chance(40):
            data[name] = self._placeholder(raw, c.pick(RAW_NUMBERS))
        else:
            data[name] = c.pick((-1, -(2**70), 1.5, 1e300, -0.0, 2.0, True, "1", None, 2**64))

    def tokens(self, data: Data, raw: dict[str, str]) -> None:
        c = self.c
        token = c.pick(RAW_NUMBERS + RAW_STRINGS)
        data[self._field(data)] = self._placeholder(raw, token)

    def nest(self, data: Data, raw: dict[str, str]) -> None:
        c = self.c
        name = self._field(data)
        depth = c.pick((2, 5, 50, 400, 2000, 100_000))
        inner = json.dumps(data.get(name))
        if c.chance(50):
            token = "[" * depth + inner + "]" * depth
        else:
            token = '{"a":' * depth + inner + "}" * depth
        data[name] = self._placeholder(raw, token)

    def retype_message(self, data: Data, raw: dict[str, str]) -> None:
        c = self.c
        choice = c.pick(
            ("dance", "", "INPUT", "input ", *CLIENT_TYPE_NAMES, *SERVER_TYPE_NAMES, 1, None, [])
        )
        data["type"] = choice

    def seq_games(self, data: Data, raw: dict[str, str]) -> None:
        c = self.c
        data["seq"] = c.pick((0, -1, -(10**20), 10**20, 10**4000, 1.0, 7.5, "1", None, False, []))

    def grow(self, data: Data, raw: dict[str, str]) -> None:
        """A list field (or a new one) grown to about 1/64, 1/2, just under or just over
        ``max_message_size``."""
        c = self.c
        target = c.pick((self.max_size // 64, self.max_size // 2, self.max_size - 64))
        target = max(64, target + c.pick((0, 0, 128)))
        kind = c.pick(("distinct", "same", "ints", "mixed", "objects", "tools"))
        name = c.pick(("capabilities", "tools")) if data.get("type") == "hello" else "extra"
        if kind == "tools" and data.get("type") == "hello":
            # Valid, distinct app tools. Each costs the server a JSON Schema check of its
            # parameters (about 0.2 ms): a few hundred are enough to show it.
            count = min(target // 64, 500)
            data["tools"] = [
                {"name": f"t{i}", "description": "", "parameters": {"type": "object"}}
                for i in range(count)
            ]
            return
        if kind == "distinct":
            data[name] = [f"c{i}" for i in range(target // 8)]
        elif kind == "same":
            data[name] = ["c"] * (target // 4)
        elif kind == "ints":
            data[name] = [1] * (target // 2)
        elif kind == "mixed":
            data[name] = [*(f"c{i}" for i in range(target // 9)), 1, [], {}]
        else:
            data[name] = [{}] * (target // 3)

    def oversize(self, data: Data, raw: dict[str, str]) -> None:
        """A string field padded so the frame is just under, at or just over the limit, in
        UTF-8 bytes, with 1 to 4-byte characters."""
        c = self.c
        name = c.pick([k for k in data if isinstance(data[k], str) and k != "type"] or ["text"])
        char = c.pick(("x", "é", "€", "😀"))
        target = self.max_size + c.pick((0, -1, 1, 2, 3, -3, 100))
        data[name] = ""
        base = len(self.render(data).encode("utf-8", "surrogatepass"))
        room = max(0, target - base)
        data[name] = self._placeholder(raw, '"' + char * (room // len(char.encode())) + '"')

    def parts(self, data: Data, raw: dict[str, str]) -> None:
        """A mutation inside a nested part: a hello's tools or resume, a result."""
        c = self.c
        type_ = data.get("type")
        if type_ == "hello":
            tool: Data = {"name": "edit", "description": "", "parameters": {"type": "object"}}
            what = c.pick(("name", "parameters", "description", "extra", "duplicate", "resume"))
            if what == "name":
                tool["name"] = c.pick(BAD_TOOL_NAMES)
            elif what == "parameters":
                tool["parameters"] = c.pick(BAD_PARAMETERS)
            elif what == "description":
                del tool["description"]
            elif what == "extra":
                tool["risk"] = "low"
            elif what == "resume":
                data["resume"] = c.pick(({}, {"sessionId": 1}, [], None, {"lastSeq": -1}))
                return
            tools = data.setdefault("tools", [])
            if not isinstance(tools, list):
                return
            tools.append(tool)
            if what == "duplicate":
                tools.append(dict(tool))
        elif type_ == "tool.result":
            data["result"] = c.pick(
                (
                    {"ok": True, "code": "FAILED"},
                    {"ok": False},
                    {"ok": False, "code": "FAILED", "output": 1},
                    {"ok": False, "code": "NOPE"},
                    {"ok": "yes"},
                    {},
                    {"ok": True, "output": None, "extra": 1},
                )
            )
        elif type_ == "tool.stream":
            data["phase"] = c.pick(("settled", "arguments-delta", "nope"))
            data.pop("ok", None)
            data.pop("delta", None)
        else:
            self.retype(data, raw)

    # text mutations: each returns new text

    def truncate(self, text: str) -> str:
        return text[: self.c.integer(0, max(0, len(text) - 1))]

    def wrap(self, text: str) -> str:
        c = self.c
        before = c.pick(("", "", "\ufeff", " ", "[", "\n", "\x00"))
        after = c.pick(("", "}", " ", "\n", "{}", "x", "\x00", ",", "]"))
        return before + text + after

    def duplicate_key(self, text: str) -> str:
        c = self.c
        if not text.startswith("{"):
            return text
        key = c.pick(('"seq":1,', '"seq":-1,', '"type":"input",', '"type":"dance",', '"text":"a",'))
        return "{" + key + text[1:] if c.chance(50) else text[:-1] + "," + key[:-1] + "}"

    def insert(self, text: str) -> str:
        c = self.c
        at = c.integer(0, len(text))
        char = c.pick(('"', "\\", "\x00", "{", "}", ",", ":", "é", "\ud800", "\udc00"))
        return text[:at] + char + text[at:]

    def replace(self, text: str) -> str:
        return self.c.pick(
            ("[]", "[1]", '"input"', "1", "null", "true", "", " ", "{}", "{" * 5000, "[" * 100_000)
        )

    def pad(self, text: str) -> str:
        """Whitespace after the opening brace: still valid JSON, the size near the limit."""
        c = self.c
        target = self.max_size + c.pick((0, -1, 1, self.max_size))
        room = max(0, target - len(text.encode("utf-8", "surrogatepass")))
        return text[:1] + c.pick((" ", "\n", "\t")) * room + text[1:]

    # byte mutations: each returns a binary frame

    def utf8(self, text: str) -> bytes:
        return text.encode("utf-8", "surrogatepass")

    def encoding(self, text: str) -> bytes:
        encoding = self.c.pick(("utf-16", "utf-16-le", "utf-32", "utf-8-sig", "latin-1"))
        return text.encode(encoding, "replace")

    def bad_bytes(self, text: str) -> bytes:
        c = self.c
        data = text.encode("utf-8", "surrogatepass")
        at = c.integer(0, len(data))
        bad = c.pick(
            (b"\xff", b"\xfe", b"\xc3", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80")
        )
        return data[:at] + bad + data[at:]

    def cut_bytes(self, text: str) -> bytes:
        data = text.encode("utf-8", "surrogatepass")
        return data[: self.c.integer(0, max(0, len(data) - 1))]


# Small mutations are three times as likely as the ones that make frames near the limit
# (their JSON takes milliseconds to write and to read).
_OBJECT_OPS: tuple[Callable[[Frames, Data, dict[str, str]], None], ...] = (
    *(
        Frames.drop,
        Frames.add,
        Frames.rename,
        Frames.retype,
        Frames.numbers,
        Frames.tokens,
        Frames.retype_message,
        Frames.seq_games,
        Frames.parts,
    )
    * 3,
    Frames.nest,
    Frames.nest,
    Frames.grow,
    Frames.oversize,
)
_TEXT_OPS: tuple[Callable[[Frames, str], str], ...] = (
    *(Frames.truncate, Frames.wrap, Frames.duplicate_key, Frames.insert, Frames.replace) * 2,
    Frames.pad,
)
_BYTE_OPS: tuple[Callable[[Frames, str], bytes], ...] = (
    Frames.utf8,
    Frames.encoding,
    Frames.bad_bytes,
    Frames.cut_bytes,
)


def next_seq(c: Chooser, last: int) -> int:
    """The seq of the next frame after ``last``: mostly ``last + 1``, sometimes a replay,
    0, an older one, a gap or a huge jump."""
    plan = c.pick(SEQ_PLANS)
    if plan == "next":
        return last + 1
    if plan == "replay":
        return last
    if plan == "zero":
        return 0
    if plan == "old":
        return c.integer(0, last)
    if plan == "gap":
        return last + c.integer(2, 1000)
    return last + 10**20


# -- the oracle ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """What a frame is, worked out from ``json`` and jsonschema alone (not the codec)."""

    code: str | None
    """The error code the codec must answer, or None for a valid message."""
    type: str | None = None
    seq: int | None = None
    """The seq an error refers to (``ref``), or the valid message's seq."""


@functools.cache
def _validator(type_: str) -> Draft202012Validator:
    return Draft202012Validator(codec.schema_of(type_))


def _not_json(token: str) -> Any:
    raise ValueError(token)


def verdict(frame: Frame, allowed: Sequence[str], max_size: int | None = None) -> Verdict:
    """The oracle: how PROTOCOL.md says a frame must be answered, before any state."""
    if max_size is not None:
        size = len(frame.encode("utf-8", "surrogatepass") if isinstance(frame, str) else frame)
        if size > max_size:
            return Verdict(m.TOO_LARGE)
    try:
        data = json.loads(frame, parse_constant=_not_json)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return Verdict(m.BAD_JSON)
    if not isinstance(data, dict):
        return Verdict(m.BAD_MESSAGE)
    seq = data.get("seq")
    if type(seq) is float and seq.is_integer():
        seq = int(seq)
    ref = seq if type(seq) is int and 0 <= seq <= 2**53 else None  # as the schemas bound it
    type_ = data.get("type")
    if not isinstance(type_, str) or type_ not in allowed:
        return Verdict(m.UNKNOWN_TYPE, None, ref)
    try:
        valid = _validator(type_).is_valid(data)
    except RecursionError:
        valid = False
    return Verdict(None if valid else m.BAD_MESSAGE, type_, ref)


# -- checks --------------------------------------------------------------------------------------


class Violation(AssertionError):
    """A core broke one of the checks."""


class Escaped(AssertionError):
    """An exception escaped a core (the original is its ``__cause__``)."""


class Hung(BaseException):
    """A frame took longer than the hang limit (raised by SIGALRM, where there is one).

    A BaseException, so that no ``except Exception`` inside a core can swallow it.
    """


def expect(ok: bool, what: str) -> None:
    if not ok:
        raise Violation(what)


def short(frame: Frame, limit: int = 160) -> str:
    """A frame shown in a failure: its start, and its length if it is long."""
    if len(frame) <= limit:
        return repr(frame)
    return f"{frame[:limit]!r}... ({len(frame):,} long)"


def shown(items: Sequence[Any]) -> str:
    """Messages, events or parsed frames shown in a failure, briefly."""
    parts = []
    for item in items:
        if isinstance(item, dict):
            parts.append(f"{item.get('type')}#{item.get('seq')} {item.get('code', '')}".strip())
        else:
            parts.append(f"{type(item).__name__}#{getattr(item, 'seq', '')}")
    return f"[{', '.join(parts)}]"


def seq_in(frame: Frame) -> int | None:
    """The seq a frame carries, as a core numbers it (None if it has no usable one)."""
    try:
        data = json.loads(frame, parse_constant=_not_json)
    except (ValueError, RecursionError):
        return None
    seq = data.get("seq") if isinstance(data, dict) else None
    if type(seq) is float and seq.is_integer():
        seq = int(seq)
    return seq if type(seq) is int else None


@contextlib.contextmanager
def hang_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`Hung` in the block after ``seconds`` (if the platform has setitimer)."""
    if not seconds or not hasattr(signal, "setitimer"):
        yield
        return

    def hung(signum: int, frame: object) -> None:
        raise Hung(f"over {seconds} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Driver:
    """What both sides' drivers share: timing, the outbox checks, numbering."""

    def __init__(self, *, oracle: bool, time_limit: float | None, hang: float | None) -> None:
        self.oracle = oracle
        self.time_limit = time_limit
        """Seconds over which a frame is a :class:`Violation` (None: only counted)."""
        self.hang = hang
        self.elapsed = 0.0
        """How long the last frame or action took."""
        self.last: Frame = ""
        """The last frame delivered."""
        self.quirks: Counter[str] = Counter()
        """Known deviations seen (reported, not yet fixed), which the checks let pass."""
        self.peer_seq = 0
        """The last seq the peer (this driver) numbered a frame with."""
        self.numbered = 0
        """The last numbered frame from the core."""
        self.acked = 0
        """The last ack from the core."""
        self.closed = False

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` (a core's receive, or an app action), timed; an exception escapes as
        :class:`Escaped`."""
        started = time.perf_counter()
        try:
            with hang_limit(self.hang):
                result = fn()
        except Exception as exc:
            raise Escaped(f"{type(exc).__name__} escaped {what}: {exc}"[:500]) from exc
        finally:
            self.elapsed = time.perf_counter() - started
        if self.time_limit is not None:
            expect(self.elapsed <= self.time_limit, f"{what} took {self.elapsed:.3f} s")
        return result

    def check_frame(self, frame: str, allowed: tuple[type[Any], ...], in_session: bool) -> Data:
        """One frame a core queued: clean, valid against its schema, numbered right."""
        expect(isinstance(frame, str), f"a binary frame: {short(frame)}")
        for mark in TRACEBACK_MARKS:
            expect(mark not in frame, f"{mark!r} in {short(frame)}")
        data: Data = json.loads(frame)
        try:
            codec.decode(frame, allowed)
        except codec.DecodeError as exc:
            if data.get("callId") != "" or data.get("type") != "tool.result":
                raise Violation(f"{short(frame)} does not decode: {exc.message}") from None
            # Known, reported: tool.call allows an empty callId, tool.result does not, and
            # the client answers a stale call with the callId it was given.
            self.quirks["empty callId answered"] += 1
        else:
            if self.oracle:
                problems = [e.message for e in _validator(data["type"]).iter_errors(data)]
                expect(not problems, f"{short(frame)} breaks its schema: {problems}")
        if data["type"] == "error":
            expect(data["code"] in ERROR_CODES, f"unknown code in {short(frame)}")
            expect(0 < len(data["message"]) <= ERROR_LIMIT, f"message length: {short(frame)}")
        expect(not self.closed, f"{short(frame)} after closed")
        seq = data["seq"]
        if data["type"] == "ack":
            expect(in_session, f"{short(frame)} outside a session")
            expect(self.acked < seq <= self.peer_seq, f"{short(frame)} after ack {self.acked}")
            self.acked = seq
        elif in_session:
            expect(seq == self.numbered + 1, f"{short(frame)} after seq {self.numbered}")
            self.numbered = seq
        else:
            expect(seq == 0, f"{short(frame)} outside a session must have seq 0")
        if data["type"] == "closed":
            self.closed = True
        return data


class ServerDriver(Driver):
    """A :class:`ServerProtocol` fed frames, every answer checked."""

    def __init__(
        self,
        max_message_size: int = MAX_MESSAGE_SIZE,
        *,
        oracle: bool = False,
        time_limit: float | None = None,
        hang: float | None = None,
    ) -> None:
        super().__init__(oracle=oracle, time_limit=time_limit, hang=hang)
        self.max_size = max_message_size
        self.proto = ServerProtocol(
            session_id="s_fuzz",
            resume_token="tok",
            server_tools=SERVER_TOOLS,
            max_message_size=max_message_size,
        )

    def feed(self, frame: Frame) -> str:
        """Deliver one frame; check everything; return its outcome."""
        proto = self.proto
        state, received, sent_before = proto.state, proto.received_seq, proto.sent_seq
        self.last = frame
        got = self.call("ServerProtocol.receive", lambda: proto.receive(frame))
        seq = seq_in(frame)
        if seq is not None:
            self.peer_seq = max(self.peer_seq, seq)
        sent = proto.take_outbox()
        types = [json.loads(f)["type"] for f in sent]
        welcome = types.index("welcome") if "welcome" in types else len(sent)
        out = []
        for i, answer in enumerate(sent):
            in_session = self.numbered > 0 or i >= welcome
            if i < welcome < len(sent) and types[i] == "ack":
                # Known, reported: a hello numbered 50 or more is acked before the welcome
                # (ServerProtocol._hello accepts its seq before it sends the welcome).
                self.quirks["ack before welcome"] += 1
                in_session = True
            out.append(self.check_frame(answer, m.SERVER_TYPES, in_session))
        replies = [f for f in out if f["type"] != "ack"]
        what = f"{short(frame)} in state {state}: returned {shown(got)}, sent {shown(replies)}"
        expect(isinstance(got, list) and len(got) <= 1, what)
        expect(proto.acked_by_peer <= proto.sent_seq, f"acked beyond sent after {what}")
        expect(len(proto.replay) <= proto.replay_limit, f"replay over its bound after {what}")
        expect(
            proto.replay_bytes == sum(len(f) for _, f in proto.replay)
            and proto.replay_bytes <= proto.replay_limit_bytes,
            f"replay bytes miscounted or over their bound after {what}",
        )
        expect(proto.received_seq >= received, f"received seq went back after {what}")
        if state == "closed":
            expect(not got and not out, f"anything after closed: {what}")
            return "silent (after closed)"
        self._check_shape(state, received, got, replies, what)
        if self.oracle:
            self._check_verdict(frame, state, received, got, replies, what, sent_before)
        if replies and replies[-1]["type"] == "closed":
            return f"closed {replies[-1]['reason']}"
        if replies and replies[0]["type"] == "error":
            return f"error {replies[0]['code']}"
        if got:
            return f"accepted {got[0].TYPE}"
        return "silent (replay or ack)"

    def _check_shape(
        self, state: str, received: int, got: list[Any], replies: list[Data], what: str
    ) -> None:
        """What the server may return and send for one frame, whatever the frame."""
        proto = self.proto
        types = [r["type"] for r in replies]
        for message in got:
            if state == "handshaking":
                expect(isinstance(message, m.Hello), what)
                welcomed = proto.state == "open" and types == ["welcome"]
                # A resume is returned, unanswered, for the server to decide which session
                # it resumes (the resume work in progress).
                kept = message.resume is not None and proto.state == "handshaking"
                expect(welcomed or (kept and not replies), what)
                continue
            expect(isinstance(message, SESSION_ACTIONS), what)
            expect(received < message.seq == proto.received_seq, what)
            closing = isinstance(message, m.Close)
            expect(closing == (proto.state == "closed"), what)
            expect(types == (["closed"] if closing else []), what)
            expect(not closing or replies[0]["reason"] == "client", what)
        if "error" in types:
            expect(not got and types[0] == "error", what)
            if len(types) == 2:
                expect(state == "handshaking" and proto.state == "closed", what)
                expect(types[1] == "closed" and replies[1]["reason"] == "rejected", what)
            else:
                expect(types == ["error"], what)
        if "welcome" in types:
            expect(state == "handshaking" and types == ["welcome"] and len(got) == 1, what)

    def _check_verdict(
        self,
        frame: Frame,
        state: str,
        received: int,
        got: list[Any],
        replies: list[Data],
        what: str,
        sent: int,
    ) -> None:
        """The answer is the one the oracle (``json`` and jsonschema) expects (``sent``: the
        last seq the server had sent before the frame)."""
        v = verdict(frame, CLIENT_TYPE_NAMES, self.max_size)
        codes = [r["code"] for r in replies if r["type"] == "error"]
        refs = [r.get("ref") for r in replies if r["type"] == "error"]
        if v.code is not None:
            if state == "open" and v.seq is not None and v.seq <= received:
                expect(not replies, f"a replay answered: {what}")  # answered the first time
                return
            expect(codes == [v.code] and refs == [v.seq], f"expected {v.code} {v.seq}: {what}")
            refused = state == "handshaking" and v.type == "hello"
            expect((len(replies) == 2) == refused, f"closed or not: {what}")
            return
        expect(not set(codes) & {m.TOO_LARGE, m.BAD_JSON, m.UNKNOWN_TYPE}, f"valid: {what}")
        if v.type == "ack":
            above = v.seq is not None and v.seq > sent  # acks what was never sent
            expect(not got and codes == ([m.BAD_MESSAGE] if above else []), what)
        elif state == "handshaking" and v.type != "hello":
            expect(codes == [m.BAD_STATE] and refs == [v.seq], what)
        elif state == "handshaking":
            expect(bool(got) or (len(codes) == 1 and codes[0] in HELLO_REFUSALS), what)
        elif v.seq is not None and v.seq <= received:
            expect(not got and not replies, f"a replay taken: {what}")
        elif v.type == "hello":
            expect(codes == [m.BAD_STATE] and refs == [v.seq], what)
        else:
            expect([(g.TYPE, g.seq) for g in got] == [(v.type, v.seq)], what)

    def probe(self) -> None:
        """The session still works: a valid ``input`` with the next seq is taken (after a
        valid ``hello`` if the handshake is not over), then an ack of everything sent
        empties the replay buffer. A closed core stays silent."""
        proto = self.proto
        if proto.state == "closed":
            outcome = self.feed('{"type":"input","seq":1,"text":"x"}')
            expect(outcome == "silent (after closed)", f"closed, yet {outcome}")
            return
        if proto.state == "handshaking":
            hello = {"type": "hello", "seq": proto.received_seq + 1, "protocol": "vrt/1"}
            outcome = self.feed(json.dumps(hello))
            expect(outcome == "accepted hello" and proto.state == "open", f"probe: {outcome}")
        seq = proto.received_seq + 1
        sent = proto.sent_seq
        outcome = self.feed(json.dumps({"type": "input", "seq": seq, "text": "probe"}))
        expect(outcome == "accepted input", f"probe input {seq}: {outcome}")
        expect(proto.sent_seq == sent, "probe input answered")
        outcome = self.feed(json.dumps({"type": "ack", "seq": proto.sent_seq}))
        expect(outcome.startswith("silent"), f"probe ack: {outcome}")
        expect(not proto.replay and proto.acked_by_peer == proto.sent_seq, "probe ack: kept")


class ClientDriver(Driver):
    """A :class:`ClientProtocol` (after its ``hello``) fed server frames and app actions."""

    def __init__(
        self, *, oracle: bool = False, time_limit: float | None = None, hang: float | None = None
    ) -> None:
        super().__init__(oracle=oracle, time_limit=time_limit, hang=hang)
        tools = [m.ToolDecl(name="edit", description="", parameters={"type": "object"})]
        self.proto = ClientProtocol(tools)
        self.proto.hello()
        self.drain()
        self.server_seq = 0
        """The last seq this driver numbered a server frame with."""

    def drain(self) -> None:
        """Check every frame the client queued (the client numbers all but its acks)."""
        for frame in self.proto.take_outbox():
            self.peer_seq = self.proto.received_seq  # what its acks may acknowledge
            self.check_frame(frame, m.CLIENT_TYPES, True)

    def feed(self, frame: Frame) -> str:
        """Deliver one server frame; check everything; return its outcome."""
        proto = self.proto
        received = proto.received_seq
        self.last = frame
        got = self.call("ClientProtocol.receive", lambda: proto.receive(frame))
        self.drain()
        what = f"{short(frame)}: returned {shown(got)}"
        expect(isinstance(got, list), what)
        for item in got:
            expect(isinstance(item, CLIENT_EVENTS), f"not an event: {what}")
            if isinstance(item, m.Error) and item.message.startswith("from the server:"):
                # The client's own report of a broken frame (the server's errors are
                # handed on as they came).
                expect(item.code in ERROR_CODES and len(item.message) <= ERROR_LIMIT, what)
                for mark in TRACEBACK_MARKS:
                    expect(mark not in item.message, what)
        self.check_state(what)
        expect(proto.received_seq >= received, f"received seq went back: {what}")
        if self.oracle:
            v = verdict(frame, SERVER_TYPE_NAMES)
            if v.code is not None:
                codes = [g.code for g in got if isinstance(g, m.Error)]
                expect(len(got) == 1 and codes == [v.code], f"expected {v.code}: {what}")
            elif v.type != "ack" and v.seq is not None and 0 < v.seq <= received:
                expect(got == [], f"a replay taken: {what}")
        if not got:
            return "silent (replay, ack or dropped)"
        first = got[0]
        if isinstance(first, m.Error) and first.message.startswith("from the server:"):
            return f"local error {first.code}"
        if any(isinstance(g, vrt.Closed) for g in got):
            return "closed"
        return f"event {type(first).__name__}"

    def check_state(self, what: str) -> None:
        proto = self.proto
        expect(proto.acked_by_peer <= proto.sent_seq, f"acked beyond sent: {what}")
        expect(proto.running is None or proto.running in proto.app_calls, f"running: {what}")
        expect(all(c in proto.app_calls for c in proto.queue), f"queue: {what}")

    def act(self, c: Chooser) -> str:
        """One of the app's own actions, checked like a frame; return its name."""
        proto = self.proto
        action = c.pick(("run", "answer", "fail", "interrupt", "input", "confirm"))
        if action == "run":
            self.call("next_app_call", proto.next_app_call)
        elif action in ("answer", "fail"):
            running = proto.running
            if running is None:
                return "nothing to answer"
            result = (
                vrt.ToolResult.success({"ok": 1})
                if action == "answer"
                else vrt.ToolResult.failure(vrt.ResultCode.FAILED, "no")
            )
            self.call("answer", lambda: proto.answer(running, result))
        elif action == "interrupt":
            self.call("interrupt", proto.interrupt)
        elif action == "input":
            self.call("send_input", lambda: proto.send_input("more"))
        else:
            call_id = c.pick(CALL_IDS)
            self.call("confirm_reply", lambda: proto.confirm_reply(call_id, True))
        self.drain()
        self.check_state(f"after {action}")
        return action

    def probe(self) -> None:
        """The client still works: a ``text.delta`` with the next seq is handed on, and an
        ack of everything it sent empties its replay buffer."""
        proto = self.proto
        seq = proto.received_seq + 1
        frame = json.dumps({"type": "text.delta", "seq": seq, "turnId": "t", "text": "probe"})
        got = self.call("receive", lambda: proto.receive(frame))
        expect(got == [vrt.TextDelta(turn_id="t", text="probe")], f"probe: {shown(got)}")
        self.drain()
        self.feed(json.dumps({"type": "ack", "seq": proto.sent_seq}))
        expect(not proto.replay and proto.acked_by_peer == proto.sent_seq, "probe ack: kept")


# -- sequences -----------------------------------------------------------------------------------


def server_sequence(
    c: Chooser, frames: Frames, driver: ServerDriver, count: Callable[[str], None]
) -> None:
    """One sequence to a fresh server core: frames before ``hello``, a ``hello``, frames in
    the session; ``count`` gets each frame's outcome. Ends with :meth:`ServerDriver.probe`."""
    proto = driver.proto

    def frame_of(type_: str) -> Frame:
        seq = next_seq(c, driver.peer_seq)
        data = frames.client_message(type_, seq, proto.sent_seq)
        return frames.frame(data)

    for _ in range(c.pick((0, 0, 0, 1, 2))):
        count(driver.feed(frame_of(c.pick(CLIENT_TYPE_NAMES))))
    hello = frames.hello(c.pick((1, 1, 1, 0, 2, 7)))
    count(driver.feed(frames.valid(hello) if c.chance(80) else frames.mutant(hello)))
    weights = ("input",) * 4 + ("interrupt", "tool.result", "confirm.reply", "ack", "hello")
    for _ in range(c.integer(1, 8)):
        type_ = "close" if c.chance(3) else c.pick(weights)
        count(driver.feed(frame_of(type_)))
    driver.probe()


def client_sequence(
    c: Chooser, frames: Frames, driver: ClientDriver, count: Callable[[str], None]
) -> None:
    """One sequence to a client core that sent its ``hello``: a ``welcome`` (mostly valid),
    server frames and app actions; ends with :meth:`ClientDriver.probe`."""
    proto = driver.proto

    def frame_of(type_: str) -> Frame:
        seq = next_seq(c, driver.server_seq)
        if type_ == "ack":
            seq = 0
        else:
            driver.server_seq = max(driver.server_seq, seq)
        data = frames.server_message(type_, seq, proto.epoch, proto.sent_seq)
        return frames.frame(data)

    welcome = frames.server_message("welcome", 1, 0, 0)
    driver.server_seq = 1
    count(driver.feed(frames.valid(welcome) if c.chance(85) else frames.mutant(welcome)))
    weights = ("tool.stream",) * 4 + ("tool.call",) * 2 + SERVER_TYPE_NAMES
    for _ in range(c.integer(1, 10)):
        count(driver.feed(frame_of(c.pick(weights))))
        if c.chance(30):
            driver.act(c)
    driver.probe()


# -- the run -------------------------------------------------------------------------------------


@dataclass
class Tally:
    """The outcomes of one core's run."""

    core: str
    outcomes: Counter[str] = field(default_factory=Counter)
    cases: int = 0
    sequences: int = 0
    probes: int = 0
    slow: int = 0
    slowest: float = 0.0
    slowest_frame: str = ""
    failures: list[str] = field(default_factory=list)
    quirks: Counter[str] = field(default_factory=Counter)
    wall: float = 0.0

    @property
    def escaped(self) -> int:
        return sum(n for k, n in self.outcomes.items() if k.startswith("escaped"))

    @property
    def broken(self) -> int:
        return self.outcomes["broken check"]


def run(
    core: str,
    cases: int,
    seed: int,
    max_message_size: int,
    *,
    oracle: bool,
    hang: float,
    verbose: bool,
) -> Tally:
    """Sequences, each to a fresh core (``server`` or ``client``), until ``cases`` frames
    were delivered."""
    tally = Tally(core)
    rng = random.Random(f"{seed}:{core}")
    c = RandomChooser(rng)
    frames = Frames(c, max_message_size)
    started = time.perf_counter()
    while tally.cases < cases:
        tally.sequences += 1
        driver: ServerDriver | ClientDriver
        if core == "server":
            driver = ServerDriver(max_message_size, oracle=oracle, hang=hang)
        else:
            driver = ClientDriver(oracle=oracle, hang=hang)

        def count(outcome: str, driver: Driver = driver) -> None:
            tally.cases += 1
            tally.outcomes[outcome] += 1
            if driver.elapsed > SLOW:
                tally.slow += 1
            if driver.elapsed > tally.slowest:
                tally.slowest = driver.elapsed
                tally.slowest_frame = f"{outcome}: {short(driver.last, 60)}"

        try:
            if isinstance(driver, ServerDriver):
                server_sequence(c, frames, driver, count)
            else:
                client_sequence(c, frames, driver, count)
            tally.probes += 1
        except (Violation, Escaped, Hung) as exc:
            label = (
                "broken check"
                if isinstance(exc, Violation)
                else f"escaped {type(exc.__cause__).__name__}"
                if isinstance(exc, Escaped)
                else "hung"
            )
            tally.cases += 1
            tally.outcomes[label] += 1
            if len(tally.failures) < 5 or verbose:
                where = ""
                if exc.__cause__ is not None:
                    tb = traceback.extract_tb(exc.__cause__.__traceback__)[-1]
                    where = f" (at {tb.filename.split('/vrt/')[-1]}:{tb.lineno})"
                tally.failures.append(f"{label}{where}: {exc}"[:600])
        tally.quirks += driver.quirks
    tally.wall = time.perf_counter() - started
    return tally


def report(args: argparse.Namespace, tallies: list[Tally]) -> None:
    for tally in tallies:
        rate = tally.cases / tally.wall if tally.wall else 0.0
        what = "ServerProtocol.receive" if tally.core == "server" else "ClientProtocol.receive"
        print(
            f"\n{tally.core} core ({what}): {tally.cases:,} cases in {tally.sequences:,} "
            f"sequences, {tally.wall:.1f} s, {rate:,.0f} cases/s"
        )
        width = max(len(k) for k in tally.outcomes)
        for outcome, n in sorted(tally.outcomes.items()):
            print(f"  {outcome:<{width}}  {n:>8,}  {n / tally.cases:6.1%}")
        print(f"  {'escaped exception':<{width}}  {tally.escaped:>8,}   (should be 0)")
        print(f"  {'broken check':<{width}}  {tally.broken:>8,}   (should be 0)")
        print(
            f"  {'slow (> 100 ms)':<{width}}  {tally.slow:>8,}   slowest "
            f"{tally.slowest * 1000:.1f} ms ({tally.slowest_frame})"
        )
        print(
            f"  still working after their sequence: {tally.probes:,} of "
            f"{tally.sequences:,} sequences"
        )
        for quirk, n in tally.quirks.items():
            print(f"  known deviation, reported: {quirk} ({n:,} times)")
        for failure in tally.failures:
            print(f"  ! {failure}")


# -- main ----------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Fuzz the sans-IO vrt/1 cores with generated and mutated frames."
    )
    add = parser.add_argument
    add("--cases", type=int, default=100_000, help="frames per core (100,000)")
    add("--seed", type=int, default=0, help="seed of random.Random (0)")
    add("--core", choices=("server", "client", "both"), default="both", help="(both)")
    add(
        "--max-message-size",
        type=int,
        default=MAX_MESSAGE_SIZE,
        help=f"the server core's limit, bytes ({MAX_MESSAGE_SIZE:,})",
    )
    add("--oracle", action="store_true", help="check every verdict against jsonschema (slower)")
    add("--hang", type=float, default=10.0, help="seconds after which a frame is hung (10)")
    add("--quick", action="store_true", help="a fast smoke run (2,000 cases per core)")
    add("-v", "--verbose", action="store_true", help="show every failure, not the first 5")
    args = parser.parse_args(argv)
    if args.quick:
        args.cases = 2_000
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    print(
        f"vrt fuzz: Python {platform.python_version()}, jsonschema {version('jsonschema')}, "
        f"cattrs {version('cattrs')}, {platform.machine()}; seed {args.seed}, "
        f"{args.cases:,} cases per core, max_message_size {args.max_message_size:,}"
        f"{', oracle' if args.oracle else ''}"
    )
    cores = ("server", "client") if args.core == "both" else (args.core,)
    tallies = [
        run(
            core,
            args.cases,
            args.seed,
            args.max_message_size,
            oracle=args.oracle,
            hang=args.hang,
            verbose=args.verbose,
        )
        for core in cores
    ]
    report(args, tallies)
    return 1 if any(t.escaped or t.broken or t.outcomes["hung"] for t in tallies) else 0


if __name__ == "__main__":
    sys.exit(main())
