/**
 * Applies image layers (tar streams) onto a root filesystem directory, the way an OCI
 * runtime's snapshotter does, but on the host as root, so every write is checked:
 *
 * - Entry names that are absolute or climb with `..` refuse the whole layer (a
 *   well-formed layer never has them; Docker strips them, pyro refuses).
 * - Parent directories are resolved inside the root: a symlink met on the way (a lower
 *   layer's `/lib -> usr/lib`) is followed as if the root were `/` (an absolute target
 *   restarts at the root, `..` at the root stays there), like a chroot would. Nothing
 *   is ever written outside the root.
 * - The last component is never followed: an existing entry is replaced (unlinked), so a
 *   symlink planted by a lower layer cannot redirect a write.
 * - Whiteouts: `.wh.NAME` deletes NAME from lower layers; `.wh..wh..opq` empties its
 *   directory of everything lower layers put there (this layer's own entries stay).
 * - Hard links must name an existing non-directory inside the root (same rules).
 * - Character/block devices and FIFOs are skipped (counted): sandboxes get their own
 *   /dev. Extended attributes (file capabilities) are not applied.
 *
 * Operations are synchronous per entry, in archive order, inside node-tar's parser
 * callbacks: the parser is the only reader, so what is checked is what is written.
 */
import {
  chmodSync,
  chownSync,
  closeSync,
  constants,
  fchmodSync,
  fchownSync,
  futimesSync,
  lchownSync,
  linkSync,
  lstatSync,
  lutimesSync,
  mkdirSync,
  openSync,
  readdirSync,
  readlinkSync,
  rmSync,
  symlinkSync,
  unlinkSync,
  writeSync,
} from "node:fs";
import path from "node:path";
import type { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import * as tar from "tar";
import { PyroError } from "../../errors.js";
import { LayerRefused } from "./unpack-budget.js";

const posix = path.posix;
const WHITEOUT = ".wh.";
const OPAQUE = ".wh..wh..opq";
const MAX_SYMLINK_HOPS = 40;
const CREATE = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW;

export interface ApplyStats {
  entries: number;
  files: number;
  bytes: number;
  whiteouts: number;
  skipped: number;
  /** Entries that replaced or removed something already in the root (whiteouts included). */
  removed: number;
  /**
   * What this layer added, as util/fs.ts treeSizeSync counts a tree (regular files'
   * sizes, hard links each time; non-directories; directories): exact for the whole root
   * while no layer applied so far has `removed` anything.
   */
  added: { bytes: number; files: number; dirs: number };
}

/** Refusal of a layer past LayerLimits. */
function tooBig(layer: string, why: string): PyroError {
  return new LayerRefused(
    `refused layer ${layer}: ${why}`,
    "the layer is larger than pyro unpacks (a decompression bomb, or a broken image); nothing was kept",
  );
}

/** Refusal of a layer whose names try to leave the root. */
function unsafe(layer: string, why: string): PyroError {
  return new LayerRefused(
    `refused layer ${layer}: ${why}`,
    "the image has a layer that tries to write outside its root filesystem; nothing was kept",
  );
}

/** The entry name as a list of components, or a refusal. */
export function entryComponents(raw: string, layer: string): string[] {
  if (raw.includes("\0")) throw unsafe(layer, "an entry name with a NUL byte");
  if (posix.isAbsolute(raw)) throw unsafe(layer, `absolute entry name '${raw}'`);
  const parts = raw.split("/").filter((p) => p !== "" && p !== ".");
  if (parts.includes("..")) throw unsafe(layer, `entry '${raw}' climbs out with '..'`);
  return parts;
}

/**
 * The host path of `parts` inside `root`, following symlinks in every component but the
 * last as if `root` were `/`. Components past a missing one are taken literally.
 */
export function resolveInRoot(
  root: string,
  parts: readonly string[],
  /** Set when a `..` climbed back over a missing component: creating it later (a symlink) changes the answer. */
  seen?: { unstable: boolean },
): string {
  const todo = [...parts];
  const last = todo.pop();
  if (last === undefined) return root;
  const cur: string[] = [];
  let hops = 0;
  let missing = false;
  while (todo.length > 0) {
    const c = todo.shift() as string;
    if (c === "" || c === ".") continue;
    if (c === "..") {
      if (missing && seen) seen.unstable = true;
      cur.pop();
      continue;
    }
    const here = path.join(root, ...cur, c);
    let st: ReturnType<typeof lstatSync> | undefined;
    try {
      st = lstatSync(here);
    } catch {
      st = undefined;
    }
    if (st?.isSymbolicLink()) {
      if (++hops > MAX_SYMLINK_HOPS)
        throw new PyroError("build_failed", `too many symlinks under ${parts.join("/")}`);
      const target = readlinkSync(here);
      if (target.startsWith("/")) cur.length = 0;
      todo.unshift(...target.split("/"));
      continue;
    }
    if (!st) missing = true;
    cur.push(c);
  }
  return path.join(root, ...cur, last);
}

/** Makes the directories of `dir` (inside root, resolved) exist; counts what it made and replaced. */
function ensureDir(root: string, parts: readonly string[], stats: ApplyStats): void {
  for (let i = 1; i <= parts.length; i++) {
    const p = resolveInRoot(root, parts.slice(0, i));
    let st: ReturnType<typeof lstatSync> | undefined;
    try {
      st = lstatSync(p);
    } catch {
      mkdirSync(p, 0o755);
      stats.added.dirs++;
      continue;
    }
    if (st.isSymbolicLink()) {
      // resolveInRoot never follows the last part: follow this one as a parent would.
      const again = resolveInRoot(root, [...parts.slice(0, i), "."]);
      if (!lstatSyncSafe(again)?.isDirectory()) {
        mkdirSync(again, { recursive: false });
        stats.added.dirs++;
      }
    } else if (!st.isDirectory()) {
      stats.removed++;
      unlinkSync(p);
      mkdirSync(p, 0o755);
    }
  }
}

function lstatSyncSafe(p: string): ReturnType<typeof lstatSync> | undefined {
  try {
    return lstatSync(p);
  } catch {
    return undefined;
  }
}

/** Removes whatever is at `p` (never following it). */
function removeAt(p: string): void {
  const st = lstatSyncSafe(p);
  if (!st) return;
  if (st.isDirectory()) rmSync(p, { recursive: true, force: true });
  else unlinkSync(p);
}

/** A resolved parent directory: its host path, and whether it is setgid (new entries take its group). */
interface Parent {
  host: string;
  setgid: boolean;
}

/** Bounds of one layer's unpacked contents (a registry is hostile: a small gzip can expand without end). */
export interface LayerLimits {
  bytes: number;
  entries: number;
  /**
   * Asked before each entry and each chunk of contents is written, with the layer's
   * totals including it; throws to refuse the layer (unpack-budget.ts: ratio, free space).
   */
  check?: (bytes: number, entries: number) => void;
}

/** 64 GiB of file contents and 4 million entries per layer: far past real images, short of a full disk. */
export const LAYER_LIMITS: LayerLimits = { bytes: 64 * 1024 ** 3, entries: 4_000_000 };

/**
 * Applies one uncompressed layer tar from `input` onto `root`. `label` names the layer in
 * errors. Throws (leaving a partial tree for the caller to discard) on any refusal.
 */
export async function applyLayer(
  root: string,
  input: Readable,
  label: string,
  onBytes?: (n: number) => void,
  limits: LayerLimits = LAYER_LIMITS,
): Promise<ApplyStats> {
  const stats: ApplyStats = {
    entries: 0,
    files: 0,
    bytes: 0,
    whiteouts: 0,
    skipped: 0,
    removed: 0,
    added: { bytes: 0, files: 0, dirs: 0 },
  };
  const asRoot = process.getuid?.() === 0;
  // Read once (the call sets it back): what `open` and `mkdir` take off a mode.
  const umask = process.umask();
  /** Paths this layer wrote: an opaque marker keeps them. */
  const mine = new Set<string>();
  /**
   * Parent directories already made and resolved in this layer, by entry path: most
   * entries share their parent with the one before. Cleared whenever something that
   * could change a resolution goes away or becomes a symlink.
   */
  const dirs = new Map<string, Parent>();
  /**
   * The parent one level below one already resolved, when it is missing (made here) or a
   * directory: one lstat instead of resolving every component again. Anything else (a
   * symlink to follow, a file to replace) takes ensureDir's way.
   */
  const below = (parentParts: string[], key: string): Parent | undefined => {
    const up = parentParts.length > 0 ? dirs.get(parentParts.slice(0, -1).join("/")) : undefined;
    if (up === undefined) return undefined;
    const host = path.join(up.host, parentParts[parentParts.length - 1] as string);
    let st = lstatSyncSafe(host);
    if (st === undefined) {
      mkdirSync(host, 0o755);
      stats.added.dirs++;
      st = lstatSync(host);
    } else if (!st.isDirectory()) return undefined;
    const parent = { host, setgid: (Number(st.mode) & 0o2000) !== 0 };
    dirs.set(key, parent);
    return parent;
  };
  const parentOf = (parentParts: string[]): Parent => {
    const key = parentParts.join("/");
    let parent = dirs.get(key) ?? below(parentParts, key);
    if (parent === undefined) {
      ensureDir(root, parentParts, stats);
      const seen = { unstable: false };
      const host = resolveInRoot(root, [...parentParts, "."], seen);
      parent = { host, setgid: (Number(lstatSyncSafe(host)?.mode ?? 0) & 0o2000) !== 0 };
      // Not kept when it depends on something missing: a later symlink there would move it.
      if (!seen.unstable) dirs.set(key, parent);
    }
    return parent;
  };
  const remove = (p: string) => {
    const st = lstatSyncSafe(p);
    if (!st) return;
    stats.removed++;
    if (st.isDirectory() || st.isSymbolicLink()) dirs.clear();
    removeAt(p);
  };
  /** Directories to date once the layer is written, by entry path (resolved again then). */
  const dirTimes: { parts: string[]; mtime: Date }[] = [];
  let failure: unknown = null;
  /** Keeps the first problem and stops reading: a bomb is not decompressed to its end for nothing. */
  const fail = (err: unknown) => {
    failure ??= err;
    input.destroy();
  };
  const parser = new tar.Parser({
    strict: true,
    onReadEntry: (entry) => {
      if (failure) {
        entry.resume();
        return;
      }
      try {
        handle(entry);
      } catch (err) {
        fail(err);
        entry.resume();
      }
    },
  });

  const owner = (p: string, e: tar.ReadEntry, link: boolean) => {
    if (!asRoot || e.uid === undefined || e.gid === undefined) return;
    if (link) lchownSync(p, e.uid, e.gid);
    else chownSync(p, e.uid, e.gid);
  };

  const handle = (e: tar.ReadEntry) => {
    if (++stats.entries > limits.entries) throw tooBig(label, `it holds more than ${limits.entries} entries`);
    limits.check?.(stats.bytes, stats.entries);
    const parts = entryComponents(e.path, label);
    if (parts.length === 0) {
      e.resume();
      return;
    }
    const base = parts[parts.length - 1] as string;
    const parentParts = parts.slice(0, -1);
    if (base === OPAQUE) {
      stats.whiteouts++;
      const dir = parentOf(parentParts).host;
      for (const child of readdirSync(dir)) {
        const p = path.join(dir, child);
        if (!mine.has(p)) remove(p);
      }
      e.resume();
      return;
    }
    if (base.startsWith(WHITEOUT)) {
      stats.whiteouts++;
      const name = base.slice(WHITEOUT.length);
      if (name === "" || name === "." || name === "..") throw unsafe(label, `bad whiteout '${e.path}'`);
      remove(path.join(parentOf(parentParts).host, name));
      e.resume();
      return;
    }
    const parent = parentOf(parentParts);
    const target = path.join(parent.host, base);
    if (!target.startsWith(root + path.sep))
      throw unsafe(label, `entry '${e.path}' resolves outside the root`);
    const mode = (e.mode ?? 0o644) & 0o7777;
    const mtime = e.mtime ?? new Date(0);
    // What this process creates is root:root with `mode & ~umask` (and the group of a
    // setgid parent): when that is already what the entry says, chown and chmod are skipped.
    const exactMode = (mode & 0o7000) === 0 && (mode & umask) === 0 && !parent.setgid;
    const rootOwned = e.uid === 0 && e.gid === 0 && !parent.setgid;
    switch (e.type) {
      case "Directory": {
        const st = lstatSyncSafe(target);
        if (st && !st.isDirectory()) remove(target);
        const made = !st?.isDirectory();
        if (made) {
          mkdirSync(target, exactMode ? mode : 0o700);
          stats.added.dirs++;
        }
        if (!made || !exactMode) chmodSync(target, mode);
        if (!made || !rootOwned) owner(target, e, false);
        // A directory that gains or loses setgid changes the group its new children get.
        if (st?.isDirectory() && ((Number(st.mode) ^ mode) & 0o2000) !== 0) dirs.clear();
        dirTimes.push({ parts, mtime });
        mine.add(target);
        e.resume();
        return;
      }
      case "File":
      case "OldFile":
      case "ContiguousFile": {
        // O_EXCL|O_NOFOLLOW: never through a symlink; only what already exists is removed first.
        let fd: number;
        try {
          fd = openSync(target, CREATE, exactMode ? mode : 0o600);
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
          remove(target);
          fd = openSync(target, CREATE, exactMode ? mode : 0o600);
        }
        mine.add(target);
        stats.files++;
        stats.added.files++;
        let closed = false;
        const close = () => {
          if (closed) return;
          closed = true;
          closeSync(fd);
        };
        e.on("data", (chunk: Buffer) => {
          if (failure) return;
          try {
            if (stats.bytes + chunk.length > limits.bytes)
              throw tooBig(label, `it unpacks to more than ${limits.bytes} bytes`);
            limits.check?.(stats.bytes + chunk.length, stats.entries);
            // A short write (a filling disk) goes on from where it stopped, or fails.
            for (let at = 0; at < chunk.length; ) at += writeSync(fd, chunk, at);
            stats.bytes += chunk.length;
            stats.added.bytes += chunk.length;
            onBytes?.(chunk.length);
          } catch (err) {
            fail(err);
          }
        });
        e.on("end", () => {
          try {
            if (!failure) {
              // Files are made by this process (root: uid 0, gid 0); chown only when that differs.
              if (asRoot && e.uid !== undefined && e.gid !== undefined && !rootOwned)
                fchownSync(fd, e.uid, e.gid);
              // After chown: chown clears setuid/setgid bits.
              if (!exactMode || !rootOwned) fchmodSync(fd, mode);
              futimesSync(fd, mtime, mtime);
            }
          } catch (err) {
            fail(err);
          } finally {
            close();
          }
        });
        return;
      }
      case "SymbolicLink": {
        // remove() forgets resolved parents when it removes a directory or a symlink; a
        // symlink made where nothing was cannot be on any resolved parent's path (those all exist).
        remove(target);
        if (!e.linkpath) throw unsafe(label, `symlink '${e.path}' has no target`);
        // The target means something inside the sandbox only; it is stored as written.
        symlinkSync(e.linkpath, target);
        stats.added.files++;
        if (!rootOwned) owner(target, e, true);
        try {
          lutimesSync(target, mtime, mtime);
        } catch {
          // not every filesystem keeps symlink times
        }
        mine.add(target);
        e.resume();
        return;
      }
      case "Link": {
        const linkParts = entryComponents(e.linkpath ?? "", label);
        if (linkParts.length === 0) throw unsafe(label, `hard link '${e.path}' has no target`);
        const source = resolveInRoot(root, linkParts);
        if (!source.startsWith(root + path.sep))
          throw unsafe(label, `hard link '${e.path}' points outside the root`);
        const st = lstatSyncSafe(source);
        if (!st || st.isDirectory())
          throw unsafe(
            label,
            `hard link '${e.path}' names '${e.linkpath}', which is not a file in the image`,
          );
        if (source !== target) {
          remove(target);
          linkSync(source, target);
          stats.added.files++;
          if (st.isFile()) stats.added.bytes += Number(st.size);
        }
        mine.add(target);
        e.resume();
        return;
      }
      default:
        // Devices, FIFOs, and anything else: sandboxes bring their own /dev.
        stats.skipped++;
        e.resume();
    }
  };

  const done = new Promise<void>((resolve, reject) => {
    parser.on("end", resolve);
    parser.on("error", reject);
    parser.on("abort", (err: Error) => reject(err));
  });
  // When the pipeline fails first (a refusal stops the input), `done` is not awaited.
  done.catch(() => {});
  try {
    await pipeline(input, parser as unknown as NodeJS.WritableStream);
    await done;
  } catch (err) {
    if (failure) throw failure;
    if (err instanceof PyroError) throw err;
    throw new LayerRefused(
      `layer ${label} is not a valid tar archive: ${(err as Error).message}`,
      "the image is broken or was tampered with; nothing was kept",
    );
  }
  if (failure) throw failure;
  // Directory times last: writing children changes them. Each path is resolved again in
  // the root (a later entry may have made it, or a parent of it, a symlink to a host
  // path) and dated only if it is still a directory, without following the last part.
  for (const d of dirTimes.reverse()) {
    const p = resolveInRoot(root, d.parts);
    if (!p.startsWith(root + path.sep) || !lstatSyncSafe(p)?.isDirectory()) continue;
    try {
      lutimesSync(p, d.mtime, d.mtime);
    } catch {
      // removed by a later entry
    }
  }
  return stats;
}
