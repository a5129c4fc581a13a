import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Pyro } from "../../src/sdk/pyro.js";
import { ENV_CACHE } from "../helpers/sandbox.js";
import { USE_CASES } from "./scenarios.js";

/**
 * The release-gate smoke pack: the five use cases for real, through `pyro mcp serve`
 * over stdio, on a backend. `npm run smoke:use-cases` runs it on PYRO_SMOKE_BACKEND
 * (`auto`, its default there: the backend pyro itself would choose); in `npm test` it
 * runs on bwrap and gvisor. One line per scenario is printed.
 */
const wanted = process.env.PYRO_SMOKE_BACKEND;
const targets: string[] = wanted ? [wanted] : ["bwrap", "gvisor"];

for (const target of targets) {
  describe(`use cases on ${target}`, () => {
    let home: string;
    let skip = "";
    let backend = target;
    beforeAll(async () => {
      home = await mkdtemp(join(tmpdir(), "pyro-smoke-"));
      const pyro = new Pyro({ home, environmentsDir: ENV_CACHE });
      try {
        const chosen = await pyro.engine.chooseBackend(
          target === "auto" ? undefined : (target as never),
          false,
        );
        backend = chosen.name;
      } catch (err) {
        skip = (err as Error).message;
      } finally {
        await pyro.close();
      }
    }, 120_000);
    afterAll(async () => {
      if (!home) return;
      // A scenario that failed half-way leaves its workspaces running: end them before
      // their home goes (a sandbox whose home was removed would run on, holding its disk).
      const pyro = new Pyro({ home, environmentsDir: ENV_CACHE });
      try {
        for (const w of (await pyro.listWorkspaces()).workspaces)
          await pyro.deleteWorkspace(w.workspace_id).catch(() => {});
      } finally {
        await pyro.close();
      }
      await rm(home, { recursive: true, force: true });
    }, 300_000);

    for (const uc of USE_CASES) {
      it(`${target}: ${uc.name}`, { timeout: 600_000 }, async (t) => {
        if (skip) {
          process.stdout.write(`SKIP ${uc.name} on ${target}: ${skip}\n`);
          t.skip(`${target} does not work here: ${skip}`);
          return;
        }
        const dir = await mkdtemp(join(tmpdir(), `pyro-smoke-${uc.name}-`));
        try {
          const started = Date.now();
          const { summary, made } = await uc.run({
            dir,
            env: { PYRO_HOME: home, PYRO_ENV_CACHE: ENV_CACHE, PYRO_BACKEND: backend },
          });
          // The recipe's calls are exactly the ones made.
          expect(made).toEqual(uc.calls);
          process.stdout.write(
            `ok   ${uc.name.padEnd(20)} ${backend.padEnd(7)} ${((Date.now() - started) / 1000).toFixed(1).padStart(5)} s  ${summary}\n`,
          );
        } finally {
          await rm(dir, { recursive: true, force: true });
        }
      });
    }
  });
}
