// A small typed use of vrt.js: `tsc --noEmit` checks it against vrt/web/vrt.d.ts (CI).
import {
  CAPABILITIES,
  connect,
  LEGACY,
  MAX_MESSAGE_SIZE,
  REPLAY_LIMIT_BYTES,
  VrtError,
  type AppTool,
  type Capability,
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
  const legacy: readonly string[] = LEGACY;
  console.log(epoch, legacy, client.capabilities, client.closed);
  await client.close();
}
