import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { rmdir } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { CgroupLimits, detectCgroups } from "../../../src/backends/linux/cgroups.js";
import { BASH_TOOLS } from "../../../src/backends/linux/launch.js";
import { cleanUpDetached } from "../../../src/backends/linux/oneshot-cleaner.js";
import { STALE_AFTER_MS, sweepOneShots } from "../../../src/backends/linux/oneshot-sweep.js";

/**
 * The detached cleaner of a CLI's one-shot (backends/linux/oneshot-cleaner.ts), on real
 * cgroups: the run's processes are killed before it returns, the cgroups and the directory
 * are gone soon after; it refuses a directory with a mount below it; and a cleaner that
 * dies before it did anything leaves what any later run's sweep removes.
 */
const BASE = `pyro-cleaner-${process.pid}`;
const isRoot = process.getuid?.() === 0;
const why = isRoot ? "" : "needs root (cgroups, mounts)";
const scratch = mkdtempSync(join(tmpdir(), "pyro-cleaner-"));
const children: ChildProcess[] = [];
afterAll(async () => {
  for (const c of children) c.kill("SIGKILL");
  rmSync(scratch, { recursive: true, force: true });
  for (const c of ["memory", "cpu", "pids", ""]) await rmdir(join("/sys/fs/cgroup", c, BASE)).catch(() => {});
  await rmdir(join("/sys/fs/cgroup/unified", BASE)).catch(() => {});
});

let seq = 0;
/** A run directory as a cold one-shot leaves it (a disk image, its mount points), with a live process in its cgroup. */
async function leftRun(): Promise<{ name: string; dir: string; cg: CgroupLimits; sleeper: ChildProcess }> {
  const name = `run_${(process.pid * 1000 + ++seq).toString(16).padStart(12, "0")}`;
  const dir = join(scratch, name);
  mkdirSync(join(dir, "disk"), { recursive: true });
  mkdirSync(join(dir, "merged"));
  writeFileSync(join(dir, "disk.img"), "x".repeat(4096));
  const cg = await CgroupLimits.create(await detectCgroups({ base: BASE }), name, {
    memoryMib: 64,
    pidsMax: 16,
  });
  const sleeper = spawn("/bin/sh", ["-c", "read -r _ && exec sleep 100"], {
    stdio: ["pipe", "ignore", "ignore"],
  });
  children.push(sleeper);
  await cg.addProcess(sleeper.pid!);
  sleeper.stdin!.end("go\n");
  await new Promise((r) => setTimeout(r, 50));
  return { name, dir, cg, sleeper };
}

/** Whether a process is dead or has SIGKILL pending (it can never run again), read at once. */
function killed(pid: number): boolean {
  let status: string;
  try {
    status = readFileSync(`/proc/${pid}/status`, "utf8");
  } catch {
    return true;
  }
  const state = /^State:\s+(\S)/m.exec(status)?.[1];
  const pending = ["SigPnd", "ShdPnd"].some(
    (k) => (BigInt(`0x${new RegExp(`^${k}:\\s+(\\S+)`, "m").exec(status)?.[1] ?? "0"}`) & 0x100n) !== 0n,
  );
  return state === "Z" || state === "X" || pending;
}

async function until(check: () => boolean | Promise<boolean>, ms = 5_000): Promise<boolean> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await check()) return true;
    await new Promise((r) => setTimeout(r, 20));
  }
  return check();
}

describe.skipIf(why !== "")(`detached one-shot cleaner${why ? ` (skipped: ${why})` : ""}`, () => {
  it("kills the run's processes before it returns, then removes its cgroups and directory", async () => {
    const { name, dir, cg, sleeper } = await leftRun();
    const handedOff = cleanUpDetached({ dir, cgroupDirs: [...cg.dirs.values()], shell: BASH_TOOLS.shell });
    // Read synchronously: the detached shell cannot have started killing yet.
    const dead = killed(sleeper.pid!);
    expect(handedOff).toBe(true);
    expect(dead).toBe(true);
    expect(await until(() => !existsSync(dir))).toBe(true);
    const layout = await detectCgroups({ base: BASE });
    expect(await until(async () => (await CgroupLimits.attach(layout, name)) === null)).toBe(true);
  });

  it("copies the next spare disk image after the removal when none is there, and none when one is", async () => {
    const template = join(scratch, "ext4-1m.img");
    writeFileSync(template, Buffer.concat([Buffer.alloc(8192, 7), Buffer.from("end")]));
    const spares = join(scratch, "spare");
    const refill = { template, dir: spares, prefix: "ext4-1m." };
    for (const shell of [BASH_TOOLS.shell, ["/bin/busybox", "sh"]]) {
      rmSync(spares, { recursive: true, force: true });
      const { dir, cg } = await leftRun();
      expect(cleanUpDetached({ dir, cgroupDirs: [...cg.dirs.values()], shell, refill })).toBe(true);
      expect(
        await until(() => existsSync(spares) && readdirSync(spares).some((n) => n.endsWith(".img"))),
      ).toBe(true);
      const [name, ...rest] = readdirSync(spares);
      // Named as refillSpare names its copies, whole (no partial left), and the template's bytes.
      expect(rest).toEqual([]);
      expect(name).toMatch(/^ext4-1m\.\d+\.0\.img$/);
      expect(readFileSync(join(spares, name!)).equals(readFileSync(template))).toBe(true);
      expect(statSync(spares).mode & 0o777).toBe(0o700);
      expect(existsSync(dir)).toBe(false);
      // One spare there: the next cleaner copies none.
      const next = await leftRun();
      expect(cleanUpDetached({ dir: next.dir, cgroupDirs: [...next.cg.dirs.values()], shell, refill })).toBe(
        true,
      );
      expect(await until(() => !existsSync(next.dir))).toBe(true);
      await new Promise((r) => setTimeout(r, 200));
      expect(readdirSync(spares)).toEqual([name]);
    }
  });

  it("refuses a directory with a mount below it (rm -rf would descend into it)", async () => {
    const { dir, cg } = await leftRun();
    const mp = join(dir, "merged");
    expect(spawnSync("mount", ["-t", "tmpfs", "pyro-test", mp]).status).toBe(0);
    try {
      writeFileSync(join(mp, "kept"), "x");
      expect(cleanUpDetached({ dir, cgroupDirs: [...cg.dirs.values()], shell: BASH_TOOLS.shell })).toBe(
        false,
      );
      await new Promise((r) => setTimeout(r, 200));
      expect(existsSync(join(mp, "kept"))).toBe(true);
    } finally {
      spawnSync("umount", [mp]);
    }
    await cg.destroy();
  });

  it("what a cleaner that died at once leaves is removed by a later run's sweep", async () => {
    const { name, dir, cg } = await leftRun();
    // A "shell" that exits without running the script: a cleaner killed before it began.
    expect(cleanUpDetached({ dir, cgroupDirs: [...cg.dirs.values()], shell: ["/bin/true"] })).toBe(true);
    await new Promise((r) => setTimeout(r, 200));
    expect(existsSync(dir)).toBe(true);
    const layout = await detectCgroups({ base: BASE });
    // The sweep takes directories STALE_AFTER_MS old: asked as if that much time had passed.
    expect(await sweepOneShots(scratch, layout, Date.now() + STALE_AFTER_MS + 1_000)).toContain(name);
    expect(existsSync(dir)).toBe(false);
    expect(await CgroupLimits.attach(layout, name)).toBeNull();
  });
});
