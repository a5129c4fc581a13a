import { readdirSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { expectSweptOnceStale, startOwner } from "../../helpers/owner.js";
import {
  gvisorSkipReason,
  type Harness,
  hostProcesses,
  openHarness,
  suiteTitle,
  waitUntil,
} from "../../helpers/sandbox.js";

/**
 * A gVisor one-shot whose owner is killed mid-run (red-team review, as for bwrap): runsc
 * dies with the owner (and its sandbox and gofer with runsc), and a later sweep removes
 * the run's directory and cgroups.
 */
const skip = gvisorSkipReason();

describe.skipIf(skip !== "")(suiteTitle("a gVisor one-shot whose owner is killed", skip), () => {
  let h: Harness;
  beforeAll(async () => {
    h = await openHarness("gvisor-oneshot-owner");
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("ends runsc, its sandbox and gofer with the owner; a later sweep removes what is left", async () => {
    const home = await h.tempDir("gvisor-cold-owner");
    const env = String(h.cliEnv.PYRO_ENV_CACHE);
    const owner = startOwner([
      `const pyro = new Pyro({ home: ${JSON.stringify(home)}, environmentsDir: ${JSON.stringify(env)}, pool: 0 });`,
      "await pyro.run('debian:12', 'echo started; exec sleep 300', { backend: 'gvisor', timeoutSeconds: 600, onOutput: () => console.log('running') });",
    ]);
    expect(await owner.printed("running", 90_000), owner.output()).toBe(true);
    const scratch = join(home, "oneshot");
    const [run] = readdirSync(scratch).filter((n) => n.startsWith("run_"));
    expect(run).toBeDefined();
    // The command runs inside the sentry: what the host sees of the run is runsc's processes.
    const runsc = () => hostProcesses((argv) => argv.some((a) => a.includes(join(scratch, run!))));
    expect(runsc().length).toBeGreaterThanOrEqual(2);
    await owner.kill();
    expect(await waitUntil(() => runsc().length === 0, 15_000)).toBe(true);
    await expectSweptOnceStale(scratch, run!);
  });
});
