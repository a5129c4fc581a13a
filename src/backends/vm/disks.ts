import { randomBytes } from "node:crypto";
import { mkdir, open, readdir, rename, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import { PyroError } from "../../errors.js";
import { exists, treeSize } from "../../util/fs.js";
import { firstLine, run } from "../../util/run.js";
import type { SandboxSpec } from "../backend.js";

/**
 * Disk images for the microVMs. Read-only images are raw ext4 made with `mkfs.ext4 -d`
 * (from a directory, no loop mounts, no root needed); writable ones are qcow2 overlays so
 * a workspace's disk costs nothing until it is written.
 */

/**
 * Every seed disk has this (sparse) size whatever its filesystem's size: a VM restored
 * from a template keeps the disk size the template's kernel probed, so the swapped-in
 * image must match it. The filesystem inside may be smaller than the disk.
 */
export const SEED_DISK_BYTES = 256 * 1024 ** 3;

/**
 * Writes an ext4 image of `dir` to `out` (atomically), sized for the tree with room to
 * spare. `readOnly` images get no journal (nothing ever writes them).
 */
export async function mkfsExt4(
  out: string,
  options: {
    dir?: string;
    sizeMib?: number;
    label: string;
    readOnly: boolean;
    /** Grow the image file (sparsely) to this many bytes before it is published. */
    padTo?: number;
    signal?: AbortSignal;
  },
): Promise<void> {
  let sizeMib = options.sizeMib ?? 0;
  let inodes: number | null = null;
  if (options.dir && !options.sizeMib) {
    // Every entry takes an inode: directories too (a tree of many empty directories
    // would otherwise run out of them).
    const t = await treeSize(options.dir);
    const entries = t.files + t.dirs;
    inodes = Math.ceil(entries * 1.3) + 4096;
    sizeMib = Math.ceil((t.bytes * 1.15 + entries * 6144) / 1024 ** 2) + 64;
  }
  const tmp = tmpName(out);
  await rm(tmp, { force: true });
  const fh = await open(tmp, "w", 0o644);
  await fh.truncate(sizeMib * 1024 ** 2);
  await fh.close();
  const argv = [
    "mkfs.ext4",
    "-q",
    "-F",
    "-L",
    options.label,
    "-m",
    "0",
    "-b",
    "4096",
    "-I",
    "256",
    "-E",
    "lazy_itable_init=1,lazy_journal_init=1",
    ...(options.readOnly ? ["-O", "^has_journal"] : []),
    ...(inodes ? ["-N", String(inodes)] : []),
    ...(options.dir ? ["-d", options.dir] : []),
    tmp,
  ];
  const r = await run(argv, {
    timeoutMs: 20 * 60_000,
    ...(options.signal ? { signal: options.signal } : {}),
  });
  if (r.exitCode !== 0) {
    await rm(tmp, { force: true });
    if (r.spawnError)
      throw new PyroError(
        "backend_unavailable",
        "mkfs.ext4 is not installed",
        "install the Debian package e2fsprogs",
      );
    throw new PyroError(
      "internal",
      `mkfs.ext4 ${out} failed: ${firstLine(r.stderr) || `exit ${r.exitCode}`}`,
    );
  }
  if (options.padTo) await padTo(tmp, options.padTo);
  await rename(tmp, out);
}

/** A temp name beside `path`, unique across processes and concurrent calls in one. */
export function tmpName(path: string): string {
  return `${path}.tmp-${process.pid}-${randomBytes(4).toString("hex")}`;
}

/** A qcow2 overlay at `path` whose reads fall through to `backing` until written. */
export async function qcow2Overlay(
  path: string,
  backing: string,
  backingFormat: "raw" | "qcow2",
): Promise<void> {
  const tmp = tmpName(path);
  const r = await run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", backing, "-F", backingFormat, tmp], {
    timeoutMs: 60_000,
  });
  if (r.exitCode !== 0) {
    await rm(tmp, { force: true });
    if (r.spawnError)
      throw new PyroError(
        "backend_unavailable",
        "qemu-img is not installed",
        "install the Debian package qemu-utils",
      );
    throw new PyroError("internal", `qemu-img create ${path} failed: ${firstLine(r.stderr)}`);
  }
  await rename(tmp, path);
}

