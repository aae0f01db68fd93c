// audio-worklet.js: vrt.js's two AudioWorklet processors (audio-v1), loaded by audio.js with
// context.audioWorklet.addModule(); they run on the audio thread, one render quantum (128
// frames at the context's rate) a call, and talk to the page only through their ports.
//
//   vrt-capture   the microphone in: resampled (linear interpolation) from the context's
//                 rate to the session's input rate, PCM16 little-endian, posted in frames of
//                 `frame` samples (20 ms) with the frame's level (RMS, 0..1)
//   vrt-playback  the agent's voice out: a queue of the turns' PCM16 chunks at the output
//                 rate, read at the context's rate (linear interpolation). A flush drops what
//                 is queued at the next quantum (a 64-frame fade inside it, so no click):
//                 the output is silent within one render quantum of the flush's arrival.
//                 It counts what it played of each turn and reports it, with the context
//                 time of its last sound, for heardMs and stats().
//
// Nothing here decides what plays: the page's epoch gate (protocol.js) drops what is
// stale before it is posted, and asks for the flush on an interrupt.

const FADE = 64; // frames: the fade-out that ends a flushed turn, within one render quantum
const REPORT_EVERY = 4; // quanta between reports while playing (about 10 ms at 48 kHz)
const TURNS_KEPT = 100; // turns whose played frames are kept for stats()
const SILENT = 1 / 32768; // quieter than the least PCM16 step: silence
const QUANTUM = 128; // frames of one render quantum

class Capture extends AudioWorkletProcessor {
  constructor({ processorOptions: { rate, frame } }) {
    super();
    this.step = sampleRate / rate; // input samples per output sample
    this.at = 0; // the next output sample's position, in input samples from this block's start
    this.last = 0; // the previous block's last sample (position -1)
    this.frame = frame;
    this._fresh();
    this.on = true;
    this.port.onmessage = ({ data }) => {
      if (data === "stop") this.on = false;
    };
  }

  _fresh() {
    this.view = new DataView(new ArrayBuffer(this.frame * 2));
    this.n = 0;
    this.squares = 0;
  }

  process(inputs) {
    const channels = inputs[0];
    if (!this.on) return false;
    if (channels.length === 0) return true; // no input connected (yet)
    const x = channels[0]; // mono: the node mixes its input down (channelCount 1)
    const end = x.length - 1;
    let at = this.at;
    for (; at <= end; at += this.step) {
      const i = Math.floor(at);
      const f = at - i;
      const a = i < 0 ? this.last : x[i];
      const s = i < end ? a + (x[i + 1] - a) * f : a;
      const clamped = s > 1 ? 1 : s < -1 ? -1 : s;
      this.view.setInt16(this.n * 2, clamped < 0 ? clamped * 32768 : clamped * 32767, true);
      this.squares += clamped * clamped;
      if (++this.n === this.frame) {
        const pcm = this.view.buffer;
        this.port.postMessage({ pcm, level: Math.sqrt(this.squares / this.frame) }, [pcm]);
        this._fresh();
      }
    }
    this.at = at - x.length;
    this.last = x[end];
    return true;
  }
}

class Playback extends AudioWorkletProcessor {
  constructor({ processorOptions: { rate, limit } }) {
    super();
    this.step = rate / sampleRate; // output-rate samples per context frame
    this.limit = limit; // the most samples queued (a server that floods is not buffered)
    this.queue = []; // [turn, Float32Array] at the output rate, in arrival order
    this.queued = 0; // samples in the queue
    this.at = 0; // read position in the head chunk (fractional samples)
    this.cut = 0; // head chunks a flush drops once its fade is over
    this.fade = 0; // frames of the fade left
    this.played = new Map(); // turn -> context frames played
    this.dropped = 0; // samples refused over the limit
    this.lastSound = null; // context time of the last sample that was not silent
    this.flushTime = null; // context time of the first quantum after the last flush
    this.flushing = false; // a flush came: the next quantum is its first
    this.quanta = 0;
    this.port.onmessage = ({ data }) => this._message(data);
  }

