// TypeScript declarations for vrt.js, the browser client of vrt/1 (checked by `tsc --noEmit`
// in CI against tests/web/usage.ts).

export declare const PROTOCOL: "vrt/1";
/** What the client offers by default: every capability it supports. */
export declare const CAPABILITIES: readonly Capability[];
/** The wire of one object a frame, previews on the wire. */
export declare const LEGACY: readonly Capability[];
/** The defaults of {@link ConnectOptions}: the Python client's. */
export declare const MAX_MESSAGE_SIZE: number;
export declare const REPLAY_LIMIT: number;
export declare const REPLAY_LIMIT_BYTES: number;

export type Capability =
  | "tool-stream-v1"
  | "batch-v1"
  | "local-preview-v1"
  | "handover-v1"
  | "audio-v1"
  | (string & {});
export type Phase =
  | "start"
  | "arguments-delta"
  | "arguments-complete"
  | "progress"
  | "settled"
  | "cancelled"
  | "failed";
export type ResultCode = "INTERRUPTED" | "REJECTED" | "INVALID" | "TIMEOUT" | "FAILED";
export type ClosedReason =
  | "client"
  | "server"
  | "expired"
  | "rejected"
  | "overflow"
  | "shutdown"
  | "lost"
  | "too_large";
export type AbortReason = "interrupted" | "timeout" | "aborted" | "closed";
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** What an app tool sees of its call. */
export interface ToolContext {
  callId: string;
  turnId: string;
  epoch: number;
  name: string;
  /** Aborted when the call is interrupted, times out, is aborted by the server, or the
   * session closes; `signal.reason` is an {@link AbortReason}. */
  signal: AbortSignal;
}

/** An app tool hosted by the page. A thrown error is FAILED; `undefined` is `output: null`. */
export interface AppTool<Args = any, Output = unknown> {
  name: string;
  description?: string;
  /** The arguments' JSON Schema, offered to the model as is. */
  parameters: { [key: string]: Json };
  run(args: Args, ctx: ToolContext): Output | Promise<Output>;
}

export interface ResumeOptions {
  /** ms to get the session back after the connection dropped (default 30000); also how
   * long `connect` keeps trying to open the session. A connection that closes with 1012
   * (handover-v1: the session moved to another server) starts a fresh one. */
  timeout?: number;
  /** ms for one connection attempt, its welcome included (default 10000). */
  connectTimeout?: number;
  /** first retry delay in ms, doubled each try, jittered (default 100); waited before
   * the first resume attempt too, except after a close 1012 (at once). */
  backoff?: number;
  /** the longest retry delay in ms (default 5000). */
  maxBackoff?: number;
}

/** audio-v1's formats, one per direction (the welcome's `audio`: the model's rates). */
export interface AudioFormat {
  format: "pcm16";
  /** Samples per second (PCM16 little-endian, mono). */
  rate: number;
}

export interface AudioOptions {
  /** The AudioContext to play and capture in (default: one made at connect and closed
   * with the session). A context made without a user gesture starts suspended: the
   * agent's voice is dropped until it runs; `audio.start()` resumes it. */
  context?: AudioContext;
}

export interface ConnectOptions {
  tools?: AppTool[];
  /** What to offer (default {@link CAPABILITIES}); `audio` adds "audio-v1". */
  capabilities?: readonly Capability[];
  /** Offer audio-v1: the page's microphone to the model, the model's voice to the page
   * (`client.audio`, once the server granted it). `connect` then also waits for the
   * playback worklet, and rejects with VrtError AUDIO (the session closed) if audio
   * cannot play here (no AudioWorklet outside a secure context). */
  audio?: boolean | AudioOptions;
  /** false: a lost connection ends the session (`closed` with reason "lost"). */
  resume?: boolean | ResumeOptions;
  /** The largest frame, both ways (default 1 MiB, at least 1024): bytes of a frame this
   * client writes (it writes ASCII), code points of a text frame from the server. A larger
   * one from the server ends the session (`closed` with reason "too_large", no resume);
   * `sendText` or `deny` rejects with VrtError TOO_LARGE rather than send one, and an app
   * tool's output over it is answered FAILED. */
  maxMessageSize?: number;
  /** Messages the server has not acked that the client keeps for a resume (default
   * 10000). Over it, the session ends: `closed` with reason "overflow". */
  replayLimit?: number;
  /** The same bound in bytes (default 2 MiB, or twice maxMessageSize if more; at least
   * twice maxMessageSize). */
  replayLimitBytes?: number;
}

