/**
 * The agent's part of an in-place reset (backends/bwrap/reset.ts does the rest from
 * outside): `begin` ends the services and shells it started, refuses new processes and
 * empties its spool and leaves /workspace so the host can swap its layer; `finish` forgets what ended, enters
 * the new /workspace and takes work again. The host kills every other process of the
 * sandbox itself between the two: it does not trust the agent to have done it.
 */
import { readdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { AgentError } from "../../errors.js";
import type { OpHandler } from "./context.js";
import { forgetServicesOf, killServicesOf } from "./services.js";
import { closeShellsOf } from "./shells.js";

/**
 * A reset the host began and has not finished. It expires: a host that died between the
 * two phases leaves a sandbox the next host start replaces, but until then the agent
 * must not refuse work for ever.
 */
let resettingUntil = 0;
const RESET_EXPIRY_MS = 30_000;

/** Throws `conflict` while a reset is under way: ops that start processes call it first. */
export function refuseWhileResetting(): void {
  if (Date.now() < resettingUntil)
    throw new AgentError("conflict", "the workspace is being reset", "retry once the reset has finished");
}

export const reset: OpHandler<"reset"> = async (args, ctx) => {
  if (args.phase === "begin") {
    resettingUntil = Date.now() + RESET_EXPIRY_MS;
    killServicesOf(ctx.workspace);
    await closeShellsOf(ctx.workspace);
    // The spool holds nothing between requests; what a command left there goes too,
    // before the host's signature, which holds the spool to be as empty as at start
    // (what this cannot remove means a restart).
    for (const name of await readdir(ctx.tmpDir))
      await rm(join(ctx.tmpDir, name), { recursive: true, force: true });
    // Out of /workspace, so its layer can be unmounted and replaced under us.
    process.chdir("/");
    return { phase: "begin" };
  }
  forgetServicesOf(ctx.workspace);
  process.chdir(ctx.workspace.givenRoot);
  resettingUntil = 0;
  return { phase: "finish" };
};
