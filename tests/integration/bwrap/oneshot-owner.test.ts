import { spawn } from "node:child_process";
import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CgroupLimits, detectCgroups } from "../../../src/backends/linux/cgroups.js";
import { STALE_AFTER_MS, sweepOneShots } from "../../../src/backends/linux/oneshot-sweep.js";
import { REPO_ROOT } from "../../helpers/cli.js";
import {
  bwrapSkipReason,
  exited,
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
    const script = [
      `import { Pyro } from ${JSON.stringify(join(REPO_ROOT, "dist", "sdk", "pyro.js"))};`,
      `const pyro = new Pyro({ home: ${JSON.stringify(home)}, environmentsDir: ${JSON.stringify(env)}, pool: 0 });`,
      `await pyro.run('debian:12', 'echo started; exec sleep ${marker}', { backend: 'bwrap', timeoutSeconds: 600, onOutput: () => console.log('running') });`,
    ].join("\n");
    const child = spawn(process.execPath, ["--input-type=module", "-e", script], { stdio: "pipe" });
    let out = "";
    child.stdout.on("data", (d: Buffer) => {
      out += d.toString();
    });
    child.stderr.on("data", (d: Buffer) => {
      out += d.toString();
    });
    await waitUntil(() => out.includes("running") || child.exitCode !== null, 60_000);
    expect(out).toContain("running");
    const sleeper = () => hostProcesses((argv) => argv.includes(marker) && argv[0] === "sleep");
    expect(await waitUntil(() => sleeper().length === 1, 10_000)).toBe(true);
    const [run] = readdirSync(join(home, "oneshot")).filter((n) => n.startsWith("run_"));
    expect(run).toBeDefined();
    child.kill("SIGKILL");
    await exited(child);
    // bwrap dies with its parent (the owner), and its pid namespace with it.
    expect(await waitUntil(() => sleeper().length === 0, 10_000)).toBe(true);
    const layout = await detectCgroups();
    const cg = await CgroupLimits.attach(layout, run!);
    const emptied = await waitUntil(async () => cg === null || (await cg.pids()).length === 0, 10_000);
    expect(emptied, `left in the run's cgroup: ${await cg?.pids()}`).toBe(true);
    // Left on disk until a later run sweeps: not while it is young, then all of it.
    expect(await sweepOneShots(join(home, "oneshot"), layout)).toEqual([]);
    expect(existsSync(join(home, "oneshot", run!))).toBe(true);
    expect(await sweepOneShots(join(home, "oneshot"), layout, Date.now() + STALE_AFTER_MS + 1_000)).toEqual([
      run,
    ]);
    expect(existsSync(join(home, "oneshot", run!))).toBe(false);
    expect(await CgroupLimits.attach(layout, run!)).toBeNull();
  });
});
