// audio.js: vrt.js's microphone and speaker (audio-v1). Part of the browser client: a page
// imports /vrt.js and reaches this as `client.audio`, never this module.
//
// The Web Audio side of a session, behind a narrow interface: the client makes one after a
// welcome that granted audio-v1 and hands it what the protocol core decided (core: which
// frames are of the current turn, when a turn's audio starts and ends, when to stop);
// this object only moves samples. Two AudioWorklet processors (audio-worklet.js, fetched
// beside this module) do the work on the audio thread:
//   - vrt-capture: the microphone (getUserMedia with echo cancellation, noise suppression
//     and automatic gain on), resampled to the session's input rate, PCM16 LE frames of
//     20 ms, each sent as one binary frame at once (realtime: dropped, never queued, when
//     the session cannot send it now);
//   - vrt-playback: a queue of the agent's voice at the output rate, read at the context's
//     rate. A flush (an interrupt) empties it at the next render quantum; it reports what
//     it played of each turn, from which heardMs is read (extrapolated on the context's
//     clock between reports, never past what was queued).

import { VrtError } from "./codec.js";

/** The processors' module, served beside this one (`GET /audio-worklet.js`). */
const WORKLET = new URL("./audio-worklet.js", import.meta.url);
/** One microphone frame, in ms (PROTOCOL.md allows up to 100). */
const FRAME_MS = 20;
/** Seconds of the agent's voice the speaker queues at most (a flood is not buffered). */
const QUEUE_LIMIT = 600;
/** Bytes the socket may hold unsent before microphone frames are dropped (about 1.3 s at
 * 24 kHz): late speech is worth less than none. */
const SEND_BACKLOG = 64 * 1024;
const TURNS_KEPT = 100; // turns whose counts stats() gives
/** What getUserMedia is asked for: the browser's echo canceller keeps the agent's own voice
 * out of the microphone (else it would interrupt itself). */
const MICROPHONE = Object.freeze({
  echoCancellation: true,
  noiseSuppression: true,
  autoGainControl: true,
  channelCount: 1,
});

/** One session's audio (`client.audio`), made by the client after a welcome that granted
 * audio-v1. `formats`: the welcome's `audio`; `io.send(pcm, backlog)` sends a binary frame
 * now or says false; `io.openTurn()` is the turn the page saw start and not end (or null);
 * `io.context`: the page's own AudioContext (else one is made, and closed with the
 * session). */
export class ClientAudio {
  constructor(formats, { send, openTurn, context = null }) {
    this.input = formats.input;
    this.output = formats.output;
    this._send = send;
    this._openTurn = openTurn;
    this._own = context === null;
    /** The AudioContext everything plays in (and whose clock stats() reads). */
    this.context = context ?? new AudioContext({ latencyHint: "interactive" });
    /** The microphone's level: the RMS of its last frame, 0..1 (0 while it is off). */
    this.level = 0;
    /** The microphone's stream while it is on (start() to stop()), else null. */
    this.microphone = null;
    this._capture = null;
    this._source = null;
    this._playback = null;
    this._turns = new Map(); // turnId -> {epoch, receivedMs, droppedMs, sentMs}
    this._turn = null; // the turn of the latest playable audio.start
    this._report = null; // the playback processor's latest report
    this._cut = undefined; // the turn the last flush cut (a user's interrupt, then the server's turn.ended)
    this._interruptTime = null;
    this._mic = { frames: 0, ms: 0, dropped: 0 };
    this._asked = new Map(); // stats() requests: id -> resolve
    this._asks = 0;
    this._closed = false;
    /** Resolves once the playback worklet is in place (connect() waits for it). */
    this.ready = this._load();
  }

  async _load() {
    await this.context.audioWorklet.addModule(WORKLET);
    const rate = this.output.rate;
    const node = new AudioWorkletNode(this.context, "vrt-playback", {
      numberOfInputs: 0,
      numberOfOutputs: 1,
      outputChannelCount: [1],
      processorOptions: { rate, limit: QUEUE_LIMIT * rate },
    });
    node.port.onmessage = ({ data }) => this._reported(data);
    node.connect(this.context.destination);
    this._playback = node;
  }

  // -- the page's side --------------------------------------------------------------------------

  /** Open the microphone and send what it hears; resume the context (browsers start one
   * suspended until a user gesture: call this from one, a click). Idempotent. */
  async start() {
    this._requireOpen();
    await this.ready;
    await this.context.resume();
    if (this.microphone !== null) return;
    const stream = await navigator.mediaDevices.getUserMedia({ audio: { ...MICROPHONE } });
    if (this._closed || this.microphone !== null) {
      for (const track of stream.getTracks()) track.stop(); // closed, or another start() won
      this._requireOpen();
      return;
    }
    const source = this.context.createMediaStreamSource(stream);
    const capture = new AudioWorkletNode(this.context, "vrt-capture", {
      numberOfInputs: 1,
      numberOfOutputs: 0,
      channelCount: 1,
      channelCountMode: "explicit",
      processorOptions: { rate: this.input.rate, frame: Math.ceil((this.input.rate * FRAME_MS) / 1000) },
    });
    capture.port.onmessage = ({ data }) => this._captured(data);
    source.connect(capture);
    this.microphone = stream;
    this._source = source;
    this._capture = capture;
  }

  /** Release the microphone (its tracks stopped: the browser's indicator goes off). */
  stop() {
    if (this.microphone === null) return;
    for (const track of this.microphone.getTracks()) track.stop();
    this._source.disconnect();
    this._capture.port.onmessage = null;
    this._capture.port.postMessage("stop");
    this.microphone = this._source = this._capture = null;
    this.level = 0;
  }

