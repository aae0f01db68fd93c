"""The oracle: how PROTOCOL.md says a frame must be answered, worked out from ``json`` and
jsonschema alone (not the codec), before any state is looked at."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator

from tests.fuzzing.frames import Frame
from vrt._wire import codec
from vrt._wire import messages as m

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
def validator(type_: str) -> Draft202012Validator:
    """jsonschema's validator of the shipped schema of message type ``type_``."""
    return Draft202012Validator(codec.schema_of(type_))


def _not_json(token: str) -> Any:
    raise ValueError(token)


NOT_JSON: Any = object()
"""What :func:`parse_frame` returns for a frame that is not JSON."""
OBJECT: Any = object()
"""A frame not parsed, which :func:`opens_object` says is an object or not JSON."""


BINARY: Any = object()
"""What :func:`parse_frame` returns for a binary frame: never read (``BAD_MESSAGE``)."""


def parse_frame(frame: Frame) -> Any:
    """A frame's JSON value, as PROTOCOL.md reads it (no ``NaN``), :data:`NOT_JSON`, or
    :data:`BINARY` for a binary frame (whatever it holds)."""
    if isinstance(frame, bytes):
        return BINARY
    try:
        return json.loads(frame, parse_constant=_not_json)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return NOT_JSON


def opens_object(frame: Frame) -> bool:
    """Whether a text frame's JSON opens with ``{`` (it is then an object, or not JSON)."""
    if not isinstance(frame, str):
        return False  # some other encoding, perhaps: parse it
    at = _SPACE.match(frame).end()
    return frame[at : at + 1] == "{"


def oversize(frame: Frame, limit: int) -> bool:
    """Whether a frame is over ``limit`` in UTF-8 bytes (a lone surrogate counts 3)."""
    if len(frame) <= limit // 4:
        return False
    return len(frame.encode("utf-8", "surrogatepass") if isinstance(frame, str) else frame) > limit


_SPACE = re.compile(r"[ \t\n\r]*")
_ITEM_DECODER = json.JSONDecoder(parse_constant=_not_json)


def item_texts(frame: Frame) -> list[str]:
    """The JSON text of each item of a frame that parses to an array, exactly as it came
    (``1e400`` stays ``1e400``: a value re-encoded would not)."""
    text = (
        frame
        if isinstance(frame, str)
        else frame.decode(json.detect_encoding(frame), "surrogatepass")
    )
    at = _SPACE.match(text, _SPACE.match(text).end() + 1).end()  # past "["
    items: list[str] = []
    while text[at] != "]":
        _, end = _ITEM_DECODER.raw_decode(text, at)
        items.append(text[at:end])
        at = _SPACE.match(text, end).end()
        if text[at] == ",":
            at = _SPACE.match(text, at + 1).end()
    return items


def verdict(frame: Frame, allowed: Sequence[str], max_size: int | None = None) -> Verdict:
    """The oracle: how PROTOCOL.md says a frame must be answered, before any state (an
    array, the frame of a batch, is refused here: see :func:`verdict_of` for its items)."""
    if max_size is not None and oversize(frame, max_size):
        return Verdict(m.TOO_LARGE)
    if isinstance(frame, bytes):  # PROTOCOL.md: text frames; a binary one, whatever it holds
        return Verdict(m.BAD_MESSAGE)
    data = parse_frame(frame)
    if data is NOT_JSON:
        return Verdict(m.BAD_JSON)
    return verdict_of(data, allowed)


def usable_seq(data: Any) -> int | None:
    """The seq an error answering the message ``data`` refers to: an integer within the
    schemas' bounds (3.0 counts as 3), else None."""
    seq = data.get("seq") if isinstance(data, dict) else None
    if type(seq) is float and seq.is_integer():
        seq = int(seq)
    return seq if type(seq) is int and 0 <= seq <= 2**53 else None  # as the schemas bound it


def verdict_of(data: Any, allowed: Sequence[str]) -> Verdict:
    """The oracle for one parsed message (a frame's, or one of a batch)."""
    if not isinstance(data, dict):
        return Verdict(m.BAD_MESSAGE)
    ref = usable_seq(data)
    type_ = data.get("type")
    if not isinstance(type_, str) or type_ not in allowed:
        return Verdict(m.UNKNOWN_TYPE, None, ref)
    try:
        valid = validator(type_).is_valid(data)
    except RecursionError:
        valid = False
    return Verdict(None if valid else m.BAD_MESSAGE, type_, ref)
