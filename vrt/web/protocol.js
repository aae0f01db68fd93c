// protocol.js: vrt.js's protocol core, sans-IO (vrt/_wire/client.py's ClientProtocol).
// Part of the browser client: a page imports /vrt.js, never this module.
//
// Frames in, messages and events out; no socket, no timer. It holds the session as the
// client sees it: the Connection machine, the negotiated capabilities, the epoch, seq and
// ack, the replay buffer and the outbox (numbered frames the client writes), and it reads
// each message from the server, handing each call's phases to the call views (views.js)
// and each tool.call, through the epoch gate, to the app-tool runner (runner.js).
//
// The client (vrt.js) pumps it through a narrow `host`: emit(type, detail) gives the app
// an event (at once: a listener sees the state of that moment), queued() says the outbox
// grew, welcomed(resumed) that a handshake finished, refusal(error) that the server sent
// an error before the session opened, closed(reason) that the server ended it, and
// finish(reason) that the session must end now. The client owns the socket, the timers,
// resume and backoff, and whether the session is over (end() tells the core).
//
// Each frame is checked as the Python client checks it (codec.js): a frame or message
// that fails is an `error` event with the Python client's code and message, and dropped.
//
// With audio-v1 (PROTOCOL.md, "Audio") a binary frame is the agent's voice: the core
// checks it (a whole number of PCM16 samples, at most 100 ms, inside an audio.start /
// audio.end span) and applies the epoch gate (a span whose epoch is behind the client's is
// dropped, every frame of it, never played); the host's speaker (audio.js) only plays what
// it is handed, and is told to stop on an interrupt: the user's, or the server's
// turn.ended `interrupted`.

import { AUDIO_SPAN, CONNECTION, Machine, pyRepr } from "./machines.js";
import { Broken, VrtError, encode, parse, structure } from "./codec.js";
import { CallViews } from "./views.js";

/** The protocol this client speaks (PROTOCOL.md). */
export const PROTOCOL = "vrt/1";
/** What the client offers by default: every capability it supports. */
export const CAPABILITIES = Object.freeze([
  "tool-stream-v1",
  "batch-v1",
  "local-preview-v1",
  "handover-v1",
]);
/** The wire of one object a frame, previews on the wire. */
export const LEGACY = Object.freeze(["tool-stream-v1"]);
const HANDOVER_V1 = "handover-v1";
/** Binary frames of PCM16 audio both ways (PROTOCOL.md, "Audio"): offered with `audio`. */
export const AUDIO_V1 = "audio-v1";
/** The server's messages of audio-v1: an unknown type without it (as to the Python client). */
const AUDIO_TYPES = new Set(["audio.start", "audio.end", "transcript"]);
/** The longest audio frame, in ms of its rate (PROTOCOL.md). */
const AUDIO_FRAME_MS = 100;
/** The most entries of a resume hello's `open` (vrt/_wire/messages.py's OPEN_LIMIT). */
const OPEN_LIMIT = 256;
const ENDED_KEPT = 100; // turns whose turn.ended the app saw (a second one is dropped)
const BATCH_MESSAGES = 100;
/** One client's protocol state, driven by vrt.js's Client (see the module's comment).
 * `options`: the app tools (name -> tool), the capabilities offered (audio-v1 among them
 * if `audio`) and the client's limits; `host`: the client's hooks (with audio-v1, its
 * `speaker()`: the session's audio.js object, or null while there is none); `runner`: the
 * app-tool runner (runner.js). */
export class Protocol {
  constructor(
    { tools, capabilities, audio = false, maxMessageSize, replayLimit, replayLimitBytes },
    host,
    runner,
  ) {
    this.tools = tools;
    this.offered = [...capabilities];
    if (audio && !this.offered.includes(AUDIO_V1)) this.offered.push(AUDIO_V1);
    this.maxMessageSize = maxMessageSize;
    this.replayLimit = replayLimit;
    this.replayLimitBytes = replayLimitBytes;
    this.host = host;
    this.runner = runner;
    this.connection = new Machine(CONNECTION);
    this.capabilities = [];
    this.sessionId = null;
    this.resumeToken = null;
    this.epoch = 0;
    this.sentSeq = 0;
    this.receivedSeq = 0;
    this.ackSent = 0;
    this.replay = []; // [seq, text] the server has not acked
    this.replayBytes = 0;
    this.overflowed = false; // the replay buffer went over its bound: the session must end
    this.outbox = [];
    this.views = new CallViews((type, detail) => host.emit(type, detail));
    this.openTurn = null; // the turn the app saw start and not end (handover-v1)
    this.lastTurn = null; // {turnId, epoch} of the last turn.started
    this.ended = new Set(); // turns whose turn.ended the app saw (the newest ENDED_KEPT)
    this.batching = false;
    this.audio = null; // with audio-v1: the welcome's `audio` (the rates)
    this.span = null; // the last audio.start's {turnId, epoch, machine: its AudioSpan}
  }

