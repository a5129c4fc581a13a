/** `ping` and `info`: liveness and a description of where the agent runs. */
import os from "node:os";
import type { OpHandler } from "./context.js";

/** Answers with the agent's clock, so the host can also gauge round-trip time. */
export const ping: OpHandler<"ping"> = async () => ({ time_ms: Date.now() });

/** Kernel, hostname, pid and Node version of the agent, and its root. */
export const info: OpHandler<"info"> = async (_args, ctx) => ({
  kernel: os.release(),
  hostname: os.hostname(),
  pid: process.pid,
  node: process.version,
  root: ctx.workspace.givenRoot,
});
