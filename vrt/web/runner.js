// runner.js: vrt.js's app-tool runner. Part of the browser client: a page imports /vrt.js,
// never this module.
//
// tool.call in, tool.result out: each call the server asks the page to run has an AppCall
// machine (machines.js, generated from machines/). A call of the current epoch is queued
// and run one at a time, in arrival order, each with its own AbortController; a call the
// epoch gate refused is answered INTERRUPTED and never runs; a call answered before (a
// tool.call sent again after a resume) gets the same answer again, never a second run. An
// aborted call's signal is aborted and its result never sent (the server settled it). The
// core (protocol.js) decides what is admitted and aborted; the client pumps next().

import { APP_CALL, Machine } from "./machines.js";
import { VrtError, cut } from "./codec.js";

const MESSAGE_KEPT = 1000; // characters of an app tool's failure message sent
const ANSWERS_KEPT = 100; // results kept to answer a tool.call sent again

/** The page's app tools, run one at a time (vrt/_wire/client.py's app-call books and
 * vrt/_client/client.py's runner). `io.send(fields)` numbers and queues a message (it
 * throws VrtError TOO_LARGE, or the JSON error, and sends nothing if it cannot);
 * `io.over()` says the session ended; `io.maxMessageSize` is the frame limit. */
export class Runner {
  constructor(tools, { send, over, maxMessageSize }) {
    this.tools = tools; // name -> the app tool
    this.send = send;
    this.over = over;
    this.maxMessageSize = maxMessageSize;
    this.calls = new Map(); // callId -> {machine, message}, queued or running
    this.queue = [];
    this.running = null; // {callId, controller}
    this.answers = new Map(); // callId -> wire result, for a replayed tool.call
  }

  /** A `tool.call` from the server; `current`: the epoch gate let it through (its epoch
   * is the client's), else it is answered INTERRUPTED at once and never runs. */
  admit(msg, current) {
    const callId = msg.callId;
    if (this.calls.has(callId)) return; // a replay: it runs once
    const answer = this.answers.get(callId);
    if (answer !== undefined) {
      this.send({ type: "tool.result", callId, epoch: msg.epoch, result: answer });
      return;
    }
    const call = { machine: new Machine(APP_CALL), message: msg };
    if (!current) {
      call.machine.send("stale"); // the epoch gate: never runs
      this._result(msg, { ok: false, code: "INTERRUPTED", message: "the call's turn was interrupted" });
      return;
    }
    call.machine.send("admit");
    this.calls.set(callId, call);
    this.queue.push(callId);
  }

  /** Start the next queued call, unless one runs, none waits or the session ended. Its
   * result is sent when it comes (unless it was aborted meanwhile), then the next starts. */
  next() {
    if (this.running !== null || this.queue.length === 0 || this.over()) return;
    const callId = this.queue.shift();
    const call = this.calls.get(callId);
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
      this.calls.delete(callId);
      if (!call.machine.final) {
        call.machine.send("answer");
        this._result(msg, result);
      }
      this.next();
    });
  }

  /** Abort one call (`reason` is its signal's reason): a queued one is dropped, a running
   * one has its signal aborted; either way no result of it is sent. */
  abort(callId, reason) {
    const call = this.calls.get(callId);
    if (call === undefined || call.machine.final) return;
    call.machine.send("abort");
    if (this.running?.callId === callId) {
      this.running.controller.abort(reason);
      return;
    }
    this.queue = this.queue.filter((id) => id !== callId);
    this.calls.delete(callId);
  }

  /** Drop every queued call and abort the running one (an interrupt, the session's end). */
  abortAll(reason) {
    for (const callId of this.queue) this.calls.get(callId)?.machine.send("abort");
    for (const callId of this.queue) this.calls.delete(callId);
    this.queue = [];
    if (this.running !== null) this.abort(this.running.callId, reason);
  }

  _result(msg, result) {
    const { callId, epoch } = msg;
    if (!result.ok && result.message !== undefined) {
      result = { ...result, message: cut(result.message, MESSAGE_KEPT) };
    }
    try {
      this.send({ type: "tool.result", callId, epoch, result });
    } catch (error) {
      // an output the server would refuse, or no JSON at all: a result it takes
      const message =
        error instanceof VrtError && error.code === "TOO_LARGE"
          ? `the app tool's output is over the frame limit (${this.maxMessageSize} bytes)`
          : `output is not JSON-serialisable: ${error?.message ?? error}`;
      result = { ok: false, code: "FAILED", message };
      this.send({ type: "tool.result", callId, epoch, result });
    }
    this.answers.set(callId, result);
    if (this.answers.size > ANSWERS_KEPT) this.answers.delete(this.answers.keys().next().value);
  }
}
