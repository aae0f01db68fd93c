// vrt.js: the browser client of vrt/1 (PROTOCOL.md), a dependency-free ES module.
//
// The same client half as the Python client (vrt/_wire/client.py, vrt/_net/client.py):
// hello/welcome and capabilities (tool-stream-v1, batch-v1, local-preview-v1), seq/ack
// and the replay buffer, resume with jittered backoff and a connect deadline, the epoch
// gate, the serial app-tool runner (one at a time, arrival order), interrupt() cancelling
// every open call locally at once before telling the server, confirm.request, closed.
// Each call's CallView and AppCall machines, and the connection's, come from
// machines.js, generated from the Python classes in machines/.

import { APP_CALL, CALL_VIEW, CONNECTION, InvalidTransition, Machine } from "./machines.js";

export const PROTOCOL = "vrt/1";
export const CAPABILITIES = Object.freeze(["tool-stream-v1", "batch-v1", "local-preview-v1"]);
export const LEGACY = Object.freeze(["tool-stream-v1"]);
const ACK_EVERY = 50;
const ACK_INTERVAL = 200; // ms
const BATCH_MESSAGES = 100;
const REPLAY_LIMIT = 10000;
const ANSWERS_KEPT = 100;
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
  if (typeof value === "number") return String(value);
  if (typeof value === "string") {
    return JSON.stringify(value).replace(/[\u0080-\uffff]/g, (c) =>
      `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`,
    );
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

/**
 * Connect to a vrt/1 server and open a session.
 * @param {string} url ws:// or wss:// URL of vrt.serve
 * @param {{tools?: Array, capabilities?: string[], resume?: boolean|object}} options
 */
export async function connect(url, options = {}) {
  const client = new Client(url, options);
  await client._open();
  return client;
}

export class Client extends EventTarget {
  constructor(url, { tools = [], capabilities = CAPABILITIES, resume = true } = {}) {
    super();
    this.url = url;
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
    this.outbox = [];
    this.views = new Map(); // callId -> {machine, first, fragments, text}
    this.ignored = new Set(); // calls of turns the user interrupted
    this.appCalls = new Map(); // callId -> {machine, message}
    this.queue = [];
    this.running = null; // {callId, controller}
    this.answers = new Map(); // callId -> wire result, for a replayed tool.call
    this.previews = new Previews();
    this.batching = false;
    this.localPreviews = false;
    this.ws = null;
    this._ackTimer = null;
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
      this.ignored.add(callId);
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

  /** The opening handshake; a connection lost before the welcome starts over with a
   * fresh hello (backoff, within the resume timeout), as the Python client does. A
   * refusal (error + closed rejected) is final. */
  async _open() {
    const { enabled, timeout, backoff, connectTimeout } = this.resumeOptions;
    const until = Date.now() + (enabled ? timeout : connectTimeout);
    this._resumeDelay = backoff;
    for (;;) {
      try {
        const ws = await this._dial(Math.min(connectTimeout, Math.max(1, until - Date.now())));
        this.ws = ws;
        this._attach(ws);
        const welcomed = new Promise((resolve, reject) => {
          this._welcomed = resolve;
          this._refused = reject;
        });
        this.sentSeq = 0;
        this.replay = [];
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
        await welcomed;
        this._welcomed = this._refused = null;
        return;
      } catch (error) {
        if (error.final || Date.now() >= until || !enabled) {
          this._finish("lost", false);
          throw error;
        }
        await this._backoff(until);
      }
    }
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
    ws.onmessage = (event) => this._receive(event.data);
    ws.onclose = () => this._lost(ws);
    ws.onerror = () => {};
  }

  _lost(ws) {
    if (ws !== this.ws || this.closed !== null) return;
    this.ws = null;
    clearTimeout(this._ackTimer);
    this._ackTimer = null;
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
      this._resume(); // a resume attempt connected, then dropped: the next one
      return;
    }
    this.connection.send("lost");
    this.outbox = [];
    this._resumeUntil = Date.now() + this.resumeOptions.timeout;
    this._resumeDelay = this.resumeOptions.backoff;
    this._emit("reconnecting", { sessionId: this.sessionId });
    this._resume();
  }

  async _resume() {
    const { connectTimeout } = this.resumeOptions;
    const until = this._resumeUntil;
    if (this._attempted) await this._backoff(until); // the last attempt dropped: wait first
    this._attempted = true;
    while (this.closed === null && Date.now() < until) {
      try {
        const ws = await this._dial(Math.min(connectTimeout, Math.max(1, until - Date.now())));
        this.ws = ws;
        this._attach(ws);
        ws.send(
          JSON.stringify({
            type: "hello",
            seq: 0,
            protocol: PROTOCOL,
            capabilities: this.offered,
            tools: [],
            resume: { sessionId: this.sessionId, token: this.resumeToken, lastSeq: this.receivedSeq },
          }),
        );
        return; // the welcome (or the refusal) arrives as a message
      } catch {
        await this._backoff(until);
      }
    }
    this._finish("lost");
  }

  /** Wait the next jittered, doubling delay (never past ``until``). */
  async _backoff(until) {
    const delay = this._resumeDelay;
    const jittered = delay * (0.5 + Math.random());
    await new Promise((r) => setTimeout(r, Math.min(jittered, Math.max(0, until - Date.now()))));
    this._resumeDelay = Math.min(this.resumeOptions.maxBackoff, delay * 2);
  }

  _finish(reason, tell = true) {
    if (this.closed !== null) return;
    this.closed = reason;
    if (!this.connection.final) this.connection.send("close");
    clearTimeout(this._ackTimer);
    this._abortAll("closed");
    this.views.clear();
    const ws = this.ws;
    this.ws = null;
    if (ws && ws.readyState <= 1) ws.close();
    if (tell) this._emit("closed", { reason });
  }

  _requireOpen() {
    if (this.closed !== null) throw new VrtError("CLOSED", `the session is closed (${this.closed})`);
  }

  // -- sending ----------------------------------------------------------------------------------

  /** Number a message, keep it for replay, queue it for the writer. */
  _send(fields) {
    this.outbox.push(this._numbered(fields));
    this._flushSoon();
  }

  /** Number a message and send it now (the hello: the writer waits for the welcome). */
  _sendMessage(fields) {
    this.ws.send(this._numbered(fields));
  }

  _numbered(fields) {
    this.sentSeq += 1;
    const text = JSON.stringify({ ...fields, seq: this.sentSeq });
    this.replay.push([this.sentSeq, text]);
    if (this.replay.length > REPLAY_LIMIT) this.replay.shift();
    return text;
  }

  _flushSoon() {
    if (this._flushing) return;
    this._flushing = true;
    queueMicrotask(() => {
      this._flushing = false;
      this._flush();
    });
  }

  /** The writer: what is queued leaves now, as one batch with batch-v1. */
  _flush() {
    const ws = this.ws;
    if (!ws || ws.readyState !== 1 || this.connection.state !== "open") return;
    while (this.outbox.length) {
      if (!this.batching || this.outbox.length === 1) {
        ws.send(this.outbox.shift());
        continue;
      }
      const group = this.outbox.splice(0, BATCH_MESSAGES);
      ws.send(`[${group.join(",")}]`);
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
    this.outbox.push(JSON.stringify({ type: "ack", seq: this.receivedSeq }));
    this._flushSoon();
  }

  // -- receiving --------------------------------------------------------------------------------

  _receive(text) {
    let data;
    try {
      data = JSON.parse(text);
    } catch {
      this._emit("error", { code: "BAD_JSON", message: "from the server: a frame that is not JSON" });
      return;
    }
    if (Array.isArray(data) && this.batching) {
      for (const item of data) {
        this._message(item);
        if (this.closed !== null) break; // closed is the last word
      }
    } else {
      this._message(data);
    }
    this._ackDue();
    this._runNext();
  }

  _message(msg) {
    if (typeof msg !== "object" || msg === null || Array.isArray(msg)) {
      this._emit("error", { code: "BAD_MESSAGE", message: "from the server: not a JSON object" });
      return;
    }
    if (msg.type === "ack") {
      this.replay = this.replay.filter(([seq]) => seq > msg.seq);
      return;
    }
    if (msg.seq !== 0) {
      if (msg.seq <= this.receivedSeq) return; // a replay already processed
      this.receivedSeq = msg.seq;
    }
    const handler = HANDLERS[msg.type];
    if (handler === undefined) {
      this._emit("error", { code: "UNKNOWN_TYPE", message: `from the server: ${msg.type}` });
      return;
    }
    handler.call(this, msg);
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
      this._attempted = false;
      this.connection.send("resumed");
      this.epoch = Math.max(this.epoch, msg.epoch);
      this.replay = this.replay.filter(([seq]) => seq > msg.lastSeq);
      this.outbox = this.replay.map(([, text]) => text);
      this.ackSent = 0;
      this._emit("resumed", { sessionId: this.sessionId });
      this._flush();
      return;
    }
    this.connection.send("welcome");
    this.sessionId = msg.sessionId;
    this.resumeToken = msg.resumeToken;
    this.epoch = Math.max(this.epoch, msg.epoch);
    this.capabilities = msg.capabilities.filter((c) => this.offered.includes(c));
    this.batching = this.capabilities.includes("batch-v1");
    this.localPreviews =
      this.capabilities.includes("local-preview-v1") && this.capabilities.includes("tool-stream-v1");
    this.replay = this.replay.filter(([seq]) => seq > msg.lastSeq);
    this._welcomed?.();
    this._flush();
  }

  _onTurnStarted(msg) {
    this.epoch = Math.max(this.epoch, msg.epoch);
    this._emit("turn.started", { turnId: msg.turnId, epoch: msg.epoch });
  }

  _onTurnEnded(msg) {
    this.epoch = Math.max(this.epoch, msg.epoch);
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
        this.ignored.add(callId); // a call of a turn the user already interrupted
        return;
      }
      const view = { machine: new Machine(CALL_VIEW), first: event, fragments: [], text: null };
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
    if (event.phase === "arguments-delta" && event.delta) view.fragments.push(event.delta);
    else if (event.phase === "arguments-complete" && view.text === null) {
      view.text = view.fragments.length ? view.fragments.join("") : argumentsText(event.arguments);
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
    this._send({ type: "tool.result", callId: msg.callId, epoch: msg.epoch, result });
    this.answers.set(msg.callId, result);
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

function argumentsText(args) {
  return typeof args === "string" ? args : pythonJson(args);
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