/**
 * A self-contained qcow2 copy of `src` (its backing chain flattened; only allocated data
 * is copied: a few MB for a fresh state disk), so nothing else has to be kept for it.
 */
export async function standaloneQcow2(src: string, srcFormat: "raw" | "qcow2", out: string): Promise<void> {
  const tmp = tmpName(out);
  const r = await run(["qemu-img", "convert", "-f", srcFormat, "-O", "qcow2", src, tmp], {
    timeoutMs: 5 * 60_000,
  });
  if (r.exitCode !== 0) {
    await rm(tmp, { force: true });
    throw new PyroError(
      "internal",
      `qemu-img convert ${src} failed: ${firstLine(r.stderr) || `exit ${r.exitCode}`}`,
    );
  }
  await rename(tmp, out);
}

/** A blank, sparse raw ext4 image of `sizeMib` at `path` (a writable state disk). */
export async function blankExt4(path: string, sizeMib: number): Promise<void> {
  await mkfsExt4(path, { sizeMib, label: "pyro-state", readOnly: false });
}

/** Grows a raw image's file (sparsely) to `bytes`; the filesystem inside is unchanged. */
export async function padTo(path: string, bytes: number): Promise<void> {
  const fh = await open(path, "r+");
  try {
    if ((await fh.stat()).size < bytes) await fh.truncate(bytes);
  } finally {
    await fh.close();
  }
}

/**
 * Identity of a snapshot tree: inode plus birth time, so a snapshot deleted and re-created
 * under the same name (which may reuse the inode) is a different tree.
 */
export function treeId(st: { ino: number; birthtimeMs: number; ctimeMs: number }): string {
  return `${st.ino}-${Math.round(st.birthtimeMs || st.ctimeMs)}`;
}

/** Where a workspace keeps the seed images of its snapshots. */
export function seedsDir(spec: SandboxSpec): string {
  return join(spec.dir, "seeds");
}

/**
 * Raw ext4 image of snapshot `name` of the workspace (the read-only seed disk), built with
 * `mkfs.ext4 -d` on first use and cached beside the workspace. Named by the snapshot
 * tree's identity (treeId), so a snapshot deleted and re-created under the same name gets
 * a new image; older images of that name are removed.
 */
export async function seedImage(spec: SandboxSpec, name: string, signal?: AbortSignal): Promise<string> {
  const tree = join(spec.snapshotsDir, name);
  const st = await stat(tree).catch(() => null);
  if (!st?.isDirectory()) throw new PyroError("not_found", `snapshot tree ${tree} is missing`);
  const dir = seedsDir(spec);
  const out = join(dir, `${name}-${treeId(st)}.ext4`);
  if (await exists(out)) return out;
  await mkdir(dir, { recursive: true, mode: 0o700 });
  // Older images of this name (the snapshot was re-created); not other names sharing the prefix.
  const mine = new RegExp(`^${name.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}-\\d+-\\d+\\.ext4$`);
  for (const f of await readdir(dir)) if (mine.test(f)) await rm(join(dir, f), { force: true });
  await mkfsExt4(out, {
    dir: tree,
    label: "pyro-seed",
    readOnly: true,
    padTo: SEED_DISK_BYTES,
    ...(signal ? { signal } : {}),
  });
  if ((await stat(out)).size > SEED_DISK_BYTES) {
    await rm(out, { force: true });
    throw new PyroError(
      "invalid_argument",
      `snapshot '${name}' is too big for a VM seed disk (limit ${SEED_DISK_BYTES / 1024 ** 3} GiB)`,
    );
  }
  return out;
}
