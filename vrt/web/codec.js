// codec.js: vrt.js's codec (vrt/_wire/codec.py's rules), pure functions and no state.
// Part of the browser client: a page imports /vrt.js, never this module.
//
// Out: a message as the frame Python's codec writes (compact JSON in ASCII), and values
// as Python's json.dumps writes them (the local previews' text). In: a frame's size as
// trio-websocket counts it, its JSON with what Python's json refuses and JSON.parse takes
// refused too, and each message checked against its type's schema (machines.js, generated
// from vrt/_wire/schemas/). What fails is a Broken with the Python client's code and
// message; the core turns it into an `error` event. VrtError, what the app is thrown, is
// here too: every other module throws or recognises it.

import { SCHEMAS, codePoints, explain, pyNumber, pyRepr } from "./machines.js";

/** Nesting deeper than this is BAD_JSON: Python's json stops at its recursion limit, 1,000
 * frames less the stack it parses on (about 985 in the Python client). */
const MAX_DEPTH = 980;
/** Python's int() refuses a longer integer (sys.int_info.default_max_str_digits). */
const MAX_DIGITS = 4300;

/** A lost connection or a refused session, as the app sees it. */
export class VrtError extends Error {
  constructor(code, message) {
    super(message);
    this.name = "VrtError";
    this.code = code;
  }
}

/** A frame or message from the server that the codec refuses (vrt/_wire/codec.py's
 * DecodeError): it becomes an `error` event, never an exception out of a handler. */
export class Broken extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

/** Python's json.dumps (", " and ": ", ASCII escapes): the text the server's engine
 * previews arguments that came whole with, so local previews match the wire's. */
export function pythonJson(value) {
  if (value === null || value === undefined) return "null";
  if (typeof value === "boolean") return value ? "true" : "false";
  if (typeof value === "number") {
    return Number.isFinite(value) ? pyNumber(value) : value > 0 ? "Infinity" : "-Infinity";
  }
  if (typeof value === "string") {
    return ascii(JSON.stringify(value));
  }
  if (Array.isArray(value)) return `[${value.map(pythonJson).join(", ")}]`;
  const items = Object.entries(value).map(([k, v]) => `${pythonJson(k)}: ${pythonJson(v)}`);
  return `{${items.join(", ")}}`;
}

/** The JSON text of arguments that came whole (the engine's json.dumps); raw text that
 * does not parse stays as it is (vrt/_wire/client.py's _arguments_text). */
export function argumentsText(args) {
  if (typeof args === "string") {
    try {
      JSON.parse(args);
    } catch {
      return args;
    }
  }
  return pythonJson(args);
}

/** A message as the frame Python's codec writes: compact JSON in ASCII (every other
 * character escaped), so its length is its size in bytes, as the Python side counts. */
export function encode(message) {
  return ascii(JSON.stringify(message));
}

/** JSON text with every character past ASCII escaped, and DEL, as Python's ensure_ascii
 * escapes them (JSON.stringify escapes the control characters already). */
function ascii(json) {
  return json.replace(/[\u007f-\uffff]/g, (c) => `\\u${hex4(c)}`);
}

function hex4(c) {
  return c.charCodeAt(0).toString(16).padStart(4, "0");
}

/** A frame's size as trio-websocket counts it for the Python client's limit: bytes of a
 * binary frame, code points (not UTF-16 units) of a text frame. */
export function frameSize(data, limit) {
  if (typeof data === "string") return data.length > limit ? codePoints(data) : data.length;
  return data.byteLength ?? data.size ?? 0;
}

/** vrt/_wire/codec.py's parse(): a text frame's JSON, or Broken. (UTF-16 or UTF-32 bytes
 * in a text frame, valid UTF-8 when they are ASCII, are no JSON: BAD_JSON, as in Python;
 * in a binary frame they are BAD_MESSAGE, as any binary frame.) */
export function parse(text) {
  if (text.length > MAX_DEPTH) refuseWhatPythonRefuses(text);
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new Broken("BAD_JSON", `the frame is not JSON: ${shorten(error.message)}`);
  }
}

/** What Python's json refuses and JSON.parse takes: nesting deeper than MAX_DEPTH, an
 * integer of more than MAX_DIGITS digits. (Both keep a duplicate key's last value, refuse
 * NaN and Infinity, take an escaped lone surrogate.) */
function refuseWhatPythonRefuses(text) {
  let depth = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 34) {
      for (i++; i < text.length; i++) {
        const d = text.charCodeAt(i);
        if (d === 92) i++;
        else if (d === 34) break;
      }
    } else if (c === 91 || c === 123) {
      if (++depth > MAX_DEPTH) throw new Broken("BAD_JSON", "the frame is nested too deeply");
    } else if (c === 93 || c === 125) {
      depth--;
    } else if (c >= 48 && c <= 57) {
      const start = i;
      while (isDigit(text.charCodeAt(i + 1))) i++;
      const next = text.charCodeAt(i + 1);
      const digits = i + 1 - start;
      if (digits > MAX_DIGITS && next !== 46 && next !== 69 && next !== 101) {
        const why = `an integer of ${digits} digits (the limit is ${MAX_DIGITS})`;
        throw new Broken("BAD_JSON", `the frame is not JSON: ${why}`);
      }
      while (isNumberPart(text.charCodeAt(i + 1))) i++; // its fraction and exponent
    }
  }
}

const isDigit = (c) => c >= 48 && c <= 57;
const isNumberPart = (c) => isDigit(c) || c === 46 || c === 69 || c === 101 || c === 43 || c === 45;
// (. E e + -: what may follow a number's integer part)

/** vrt/_wire/codec.py's structure(), without the records: the message, checked against
 * its type's schema, or Broken. */
export function structure(data, what) {
  if (typeof data !== "object" || data === null || Array.isArray(data)) {
    throw new Broken("BAD_MESSAGE", `${what} must be a JSON object`);
  }
  const type = Object.hasOwn(data, "type") ? data.type : undefined;
  if (typeof type !== "string" || !Object.hasOwn(SCHEMAS, type)) {
    const shown = typeof type === "string" ? pyRepr(type) : "None";
    throw new Broken("UNKNOWN_TYPE", cut(`unknown message type ${shown}`, 200));
  }
  const problem = explain(SCHEMAS[type], data);
  if (problem !== null) {
    const [path, message] = problem;
    const where = path.join("/") || "(message)";
    throw new Broken("BAD_MESSAGE", `${type}: ${where}: ${shorten(message)}`);
  }
  return data;
}

/** vrt/_wire/codec.py's shorten(): one line, at most `limit` characters (code points). */
function shorten(text, limit = 200) {
  const line = text.replace(/\s+/g, " ");
  return codePoints(line) <= limit ? line : `${cut(line, limit - 3)}...`;
}

/** `text`'s first `limit` characters (code points, as Python counts them). */
export function cut(text, limit) {
  return codePoints(text) <= limit ? text : Array.from(text).slice(0, limit).join("");
}