  // -- the client's actions ---------------------------------------------------------------------

  /** The frame of the hello that opens the session, numbered from 1 again (an earlier
   * attempt's was never welcomed). Throws VrtError TOO_LARGE past maxMessageSize. */
  hello() {
    this.sentSeq = 0;
    this.replay = [];
    this.replayBytes = 0;
    return this._numbered({
      type: "hello",
      protocol: PROTOCOL,
      capabilities: this.offered,
      tools: [...this.tools.values()].map(({ name, description = "", parameters }) => ({
        name,
        description,
        parameters,
      })),
    });
  }

  /** The frame of a resume's hello (vrt/_wire/client.py's resume_hello()): outside the
   * numbering, no tools (declared when the session began), and with handover-v1 what the
   * app holds open, so that a server adopting the session from an earlier save can end it. */
  resumeHello() {
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
    const held = this.views.held(OPEN_LIMIT - 1);
    const turn = this.openTurn;
    if (turn !== null && held.every((entry) => entry.turnId !== turn)) held.push({ turnId: turn });
    return held;
  }

  /** The open connection is gone: reconnecting. Queued frames are dropped; every
   * numbered one is kept for replay. */
  lost() {
    this.connection.send("lost");
    this.outbox = [];
  }

  /** The user interrupted: epoch + 1, every open call "cancelled" locally at once, the
   * runner's calls aborted, the speaker silenced; then the server is told (with audio-v1,
   * how much of the open turn's audio was played: `heardMs`). */
  interrupt() {
    this.epoch += 1;
    this.views.cancelAll();
    this.runner.abortAll("interrupted");
    if (this.audio === null) {
      this.send({ type: "interrupt", epoch: this.epoch });
      return;
    }
    const heardMs = this._speaker()?.interrupted() ?? 0;
    this.send({ type: "interrupt", epoch: this.epoch, heardMs });
  }

  /** The session ended (the client's closed is set): the Connection machine closed, the
   * runner's calls aborted, no call view left. */
  end() {
    if (!this.connection.final) this.connection.send("close");
    this.runner.abortAll("closed");
    this.views.clear();
  }

  // -- sending ----------------------------------------------------------------------------------