  _message(data) {
    if (data.type === "pcm") {
      const pcm = new DataView(data.pcm);
      const n = pcm.byteLength >> 1;
      if (this.queued + n > this.limit) {
        this.dropped += n;
        return;
      }
      const samples = new Float32Array(n);
      for (let i = 0; i < n; i++) samples[i] = pcm.getInt16(i * 2, true) / 32768;
      this.queue.push([data.turn, samples]);
      this.queued += n;
      if (!this.played.has(data.turn)) {
        this.played.set(data.turn, 0);
        if (this.played.size > TURNS_KEPT) this.played.delete(this.played.keys().next().value);
      }
    } else if (data.type === "flush") {
      this.cut = this.queue.length; // what came before it (not what follows on the port)
      this.fade = this.cut ? this.fade || FADE : 0; // (a fade under way goes on)
      this.flushing = true; // its time: the next quantum's (process() knows it)
    } else if (data.type === "stats") {
      this.port.postMessage({ type: "stats", id: data.id, ...this._state() });
    }
  }

  /** What it played, as of the end of the last quantum rendered (between quanta, and at
   * the end of process(), currentTime is that quantum's start). */
  _state() {
    const head = this.queue.length ? this.queue[0][0] : null;
    return {
      time: currentTime + QUANTUM / sampleRate,
      played: Object.fromEntries(this.played),
      head,
      // what is queued of the head's turn (the page extrapolates heardMs from the report)
      ahead: this._ahead(head),
      queued: this.queued - this.at, // samples not played yet
      dropped: this.dropped,
      lastSound: this.lastSound,
      flushTime: this.flushTime,
    };
  }

  _ahead(turn) {
    let n = -this.at;
    for (const [t, samples] of this.queue) {
      if (t !== turn) break;
      n += samples.length;
    }
    return Math.max(0, n / this.step); // in context frames
  }

  _report() {
    this.port.postMessage({ type: "report", ...this._state() });
  }

  process(_inputs, outputs) {
    if (this.flushing) {
      this.flushTime = currentTime; // this quantum's start: the first after the flush
      this.flushing = false;
    }
    const out = outputs[0][0];
    let last = -1;
    let turn = null;
    let frames = 0;
    for (let j = 0; j < out.length; j++) {
      if (this.queue.length === 0) {
        out[j] = 0;
        continue;
      }
      const [t, x] = this.queue[0];
      if (t !== turn) {
        if (turn !== null) this._played(turn, frames);
        turn = t;
        frames = 0;
      }
      const i = Math.floor(this.at);
      const f = this.at - i;
      const next = i + 1 < x.length ? x[i + 1] : this.queue.length > 1 ? this.queue[1][1][0] : x[i];
      let s = x[i] + (next - x[i]) * f;
      if (this.fade > 0) s *= this.fade-- / FADE;
      out[j] = s;
      if (s > SILENT || s < -SILENT) last = j;
      frames += 1;
      this.at += this.step;
      while (this.queue.length && this.at >= this.queue[0][1].length) {
        this.at -= this.queue[0][1].length;
        this.queued -= this.queue[0][1].length;
        this.queue.shift();
        if (this.cut > 0) this.cut -= 1;
      }
      if (this.queue.length === 0) this.at = 0; // (an underrun: the next chunk from its start)
      if (this.cut > 0 && this.fade === 0) this._drop();
    }
    if (turn !== null) this._played(turn, frames);
    for (let c = 1; c < outputs[0].length; c++) outputs[0][c].set(out);
    if (last >= 0) this.lastSound = currentTime + last / sampleRate;
    const flushed = this.flushTime === currentTime; // (the fade ends within this quantum)
    const due = turn !== null && (++this.quanta % REPORT_EVERY === 0 || this.queue.length === 0);
    if (flushed || due) this._report();
    return true;
  }

  _played(turn, frames) {
    this.played.set(turn, (this.played.get(turn) ?? 0) + frames);
  }

  /** The fade is over: what was queued before the flush goes, unplayed. */
  _drop() {
    for (const [, samples] of this.queue.splice(0, this.cut)) this.queued -= samples.length;
    this.cut = 0;
    this.at = 0;
  }
}

registerProcessor("vrt-capture", Capture);
registerProcessor("vrt-playback", Playback);
