/**
 * File-system helpers shared by the ops: atomic writes (staged so that several files
 * can be written all-or-nothing) and a tree walk that never follows symlinks.
 */
import { randomBytes } from "node:crypto";
import type { Stats } from "node:fs";
import { chmod, lstat, lutimes, mkdir, readdir, rename, rm, writeFile } from "node:fs/promises";
import path from "node:path";

/** A file written next to its target, not yet moved into place. */
export interface StagedWrite {
  /** Moves the staged file over the target (atomic on one file system). */
  commit(): Promise<void>;
  /** Removes the staged file; safe to call after commit. */
  discard(): Promise<void>;
}

/**
 * Writes `data` to a temporary file in the target's directory. The directory must
 * already exist. `mode` defaults to 0644 (or keeps the mode of the file replaced,
 * when the caller passes it), so a rewrite does not silently drop the executable bit.
 */
export async function stageWrite(target: string, data: Uint8Array, mode = 0o644): Promise<StagedWrite> {
  const temp = path.join(
    path.dirname(target),
    `.${path.basename(target)}.pyro-${randomBytes(6).toString("hex")}.tmp`,
  );
  let committed = false;
  try {
    await writeFile(temp, data, { flag: "wx", mode });
    // writeFile's mode is filtered by the umask; set it exactly.
    await chmod(temp, mode & 0o7777);
  } catch (err) {
    await rm(temp, { force: true });
    throw err;
  }
  return {
    async commit() {
      await newerSecond(target, temp);
      await rename(temp, target);
      committed = true;
    },
    async discard() {
      if (!committed) await rm(temp, { force: true });
    },
  };
}

/**
 * A replaced file's new modification time falls in a later whole second than the old
 * one's: caches that trust (mtime in seconds, size), such as Python's .pyc files, would
 * otherwise keep a same-size edit made in the same second as the last run (a model's
 * fix that "does not work"). Bumps the staged file's mtime to the next second when needed.
 */
async function newerSecond(target: string, staged: string): Promise<void> {
  const old = await lstat(target).catch(() => null);
  if (!old?.isFile()) return;
  const fresh = await lstat(staged);
  const oldSecond = Math.floor(old.mtimeMs / 1000);
  if (Math.floor(fresh.mtimeMs / 1000) <= oldSecond)
    await lutimes(staged, fresh.atime, new Date((oldSecond + 1) * 1000));
}

/** Atomic replace of one file (temp + rename). */
export async function atomicWrite(target: string, data: Uint8Array, mode?: number): Promise<void> {
  const staged = await stageWrite(target, data, mode);
  try {
    await staged.commit();
  } finally {
    await staged.discard();
  }
}

/** Creates the parent directories of an already contained, resolved path. */
export async function ensureParent(real: string): Promise<void> {
  await mkdir(path.dirname(real), { recursive: true });
}

/** One node of a walked tree. */
export interface WalkEntry {
  /** Path relative to the walk's start, with "/" separators. */
  rel: string;
  abs: string;
  stat: Stats;
}

/**
 * Depth-first walk under `dir` (not including `dir`), using lstat so symlinks are
 * reported and never followed. Entries come out sorted by path. Stops early (returns
 * `true`) once `limit` entries have been collected.
 */
export async function walk(
  dir: string,
  out: WalkEntry[],
  recursive = true,
  limit = Infinity,
  prefix = "",
): Promise<boolean> {
  const names = (await readdir(dir)).sort();
  for (const name of names) {
    if (out.length >= limit) return true;
    const abs = path.join(dir, name);
    const rel = prefix ? `${prefix}/${name}` : name;
    let st: Stats;
    try {
      st = await lstat(abs);
    } catch (err) {
      // Removed between readdir and lstat by something running in the workspace.
      if ((err as NodeJS.ErrnoException).code === "ENOENT") continue;
      throw err;
    }
    out.push({ rel, abs, stat: st });
    if (recursive && st.isDirectory()) {
      if (await walk(abs, out, true, limit, rel)) return true;
    }
  }
  return false;
}

/** The artifact type of an lstat result, as reported in results. */
export function artifactType(st: Stats): "file" | "directory" | "symlink" | "other" {
  if (st.isFile()) return "file";
  if (st.isDirectory()) return "directory";
  if (st.isSymbolicLink()) return "symlink";
  return "other";
}
