// vrt.js: the browser client of vrt/1 (PROTOCOL.md), a dependency-free ES module.
//
// The same client half as the Python client (vrt/_wire/client.py, vrt/_client/client.py):
// hello/welcome and capabilities (tool-stream-v1, batch-v1, local-preview-v1,
// handover-v1), seq/ack and the replay buffer, resume with jittered backoff and a connect
// deadline (at once after a close 1012, saying which calls and turn it holds open), the
// epoch gate, the serial app-tool runner (one at a time, arrival order), interrupt()
// cancelling every open call locally at once before telling the server, confirm.request,
// closed.
// Each call's CallView and AppCall machines, and the connection's, come from
// machines.js, generated from the Python classes in machines/; so do the JSON Schemas
// every message from the server is checked against, as the Python client checks them.
//
// The server is not trusted. Each frame is checked as the Python client checks it: its
// size (maxMessageSize), its kind (text, UTF-8), its JSON (with what Python's json
// refuses and JSON.parse takes), each message's shape (the schemas), its place in the
// session. What fails is an `error` event whose code and message are the Python
// client's, and the session goes on or ends exactly as it would there; nothing a server
// sends makes a handler throw.

import {
  APP_CALL,
  CALL_VIEW,
  CONNECTION,
  InvalidTransition,
  Machine,
  SCHEMAS,
  codePoints,
  explain,
  pyNumber,
  pyRepr,
} from "./machines.js";

export const PROTOCOL = "vrt/1";
export const CAPABILITIES = Object.freeze([
  "tool-stream-v1",
  "batch-v1",
  "local-preview-v1",
  "handover-v1",
]);
export const LEGACY = Object.freeze(["tool-stream-v1"]);
const HANDOVER_V1 = "handover-v1";
/** Close code "service restart" (handover-v1): the session moved, resume now, elsewhere. */
const HANDOVER_CLOSE = 1012;
/** A resumed connection that lasts this long ends the resume episode: the next loss has a
 * fresh timeout and backoff (vrt/_client/client.py's STABLE_AFTER). One that drops sooner
 * keeps both, so a server that drops every resume is not retried forever. */
const STABLE_AFTER = 5000; // ms
/** The most entries of a resume hello's `open` (vrt/_wire/messages.py's OPEN_LIMIT). */
const OPEN_LIMIT = 256;
const ENDED_KEPT = 100; // turns whose turn.ended the app saw (a second one is dropped)
const ACK_EVERY = 50;
const ACK_INTERVAL = 200; // ms
const BATCH_MESSAGES = 100;
/** The Python client's defaults (vrt/_wire/server.py, vrt/_wire/endpoint.py). */
export const MAX_MESSAGE_SIZE = 1 << 20;
export const REPLAY_LIMIT = 10000;
export const REPLAY_LIMIT_BYTES = 2 * 1024 * 1024;
/** Nesting deeper than this is BAD_JSON: Python's json stops at its recursion limit, 1,000
 * frames less the stack it parses on (about 985 in the Python client). */
const MAX_DEPTH = 980;
/** Python's int() refuses a longer integer (sys.int_info.default_max_str_digits). */
const MAX_DIGITS = 4300;
const MESSAGE_KEPT = 1000; // characters of an app tool's failure message sent
const ANSWERS_KEPT = 100;
const IGNORED_KEPT = 1000; // calls of interrupted turns remembered (the newest)
const PREVIEW_KEPT = 1 << 20; // characters of a call's arguments a local preview keeps
const PREVIEW_STEP = 64;
const TERMINAL = new Set(["settled", "cancelled", "failed"]);
const VIEW_EVENT = {
  "arguments-delta": "delta",
  "arguments-complete": "complete",
  progress: "progress",
  settled: "settle",
  cancelled: "cancel",
  failed: "fail",
};

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

/** Which local previews are shown: vrt/_core/previews.py's rule, the server's own. */
class Previews {
  constructor() {
    this.sent = new Map(); // callId -> length last shown, or -1 once complete
    this.ending = new Set();
  }
  stream(event) {
    if (TERMINAL.has(event.phase)) this.ending.add(event.callId);
  }
  forget(callId) {
    this.sent.delete(callId);
    this.ending.delete(callId);
  }
  wanted(preview) {
    const id = preview.callId;
    const last = this.sent.get(id);
    const size = preview.arguments.length;
    if (this.ending.has(id)) {
      this.forget(id);
      return last === undefined || (last !== -1 && (preview.complete || size !== last));
    }
    if (last === -1) return false;
    if (last === undefined || preview.complete || size - last >= Math.max(PREVIEW_STEP, Math.floor(last / 4))) {
      this.sent.set(id, preview.complete ? -1 : size);
      return true;
    }
    return false;
  }
}

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
class Broken extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

