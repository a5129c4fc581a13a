import { randomBytes } from "node:crypto";
import { type Dirent, lstatSync, mkdirSync, readdirSync, statSync } from "node:fs";
import { lstat, mkdir, open, readdir, rename, rm, stat, utimes } from "node:fs/promises";
import { basename, dirname, join, resolve } from "node:path";

/**
 * Writes a file atomically: a temp file in the same directory, fsync, rename.
 * A reader sees the old content or the new one, never a torn write.
 */
export async function atomicWriteFile(path: string, data: string | Buffer, mode = 0o644): Promise<void> {
  const tmp = join(dirname(path), `.${basename(path)}.${process.pid}.${randomBytes(4).toString("hex")}.tmp`);
  const fh = await open(tmp, "w", mode);
  try {
    await fh.writeFile(data);
    await fh.sync();
  } finally {
    await fh.close();
  }
  try {
    await rename(tmp, path);
  } catch (err) {
    await rm(tmp, { force: true });
    throw err;
  }
  await fsyncDir(dirname(path));
}

/** fsync a directory so a rename inside it is durable. */
export async function fsyncDir(dir: string): Promise<void> {
  const fh = await open(dir, "r");
  try {
    await fh.sync();
  } catch {
    // some filesystems refuse fsync on directories; the rename is still atomic
  } finally {
    await fh.close();
  }
}

/**
 * Apparent size of a tree, not following symlinks: bytes of regular files, entries that
 * are not directories (`files`), and directories below the root (`dirs`).
 */
export async function treeSize(root: string): Promise<{ bytes: number; files: number; dirs: number }> {
  let bytes = 0;
  let files = 0;
  let dirs = 0;
  const stack = [root];
  while (stack.length > 0) {
    const dir = stack.pop()!;
    let entries: import("node:fs").Dirent[];
    try {
      entries = await readdir(dir, { withFileTypes: true });
    } catch {
      continue;
    }
    for (const e of entries) {
      const p = join(dir, e.name);
      if (e.isDirectory()) {
        dirs++;
        stack.push(p);
        continue;
      }
      files++;
      try {
        const st = await lstat(p);
        if (st.isFile()) bytes += st.size;
      } catch {
        // vanished while walking
      }
    }
  }
  return { bytes, files, dirs };
}

/**
 * `treeSize` without a thread-pool round trip per file: for a tree the caller has just
 * written and nothing else touches (a pulled image's root), where one `lstat` each in
 * sequence costs a few milliseconds in all and the asynchronous walk took seconds on a
 * busy machine.
 */
export function treeSizeSync(root: string): { bytes: number; files: number; dirs: number } {
  let bytes = 0;
  let files = 0;
  let dirs = 0;
  const stack = [root];
  while (stack.length > 0) {
    const dir = stack.pop() as string;
    let entries: Dirent[];
    try {
      entries = readdirSync(dir, { withFileTypes: true });
    } catch {
      continue;
    }
    for (const e of entries) {
      const p = join(dir, e.name);
      if (e.isDirectory()) {
        dirs++;
        stack.push(p);
        continue;
      }
      files++;
      if (e.isFile()) bytes += lstatSync(p, { throwIfNoEntry: false })?.size ?? 0;
    }
  }
  return { bytes, files, dirs };
}

export function formatBytes(n: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${i === 0 ? v : v.toFixed(1)} ${units[i]}`;
}

/** True when a process with this pid exists (signal 0 probe). */
export function pidAlive(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** True when `path` exists (follows symlinks; anything stat can see). */
export async function exists(path: string): Promise<boolean> {
  return stat(path).then(
    () => true,
    () => false,
  );
}

/** Sets a file's times to now (marks it as used); false when it does not exist. */
export async function touch(path: string): Promise<boolean> {
  const now = new Date();
  return utimes(path, now, now).then(
    () => true,
    () => false,
  );
}

/**
 * `mkdir -p` that always ends. Node's `mkdir(path, {recursive: true})` (sync, callback and
 * promise forms alike) loops forever at 100% CPU when a parent cannot be created and
 * mkdir answers ENOENT for it (`/proc/nope/x`): every path a user names goes through
 * this instead. It finds the deepest existing ancestor, then creates each missing
 * component once; an error is the error of the component that failed.
 */
export async function makeDirs(path: string, mode = 0o777): Promise<void> {
  const chain: string[] = [];
  for (let p = resolve(path); ; p = dirname(p)) {
    const s = await lstat(p).catch(absent);
    if (s) {
      if (!s.isDirectory() && !(await stat(p)).isDirectory()) throw notDir(p);
      break;
    }
    chain.unshift(p);
    if (dirname(p) === p) break;
  }
  for (const dir of chain) await mkdir(dir, { mode }).catch((err) => existingDir(err, dir));
}

export function makeDirsSync(path: string, mode = 0o777): void {
  const chain: string[] = [];
  for (let p = resolve(path); ; p = dirname(p)) {
    let s: import("node:fs").Stats | null;
    try {
      s = lstatSync(p);
    } catch (err) {
      s = absent(err);
    }
    if (s) {
      if (!s.isDirectory() && !statSync(p).isDirectory()) throw notDir(p);
      break;
    }
    chain.unshift(p);
    if (dirname(p) === p) break;
  }
  for (const dir of chain) {
    try {
      mkdirSync(dir, { mode });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST" || !statSync(dir).isDirectory()) throw err;
    }
  }
}

function absent(err: unknown): null {
  if ((err as NodeJS.ErrnoException).code === "ENOENT") return null;
  throw err;
}

async function existingDir(err: unknown, dir: string): Promise<void> {
  if ((err as NodeJS.ErrnoException).code !== "EEXIST" || !(await stat(dir)).isDirectory()) throw err;
}

function notDir(p: string): NodeJS.ErrnoException {
  return Object.assign(new Error(`ENOTDIR: not a directory, mkdir '${p}'`), { code: "ENOTDIR", path: p });
}