  /** Milliseconds of the latest turn's audio played so far, counted from its audio.start
   * (what the playback worklet output, on the context's clock). */
  get heardMs() {
    return this._turn === null ? 0 : Math.floor(this._playedMs(this._turn));
  }

  /** What a test measures: per turn, what came, was dropped and played; the context time
   * of the last sound played, of the last interrupt and of the flush it made. */
  async stats() {
    this._requireOpen();
    await this.ready;
    let state = this._report;
    if (this.context.state === "running") {
      const id = ++this._asks;
      state = await new Promise((resolve) => {
        this._asked.set(id, resolve);
        this._playback.port.postMessage({ type: "stats", id });
      });
    }
    const rate = this.context.sampleRate;
    const turns = {};
    for (const [turnId, counts] of this._turns) {
      turns[turnId] = { ...counts, playedMs: ((state?.played[turnId] ?? 0) * 1000) / rate };
    }
    return {
      sampleRate: rate,
      time: state?.time ?? this.context.currentTime,
      turns,
      lastSoundTime: state?.lastSound ?? null,
      interruptTime: this._interruptTime,
      flushTime: state?.flushTime ?? null,
      queuedMs: ((state?.queued ?? 0) * 1000) / this.output.rate,
      overflowMs: ((state?.dropped ?? 0) * 1000) / this.output.rate,
      microphone: { ...this._mic },
    };
  }

  // -- the client's side ------------------------------------------------------------------------

  /** An audio.start: the turn's audio follows; `fresh`: of the current epoch (the epoch
   * gate let it through), else every frame of it will be dropped. */
  begin(turnId, epoch, fresh) {
    if (fresh) this._turn = turnId;
    this._counts(turnId, epoch);
  }

  /** One binary frame of `turnId`'s span; `fresh`: of the current epoch (else dropped). */
  play(turnId, pcm, fresh) {
    const counts = this._counts(turnId, null);
    const ms = (pcm.byteLength * 500) / this.output.rate;
    counts.receivedMs += ms;
    // Not playing (a suspended context would play it late, out of step with the talk)
    if (!fresh || this._playback === null || this.context.state !== "running") {
      counts.droppedMs += ms;
      return;
    }
    this._playback.port.postMessage({ type: "pcm", turn: turnId, pcm }, [pcm]);
  }

  /** The turn's audio.end: the server sent `sentMs` of it. */
  end(turnId, sentMs) {
    const counts = this._turns.get(turnId);
    if (counts !== undefined) counts.sentMs = sentMs;
  }

  /** The user interrupted: what plays stops (within a render quantum of the flush
   * reaching the audio thread); returns heardMs of the open turn (0 if its audio has not
   * started), for the interrupt message. */
  interrupted() {
    const open = this._openTurn();
    const heard = open !== null && open === this._turn ? Math.floor(this._playedMs(open)) : 0;
    this.flush(open);
    return heard;
  }

  /** Stop playing now: the server ended `turnId` interrupted (nothing is done twice for
   * a turn the user's interrupt cut already), or the user interrupted (`turnId`: the open
   * turn, or null). */
  flush(turnId, server = false) {
    if (server && turnId === this._cut) return;
    this._cut = turnId;
    if (this._playback === null) return;
    this._interruptTime = this.context.currentTime;
    // heardMs stays what it is now until the processor reports the flush
    const report = this._report;
    if (report !== null && report.head !== null) {
      const frames = this._playedFrames(report.head);
      this._report = { ...report, played: { ...report.played, [report.head]: frames }, ahead: 0 };
    }
    this._playback.port.postMessage({ type: "flush" });
  }

  /** The session ended: the microphone released, the context closed if it is ours. */
  close() {
    if (this._closed) return;
    this._closed = true;
    this.stop();
    if (this._playback !== null) {
      this._playback.port.onmessage = null;
      this._playback.disconnect();
    }
    for (const resolve of this._asked.values()) resolve(this._report);
    this._asked.clear();
    if (this._own && this.context.state !== "closed") this.context.close().catch(() => {});
  }

  // -- inside -----------------------------------------------------------------------------------

  _requireOpen() {
    if (this._closed) throw new VrtError("CLOSED", "the session is closed");
  }

  _counts(turnId, epoch) {
    let counts = this._turns.get(turnId);
    if (counts === undefined) {
      counts = { epoch, receivedMs: 0, droppedMs: 0, sentMs: null };
      this._turns.set(turnId, counts);
      if (this._turns.size > TURNS_KEPT) this._turns.delete(this._turns.keys().next().value);
    }
    return counts;
  }

  /** Context frames of `turnId` played: the last report's, and since it, on the context's
   * clock, what was queued of the turn it was playing. */
  _playedFrames(turnId) {
    const report = this._report;
    if (report === null) return 0;
    let frames = report.played[turnId] ?? 0;
    if (report.head === turnId) {
      const since = (this.context.currentTime - report.time) * this.context.sampleRate;
      frames += Math.min(report.ahead, Math.max(0, since));
    }
    return frames;
  }

  _playedMs(turnId) {
    return (this._playedFrames(turnId) * 1000) / this.context.sampleRate;
  }

  /** A microphone frame: sent at once, or dropped. */
  _captured({ pcm, level }) {
    this.level = level;
    const ms = (pcm.byteLength * 500) / this.input.rate;
    if (this._send(pcm, SEND_BACKLOG)) {
      this._mic.frames += 1;
      this._mic.ms += ms;
    } else {
      this._mic.dropped += 1;
    }
  }

  /** The playback processor's report (or a stats() answer). */
  _reported(data) {
    this._report = data;
    if (data.type === "stats") {
      const resolve = this._asked.get(data.id);
      this._asked.delete(data.id);
      resolve?.(data);
    }
  }
}
