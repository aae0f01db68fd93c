"""The server's message schemas for the browser client, and the checker that reads them.

``vrt.js`` checks every message the server sends as the Python client does: against the
JSON Schemas in ``vrt/_wire/schemas/``. This module writes those schemas, as data, into
the generated ``machines.js`` (:mod:`vrt._cli.webtables`), with a small checker for
exactly the subset of JSON Schema that :mod:`vrt._core.fastcheck` compiles. A schema
using anything else is refused here, when the file is generated, as fastcheck refuses it
at import. The checker reports the first error in jsonschema's order (the schema's own
key order), with its path and jsonschema's wording, so a refused frame reads the same
in the page as in the Python client.

Regular expressions (``pattern``) are written for Python's ``re``; the generator turns
each into the JavaScript pattern that matches the same strings (``$`` also before a final
newline, ``.`` anything but a newline) and refuses any construct whose meaning differs
between the two (``\\d``, ``\\w``, inline flags, possessive quantifiers, ...).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from vrt._core.fastcheck import compile_schema
from vrt._wire import codec
from vrt._wire import messages as m

IGNORED = ("$schema", "$id", "title", "description")
"""Keys fastcheck ignores: left out of the generated data."""
KEYWORDS = frozenset(
    {
        *IGNORED,
        *("type", "const", "enum", "minimum", "maximum", "minLength", "pattern", "items"),
        *("uniqueItems", "properties", "required", "additionalProperties"),
        *("allOf", "anyOf", "not", "if", "then", "else"),
    }
)
"""What the checker reads (its KEYWORDS below): fastcheck's subset, no more and no less (a
test keeps the two equal, so a keyword fastcheck learns is refused here until the checker
reads it too)."""

_SUBSCHEMA = ("items", "not", "if", "then", "else")
_SUBSCHEMAS = ("allOf", "anyOf")
_ESCAPABLE = set("^$\\.*+?()[]{}|/")
"""What may follow a backslash outside a class, with the same meaning in both engines
(JavaScript's ``u`` flag allows no other identity escape)."""
_QUANTIFIER = re.compile(r"\{\d+(,\d*)?\}")


def server_schemas() -> dict[str, Any]:
    """Every server-to-client message type and its schema, as ``vrt/_wire/schemas/`` has
    it (``audio-v1``'s too: vrt.js speaks it)."""
    return {cls.TYPE: codec.schema_of(cls.TYPE) for cls in m.SERVER_TYPES}


def _strip(schema: Any) -> Any:
    """``schema`` without the keys the checker ignores, at every level."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in IGNORED:
            continue
        if key == "properties":
            value = {name: _strip(sub) for name, sub in value.items()}
        elif key in _SUBSCHEMAS:
            value = [_strip(sub) for sub in value]
        elif key in _SUBSCHEMA:
            value = _strip(value)
        out[key] = value
    return out


def _subschemas(schema: Any) -> Iterator[Any]:
    """``schema`` and every schema inside it."""
    yield schema
    if not isinstance(schema, dict):
        return
    unknown = sorted(schema.keys() - KEYWORDS)
    if unknown:
        raise ValueError(f"the browser's checker does not read {', '.join(unknown)}")
    for name, sub in schema.get("properties", {}).items():
        if re.fullmatch(r"0|[1-9][0-9]*", name):
            # JavaScript orders such keys first: the error order would not be the schema's
            raise ValueError(f"property name {name!r} looks like an array index")
        yield from _subschemas(sub)
    for key in _SUBSCHEMA:
        if key in schema:
            yield from _subschemas(schema[key])
    for key in _SUBSCHEMAS:
        for sub in schema.get(key, ()):
            yield from _subschemas(sub)


def js_pattern(pattern: str) -> str:
    """The JavaScript pattern (``u`` flag) that ``test``s true exactly where Python's
    ``re.search(pattern, ...)`` finds a match; ValueError for a construct outside the
    subset both engines read alike."""
    out: list[str] = []
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            escaped = pattern[i + 1 : i + 2]
            if not (escaped in _ESCAPABLE or (in_class and escaped == "-")):
                raise ValueError(f"pattern {pattern!r}: the escape \\{escaped} reads differently")
            out.append(c + escaped)
            i += 2
            continue
        if in_class:
            if c == "[":
                raise ValueError(f"pattern {pattern!r}: '[' inside a class")
            in_class = c != "]"
            out.append(c)
        elif c == "[":
            if pattern[i + 1 : i + 2] == "]" or pattern[i + 1 : i + 3] == "^]":
                raise ValueError(f"pattern {pattern!r}: a class opening with ']'")
            in_class = True
            out.append(c)
        elif c == ".":
            out.append("[^\\n]")  # Python's '.' matches '\r', '\u2028' and '\u2029' too
        elif c == "$":
            out.append("(?=\\n?$)")  # Python's '$' matches before a final newline too
        elif c == "(" and pattern[i + 1 : i + 2] == "?" and pattern[i + 2 : i + 3] != ":":
            raise ValueError(f"pattern {pattern!r}: only (?:...) groups are shared")
        elif c == "{":
            quantifier = _QUANTIFIER.match(pattern, i)
            if quantifier is None:
                raise ValueError(f"pattern {pattern!r}: a '{{' that is no quantifier")
            out.append(quantifier.group())
            i = quantifier.end()
            if pattern[i : i + 1] == "+":
                raise ValueError(f"pattern {pattern!r}: a possessive quantifier")
            continue
        elif c == "}":
            raise ValueError(f"pattern {pattern!r}: a '}}' that closes no quantifier")
        else:
            if c in "*+?" and pattern[i + 1 : i + 2] == "+":
                raise ValueError(f"pattern {pattern!r}: a possessive quantifier")
            out.append(c)
        i += 1
    if in_class:
        raise ValueError(f"pattern {pattern!r}: an unclosed class")
    return "".join(out)


def checked(schemas: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The schemas as the checker reads them, and their patterns translated; ValueError
    for anything outside fastcheck's subset (its own refusal) or the shared patterns."""
    data: dict[str, Any] = {}
    patterns: dict[str, str] = {}
    for name, schema in schemas.items():
        compile_schema(schema)  # fastcheck's subset, and nothing else
        for sub in _subschemas(schema):  # the checker's, the same
            if isinstance(sub, dict) and "pattern" in sub:
                patterns[sub["pattern"]] = js_pattern(sub["pattern"])
        data[name] = _strip(schema)
    return data, patterns


def schemas_js(schemas: Mapping[str, Any] | None = None) -> str:
    """The generated JavaScript: ``SCHEMAS`` (``schemas``, by default the server's
    messages), the patterns' translations and the checker. Self-contained (no import)."""
    data, patterns = checked(server_schemas() if schemas is None else schemas)
    rows = ",\n".join(
        f"  {json.dumps(name)}: {json.dumps(schema, separators=(', ', ': '))}"
        for name, schema in data.items()
    )
    table = "".join(f"  {json.dumps(p)}: {json.dumps(j)},\n" for p, j in patterns.items())
    return (
        "/** vrt/_wire/schemas/: the JSON Schema of every message the server sends. */\n"
        f"export const SCHEMAS = frozen({{\n{rows},\n}});\n\n"
        "/** Each pattern of SCHEMAS (Python's re) as the JavaScript pattern that matches the"
        " same strings. */\n"
        f"const PATTERNS = frozen({{\n{table}}});\n" + _CHECKER
    )


_CHECKER = r"""
function frozen(value) {
  if (typeof value === "object" && value !== null) {
    for (const item of Object.values(value)) frozen(item);
    Object.freeze(value);
  }
  return value;
}

const COMPILED = new Map();

/**
 * How `value` breaks `schema`: the first error in jsonschema's order, as [path, message]
 * (path: the property names and item indexes down to the offending value; message:
 * jsonschema's), or null when it is valid. Exactly the keywords vrt/_core/fastcheck.py
 * compiles; any other throws.
 */
export function explain(schema, value, path = []) {
  if (schema === true) return null;
  if (schema === false) return [path, `False schema does not allow ${pyRepr(value)}`];
  for (const key of Object.keys(schema)) {
    const keyword = KEYWORDS[key];
    if (keyword === undefined) throw new Error(`unsupported keyword ${key}`);
    const found = keyword(schema[key], value, path, schema);
    if (found !== null) return found;
  }
  return null;
}

const isObject = (v) => typeof v === "object" && v !== null && !Array.isArray(v);
const TYPES = {
  integer: (v) => Number.isInteger(v),  // JSON Schema: 1.0 is an integer too
  number: (v) => typeof v === "number",
  string: (v) => typeof v === "string",
  boolean: (v) => typeof v === "boolean",
  object: isObject,
  array: (v) => Array.isArray(v),
  null: (v) => v === null,
};
const skip = () => null;

const KEYWORDS = Object.assign(Object.create(null), {
  $schema: skip, $id: skip, title: skip, description: skip, then: skip, else: skip,
  type(rule, v, path) {
    const types = Array.isArray(rule) ? rule : [rule];
    if (types.some((t) => TYPES[t](v))) return null;
    return [path, `${pyRepr(v)} is not of type ${types.map(pyRepr).join(", ")}`];
  },
  const: (rule, v, path) => (equal(v, rule) ? null : [path, `${pyRepr(rule)} was expected`]),
  enum(rule, v, path) {
    if (rule.some((c) => equal(v, c))) return null;
    return [path, `${pyRepr(v)} is not one of ${pyRepr(rule)}`];
  },
  minimum(rule, v, path) {
    if (typeof v !== "number" || v >= rule) return null;
    return [path, `${pyRepr(v)} is less than the minimum of ${pyRepr(rule)}`];
  },
  maximum(rule, v, path) {
    if (typeof v !== "number" || v <= rule) return null;
    return [path, `${pyRepr(v)} is greater than the maximum of ${pyRepr(rule)}`];
  },
  minLength(rule, v, path) {
    if (typeof v !== "string" || codePoints(v) >= rule) return null;
    return [path, `${pyRepr(v)} ${rule === 1 ? "should be non-empty" : "is too short"}`];
  },
  pattern(rule, v, path) {
    if (typeof v !== "string") return null;
    let rx = COMPILED.get(rule);
    if (rx === undefined) {
      if (!Object.hasOwn(PATTERNS, rule)) throw new Error(`pattern ${rule} was not generated`);
      COMPILED.set(rule, (rx = new RegExp(PATTERNS[rule], "u")));
    }
    return rx.test(v) ? null : [path, `${pyRepr(v)} does not match ${pyRepr(rule)}`];
  },
  items(rule, v, path) {
    if (!Array.isArray(v)) return null;
    for (let i = 0; i < v.length; i++) {
      const found = explain(rule, v[i], [...path, i]);
      if (found !== null) return found;
    }
    return null;
  },
  uniqueItems(rule, v, path) {
    if (!rule || !Array.isArray(v) || new Set(v.map(canonical)).size === v.length) return null;
    let head = pyRepr(v.slice(0, 10));  // vrt/_wire/codec.py's message: the first ten
    if (v.length > 10) head = `${head.slice(0, -1)}, ...]`;
    return [path, `${head} has non-unique elements`];
  },
  properties(rule, v, path) {
    if (!isObject(v)) return null;
    for (const name of Object.keys(rule)) {
      if (!Object.hasOwn(v, name)) continue;
      const found = explain(rule[name], v[name], [...path, name]);
      if (found !== null) return found;
    }
    return null;
  },
  required(rule, v, path) {
    if (!isObject(v)) return null;
    const name = rule.find((n) => !Object.hasOwn(v, n));
    return name === undefined ? null : [path, `${pyRepr(name)} is a required property`];
  },
  additionalProperties(rule, v, path, schema) {
    if (rule === true || !isObject(v)) return null;
    if (rule !== false) throw new Error("additionalProperties must be true or false");
    const known = schema.properties ?? {};
    const extras = Object.keys(v).filter((k) => !Object.hasOwn(known, k)).sort(byCodePoint);
    if (extras.length === 0) return null;
    const named = `${extras.map(pyRepr).join(", ")} ${extras.length === 1 ? "was" : "were"}`;
    return [path, `Additional properties are not allowed (${named} unexpected)`];
  },
  allOf(rule, v, path) {
    for (const sub of rule) {
      const found = explain(sub, v, path);
      if (found !== null) return found;
    }
    return null;
  },
  anyOf(rule, v, path) {
    if (rule.some((sub) => explain(sub, v) === null)) return null;
    return [path, `${pyRepr(v)} is not valid under any of the given schemas`];
  },
  not(rule, v, path) {
    if (explain(rule, v) !== null) return null;
    return [path, `${pyRepr(v)} should not be valid under ${pyRepr(rule)}`];
  },
  if(rule, v, path, schema) {
    const branch = explain(rule, v) === null ? schema.then : schema.else;
    return branch === undefined ? null : explain(branch, v, path);
  },
});

/** JSON equality: 1 equals 1.0 (one number in JavaScript), true is not 1. */
function equal(a, b) {
  if (a === b) return true;
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a)) return a.length === b.length && a.every((x, i) => equal(x, b[i]));
  const keys = Object.keys(a);
  if (keys.length !== Object.keys(b).length) return false;
  return keys.every((k) => Object.hasOwn(b, k) && equal(a[k], b[k]));
}

function canonical(v) {
  if (!isObject(v)) return Array.isArray(v) ? `[${v.map(canonical).join(",")}]` : JSON.stringify(v);
  const keys = Object.keys(v).sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`).join(",")}}`;
}

/** Python's len(): code points (a lone surrogate is one). */
export function codePoints(text) {
  let n = text.length;
  for (let i = 0; i < text.length - 1; i++) {
    const c = text.charCodeAt(i);
    if (c >= 0xd800 && c < 0xdc00) {
      const d = text.charCodeAt(i + 1);
      if (d >= 0xdc00 && d < 0xe000) {
        n -= 1;
        i += 1;
      }
    }
  }
  return n;
}

/** Python's sort order of strings: by code point (JavaScript's own is by UTF-16 unit). */
function byCodePoint(a, b) {
  const x = [...a], y = [...b];
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    const d = x[i].codePointAt(0) - y[i].codePointAt(0);
    if (d !== 0) return d;
  }
  return x.length - y.length;
}

const UNPRINTABLE = /[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}]/u;
const hex = (c, n) => c.toString(16).padStart(n, "0");

/** Python's repr() of a JSON value, as jsonschema's messages quote it. A number that is
 * a whole one reads as an int (JavaScript cannot tell 1.0 from 1). */
export function pyRepr(v) {
  if (v === null) return "None";
  if (v === true) return "True";
  if (v === false) return "False";
  if (typeof v === "number") return pyNumber(v);
  if (typeof v === "string") return pyString(v);
  if (Array.isArray(v)) return `[${v.map(pyRepr).join(", ")}]`;
  return `{${Object.keys(v).map((k) => `${pyString(k)}: ${pyRepr(v[k])}`).join(", ")}}`;
}

/** Python's repr() of a number (json.dumps writes floats the same way). */
export function pyNumber(x) {
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
  if (Number.isInteger(x)) return BigInt(x).toString();
  if (Math.abs(x) >= 1e-4) return String(x);
  const [digits, exponent] = x.toExponential().split("e");
  return `${digits}e-${exponent.slice(1).padStart(2, "0")}`;
}

function pyString(s) {
  const quote = s.includes("'") && !s.includes('"') ? '"' : "'";
  let out = quote;
  for (const ch of s) {
    const c = ch.codePointAt(0);
    if (ch === quote || ch === "\\") out += `\\${ch}`;
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (c < 0x20 || (c >= 0x7f && c < 0xa0)) out += `\\x${hex(c, 2)}`;
    else if (c < 0x7f || !UNPRINTABLE.test(ch)) out += ch;
    else out += c < 0x100 ? `\\x${hex(c, 2)}` : c < 0x10000 ? `\\u${hex(c, 4)}` : `\\U${hex(c, 8)}`;
  }
  return out + quote;
}
"""
