"""The generator and the mutator: valid frames of every vrt/1 message type, and mutants of them.

Every choice comes from a :class:`Chooser`: a seeded ``random.Random`` for a long run
(``python -m tests.fuzzing``), Hypothesis draws in tests/test_fuzz.py (which then shrink).
"""

from __future__ import annotations

import copy
import json
import random
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from vrt._wire import messages as m

T = TypeVar("T")
Frame = str | bytes
Data = dict[str, Any]

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
CLIENT_TYPE_NAMES = tuple(cls.TYPE for cls in m.CLIENT_TYPES)
SERVER_TYPE_NAMES = tuple(
    cls.TYPE
    for cls in m.SERVER_TYPES
    # audio-v1's messages are unknown types where it is not granted (GRANTS never has it)
    if cls.TYPE not in ("audio.start", "audio.end", "transcript")
)


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
OFFERS = (
    (m.TOOL_STREAM_V1, 50),
    (m.BATCH_V1, 60),
    (m.LOCAL_PREVIEW_V1, 40),
    ("tool-stream-v2", 20),
    ("x-future", 20),
)
"""What a hello's capabilities offer, each with its chance in percent (a hello has a list
70% of the time: batch-v1 is offered in about 42% of hellos)."""
GRANTS = ((m.TOOL_STREAM_V1, 80), (m.BATCH_V1, 45), (m.LOCAL_PREVIEW_V1, 35), ("x-future", 5))
"""What a welcome's capabilities grant, each with its chance in percent."""
SERVER_SUPPORTS = (m.CAPABILITIES,) * 4 + (m.LEGACY,)
"""What a fuzzed server core supports (``ServerProtocol(capabilities=)``)."""
CLIENT_OFFERS = (m.CAPABILITIES,) * 6 + (m.LEGACY, (m.TOOL_STREAM_V1, m.BATCH_V1), ())
"""What a fuzzed client core offers (``ClientProtocol(capabilities=)``)."""
BATCH_SIZES = (1, 1, 2, 2, 3, 3, 4, 5)
LONG_BATCHES = (100, 101, 101, 150, 400)
"""Batches at and over :data:`vrt._wire.messages.BATCH_MESSAGES`, the server's bound."""
CLIENT_LONG_BATCHES = (100, 101, 150)
"""The client has no such bound: it reads every message of these (twice, with its twin)."""
EMPTY_BATCHES = ("[]", "[ ]", "[\n]")
ODD_ITEMS = ("1", "null", "true", '"input"', "0.5", '""', "[]", "{}", "[{}]", '[{"seq":1}]')
"""Items of a batch that are no message (``{}`` is an object, of no type)."""
NOT_OBJECT = "a frame must be a JSON object"
NOT_OBJECT_ITEM = "a batch's message must be a JSON object"


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
            data["capabilities"] = [o for o, percent in OFFERS if c.chance(percent)]
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
            if c.chance(20):
                data["heardMs"] = c.integer(0, 5000)
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
                capabilities=[g for g, percent in GRANTS if c.chance(percent)],
                resumed=c.chance(5),
                lastSeq=c.integer(0, 2),
            )
        elif type_ in ("turn.started", "turn.ended"):
            data.update(turnId=c.pick(TURN_IDS), epoch=epoch)
            if type_ == "turn.ended":
                data["reason"] = c.pick(("finished", "interrupted", "failed"))
        elif type_ == "text.delta":
            data.update(turnId=c.pick(TURN_IDS), text=self.text())
        elif type_ == "audio.start":
            data.update(turnId=c.pick(TURN_IDS), epoch=epoch)
        elif type_ == "audio.end":
            data.update(turnId=c.pick(TURN_IDS), sentMs=c.integer(0, 5000))
        elif type_ == "transcript":
            data.update(turnId=c.pick(TURN_IDS), role=c.pick(("user", "agent")), text=self.text())
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

    # -- batches (batch-v1) -----------------------------------------------------------------------

    def batch(
        self,
        message: Callable[[str | None], Data],
        ending: str,
        filler: str,
        long: Sequence[int] = LONG_BATCHES,
    ) -> Frame:
        """A frame of ``batch-v1``: a JSON array of 1 to 5 messages, each valid or mutated
        (``message(type)`` makes the next, of a random type for None); sometimes with items
        that are not messages, the session's end (``ending``: ``close`` or ``closed``) before
        the last, the frame itself mutated; rarely empty, or of one of the ``long`` lengths
        (``filler``'s type, consecutive seqs or replays; acks of 0)."""
        c = self.c
        self.ascii = c.chance(40)
        kind = c.integer(0, 99)
        if kind < 4:
            return c.pick(EMPTY_BATCHES)
        if kind < 7:
            count, plan = c.pick(long), c.pick((filler, filler, "replays", "ack"))
            if plan == "ack":
                items = ['{"type":"ack","seq":0}'] * count
            else:
                first = message(filler)
                step = int(plan != "replays")
                items = [
                    self.render({**first, "seq": first["seq"] + i * step}) for i in range(count)
                ]
            return "[" + ",".join(items) + "]"
        size = c.pick(BATCH_SIZES)
        end = c.integer(0, size - 2) if size > 1 and c.chance(12) else None
        parts = [self.item(message(ending if i == end else None)) for i in range(size)]
        if c.chance(12):
            parts.insert(c.integer(0, len(parts)), c.pick(ODD_ITEMS))
        text = "[" + c.pick((",", ", ", ",\n")).join(parts) + "]"
        frame: Frame = text
        if c.chance(8):
            frame = text = c.pick(_TEXT_OPS)(self, text)
        if c.chance(5):
            frame = c.pick(_BYTE_OPS)(self, text)
        if not self.raw_surrogates and isinstance(frame, str) and len(frame) > self.max_size // 4:
            frame = frame.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        return frame

    def item(self, data: Data) -> str:
        """One message of a batch as JSON text: valid, or changed by one or two small
        mutations of the object (rarely of its text too: the frame may then not parse, or
        hold an array where a message should be)."""
        c = self.c
        if c.chance(60):
            return self.render(data)
        raw: dict[str, str] = {}
        for _ in range(c.pick((1, 1, 2))):
            c.pick(_ITEM_OPS)(self, data, raw)
        text = self.render(data, raw)
        if c.chance(5):
            text = c.pick((Frames.truncate, Frames.wrap, Frames.insert))(self, text)
        return text

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
_SMALL_OPS: tuple[Callable[[Frames, Data, dict[str, str]], None], ...] = (
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
_OBJECT_OPS = (*_SMALL_OPS * 3, Frames.nest, Frames.nest, Frames.grow, Frames.oversize)
_ITEM_OPS = _SMALL_OPS
"""A batch's messages get only the small mutations: the frame around them stays small (the
frame itself may still be padded to the limit)."""
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
