"""JSON Schemas compiled into plain Python predicates, for the hot path.

Why: jsonschema takes 40-90 µs to validate one ``tool.stream`` frame, more than
trio-websocket needs to carry it. The shipped schemas stay the single source, as the
machine classes do for the compiled tables: this module compiles the subset of JSON Schema
they use into closures (about 5 µs a frame), refuses at import any keyword outside that
subset, and the codec still asks jsonschema for the error message whenever a frame fails.
A property test checks both agree.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]

_IGNORED = {"$schema", "$id", "title", "description"}


def _is_type(name: str) -> Check:
    if name == "integer":  # JSON Schema: 1.0 is an integer too
        return lambda v: type(v) is int or (type(v) is float and v.is_integer())
    if name == "number":
        return lambda v: type(v) in (int, float)
    if name == "string":
        return lambda v: type(v) is str
    if name == "boolean":
        return lambda v: type(v) is bool
    if name == "object":
        return lambda v: type(v) is dict
    if name == "array":
        return lambda v: type(v) is list
    if name == "null":
        return lambda v: v is None
    raise ValueError(f"unsupported type {name!r}")


def _equal(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0 but True != 1."""
    if type(a) is bool or type(b) is bool:
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b) and (isinstance(a, int | float) == isinstance(b, int | float))


def compile_schema(schema: Any) -> Check:
    """A predicate equivalent to ``Draft202012Validator(schema).is_valid`` for our subset."""
    if schema is True or schema == {}:
        return lambda v: True
    if schema is False:
        return lambda v: False
    if not isinstance(schema, dict):
        raise ValueError(f"not a schema: {schema!r}")
    fused = _fused(schema)
    if fused is not None:
        return fused
    checks: list[Check] = []
    for key, value in schema.items():
        if key in _IGNORED or key in (
            "properties",
            "required",
            "additionalProperties",
            "then",
            "else",
        ):
            continue  # the object keywords compile together below; then/else with "if"
        if key == "if":
            checks.append(
                _if(
                    compile_schema(value),
                    compile_schema(schema.get("then", True)),
                    compile_schema(schema.get("else", True)),
                )
            )
        elif key == "uniqueItems":
            if value:
                checks.append(unique)
        elif key in _KEYWORDS:
            checks.append(_KEYWORDS[key](value))
        else:
            raise ValueError(f"unsupported keyword {key!r}")
    if any(k in schema for k in ("properties", "required", "additionalProperties")):
        checks.append(_object(schema))
    if len(checks) == 1:
        return checks[0]

    def all_checks(v: Any) -> bool:
        for check in checks:
            if not check(v):
                return False
        return True

    return all_checks


def _fused(schema: dict[str, Any]) -> Check | None:
    """One closure for the commonest small schemas (a bounded integer: seq, epoch; a
    non-empty string: callId), not one per keyword chained: a message checks ten fields."""
    keys = schema.keys() - _IGNORED
    kind = schema.get("type")
    if kind == "integer" and keys <= {"type", "minimum", "maximum"}:
        low, high = schema.get("minimum", -math.inf), schema.get("maximum", math.inf)
        if not all(type(b) in (int, float) for b in (low, high)):
            return None
        return lambda v: (
            (type(v) is int or (type(v) is float and v.is_integer())) and low <= v <= high
        )
    if (
        kind == "string"
        and keys <= {"type", "minLength"}
        and type(schema.get("minLength", 0)) is int
    ):
        shortest = schema.get("minLength", 0)
        return lambda v: type(v) is str and len(v) >= shortest
    return None


def _type(value: Any) -> Check:
    preds = [_is_type(n) for n in (value if isinstance(value, list) else [value])]
    if len(preds) == 1:
        return preds[0]
    return lambda v: any(f(v) for f in preds)


def _const(value: Any) -> Check:
    if type(value) is str:  # the common case: JSON equality of strings is str equality
        return lambda v: v == value and type(v) is str
    return lambda v: _equal(v, value)


def _enum(value: list[Any]) -> Check:
    if all(type(c) is str for c in value):  # e.g. phase, kind, code: a set lookup
        options = frozenset(value)
        return lambda v: type(v) is str and v in options
    return lambda v: any(_equal(v, c) for c in value)


def _minimum(value: float) -> Check:
    return lambda v: type(v) not in (int, float) or v >= value


def _maximum(value: float) -> Check:
    return lambda v: type(v) not in (int, float) or v <= value


def _min_length(value: int) -> Check:
    return lambda v: type(v) is not str or len(v) >= value


def _pattern(value: str) -> Check:
    rx = re.compile(value)
    return lambda v: type(v) is not str or rx.search(v) is not None


def _items(value: Any) -> Check:
    item = compile_schema(value)
    return lambda v: type(v) is not list or all(item(x) for x in v)


def _all_of(value: list[Any]) -> Check:
    parts = [compile_schema(s) for s in value]
    return lambda v: all(f(v) for f in parts)


def _any_of(value: list[Any]) -> Check:
    parts = [compile_schema(s) for s in value]
    return lambda v: any(f(v) for f in parts)


def _not(value: Any) -> Check:
    part = compile_schema(value)
    return lambda v: not part(v)


def _if(cond: Check, then: Check, other: Check) -> Check:
    return lambda v: then(v) if cond(v) else other(v)


_KEYWORDS: dict[str, Callable[[Any], Check]] = {
    "type": _type,
    "const": _const,
    "enum": _enum,
    "minimum": _minimum,
    "maximum": _maximum,
    "minLength": _min_length,
    "pattern": _pattern,
    "items": _items,
    "allOf": _all_of,
    "anyOf": _any_of,
    "not": _not,
}


def unique(v: Any) -> bool:
    """``uniqueItems``: no two items of a list are JSON-equal.

    A set of canonical keys, not every pair compared: a 1 MiB frame holds some 150,000
    items, and comparing each pair took hours (found by the fuzzer, tests/fuzzing).
    """
    if type(v) is not list:
        return True
    return len({_canonical(x) for x in v}) == len(v)


def _canonical(v: Any) -> Any:
    """A hashable key, equal for JSON-equal values: 1 and 1.0 alike, True and 1 not."""
    kind = type(v)
    if kind is str:
        return v
    if kind is bool:
        return (bool, v)
    if kind is int or kind is float:
        return (float, v)  # 1 == 1.0 and hash(1) == hash(1.0)
    if kind is list:
        return (list, tuple(_canonical(x) for x in v))
    if kind is dict:
        return (dict, frozenset((k, _canonical(x)) for k, x in v.items()))
    return (None, v)


def _object(schema: dict[str, Any]) -> Check:
    props = {name: compile_schema(s) for name, s in schema.get("properties", {}).items()}
    required = tuple(schema.get("required", ()))
    additional = schema.get("additionalProperties", True)
    if additional not in (True, False):
        raise ValueError("additionalProperties must be true or false here")

    def check(v: Any) -> bool:
        if type(v) is not dict:
            return True
        for name in required:
            if name not in v:
                return False
        for name, value in v.items():
            prop = props.get(name)
            if prop is None:
                if not additional:
                    return False
            elif not prop(value):
                return False
        return True

    if additional is False:
        return check
    named = tuple(props.items())

    def open_check(v: Any) -> bool:
        # Other properties allowed: only the named ones are looked at (an "if" on one
        # field of a ten-field message is one lookup, not a walk of the ten).
        if type(v) is not dict:
            return True
        for name in required:
            if name not in v:
                return False
        for name, prop in named:
            if name in v and not prop(v[name]):
                return False
        return True

    return open_check
