import { readFileSync } from "node:fs";
import { readFile, realpath, rm } from "node:fs/promises";
import { resolve, sep } from "node:path";
import { run } from "./run.js";

/** Mount points at or below `root`, deepest first (from /proc/self/mountinfo). */
export async function mountsUnder(root: string): Promise<string[]> {
  // mountinfo names the canonical path: a PYRO_HOME below a symlink (/home -> /var/home)
  // would otherwise match nothing, and a removal would descend into a mounted image.
  const abs = await realpath(root).catch(() => resolve(root));
  let text: string;
  try {
    text = await readFile("/proc/self/mountinfo", "utf8");
  } catch {
    return [];
  }
  const points = mountPoints(text).filter((p) => p === abs || p.startsWith(abs + sep));
  return [...new Set(points)].sort((a, b) => b.length - a.length);
}

/** The mount point of every line of a mountinfo text, one per mount (stacked ones repeat). */
function mountPoints(mountinfo: string): string[] {
  return mountinfo
    .split("\n")
    .map((l) => l.split(" ")[4])
    .filter((p): p is string => p !== undefined)
    .map(unescapeMountPath);
}

/**
 * How many mounts are stacked at each of `paths` in the mount namespace of process
 * `pid`, from one synchronous read (procfs answers from memory; an async read is a
 * thread-pool round trip, which cost milliseconds on a busy machine in the reset).
 */
export function mountsStackedAt(pid: number, paths: readonly string[]): number[] {
  const points = mountPoints(readFileSync(`/proc/${pid}/mountinfo`, "utf8"));
  return paths.map((path) => {
    const abs = resolve(path);
    return points.filter((p) => p === abs).length;
  });
}

/**
 * Mounts a tmpfs with `options` at `path` unless one is mounted there already. Throws
 * when it cannot (the caller refuses to start: the bound is the point).
 */
export async function ensureTmpfs(path: string, options: string): Promise<void> {
  const abs = await realpath(path).catch(() => resolve(path));
  if ((await mountsUnder(abs)).includes(abs)) return;
  const r = await run(["mount", "-t", "tmpfs", "-o", options, "pyro-tmpfs", abs], { timeoutMs: 10_000 });
  if (r.exitCode !== 0)
    throw new Error(`cannot mount a tmpfs at ${abs}: ${r.stderr.trim() || `exit ${r.exitCode}`}`);
}

function unescapeMountPath(p: string): string {
  return p.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(Number.parseInt(o, 8)));
}

/**
 * Removes a tree that a sandbox or a build may have mounted things into (debootstrap
 * mounts /proc and /sys in its target; a killed build leaves them). Everything mounted
 * below is detached first, so the removal can never descend into a host filesystem.
 * Refuses to remove anything if a mount cannot be detached.
 */
export async function removeTree(path: string): Promise<void> {
  for (const mp of await mountsUnder(path)) {
    const r = await run(["umount", "-l", mp], { timeoutMs: 10_000 });
    if (r.exitCode !== 0) throw new Error(`cannot unmount ${mp} before removing ${path}: ${r.stderr.trim()}`);
  }
  await rm(path, { recursive: true, force: true, maxRetries: 3 });
}
