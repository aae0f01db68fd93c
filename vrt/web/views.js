// views.js: vrt.js's call views, what the app sees of each call the server streams (vrt/
// _wire/client.py's _View, vrt/_core/previews.py). Part of the browser client: a page
// imports /vrt.js, never this module.
//
// Every call has a CallView machine (machines.js, generated from machines/), so the app
// never sees two terminal phases for one call: cancelAll() (an interrupt) cancels every
// open view at once, locally, and the server's own late phases for those calls are
// dropped, as is every message of a call begun by a turn the user already interrupted.
// With local-preview-v1 the legacy previews are made here from tool.stream, by the rule
// the server's engine uses, so the app sees the previews the wire would have carried.

import { CALL_VIEW, InvalidTransition, Machine } from "./machines.js";
import { argumentsText } from "./codec.js";

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

/** The calls as the app sees them; `emit(type, detail)` gives the app an event (the
 * client's). `local`: previews are made here (local-preview-v1 with tool-stream-v1). */
export class CallViews {
  constructor(emit) {
    this.emit = emit;
    this.open = new Map(); // callId -> {machine, first, fragments, chars, text}
    this.ignored = new Set(); // calls of turns the user interrupted (the newest IGNORED_KEPT)
    this.previews = new Previews();
    this.local = false;
  }

  /** One `tool.stream` event (the message without seq and type) of the client's `epoch`.
   * Returns the reason the call's app tool must stop with if the call just ended here
   * (the app saw it end: a queued tool.call for it must never run), else null. */
  stream(event, epoch) {
    const callId = event.callId;
    if (this.ignored.has(callId)) return null;
    if (event.phase === "start") {
      if (this.open.has(callId) || event.epoch < epoch) {
        this._ignore(callId); // a call of a turn the user already interrupted
        return null;
      }
      const machine = new Machine(CALL_VIEW);
      const view = { machine, first: event, fragments: [], chars: 0, text: null };
      this.open.set(callId, view);
      this._show(view, event);
      return null;
    }
    const view = this.open.get(callId);
    if (view === undefined) return null; // final here already (cancelled locally)
    try {
      view.machine.send(VIEW_EVENT[event.phase]);
    } catch (error) {
      if (!(error instanceof InvalidTransition)) throw error;
      this.emit("error", {
        code: "BAD_MESSAGE",
        message: `from the server: ${event.phase} while call ${callId} is ${view.machine.state}`,
      });
      return null;
    }
    this._show(view, event);
    if (!view.machine.final) return null;
    this.open.delete(callId);
    return event.phase === "cancelled" ? "interrupted" : event.code === "TIMEOUT" ? "timeout" : "aborted";
  }

  /** `event` for the app, and with local previews the preview that follows it when the
   * server would have sent one (the same Previews choice as its own). */
  _show(view, event) {
    this.emit("tool.stream", event);
    if (!this.local) return;
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
    if (this.previews.wanted(preview)) this.emit("tool.preview", preview);
  }

  /** A `tool.preview` from the server (the message without seq and type): shown unless
   * its call is ignored, or previews are made here (it would be shown twice). */
  preview(preview) {
    if (this.ignored.has(preview.callId) || this.local) return;
    this.emit("tool.preview", preview);
  }

  /** Whether the app no longer hears of `callId` (a call of an interrupted turn). */
  ignoring(callId) {
    return this.ignored.has(callId);
  }

  /** The user interrupted: every open call "cancelled" for the app at once, then ignored. */
  cancelAll() {
    for (const [callId, view] of this.open) {
      view.machine.send("cancel");
      this._ignore(callId);
      this.previews.forget(callId);
      this.emit("tool.stream", { ...view.first, phase: "cancelled" });
    }
    this.open.clear();
  }

  /** Each open call (as its start showed it), at most `limit`, for a resume hello. */
  held(limit) {
    const held = [];
    for (const [callId, view] of this.open) {
      if (held.length === limit) break;
      const { turnId, name, kind } = view.first;
      held.push({ turnId, callId, name, kind });
    }
    return held;
  }

  /** The session ended: no view is left open. */
  clear() {
    this.open.clear();
  }

  _ignore(callId) {
    this.ignored.add(callId);
    if (this.ignored.size > IGNORED_KEPT) this.ignored.delete(this.ignored.values().next().value);
  }
}
