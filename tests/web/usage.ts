// A small typed use of vrt.js: `tsc --noEmit` checks it against vrt/web/vrt.d.ts (CI).
import {
  CAPABILITIES,
  connect,
  LEGACY,
  MAX_MESSAGE_SIZE,
  REPLAY_LIMIT_BYTES,
  VrtError,
  type AppTool,
  type AudioStats,
  type Capability,
  type ClientAudio,
  type ClosedReason,
  type ToolStreamDetail,
} from "../../vrt/web/vrt.js";

interface Edit {
  text: string;
  at: number;
}

const edit: AppTool<Edit, { done: boolean }> = {
  name: "edit",
  description: "Edit the document",
  parameters: { type: "object", properties: { text: { type: "string" } } },
  async run(args, ctx) {
    if (ctx.signal.aborted) throw new Error(String(ctx.signal.reason));
    const where: number = args.at;
    return { done: where >= 0 && args.text.length > 0 };
  },
};

export async function main(url: string): Promise<void> {
  const handover: Capability = "handover-v1"; // resume at once after a close 1012
  const client = await connect(url, {
    tools: [edit],
    capabilities: CAPABILITIES.includes(handover) ? CAPABILITIES : [...LEGACY, handover],
    resume: { timeout: 5000, connectTimeout: 2000, backoff: 50 },
    maxMessageSize: 4 * MAX_MESSAGE_SIZE,
    replayLimit: 1000,
    replayLimitBytes: 2 * REPLAY_LIMIT_BYTES,
  });
  const limits: number[] = [client.maxMessageSize, client.replayLimit, client.replayLimitBytes];
  client.addEventListener("error", (e) => console.log(e.detail.code, e.detail.message, e.detail.ref ?? 0));
  const phases: ToolStreamDetail["phase"][] = [];
  client.addEventListener("tool.stream", (e) => {
    phases.push(e.detail.phase);
    if (e.detail.phase === "settled" && e.detail.ok === false) console.log(e.detail.code);
  });
  client.addEventListener("tool.preview", (e) => console.log(e.detail.arguments.length, e.detail.complete));
  client.addEventListener("confirm.request", (e) => {
    void (e.detail.risk === "high" || e.detail.risk === null ? e.detail.deny("no") : e.detail.approve());
  });
  client.addEventListener("turn.ended", (e) => console.log(e.detail.reason, e.detail.epoch));
  client.addEventListener("closed", (e) => {
    const reason: ClosedReason = e.detail.reason;
    if (reason === "too_large" || reason === "overflow") console.log("not resumable", limits);
  });
  try {
    await client.sendText("hello");
  } catch (error) {
    if (error instanceof VrtError && error.code === "TOO_LARGE") console.log(error.message);
  }
  client.interrupt();
  const epoch: number = client.epoch;
  await talk(url);
  const legacy: readonly string[] = LEGACY;
  console.log(epoch, legacy, client.capabilities, client.closed);
  await client.close();
}

/** A voice session: the page's microphone to the model, the model's voice to the page. */
export async function talk(url: string): Promise<number> {
  const client = await connect(url, { audio: true, resume: false });
  client.addEventListener("transcript", (e) => console.log(e.detail.role, e.detail.text, e.detail.turnId));
  const audio: ClientAudio | null = client.audio;
  if (audio === null) return 0; // the server's model neither hears nor speaks
  const rates: number[] = [audio.input.rate, audio.output.rate];
  await audio.start();
  const meter = setInterval(() => console.log(audio.level.toFixed(2), audio.heardMs), 100);
  client.interrupt(); // silent at once; the interrupt says how much was heard
  const stats: AudioStats = await audio.stats();
  const turn = stats.turns["t_1"];
  const late = stats.lastSoundTime !== null && stats.flushTime !== null && stats.lastSoundTime > stats.flushTime;
  console.log(rates, turn?.playedMs, turn?.sentMs ?? "sending", late, stats.microphone.frames);
  clearInterval(meter);
  audio.stop();
  const mine = new AudioContext();
  const other = await connect(url, { audio: { context: mine } });
  console.log(other.audio?.context === mine, other.audio?.microphone === null);
  await other.close();
  await client.close();
  return stats.sampleRate;
}
