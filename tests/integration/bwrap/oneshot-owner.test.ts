import { readdirSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { expectSweptOnceStale, startOwner } from "../../helpers/owner.js";
import {
  bwrapSkipReason,
  type Harness,
  hostProcesses,
  openHarness,
  suiteTitle,
  waitUntil,
} from "../../helpers/sandbox.js";

/**
 * A cold one-shot whose owner is killed mid-run (red-team review): its command must not
 * outlive the owner (whose timer can no longer end it), and what it leaves on disk (its
 * run directory with the disk image, its cgroups) is swept by a later run.
 */
const skip = bwrapSkipReason();

describe.skipIf(skip !== "")(suiteTitle("a cold one-shot whose owner is killed", skip), () => {
  let h: Harness;
  beforeAll(async () => {
    h = await openHarness("oneshot-owner");
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("ends the command with its owner, and a later sweep removes the directory and cgroups", async () => {
    const home = await h.tempDir("cold-owner");
    const env = String(h.cliEnv.PYRO_ENV_CACHE);
    // GNU sleep takes fractions: a duration no other process of this host runs with.
    const marker = `299.${process.pid}${Date.now() % 1000}`;
    const owner = startOwner([
      `const pyro = new Pyro({ home: ${JSON.stringify(home)}, environmentsDir: ${JSON.stringify(env)}, pool: 0 });`,
      `await pyro.run('debian:12', 'echo started; exec sleep ${marker}', { backend: 'bwrap', timeoutSeconds: 600, onOutput: () => console.log('running') });`,
    ]);
    expect(await owner.printed("running", 60_000), owner.output()).toBe(true);
    const sleeper = () => hostProcesses((argv) => argv.includes(marker) && argv[0] === "sleep");
    expect(await waitUntil(() => sleeper().length === 1, 10_000)).toBe(true);
    const scratch = join(home, "oneshot");
    const [run] = readdirSync(scratch).filter((n) => n.startsWith("run_"));
    expect(run).toBeDefined();
    await owner.kill();
    // bwrap dies with its parent (the owner), and its pid namespace with it.
    expect(await waitUntil(() => sleeper().length === 0, 10_000)).toBe(true);
    await expectSweptOnceStale(scratch, run!);
  });
});