/** One lifecycle event of one call (the `tool.stream` message). */
export interface ToolStreamDetail {
  callId: string;
  turnId: string;
  epoch: number;
  name: string;
  kind: "server" | "app";
  phase: Phase;
  delta?: string;
  arguments?: Json;
  progress?: Json;
  ok?: boolean;
  code?: ResultCode;
  message?: string;
}

/** The legacy preview: the arguments' JSON text so far. */
export interface ToolPreviewDetail {
  callId: string;
  turnId: string;
  name: string;
  arguments: string;
  complete: boolean;
}

export interface TurnStartedDetail {
  turnId: string;
  epoch: number;
}

export interface TurnEndedDetail {
  turnId: string;
  epoch: number;
  reason: "finished" | "interrupted" | "failed";
}

export interface TextDeltaDetail {
  turnId: string;
  text: string;
}

export interface ConfirmRequestDetail {
  callId: string;
  name: string;
  arguments: Json;
  risk: "low" | "medium" | "high" | null;
  prompt: string;
  approve(): Promise<void>;
  deny(reason?: string): Promise<void>;
}

/** A protocol error: one the server sent (with its `ref`), or a frame from the server
 * this client refused, with the Python client's code and message ("from the server: ..."):
 * BAD_JSON, BAD_MESSAGE (not an object, a binary frame, the schema), UNKNOWN_TYPE,
 * BAD_STATE; INTERNAL for a failure of vrt.js itself. With audio-v1, an audio frame of
 * an odd length is BAD_MESSAGE, one over 100 ms TOO_LARGE, one outside an audio.start /
 * audio.end span BAD_MESSAGE (each dropped). The session goes on. */
export interface ErrorDetail {
  code: string;
  message: string;
  ref?: number;
}

/** The model's transcript of the user's or the agent's speech (audio-v1). The agent's
 * words of a turn the user interrupted are dropped with its audio (never heard). */
export interface TranscriptDetail {
  turnId: string;
  role: "user" | "agent";
  text: string;
}

/** One turn's audio as the page got it (ms of audio at the output rate). */
export interface TurnAudioStats {
  /** The epoch of its audio.start. */
  epoch: number | null;
  /** Audio that came for the turn. */
  receivedMs: number;
  /** What of it was never played: a span of an epoch behind the client's (the epoch
   * gate), frames that crossed an interrupt on the wire, audio while the context was
   * not running. */
  droppedMs: number;
  /** What the playback worklet played of it (a flush's fade of 64 frames included). */
  playedMs: number;
  /** The server's count, from its audio.end (null before). */
  sentMs: number | null;
}

/** What the page can measure of its audio: times are on the AudioContext's clock
 * (`context.currentTime`, in seconds). */
export interface AudioStats {
  /** The context's rate. */
  sampleRate: number;
  /** When these numbers were taken. */
  time: number;
  /** The last 100 turns with audio, by turnId. */
  turns: { [turnId: string]: TurnAudioStats };
  /** When the last sample that was not silent was played (null: none yet). */
  lastSoundTime: number | null;
  /** `context.currentTime` at the last interrupt: the user's `interrupt()`, or the
   * server's turn.ended "interrupted" (null: none yet). */
  interruptTime: number | null;
  /** The start of the first render quantum after that interrupt's flush reached the
   * audio thread: every sample of the flushed turns after it is silent but a 64-frame
   * fade, so `lastSoundTime` of those turns is within one render quantum (128 frames)
   * of it. */
  flushTime: number | null;
  /** The agent's voice queued, not yet played. */
  queuedMs: number;
  /** Audio refused because the queue held its bound (600 s). */
  overflowMs: number;
  /** The microphone: frames sent, their ms, frames dropped (the session could not send
   * them at once: reconnecting, or the socket's buffer full). */
  microphone: { frames: number; ms: number; dropped: number };
}