/** A message as the frame Python's codec writes: compact JSON in ASCII (every other
 * character escaped), so its length is its size in bytes, as the Python side counts. */
function encode(message) {
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
function frameSize(data, limit) {
  if (typeof data === "string") return data.length > limit ? codePoints(data) : data.length;
  return data.byteLength ?? data.size ?? 0;
}

/** vrt/_wire/codec.py's parse(): a text frame's JSON, or Broken. (UTF-16 or UTF-32 bytes
 * in a text frame, valid UTF-8 when they are ASCII, are no JSON: BAD_JSON, as in Python;
 * in a binary frame they are BAD_MESSAGE, as any binary frame.) */
function parse(text) {
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
function structure(data, what) {
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

function cut(text, limit) {
  return codePoints(text) <= limit ? text : Array.from(text).slice(0, limit).join("");
}

function positive(name, value, least) {
  if (!Number.isInteger(value) || value < least) {
    throw new RangeError(`${name} must be a whole number of at least ${least}, not ${value}`);
  }
  return value;
}

/**
 * Connect to a vrt/1 server and open a session.
 * @param {string} url ws:// or wss:// URL of vrt.serve
 * @param {{tools?: Array, capabilities?: string[], resume?: boolean|object,
 *   maxMessageSize?: number, replayLimit?: number, replayLimitBytes?: number}} options
 */
export async function connect(url, options = {}) {
  const client = new Client(url, options);
  await client._open();
  return client;
}

export class Client extends EventTarget {
  constructor(
    url,
    {
      tools = [],
      capabilities = CAPABILITIES,
      resume = true,
      maxMessageSize = MAX_MESSAGE_SIZE,
      replayLimit = REPLAY_LIMIT,
      replayLimitBytes,
    } = {},
  ) {
    super();
    this.url = url;
    // Both ways, as the Python client's max_message_size: a larger frame from the server
    // ends the session; one this client would send is refused before it is numbered.
    this.maxMessageSize = positive("maxMessageSize", maxMessageSize, 1024);
    this.replayLimit = positive("replayLimit", replayLimit, 1);
    // The frames' bytes, as ASCII: at least two of the largest (vrt.serve's rule)
    this.replayLimitBytes = positive(
      "replayLimitBytes",
      replayLimitBytes ?? Math.max(REPLAY_LIMIT_BYTES, 2 * this.maxMessageSize),
      2 * this.maxMessageSize,
    );
    this.tools = new Map(tools.map((t) => [t.name, t]));
    this.offered = [...capabilities];
    this.resumeOptions = {
      enabled: resume !== false,
      timeout: resume?.timeout ?? 30000, // ms to get back before Closed("lost")
      connectTimeout: resume?.connectTimeout ?? 10000,
      backoff: resume?.backoff ?? 100,
      maxBackoff: resume?.maxBackoff ?? 5000,
    };
    this.connection = new Machine(CONNECTION);
    this.capabilities = [];
    this.sessionId = null;
    this.resumeToken = null;
    this.epoch = 0;
    this.closed = null; // the Closed reason, once the session is over
    this.sentSeq = 0;
    this.receivedSeq = 0;
    this.ackSent = 0;
    this.replay = []; // [seq, text] the server has not acked
    this.replayBytes = 0;
    this._overflowed = false;
    this.outbox = [];
    this.views = new Map(); // callId -> {machine, first, fragments, chars, text}
    this.ignored = new Set(); // calls of turns the user interrupted (the newest IGNORED_KEPT)
    this.appCalls = new Map(); // callId -> {machine, message}
    this.queue = [];
    this.running = null; // {callId, controller}
    this.answers = new Map(); // callId -> wire result, for a replayed tool.call
    this.openTurn = null; // the turn the app saw start and not end (handover-v1)
    this.ended = new Set(); // turns whose turn.ended the app saw (the newest ENDED_KEPT)
    this.previews = new Previews();
    this.batching = false;
    this.localPreviews = false;
    this.ws = null;
    this._ackTimer = null;
    this._welcomeTimer = null;
    this._resumeUntil = null; // the resume episode's deadline (null: none under way)
    this._connectedAt = 0; // when the last welcome came
    this._closing = false;
  }

  // -- the app's side ---------------------------------------------------------------------------

  /** Send user input: a new turn (the server interrupts an open one first). */
  async sendText(text) {
    if (typeof text !== "string") throw new TypeError("text must be a string");
    this._requireOpen();
    this._send({ type: "input", text });
  }

  /** The user interrupted: epoch + 1, every open call "cancelled" locally at once, the
   * running app tool's signal aborted, queued ones dropped; then the server is told. */
  interrupt() {
    this._requireOpen();
    this.epoch += 1;
    for (const [callId, view] of this.views) {
      view.machine.send("cancel");
      this._ignore(callId);
      this.previews.forget(callId);
      this._emit("tool.stream", { ...view.first, phase: "cancelled" });
    }
    this.views.clear();
    this._abortAll("interrupted");
    this._send({ type: "interrupt", epoch: this.epoch });
  }

  /** End the session for good; resolves once the server said closed (or the socket went). */
  async close() {
    if (this.closed !== null) return;
    this._closing = true;
    const done = new Promise((resolve) => this.addEventListener("closed", resolve, { once: true }));
    if (this.connection.state === "open") this._send({ type: "close" });
    else this._finish("client");
    await Promise.race([done, new Promise((r) => setTimeout(r, 5000))]);
    this._finish("client");
  }

  // -- the connection ---------------------------------------------------------------------------

  /** The opening handshake; an attempt that fails before the welcome starts over with a
   * fresh hello (backoff, within the resume timeout), as the Python client does. A
   * refusal (error + closed rejected) is final.
   *
   * An attempt that fails before the WebSocket opens is one failed attempt whatever its
   * cause: the browser does not tell a page why (an upgrade refused with 503 by a
   * draining server, which the Python client retries, looks the same as nothing
   * listening, a refused origin or a TLS failure). So every such failure is retried,
   * within the opening's deadline (the resume timeout; with resume off, the first
   * failure rejects at once), never more. Each attempt, its welcome included, has
   * connectTimeout. */
  async _open() {
    const { enabled, timeout, backoff, connectTimeout } = this.resumeOptions;
    const until = Date.now() + (enabled ? timeout : connectTimeout);
    this._resumeDelay = backoff;
    for (;;) {
      let ws = null;
      try {
        const started = Date.now();
        const budget = Math.min(connectTimeout, Math.max(1, until - started));
        ws = await this._dial(budget);
        this.ws = ws;
        this._attach(ws);
        const welcomed = new Promise((resolve, reject) => {
          this._welcomed = resolve;
          this._refused = reject;
        });
        this.sentSeq = 0;
        this.replay = [];
        this.replayBytes = 0;
        this._sendMessage({
          type: "hello",
          protocol: PROTOCOL,
          capabilities: this.offered,
          tools: [...this.tools.values()].map(({ name, description = "", parameters }) => ({
            name,
            description,
            parameters,
          })),
        });
        await this._within(welcomed, started + budget - Date.now());
        this._welcomed = this._refused = null;
        return;
      } catch (error) {
        if (ws !== null && this.ws === ws) this._drop(ws); // (a stalled welcome)
        if (error.final || error.code === "TOO_LARGE" || Date.now() >= until || !enabled) {
          this._finish("lost", false);
          throw error;
        }
        await this._backoff(until);
      }
    }
  }

  /** The welcome `promise`, or VrtError TIMEOUT after `ms`. */
  async _within(promise, ms) {
    let timer;
    const late = new Promise((_, reject) => {
      const why = `no welcome within ${Math.round(Math.max(0, ms))} ms`;
      timer = setTimeout(() => reject(new VrtError("TIMEOUT", why)), Math.max(0, ms));
    });
    try {
      return await Promise.race([promise, late]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Let go of a connection that is no longer this session's (nothing more read). */
  _drop(ws) {
    ws.onmessage = ws.onclose = ws.onerror = null;
    if (this.ws === ws) this.ws = null;
    if (ws.readyState <= 1) ws.close();
  }

  _dial(timeout) {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(this.url);
      const timer = setTimeout(() => {
        ws.close();
        reject(new VrtError("TIMEOUT", `no connection within ${timeout} ms`));
      }, timeout);
      ws.onopen = () => {
        clearTimeout(timer);
        resolve(ws);
      };
      ws.onerror = () => {
        clearTimeout(timer);
        reject(new VrtError("CONNECT", `cannot connect to ${this.url}`));
      };
    });
  }

  _attach(ws) {
    ws.binaryType = "arraybuffer"; // a binary frame's size, at once (it is refused anyway)
    ws.onmessage = (event) => this._receive(event.data);
    ws.onclose = (event) => this._lost(ws, event.code);
    ws.onerror = () => {};
  }

  /** `ws` closed (with `code`): before the welcome, the opening tries again; after it,
   * the session is resumed: after a close 1012 (handover-v1: it moved) at once, with a
   * fresh timeout, as the Python client does; otherwise after the first backoff. */
  _lost(ws, code) {
    if (ws !== this.ws || this.closed !== null) return;
    this.ws = null;
    clearTimeout(this._ackTimer);
    this._ackTimer = null;
    clearTimeout(this._welcomeTimer);
    this._welcomeTimer = null;
    if (this.connection.state === "connecting") {
      // before the welcome: _open() starts over with a fresh hello, or gives up
      this._refused?.(new VrtError("CLOSED", "the connection closed before the welcome"));
      return;
    }
    if (!this.resumeOptions.enabled || this._closing) {
      this._finish(this._closing ? "client" : "lost");
      return;
    }
    if (this.connection.state === "reconnecting") {
      this._resume(true); // a resume attempt connected, then dropped: the next one
      return;
    }
    this.connection.send("lost");
    this.outbox = [];
    const now = Date.now();
    const moved = code === HANDOVER_CLOSE;
    if (moved || this._resumeUntil === null || now - this._connectedAt >= STABLE_AFTER) {
      this._resumeUntil = now + this.resumeOptions.timeout; // a new episode
      this._resumeDelay = this.resumeOptions.backoff;
    }
    this._emit("reconnecting", { sessionId: this.sessionId });
    this._resume(!moved);
  }

  /** Resume attempts until one connects and sends its hello (the welcome, or the
   * refusal, arrives as a message; no welcome within connectTimeout is one more failed
   * attempt), or the episode's deadline passes (closed "lost"). Each attempt that fails
   * before the WebSocket opens (a 503 from a draining server among them: the page cannot
   * tell) waits the next backoff. */
  async _resume(wait) {
    const { connectTimeout } = this.resumeOptions;
    const until = this._resumeUntil;
    if (wait) await this._backoff(until);
    while (this.closed === null && Date.now() < until) {
      try {
        const started = Date.now();
        const budget = Math.min(connectTimeout, Math.max(1, until - started));
        const ws = await this._dial(budget);
        if (this.closed !== null) {
          ws.close(); // the app closed meanwhile
          return;
        }
        this.ws = ws;
        this._attach(ws);
        ws.send(this._resumeHello());
        this._welcomeTimer = setTimeout(() => {
          this._welcomeTimer = null;
          if (this.ws !== ws || this.connection.state !== "reconnecting") return;
          this._drop(ws); // stalled: the next attempt
          this._resume(true);
        }, Math.max(0, started + budget - Date.now()));
        return;
      } catch {
        await this._backoff(until);
      }
    }
    this._finish("lost");
  }

  /** The hello of a resume (vrt/_wire/client.py's resume_hello()): outside the numbering,
   * no tools (declared when the session began), and with handover-v1 what the app holds
   * open, so that a server adopting the session from an earlier save can end it. */
  _resumeHello() {
    const hello = {
      type: "hello",
      seq: 0,
      protocol: PROTOCOL,
      capabilities: this.offered,
      resume: { sessionId: this.sessionId, token: this.resumeToken, lastSeq: this.receivedSeq },
    };
    if (this.capabilities.includes(HANDOVER_V1)) {
      const open = this._heldOpen();
      if (open.length) hello.open = open; // (the Python codec leaves an empty one out)
    }
    return encode(hello);
  }

  /** Each call without a terminal phase (as its start showed it), at most OPEN_LIMIT - 1,
   * then the open turn if none of them is of it (vrt/_wire/client.py's held_open()). */
  _heldOpen() {
    const held = [];
    for (const [callId, view] of this.views) {
      if (held.length === OPEN_LIMIT - 1) break;
      const { turnId, name, kind } = view.first;
      held.push({ turnId, callId, name, kind });
    }
    const turn = this.openTurn;
    if (turn !== null && held.every((entry) => entry.turnId !== turn)) held.push({ turnId: turn });
    return held;
  }

  /** Wait the next jittered, doubling delay (never past ``until``). */
  async _backoff(until) {
    const delay = this._resumeDelay;
    const jittered = delay * (0.5 + Math.random());
    await new Promise((r) => setTimeout(r, Math.min(jittered, Math.max(0, until - Date.now()))));
    this._resumeDelay = Math.min(this.resumeOptions.maxBackoff, delay * 2);
  }

  _finish(reason, tell = true, closeCode = 1000) {
    if (this.closed !== null) return;
    this.closed = reason;
    if (!this.connection.final) this.connection.send("close");
    clearTimeout(this._ackTimer);
    clearTimeout(this._welcomeTimer);
    this._abortAll("closed");
    this.views.clear();
    const ws = this.ws;
    this.ws = null;
    if (ws && ws.readyState <= 1) ws.close(closeCode);
    if (this._refused) {
      // still opening: connect() fails, for good (a refusal already failed it: no-op)
      const code = reason === "too_large" ? "TOO_LARGE" : "CLOSED";
      const error = new VrtError(code, `the session ended before its welcome (${reason})`);
      error.final = true;
      this._refused(error);
    }
    if (tell) this._emit("closed", { reason });
  }

  /** A frame over maxMessageSize: not read, and the session ends ("too_large"), as the
   * Python client's does (trio-websocket closes 1009 there; a page may not send 1009:
   * 4009): resuming would replay the same frame into the same refusal. */
  _tooLarge() {
    this._finish("too_large", true, 4009);
  }

  /** The replay buffer went over its bound (replayLimit messages or replayLimitBytes the
   * server has not acked): a lost connection could no longer be made good, so the session
   * ends now ("overflow", as PROTOCOL.md says), the server told if it can hear it. */
  _overflow() {
    this._flush();
    const ws = this.ws;
    if (ws?.readyState === 1 && this.connection.state === "open") {
      ws.send(encode({ type: "close", seq: this.sentSeq + 1 }));
    }
    this._finish("overflow");
  }

  _requireOpen() {
    if (this.closed !== null) throw new VrtError("CLOSED", `the session is closed (${this.closed})`);
  }

  // -- sending ----------------------------------------------------------------------------------

  /** Number a message, keep it for replay, queue it for the writer. Throws VrtError
   * TOO_LARGE (and numbers nothing) for a frame over maxMessageSize: the server would
   * refuse it, and a resume would replay it forever. */
  _send(fields) {
    this.outbox.push(this._numbered(fields));
    if (this._overflowed && !this._closing) this._overflow(); // (a close ends it anyway)
    else this._flushSoon();
  }

  /** Number a message and send it now (the hello: the writer waits for the welcome). */
  _sendMessage(fields) {
    this.ws.send(this._numbered(fields));
  }

  _numbered(fields) {
    const seq = this.sentSeq + 1;
    const text = encode({ ...fields, seq });
    if (text.length > this.maxMessageSize) {
      throw new VrtError(
        "TOO_LARGE",
        `a ${fields.type} frame of ${text.length} bytes is over maxMessageSize ` +
          `(${this.maxMessageSize})`,
      );
    }
    this.sentSeq = seq;
    this.replay.push([seq, text]);
    this.replayBytes += text.length;
    if (this.replay.length > this.replayLimit || this.replayBytes > this.replayLimitBytes) {
      this._overflowed = true;
    }
    return text;
  }

  /** The server processed our messages up to `seq`: forget their frames. */
  _peerAcked(seq) {
    const replay = this.replay;
    let n = 0;
    while (n < replay.length && replay[n][0] <= seq) this.replayBytes -= replay[n++][1].length;
    if (n) replay.splice(0, n);
  }

  _flushSoon() {
    if (this._flushing) return;
    this._flushing = true;
    queueMicrotask(() => {
      this._flushing = false;
      this._flush();
    });
  }

  /** The writer: what is queued leaves now, with batch-v1 as batches of at most
   * BATCH_MESSAGES messages and maxMessageSize bytes (each message alone fits). */
  _flush() {
    const ws = this.ws;
    if (!ws || ws.readyState !== 1 || this.connection.state !== "open") return;
    const outbox = this.outbox;
    while (outbox.length) {
      let n = 1;
      let size = outbox[0].length + 2;
      while (this.batching && n < outbox.length && n < BATCH_MESSAGES) {
        size += outbox[n].length + 1;
        if (size > this.maxMessageSize) break;
        n += 1;
      }
      const group = outbox.splice(0, n);
      ws.send(n === 1 ? group[0] : `[${group.join(",")}]`);
    }
  }

  _ackDue() {
    if (this.receivedSeq - this.ackSent >= ACK_EVERY) this._sendAck();
    else if (this.receivedSeq > this.ackSent && this._ackTimer === null) {
      this._ackTimer = setTimeout(() => {
        this._ackTimer = null;
        this._sendAck();
      }, ACK_INTERVAL);
    }
  }

  _sendAck() {
    if (this.receivedSeq <= this.ackSent || this.connection.state !== "open") return;
    this.ackSent = this.receivedSeq;
    this.outbox.push(encode({ type: "ack", seq: this.receivedSeq }));
    this._flushSoon();
  }

  // -- receiving --------------------------------------------------------------------------------

  /** One frame from the server (vrt/_wire/client.py's receive()). */
  _receive(data) {
    if (this.closed !== null) return;
    try {
      this._frame(data);
      this._ackDue();
      this._runNext();
    } catch (error) {
      // a bug here, never the server's doing: reported, and the session goes on
      const why = `${error?.name ?? "Error"}: ${error?.message ?? error}`;
      this._emit("error", { code: "INTERNAL", message: `vrt.js failed on a frame from the server: ${why}` });
    }
  }

  _frame(data) {
    if (frameSize(data, this.maxMessageSize) > this.maxMessageSize) {
      this._tooLarge();
      return;
    }
    let value;
    try {
      if (typeof data !== "string") {
        throw new Broken("BAD_MESSAGE", "a binary frame: vrt/1 frames are text (UTF-8)");
      }
      value = parse(data);
    } catch (error) {
      this._broken(error);
      return;
    }
    if (!Array.isArray(value) || !this.batching) {
      this._message(value, "a frame");
      return;
    }
    if (value.length === 0) {
      this._broken(new Broken("BAD_MESSAGE", "an empty batch"));
      return;
    }
    for (const item of value) {
      this._message(item, "a batch's message");
      if (this.closed !== null) break; // closed is the last word: nothing after it is read
    }
  }

  /** A refused frame or message: surfaced as an `error` event, then dropped. */
  _broken(error) {
    if (!(error instanceof Broken)) throw error;
    this._emit("error", { code: error.code, message: `from the server: ${error.message}` });
  }

  _message(data, what) {
    let msg;
    try {
      msg = structure(data, what);
    } catch (error) {
      this._broken(error);
      return;
    }
    if (msg.type === "ack") {
      if (msg.seq > this.sentSeq) {
        const why = `ack ${msg.seq} is above our last seq ${this.sentSeq}`;
        this._broken(new Broken("BAD_MESSAGE", why)); // ignored: it claims what was never sent
      } else {
        this._peerAcked(msg.seq);
      }
      return;
    }
    if (msg.seq !== 0) {
      if (msg.seq <= this.receivedSeq) return; // a replay already processed
      this.receivedSeq = msg.seq;
    }
    HANDLERS[msg.type].call(this, msg);
  }

  _emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }

  _onWelcome(msg) {
    if (this.connection.state === "reconnecting" && !msg.resumed) {
      this._finish("expired"); // not our session: a resume is never answered with a new one
      return;
    }
    if (this.connection.state === "reconnecting") {
      if (msg.sessionId !== this.sessionId) {
        this._broken(new Broken("BAD_STATE", "resumed another session"));
        return;
      }
      clearTimeout(this._welcomeTimer);
      this._welcomeTimer = null;
      this._connectedAt = Date.now();
      this.connection.send("resumed");
      this.epoch = Math.max(this.epoch, msg.epoch);
      if (msg.lastSeq <= this.sentSeq) this._peerAcked(msg.lastSeq);
      this.outbox = this.replay.map(([, text]) => text);
      this.ackSent = 0;
      this._emit("resumed", { sessionId: this.sessionId });
      this._flush();
      return;
    }
    if (this.connection.state !== "connecting" || msg.resumed) {
      this._broken(new Broken("BAD_STATE", "a second welcome"));
      return;
    }
    this.connection.send("welcome");
    this._connectedAt = Date.now();
    this.sessionId = msg.sessionId;
    this.resumeToken = msg.resumeToken;
    this.epoch = Math.max(this.epoch, msg.epoch);
    this.capabilities = msg.capabilities.filter((c) => this.offered.includes(c));
    this.batching = this.capabilities.includes("batch-v1");
    this.localPreviews =
      this.capabilities.includes("local-preview-v1") && this.capabilities.includes("tool-stream-v1");
    if (msg.lastSeq <= this.sentSeq) this._peerAcked(msg.lastSeq);
    this._welcomed?.();
    this._flush();
  }

  _onTurnStarted(msg) {
    this.epoch = Math.max(this.epoch, msg.epoch);
    this.openTurn = msg.turnId;
    this._emit("turn.started", { turnId: msg.turnId, epoch: msg.epoch });
  }

  _onTurnEnded(msg) {
    this.epoch = Math.max(this.epoch, msg.epoch);
    const ended = this.ended;
    if (ended.has(msg.turnId)) return; // ended already (an adopting server ends what it cannot know ended)
    ended.add(msg.turnId);
    if (ended.size > ENDED_KEPT) ended.delete(ended.values().next().value);
    if (this.openTurn === msg.turnId) this.openTurn = null;
    this._emit("turn.ended", { turnId: msg.turnId, epoch: msg.epoch, reason: msg.reason });
  }

  _onTextDelta(msg) {
    this._emit("text.delta", { turnId: msg.turnId, text: msg.text });
  }

  _onToolStream(msg) {
    const { seq, type, ...event } = msg;
    const callId = msg.callId;
    if (this.ignored.has(callId)) return;
    if (msg.phase === "start") {
      if (this.views.has(callId) || msg.epoch < this.epoch) {
        this._ignore(callId); // a call of a turn the user already interrupted
        return;
      }
      const machine = new Machine(CALL_VIEW);
      const view = { machine, first: event, fragments: [], chars: 0, text: null };
      this.views.set(callId, view);
      this._show(view, event);
      return;
    }
    const view = this.views.get(callId);
    if (view === undefined) return; // final here already (cancelled locally)
    try {
      view.machine.send(VIEW_EVENT[msg.phase]);
    } catch (error) {
      if (!(error instanceof InvalidTransition)) throw error;
      this._emit("error", {
        code: "BAD_MESSAGE",
        message: `from the server: ${msg.phase} while call ${callId} is ${view.machine.state}`,
      });
      return;
    }
    this._show(view, event);
    if (!view.machine.final) return;
    this.views.delete(callId);
    this._abort(callId, msg.phase === "cancelled" ? "interrupted" : msg.code === "TIMEOUT" ? "timeout" : "aborted");
  }

  _show(view, event) {
    this._emit("tool.stream", event);
    if (!this.localPreviews) return;
    if (event.phase === "arguments-delta" && event.delta) {
      if (view.chars < PREVIEW_KEPT) {
        // a server that never completes the arguments: bounded here, as in Python
        view.fragments.push(event.delta);
        view.chars += event.delta.length;
      }
    } else if (event.phase === "arguments-complete" && view.text === null) {
      view.text = view.fragments.length ? view.fragments.join("") : argumentsText(event.arguments);
      view.fragments = [];
    }
    const text = view.text ?? view.fragments.join("");
    const preview = {
      callId: event.callId,
      turnId: event.turnId,
      name: event.name,
      arguments: text,
      complete: view.text !== null,
    };
    this.previews.stream(event);
    if (this.previews.wanted(preview)) this._emit("tool.preview", preview);
  }

  _ignore(callId) {
    this.ignored.add(callId);
    if (this.ignored.size > IGNORED_KEPT) this.ignored.delete(this.ignored.values().next().value);
  }

  _onToolPreview(msg) {
    if (this.ignored.has(msg.callId) || this.localPreviews) return;
    const { seq, type, ...preview } = msg;
    this._emit("tool.preview", preview);
  }

  _onToolCall(msg) {
    const callId = msg.callId;
    if (this.appCalls.has(callId)) return; // a replay: it runs once
    const answer = this.answers.get(callId);
    if (answer !== undefined) {
      this._send({ type: "tool.result", callId, epoch: msg.epoch, result: answer });
      return;
    }
    const call = { machine: new Machine(APP_CALL), message: msg };
    if (msg.epoch !== this.epoch) {
      call.machine.send("stale"); // the epoch gate: never runs
      this._result(msg, { ok: false, code: "INTERRUPTED", message: "the call's turn was interrupted" });
      return;
    }
    call.machine.send("admit");
    this.appCalls.set(callId, call);
    this.queue.push(callId);
  }

  _onToolAbort(msg) {
    this._abort(msg.callId, "aborted");
  }

  _onConfirmRequest(msg) {
    if (this.ignored.has(msg.callId)) return;
    const { seq, type, ...request } = msg;
    this._emit("confirm.request", {
      ...request,
      approve: async () => this._send({ type: "confirm.reply", callId: msg.callId, approved: true }),
      deny: async (reason) =>
        this._send({ type: "confirm.reply", callId: msg.callId, approved: false, ...(reason ? { reason } : {}) }),
    });
  }

  _onError(msg) {
    const { seq, type, ...error } = msg;
    this._emit("error", error);
    if (this.connection.state !== "open" && this._refused) {
      this._refusal = error;
    }
  }

  _onClosed(msg) {
    if (this.connection.state === "connecting" && this._refused) {
      const error = this._refusal ?? { code: "CLOSED", message: msg.reason };
      const refusal = new VrtError(error.code, error.message);
      refusal.final = true; // refused: no retry
      this._refused(refusal);
    }
    if (this.connection.state === "reconnecting") {
      this._finish(this._closing ? "client" : "expired");
      return;
    }
    this._finish(msg.reason);
  }

  // -- the app-tool runner ----------------------------------------------------------------------

  _runNext() {
    if (this.running !== null || this.queue.length === 0 || this.closed !== null) return;
    const callId = this.queue.shift();
    const call = this.appCalls.get(callId);
    call.machine.send("begin");
    const controller = new AbortController();
    this.running = { callId, controller };
    const msg = call.message;
    const tool = this.tools.get(msg.name);
    const ctx = {
      callId,
      turnId: msg.turnId,
      epoch: msg.epoch,
      name: msg.name,
      signal: controller.signal,
    };
    const run = async () => {
      if (tool === undefined) return { ok: false, code: "FAILED", message: `no app tool named ${msg.name}` };
      try {
        const output = await tool.run(msg.arguments, ctx);
        return { ok: true, output: output === undefined ? null : output };
      } catch (error) {
        if (controller.signal.aborted) return { ok: false, code: "INTERRUPTED", message: "aborted" };
        return { ok: false, code: "FAILED", message: `${error?.name ?? "Error"}: ${error?.message ?? error}` };
      }
    };
    run().then((result) => {
      if (this.running?.callId === callId) this.running = null;
      this.appCalls.delete(callId);
      if (!call.machine.final) {
        call.machine.send("answer");
        this._result(msg, result);
      }
      this._runNext();
    });
  }

  _result(msg, result) {
    const { callId, epoch } = msg;
    if (!result.ok && result.message !== undefined) {
      result = { ...result, message: cut(result.message, MESSAGE_KEPT) };
    }
    try {
      this._send({ type: "tool.result", callId, epoch, result });
    } catch (error) {
      // an output the server would refuse, or no JSON at all: a result it takes
      const message =
        error instanceof VrtError && error.code === "TOO_LARGE"
          ? `the app tool's output is over the frame limit (${this.maxMessageSize} bytes)`
          : `output is not JSON-serialisable: ${error?.message ?? error}`;
      result = { ok: false, code: "FAILED", message };
      this._send({ type: "tool.result", callId, epoch, result });
    }
    this.answers.set(callId, result);
    if (this.answers.size > ANSWERS_KEPT) this.answers.delete(this.answers.keys().next().value);
  }

  _abort(callId, reason) {
    const call = this.appCalls.get(callId);
    if (call === undefined || call.machine.final) return;
    call.machine.send("abort");
    if (this.running?.callId === callId) {
      this.running.controller.abort(reason);
      return;
    }
    this.queue = this.queue.filter((id) => id !== callId);
    this.appCalls.delete(callId);
  }

  _abortAll(reason) {
    for (const callId of this.queue) this.appCalls.get(callId)?.machine.send("abort");
    for (const callId of this.queue) this.appCalls.delete(callId);
    this.queue = [];
    if (this.running !== null) this._abort(this.running.callId, reason);
  }
}

/** The JSON text of arguments that came whole (the engine's json.dumps); raw text that
 * does not parse stays as it is (vrt/_wire/client.py's _arguments_text). */
function argumentsText(args) {
  if (typeof args === "string") {
    try {
      JSON.parse(args);
    } catch {
      return args;
    }
  }
  return pythonJson(args);
}

const HANDLERS = {
  welcome: Client.prototype._onWelcome,
  "turn.started": Client.prototype._onTurnStarted,
  "turn.ended": Client.prototype._onTurnEnded,
  "text.delta": Client.prototype._onTextDelta,
  "tool.stream": Client.prototype._onToolStream,
  "tool.preview": Client.prototype._onToolPreview,
  "tool.call": Client.prototype._onToolCall,
  "tool.abort": Client.prototype._onToolAbort,
  "confirm.request": Client.prototype._onConfirmRequest,
  error: Client.prototype._onError,
  closed: Client.prototype._onClosed,
};
