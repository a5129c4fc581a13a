import { rm } from "node:fs/promises";
import { afterAll, beforeAll, describe, it } from "vitest";
import { parityTargets } from "./backends.js";
import { makeSeed, SCENARIOS, type ScenarioContext } from "./scenarios.js";

/**
 * One scenario list, every backend. A failure names the backend in the test title; a
 * backend that cannot run here is skipped with its reason; scenarios that need a sandbox
 * reachable from other processes are skipped on the in-process fake, saying so.
 */
for (const target of parityTargets()) {
  describe.skipIf(target.skip !== "")(
    `parity on ${target.label}${target.skip ? ` (skipped: ${target.skip})` : ""}`,
    () => {
      let ctx: ScenarioContext;
      let close: () => Promise<void>;
      beforeAll(async () => {
        const opened = await target.open();
        close = opened.close;
        ctx = {
          target,
          pyro: opened.pyro,
          home: opened.home,
          cliEnv: opened.cliEnv,
          seed: await makeSeed(),
          createOptions: {
            backend: target.backend,
            ...(target.backend === "host" ? { allowHostCompat: true } : {}),
          },
        };
      });
      afterAll(async () => {
        if (!ctx) return;
        for (const w of (await ctx.pyro.listWorkspaces()).workspaces)
          await ctx.pyro.deleteWorkspace(w.workspace_id).catch(() => {});
        await close();
        await rm(ctx.seed, { recursive: true, force: true });
        await rm(ctx.home, { recursive: true, force: true });
      });
      for (const s of SCENARIOS) {
        const skip = s.real && !target.real;
        it.skipIf(skip)(
          `${target.label}: ${s.name}${skip ? " (skipped: needs a sandbox other processes can reach; the fake lives in this process)" : ""}`,
          { timeout: 180_000 },
          () => s.run(ctx),
        );
      }
    },
  );
}
