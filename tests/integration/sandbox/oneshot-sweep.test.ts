import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, rmSync, utimesSync, writeFileSync } from "node:fs";
import { rmdir } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { CgroupLimits, detectCgroups } from "../../../src/backends/linux/cgroups.js";
import { STALE_AFTER_MS, sweepOneShots } from "../../../src/backends/linux/oneshot-sweep.js";

/**
 * The sweep of one-shot run directories an owner killed mid-run leaves behind
 * (backends/linux/oneshot-sweep.ts), on real cgroups: what no process is left in goes,
 * with its cgroup; a live run, a young directory and anything not named like a run stay.
 */
const BASE = `pyro-sweep-${process.pid}`;
const isRoot = process.getuid?.() === 0;
const why = isRoot ? "" : "needs root (cgroups)";
const scratch = mkdtempSync(join(tmpdir(), "pyro-sweep-"));
const children: ChildProcess[] = [];
afterAll(async () => {
  for (const c of children) c.kill("SIGKILL");
  rmSync(scratch, { recursive: true, force: true });
  for (const c of ["memory", "cpu", "pids", "blkio", ""])
    await rmdir(join("/sys/fs/cgroup", c, BASE)).catch(() => {});
  await rmdir(join("/sys/fs/cgroup/unified", BASE)).catch(() => {});
});

let seq = 0;
/** A run directory `age` ms old, with a disk image stand-in. */
function runDir(age: number): string {
  const name = `run_${(process.pid * 1000 + ++seq).toString(16).padStart(12, "0")}`;
  const dir = join(scratch, name);
  mkdirSync(join(dir, "disk"), { recursive: true });
  writeFileSync(join(dir, "disk.img"), "x");
  const t = (Date.now() - age) / 1000;
  utimesSync(dir, t, t);
  return name;
}

describe.skipIf(why !== "")(`sweep of one-shot leftovers${why ? ` (skipped: ${why})` : ""}`, () => {
  it("removes an old run whose cgroup is empty, with its cgroup; keeps a live, a young and a foreign one", async () => {
    const layout = await detectCgroups({ base: BASE });
    const limits = { memoryMib: 64, pidsMax: 16 };
    const dead = runDir(STALE_AFTER_MS + 5_000);
    const deadCg = await CgroupLimits.create(layout, dead, limits);
    // runsc makes its container's group in hierarchies pyro does not limit with, too.
    const otherGroup = existsSync("/sys/fs/cgroup/blkio") ? join("/sys/fs/cgroup/blkio", BASE, dead) : null;
    if (otherGroup) mkdirSync(otherGroup, { recursive: true });
    const noCgroup = runDir(STALE_AFTER_MS + 5_000);
    const live = runDir(STALE_AFTER_MS + 5_000);
    const liveCg = await CgroupLimits.create(layout, live, limits);
    const sleeper = spawn("/bin/sh", ["-c", "read -r _ && exec sleep 100"], {
      stdio: ["pipe", "ignore", "ignore"],
    });
    children.push(sleeper);
    await liveCg.addProcess(sleeper.pid!);
    sleeper.stdin!.end("go\n");
    const young = runDir(1_000);
    const youngCg = await CgroupLimits.create(layout, young, limits);
    const foreign = "run_notarun";
    mkdirSync(join(scratch, foreign));
    utimesSync(join(scratch, foreign), 1, 1);

    const removed = await sweepOneShots(scratch, layout);

    expect(removed.sort()).toEqual([dead, noCgroup].sort());
    expect(existsSync(join(scratch, dead))).toBe(false);
    expect(existsSync(join(scratch, noCgroup))).toBe(false);
    expect(await CgroupLimits.attach(layout, dead)).toBeNull();
    if (otherGroup) expect(existsSync(otherGroup)).toBe(false);
    for (const kept of [live, young, foreign]) expect(existsSync(join(scratch, kept)), kept).toBe(true);
    expect((await liveCg.pids()).length).toBe(1);
    expect(await CgroupLimits.attach(layout, young)).not.toBeNull();
    await liveCg.destroy();
    await youngCg.destroy();
    await deadCg.destroy(); // idempotent: already gone
  });

  it("a missing scratch directory is nothing to sweep", async () => {
    const layout = await detectCgroups({ base: BASE });
    expect(await sweepOneShots(join(scratch, "nope"), layout)).toEqual([]);
  });
});
