import { type ChildProcess, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { expect } from "vitest";
import { CgroupLimits, detectCgroups } from "../../src/backends/linux/cgroups.js";
import { STALE_AFTER_MS, sweepOneShots } from "../../src/backends/linux/oneshot-sweep.js";
import { REPO_ROOT } from "./cli.js";
import { exited, waitUntil } from "./sandbox.js";

/**
 * An SDK script run as a process of its own: an owner a test can SIGKILL mid-run (pool,
 * one-shot and standby tests). `lines` follow an import of the built SDK's `Pyro`.
 */
export interface Owner {
  child: ChildProcess;
  /** What it printed so far (stdout and stderr). */
  output(): string;
  /** Waits until it printed `text` (false if it exited or `timeoutMs` passed first). */
  printed(text: string, timeoutMs: number): Promise<boolean>;
  /** SIGKILL, then its exit. */
  kill(): Promise<void>;
}

export function startOwner(lines: readonly string[]): Owner {
  const script = [
    `import { Pyro } from ${JSON.stringify(join(REPO_ROOT, "dist", "sdk", "pyro.js"))};`,
    ...lines,
  ];
  const child = spawn(process.execPath, ["--input-type=module", "-e", script.join("\n")], { stdio: "pipe" });
  let out = "";
  const collect = (d: Buffer) => {
    out += d.toString();
  };
  child.stdout!.on("data", collect);
  child.stderr!.on("data", collect);
  return {
    child,
    output: () => out,
    printed: async (text, timeoutMs) => {
      await waitUntil(() => out.includes(text) || child.exitCode !== null, timeoutMs);
      return out.includes(text);
    },
    kill: async () => {
      child.kill("SIGKILL");
      await exited(child);
    },
  };
}

/**
 * What a one-shot `run` under `scratch` left once no process of it is left: its cgroup
 * empties, a sweep keeps the directory while it is young, and one run as if it were stale
 * removes the directory and its cgroups (backends/linux/oneshot-sweep.ts).
 */
export async function expectSweptOnceStale(scratch: string, run: string): Promise<void> {
  const layout = await detectCgroups();
  const cg = await CgroupLimits.attach(layout, run);
  const emptied = await waitUntil(async () => cg === null || (await cg.pids()).length === 0, 10_000);
  expect(emptied, `left in the run's cgroup: ${await cg?.pids()}`).toBe(true);
  expect(await sweepOneShots(scratch, layout)).toEqual([]);
  expect(existsSync(join(scratch, run))).toBe(true);
  expect(await sweepOneShots(scratch, layout, Date.now() + STALE_AFTER_MS + 1_000)).toEqual([run]);
  expect(existsSync(join(scratch, run))).toBe(false);
  expect(await CgroupLimits.attach(layout, run)).toBeNull();
}