  /** Number a message, keep it for replay, queue it for the writer (host.queued()). Throws
   * VrtError TOO_LARGE (and numbers nothing) for a frame over maxMessageSize: the server
   * would refuse it, and a resume would replay it forever. */
  send(fields) {
    this.outbox.push(this._numbered(fields));
    this.host.queued();
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
      this.overflowed = true;
    }
    return text;
  }

  /** The frame of the close that ends an overflowed session: the next seq, not kept (the
   * session is not resumed after it). */
  lastClose() {
    return encode({ type: "close", seq: this.sentSeq + 1 });
  }

  /** The server processed our messages up to `seq`: forget their frames. */
  _peerAcked(seq) {
    const replay = this.replay;
    let n = 0;
    while (n < replay.length && replay[n][0] <= seq) this.replayBytes -= replay[n++][1].length;
    if (n) replay.splice(0, n);
  }

  /** The frames that carry what is queued, taking it: with batch-v1, batches of at most
   * BATCH_MESSAGES messages and maxMessageSize bytes (each message alone fits). */
  frames() {
    const outbox = this.outbox;
    const frames = [];
    while (outbox.length) {
      let n = 1;
      let size = outbox[0].length + 2;
      while (this.batching && n < outbox.length && n < BATCH_MESSAGES) {
        size += outbox[n].length + 1;
        if (size > this.maxMessageSize) break;
        n += 1;
      }
      const group = outbox.splice(0, n);
      frames.push(n === 1 ? group[0] : `[${group.join(",")}]`);
    }
    return frames;
  }

  /** How many of the server's messages are not acked yet. */
  get unacked() {
    return this.receivedSeq - this.ackSent;
  }

  /** Queue an ack of every message received, if one is due and the connection is open;
   * true if one was queued (acks are not numbered). */
  ack() {
    if (this.receivedSeq <= this.ackSent || this.connection.state !== "open") return false;
    this.ackSent = this.receivedSeq;
    this.outbox.push(encode({ type: "ack", seq: this.receivedSeq }));
    return true;
  }

  // -- receiving --------------------------------------------------------------------------------

  /** One frame from the server, within maxMessageSize (vrt/_wire/client.py's receive()). */
  receive(data) {
    if (typeof data !== "string" && this.audio !== null) {
      this._sound(data);
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
      if (this.connection.final) break; // closed is the last word: nothing after it is read
    }
  }

  /** A refused frame or message: surfaced as an `error` event, then dropped. */
  _broken(error) {
    if (!(error instanceof Broken)) throw error;
    this.host.emit("error", { code: error.code, message: `from the server: ${error.message}` });
  }

  /** The session's speaker (audio.js), if audio-v1 is on and the client made it. */
  _speaker() {
    return this.audio === null ? null : this.host.speaker();
  }

  /** A binary frame with audio-v1: the agent's voice, checked, through the epoch gate. */
  _sound(data) {
    const bytes = data.byteLength;
    const rate = this.audio.output.rate;
    const limit = 2 * Math.max(1, Math.floor((rate * AUDIO_FRAME_MS) / 1000));
    let why = null;
    if (bytes % 2 !== 0) {
      const what = "PCM16 takes a whole number of 2-byte samples";
      why = new Broken("BAD_MESSAGE", `an audio frame of ${bytes} bytes: ${what}`);
    } else if (bytes > limit) {
      const what = `over ${AUDIO_FRAME_MS} ms (${limit} bytes at ${rate} Hz)`;
      why = new Broken("TOO_LARGE", `an audio frame of ${bytes} bytes is ${what}`);
    } else if (this.span === null || !this.span.machine.accepts("speak")) {
      why = new Broken("BAD_MESSAGE", "an audio frame outside an audio.start/audio.end span");
    }
    if (why !== null) {
      this._broken(why);
      return;
    }
    const { turnId, epoch, machine } = this.span;
    machine.send("speak");
    this._speaker()?.play(turnId, data, epoch >= this.epoch); // the epoch gate
  }

  _message(data, what) {
    let msg;
    try {
      if (this.audio === null && AUDIO_TYPES.has(data?.type)) {
        throw new Broken("UNKNOWN_TYPE", `unknown message type ${pyRepr(data.type)}`);
      }
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

  _onWelcome(msg) {
    const connection = this.connection;
    if (connection.state === "reconnecting" && !msg.resumed) {
      this.host.finish("expired"); // not our session: a resume is never answered with a new one
      return;
    }
    if (connection.state === "reconnecting") {
      if (msg.sessionId !== this.sessionId) {
        this._broken(new Broken("BAD_STATE", "resumed another session"));
        return;
      }
      connection.send("resumed");
      this.epoch = Math.max(this.epoch, msg.epoch);
      if (msg.lastSeq <= this.sentSeq) this._peerAcked(msg.lastSeq);
      this.outbox = this.replay.map(([, text]) => text);
      this.ackSent = 0;
      this.host.welcomed(true);
      return;
    }
    if (connection.state !== "connecting" || msg.resumed) {
      this._broken(new Broken("BAD_STATE", "a second welcome"));
      return;
    }
    connection.send("welcome");
    this.sessionId = msg.sessionId;
    this.resumeToken = msg.resumeToken;
    this.epoch = Math.max(this.epoch, msg.epoch);
    this.capabilities = msg.capabilities.filter((c) => this.offered.includes(c));
    if (this.capabilities.includes(AUDIO_V1)) {
      if (msg.audio === undefined) {
        this.capabilities = this.capabilities.filter((c) => c !== AUDIO_V1);
        this._broken(new Broken("BAD_MESSAGE", "audio-v1 without the audio rates"));
      } else {
        this.audio = msg.audio;
      }
    }
    this.batching = this.capabilities.includes("batch-v1");
    this.views.local =
      this.capabilities.includes("local-preview-v1") && this.capabilities.includes("tool-stream-v1");
    if (msg.lastSeq <= this.sentSeq) this._peerAcked(msg.lastSeq);
    this.host.welcomed(false);
  }

  _onTurnStarted(msg) {
    this.epoch = Math.max(this.epoch, msg.epoch);
    this.openTurn = msg.turnId;
    this.lastTurn = { turnId: msg.turnId, epoch: msg.epoch };
    this.host.emit("turn.started", { turnId: msg.turnId, epoch: msg.epoch });
  }

  _onTurnEnded(msg) {
    this.epoch = Math.max(this.epoch, msg.epoch);
    if (this.span?.turnId === msg.turnId) this._endSpan(); // (its audio.end lost with a node)
    const ended = this.ended;
    if (ended.has(msg.turnId)) return; // ended already (an adopting server ends what it cannot know ended)
    if (msg.reason === "interrupted") this._speaker()?.flush(msg.turnId, true);
    ended.add(msg.turnId);
    if (ended.size > ENDED_KEPT) ended.delete(ended.values().next().value);
    if (this.openTurn === msg.turnId) this.openTurn = null;
    this.host.emit("turn.ended", { turnId: msg.turnId, epoch: msg.epoch, reason: msg.reason });
  }

  _onTextDelta(msg) {
    this.host.emit("text.delta", { turnId: msg.turnId, text: msg.text });
  }

  _onAudioStart(msg) {
    // a new span; one still open is over (its audio.end lost with a node, or two turns'
    // spans overlap): frames follow the new one
    this._endSpan();
    const machine = new Machine(AUDIO_SPAN);
    machine.send("speak");
    this.span = { turnId: msg.turnId, epoch: msg.epoch, machine };
    this._speaker()?.begin(msg.turnId, msg.epoch, msg.epoch >= this.epoch); // the epoch gate
  }

  _onAudioEnd(msg) {
    if (this.span?.turnId === msg.turnId) this._endSpan();
    this._speaker()?.end(msg.turnId, msg.sentMs);
  }

  /** The open audio span, if any, is over: its AudioSpan machine moves to `ended` (a
   * frame after it is outside any span). */
  _endSpan() {
    if (this.span?.machine.accepts("end")) this.span.machine.send("end");
  }

  _onTranscript(msg) {
    const turn = this.lastTurn;
    if (msg.role === "agent" && msg.turnId === turn?.turnId && turn.epoch < this.epoch) {
      return; // the words of audio the epoch gate drops: the user never heard them
    }
    const { seq, type, ...transcript } = msg;
    this.host.emit("transcript", transcript);
  }

  _onToolStream(msg) {
    const { seq, type, ...event } = msg;
    const ended = this.views.stream(event, this.epoch);
    if (ended !== null) this.runner.abort(msg.callId, ended);
  }

  _onToolPreview(msg) {
    const { seq, type, ...preview } = msg;
    this.views.preview(preview);
  }

  _onToolCall(msg) {
    this.runner.admit(msg, msg.epoch === this.epoch); // the epoch gate
  }

  _onToolAbort(msg) {
    this.runner.abort(msg.callId, "aborted");
  }

  _onConfirmRequest(msg) {
    if (this.views.ignoring(msg.callId)) return;
    const { seq, type, ...request } = msg;
    this.host.emit("confirm.request", {
      ...request,
      approve: async () => this.send({ type: "confirm.reply", callId: msg.callId, approved: true }),
      deny: async (reason) =>
        this.send({ type: "confirm.reply", callId: msg.callId, approved: false, ...(reason ? { reason } : {}) }),
    });
  }

  _onError(msg) {
    const { seq, type, ...error } = msg;
    this.host.emit("error", error);
    if (this.connection.state !== "open") this.host.refusal(error);
  }

  _onClosed(msg) {
    this.host.closed(msg.reason);
  }
}

const HANDLERS = {
  welcome: Protocol.prototype._onWelcome,
  "turn.started": Protocol.prototype._onTurnStarted,
  "turn.ended": Protocol.prototype._onTurnEnded,
  "audio.start": Protocol.prototype._onAudioStart,
  "audio.end": Protocol.prototype._onAudioEnd,
  transcript: Protocol.prototype._onTranscript,
  "text.delta": Protocol.prototype._onTextDelta,
  "tool.stream": Protocol.prototype._onToolStream,
  "tool.preview": Protocol.prototype._onToolPreview,
  "tool.call": Protocol.prototype._onToolCall,
  "tool.abort": Protocol.prototype._onToolAbort,
  "confirm.request": Protocol.prototype._onConfirmRequest,
  error: Protocol.prototype._onError,
  closed: Protocol.prototype._onClosed,
};