/** A session's microphone and speaker (audio-v1): `client.audio`. */
export interface ClientAudio {
  /** The negotiated formats (the welcome's). */
  readonly input: AudioFormat;
  readonly output: AudioFormat;
  /** The context it plays and captures in. */
  readonly context: AudioContext;
  /** The microphone's stream while it is on, else null. */
  readonly microphone: MediaStream | null;
  /** The microphone's level, 0..1: the RMS of its last 20 ms frame (0 while off). */
  readonly level: number;
  /** Milliseconds of the latest turn's audio played so far, from its audio.start (what
   * the playback worklet output; an interrupt sends the open turn's). */
  readonly heardMs: number;
  /** Resolves once the playback worklet is in place (connect() waited for it). */
  readonly ready: Promise<void>;
  /** Open the microphone (getUserMedia with echoCancellation, noiseSuppression and
   * autoGainControl on) and send it, resampled to the input rate, in 20 ms PCM16 frames;
   * resumes the context (call it from a user gesture). Idempotent. Rejects as
   * getUserMedia does (NotAllowedError...), or VrtError CLOSED. */
  start(): Promise<void>;
  /** Release the microphone. */
  stop(): void;
  /** Fresh numbers from the playback worklet. */
  stats(): Promise<AudioStats>;
}

export interface SessionDetail {
  sessionId: string | null;
}

export interface ClosedDetail {
  reason: ClosedReason;
}

export interface ClientEventMap {
  "tool.stream": CustomEvent<ToolStreamDetail>;
  "tool.preview": CustomEvent<ToolPreviewDetail>;
  "turn.started": CustomEvent<TurnStartedDetail>;
  "turn.ended": CustomEvent<TurnEndedDetail>;
  "text.delta": CustomEvent<TextDeltaDetail>;
  transcript: CustomEvent<TranscriptDetail>;
  "confirm.request": CustomEvent<ConfirmRequestDetail>;
  error: CustomEvent<ErrorDetail>;
  reconnecting: CustomEvent<SessionDetail>;
  resumed: CustomEvent<SessionDetail>;
  closed: CustomEvent<ClosedDetail>;
}

/** A refused session or a connection that could not be made. */
export declare class VrtError extends Error {
  code: string;
  constructor(code: string, message: string);
}

export declare class Client extends EventTarget {
  readonly url: string;
  readonly maxMessageSize: number;
  readonly replayLimit: number;
  readonly replayLimitBytes: number;
  /** The negotiated capabilities (the intersection). */
  readonly capabilities: Capability[];
  readonly sessionId: string | null;
  /** Raised by one on each interrupt(); adopted from the server's turns. */
  readonly epoch: number;
  /** Why the session ended, once it has; null while it lives. */
  readonly closed: ClosedReason | null;
  /** The microphone and the speaker, when audio-v1 was negotiated; else null. */
  readonly audio: ClientAudio | null;
  /** Send user input: a new turn (the server interrupts an open one first). */
  sendText(text: string): Promise<void>;
  /** Synchronous: epoch + 1, every open call "cancelled" locally at once, the running app
   * tool's signal aborted, the agent's voice silenced within one render quantum of the
   * flush reaching the audio thread (its audio still on the way dropped), then the server
   * told (with audio-v1, `heardMs`: how much of the open turn's audio was played). The
   * server's turn.ended "interrupted" silences the voice as well. */
  interrupt(): void;
  /** End the session for good. */
  close(): Promise<void>;
  addEventListener<K extends keyof ClientEventMap>(
    type: K,
    listener: (event: ClientEventMap[K]) => void,
    options?: boolean | AddEventListenerOptions,
  ): void;
  addEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | AddEventListenerOptions,
  ): void;
  removeEventListener<K extends keyof ClientEventMap>(
    type: K,
    listener: (event: ClientEventMap[K]) => void,
    options?: boolean | EventListenerOptions,
  ): void;
  removeEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | EventListenerOptions,
  ): void;
}

/** Connect and open a session; resolves once the server welcomed it. An attempt that
 * fails before the WebSocket opens (the browser does not say why: a 503 from a draining
 * server, nothing listening, a refused origin) is tried again with backoff until
 * `resume.timeout`; with `resume: false` it rejects at once. Rejects with VrtError: the
 * server's refusal (its code), or the last attempt's CONNECT, TIMEOUT or CLOSED; AUDIO if
 * audio-v1 was granted and cannot play here. */
export declare function connect(url: string, options?: ConnectOptions): Promise<Client>;

/** Python's json.dumps of a value (how the server's engine writes arguments' text). */
export declare function pythonJson(value: Json): string;
