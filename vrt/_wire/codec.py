"""The vrt/1 codec: JSON text <-> message records, schema first.

Decoding validates the frame against the JSON Schema of its ``type`` (shipped in
``schemas/`` as package data) before cattrs structures it; cattrs alone would quietly turn
``3`` into ``"3"``. The converter renames snake_case fields to the wire's camelCase and
forbids extra keys. Encoding leaves out fields that are None.
"""

from __future__ import annotations

import itertools
import json
import re
from importlib import resources
from typing import Any

import attrs
import cattrs
import jsonschema
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override
from jsonschema import Draft202012Validator, ValidationError
from jsonschema.protocols import Validator

from vrt._core.fastcheck import Check, compile_schema, unique
from vrt._wire import messages as m


class DecodeError(Exception):
    """A frame the codec refuses; ``code`` is the wire error code, ``ref`` the frame's seq."""

    def __init__(
        self, code: str, message: str, ref: int | None = None, type_: str | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.ref = ref
        self.type = type_


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


_converter = cattrs.Converter(forbid_extra_keys=True)


def _unstructure_result(result: m.WireResult) -> dict[str, Any]:
    # "A tool that returns nothing answers with output: null": keep output when ok.
    if result.ok:
        return {"ok": True, "output": result.output}
    data: dict[str, Any] = {"ok": False, "code": result.code}
    if result.message is not None:
        data["message"] = result.message
    return data


_converter.register_unstructure_hook(m.WireResult, _unstructure_result)


_RECORDS: tuple[type[Any], ...] = (
    m.ToolDecl,
    m.ResumeRequest,
    m.OpenCall,
    m.WireResult,
    m.AudioStream,
    m.AudioSpec,
    *m.CLIENT_TYPES,
    *m.SERVER_TYPES,
)
for _cls in dict.fromkeys(_RECORDS):
    _renames: dict[str, Any] = {
        f.name: override(rename=_camel(f.name)) for f in attrs.fields(_cls) if "_" in f.name
    }
    _converter.register_structure_hook(
        _cls, make_dict_structure_fn(_cls, _converter, _cattrs_forbid_extra_keys=True, **_renames)
    )
    if _cls is m.WireResult:
        continue  # its own unstructure hook, above
    _converter.register_unstructure_hook(
        _cls, make_dict_unstructure_fn(_cls, _converter, _cattrs_omit_if_default=True, **_renames)
    )


_BY_TYPE: dict[str, type[Any]] = {cls.TYPE: cls for cls in (*m.CLIENT_TYPES, *m.SERVER_TYPES)}


# The error messages are jsonschema's, but a frame of 1 MiB may hold 250,000 items: jsonschema
# descends into every one (about 5 µs each), and compares every pair for uniqueItems when
# they do not sort. So its validator is given the compiled check of ``items`` to skip the
# items that pass, and the linear uniqueness check (both found by the fuzzer, tests/fuzzing).
_ITEM_CHECKS: dict[int, tuple[Any, Check]] = {}


def _items(validator: Any, items: Any, instance: Any, schema: Any) -> Any:
    if not validator.is_type(instance, "array"):
        return
    key = id(items)
    if key not in _ITEM_CHECKS:  # the schema is kept too: its id stays its own
        _ITEM_CHECKS[key] = (items, compile_schema(items))
    passes = _ITEM_CHECKS[key][1]
    for index, item in enumerate(instance):
        if not passes(item):
            yield from validator.descend(instance=item, schema=items, path=index)


def _unique_items(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
    if value and validator.is_type(instance, "array") and not unique(instance):
        head = repr(instance[:10])  # not all of it: the message is cut short anyway
        if len(instance) > 10:
            head = head[:-1] + ", ...]"
        yield ValidationError(f"{head} has non-unique elements")


_Explainer: type[Validator] = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator, {"items": _items, "uniqueItems": _unique_items}
)


def _load_validators() -> dict[str, tuple[Check, Validator]]:
    folder = resources.files("vrt._wire").joinpath("schemas")
    validators = {}
    for name in _BY_TYPE:
        schema = json.loads(folder.joinpath(f"{name}.json").read_text())
        Draft202012Validator.check_schema(schema)
        validators[name] = (compile_schema(schema), _Explainer(schema))
    return validators


#: Per type: the compiled predicate (hot path) and jsonschema (error messages, the oracle).
_VALIDATORS = _load_validators()


def schema_of(type_: str) -> dict[str, Any]:
    """The JSON Schema shipped for a message type."""
    schema: Any = _VALIDATORS[type_][1].schema
    return dict(schema)


def _no_constants(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


# Built once: json.loads/json.dumps build a new decoder/encoder on every call that passes
# options (about 1 µs a frame each way).
_DECODER = json.JSONDecoder(parse_constant=_no_constants)
# allow_nan=False: Python writes NaN and Infinity, which no JSON parser reads (a value
# that reaches encode() unchecked is a ValueError here, never a frame the peer refuses).
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def decode(text: str | bytes, allowed: tuple[type[Any], ...]) -> Any:
    """One frame to one message record of the ``allowed`` types, or raise DecodeError."""
    data = parse(text)
    if not isinstance(data, dict):
        raise DecodeError(m.BAD_MESSAGE, "a frame must be a JSON object")
    return structure(data, allowed)


def parse(text: str | bytes) -> Any:
    """A frame's JSON, or raise DecodeError: ``BAD_JSON``, or ``BAD_MESSAGE`` for a
    binary frame (vrt/1 frames are text, UTF-8: ``json.loads`` would read bytes in UTF-16
    or UTF-32 too)."""
    if type(text) is not str:
        raise DecodeError(m.BAD_MESSAGE, "a binary frame: vrt/1 frames are text (UTF-8)")
    try:
        return _DECODER.decode(text)
    except RecursionError:
        raise DecodeError(m.BAD_JSON, "the frame is nested too deeply") from None
    except ValueError as exc:
        raise DecodeError(m.BAD_JSON, f"the frame is not JSON: {shorten(exc)}") from None


def structure(data: dict[str, Any], allowed: tuple[type[Any], ...]) -> Any:
    """One parsed message (a JSON object; it is consumed) to its record of the
    ``allowed`` types, or raise DecodeError."""
    ref = ref_of(data)
    type_ = data.get("type")
    cls = _BY_TYPE.get(type_) if isinstance(type_, str) else None
    if cls is None or cls not in allowed:
        shown = type_ if isinstance(type_, str) else None
        raise DecodeError(m.UNKNOWN_TYPE, f"unknown message type {shown!r}"[:200], ref)
    type_ = cls.TYPE
    fast, full = _VALIDATORS[type_]
    if not fast(data):
        detail = "does not match its schema"
        try:
            # The first error only: all of them can take seconds to collect (one per item
            # of a 1 MiB array, or uniqueItems comparing every pair of unsortable items).
            error = jsonschema.exceptions.best_match(itertools.islice(full.iter_errors(data), 1))
        except RecursionError:
            error, detail = None, "nested too deeply"
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(message)"
            detail = f"{where}: {shorten(error.message)}"
        raise DecodeError(m.BAD_MESSAGE, f"{type_}: {detail}", ref, type_)
    del data["type"]
    try:
        return _converter.structure(data, cls)
    except Exception as exc:  # the schema should have caught it; never leak a traceback
        raise DecodeError(m.BAD_MESSAGE, f"{type_}: {shorten(exc)}", ref, type_) from None


def encode(message: Any) -> str:
    """One message record to one frame of JSON text."""
    data: dict[str, Any] = {"type": message.TYPE}
    data.update(_converter.unstructure(message))
    return _ENCODER.encode(data)


def to_plain(record: Any) -> Any:
    """A record (a message's part, such as a :class:`~vrt._wire.messages.ToolDecl`) as the
    wire has it; :func:`from_plain` reads it back."""
    return _converter.unstructure(record)


def from_plain(data: Any, cls: type[Any]) -> Any:
    """The record of ``cls`` that :func:`to_plain` wrote."""
    return _converter.structure(data, cls)


def to_dict(message: Any) -> dict[str, Any]:
    """A message as the JSON object it is on the wire."""
    data: dict[str, Any] = json.loads(encode(message))
    return data


_SPACES = re.compile(r"\s+")


MAX_INTEGER = 2**53
"""The largest seq or epoch of the schemas (``maximum``): past it a number is refused, and
never echoed back in an error's ``ref``."""


def ref_of(data: Any) -> int | None:
    """The seq an error answering the message ``data`` (parsed JSON, of any shape) refers
    to, if it has a usable one."""
    return _ref(data.get("seq")) if type(data) is dict else None


def _ref(seq: Any) -> int | None:
    """The seq an error answering this frame refers to, if it has a usable one.

    JSON Schema counts 3.0 as an integer, and such a frame, when valid, is numbered 3: its
    error refers to 3 too, so that it counts as processed like any other (a replay of it
    is then dropped, not answered twice).
    """
    if type(seq) is float and seq.is_integer():
        seq = int(seq)
    return seq if type(seq) is int and 0 <= seq <= MAX_INTEGER else None


def shorten(exc: object, limit: int = 200) -> str:
    """``str(exc)`` on one line and at most ``limit`` characters (for error messages)."""
    text = _SPACES.sub(" ", str(exc))
    return text if len(text) <= limit else text[: limit - 3] + "..."
