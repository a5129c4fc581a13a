import { spawn } from "node:child_process";
import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CgroupLimits, detectCgroups } from "../../../src/backends/linux/cgroups.js";
import { STALE_AFTER_MS, sweepOneShots } from "../../../src/backends/linux/oneshot-sweep.js";
import { REPO_ROOT } from "../../helpers/cli.js";
import {
  exited,
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
    const script = [
      `import { Pyro } from ${JSON.stringify(join(REPO_ROOT, "dist", "sdk", "pyro.js"))};`,
      `const pyro = new Pyro({ home: ${JSON.stringify(home)}, environmentsDir: ${JSON.stringify(env)}, pool: 0 });`,
      "await pyro.run('debian:12', 'echo started; exec sleep 300', { backend: 'gvisor', timeoutSeconds: 600, onOutput: () => console.log('running') });",
    ].join("\n");
    const child = spawn(process.execPath, ["--input-type=module", "-e", script], { stdio: "pipe" });
    let out = "";
    child.stdout.on("data", (d: Buffer) => {
      out += d.toString();
    });
    child.stderr.on("data", (d: Buffer) => {
      out += d.toString();
    });
    await waitUntil(() => out.includes("running") || child.exitCode !== null, 90_000);
    expect(out).toContain("running");
    const scratch = join(home, "oneshot");
    const [run] = readdirSync(scratch).filter((n) => n.startsWith("run_"));
    expect(run).toBeDefined();
    // The command runs inside the sentry: what the host sees of the run is runsc's processes.
    const runsc = () => hostProcesses((argv) => argv.some((a) => a.includes(join(scratch, run!))));
    expect(runsc().length).toBeGreaterThanOrEqual(2);
    child.kill("SIGKILL");
    await exited(child);
    expect(await waitUntil(() => runsc().length === 0, 15_000)).toBe(true);
    const layout = await detectCgroups();
    const cg = await CgroupLimits.attach(layout, run!);
    expect(await waitUntil(async () => cg === null || (await cg.pids()).length === 0, 10_000)).toBe(true);
    expect(await sweepOneShots(scratch, layout)).toEqual([]);
    expect(await sweepOneShots(scratch, layout, Date.now() + STALE_AFTER_MS + 1_000)).toEqual([run]);
    expect(existsSync(join(scratch, run!))).toBe(false);
    expect(await CgroupLimits.attach(layout, run!)).toBeNull();
  });
});
