import { randomBytes } from "node:crypto";
import { mkdir, open, readdir, rename, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import { PyroError } from "../errors.js";
import { run } from "../util/run.js";
import type { BackendName } from "./backend.js";
import { LAUNCH_ENV } from "./common.js";

/**
 * The disk limit of a namespace sandbox (bwrap, gVisor). Its writable layers live in a
 * sparse ext4 image of the limit's size, loop-mounted in the sandbox's private mount
 * namespace by the launch step (linux/launch.ts): a command that fills it gets ENOSPC,
 * the host's filesystem keeps its space (the image only grows by what is written, up to
 * the limit), and the workspace stays usable (delete the files, or reset). The image is
 * made on the first start after a create or a reset: mkfs of a sparse image takes
 * ~25 ms and ~4 MB whatever its size.
 */
export const DEFAULT_DISK_MIB = 10 * 1024;

/**
 * Backends that enforce a disk limit on what commands write: bwrap and gVisor put the
 * writable layers on a sized ext4 image (this module); the VMs (qemu, firecracker) size
 * their state filesystem (one template per size: the saved state has it mounted).
 */
export const DISK_LIMITED: readonly BackendName[] = ["bwrap", "gvisor", "qemu", "firecracker"];
/** Where blank images are kept for copying: beside the injected Node runtime, in the cache. */
export function diskTemplates(spec: { runtimeCacheDir: string }): string {
  return join(spec.runtimeCacheDir, "disk-templates");
}

/** Small enough for tests, large enough for ext4's own metadata and a Debian upper layer. */
export const MIN_DISK_MIB = 64;

/**
 * Makes the image at `path` with `mib` MiB unless it exists; fails closed. With
 * `templateDir` (a cache directory), the image is a sparse copy of a blank image of that
 * size made once there: a create or reset then copies ~4 MB of ext4 metadata instead of
 * running mkfs (measured here: 7-9 ms of CPU against 13 ms, and less I/O wait). Copies
 * share the template's file system UUID, which ext4 does not use to tell mounts apart.
 */
export async function ensureDiskImage(path: string, mib: number, templateDir?: string): Promise<void> {
  if (await stat(path).catch(() => null)) return;
  if (!Number.isInteger(mib) || mib < MIN_DISK_MIB)
    throw new PyroError(
      "invalid_argument",
      `the disk limit must be a whole number of MiB, at least ${MIN_DISK_MIB}`,
    );
  if (templateDir === undefined) return makeImage(path, mib);
  const template = join(templateDir, `ext4-${mib}m.img`);
  if (!(await stat(template).catch(() => null))) {
    await mkdir(templateDir, { recursive: true, mode: 0o700 });
    // A name of its own: concurrent first starts each make one and the last rename wins.
    await makeImage(template, mib, `${template}.${process.pid}.${randomBytes(4).toString("hex")}`);
  }
  await copyTemplate(template, path);
}

/** A sparse copy of `template` at `path` (through `<path>.partial`); fails closed. */
async function copyTemplate(template: string, path: string): Promise<void> {
  const partial = `${path}.partial`;
  const r = await run(["cp", "--sparse=always", template, partial], {
    timeoutMs: 60_000,
    env: { ...LAUNCH_ENV },
  }).catch((err: Error) => ({ exitCode: -1, stdout: "", stderr: err.message }));
  if (r.exitCode !== 0) {
    await rm(partial, { force: true });
    throw new PyroError(
      "backend_unavailable",
      `cannot apply the disk limit: copying the blank disk image failed (${r.stderr.trim().split("\n").slice(-1)[0] ?? ""})`,
      "check the free space of the pyro cache; pyro refuses to run without a disk limit",
    );
  }
  await rename(partial, path);
}

/** mkfs of a sparse ext4 image of `mib` MiB, written to `partial` and renamed to `path`. */
async function makeImage(path: string, mib: number, partial = `${path}.partial`): Promise<void> {
  const fh = await open(partial, "w", 0o600);
  try {
    await fh.truncate(mib * 1024 * 1024);
  } finally {
    await fh.close();
  }
  // No reserved blocks (the sandbox is root anyway); lazy init keeps the image sparse.
  const r = await run(
    ["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", partial],
    // LAUNCH_ENV's PATH has the sbin directories a user's PATH often lacks.
    { timeoutMs: 60_000, env: { ...LAUNCH_ENV } },
  ).catch((err: Error) => ({ exitCode: -1, stdout: "", stderr: err.message }));
  if (r.exitCode !== 0) {
    await rm(partial, { force: true });
    throw new PyroError(
      "backend_unavailable",
      `cannot apply the disk limit: mkfs.ext4 failed (${r.stderr.trim().split("\n").slice(-1)[0] ?? ""})`,
      "install e2fsprogs (npm run setup); pyro refuses to run without a disk limit",
    );
  }
  await rename(partial, path);
}

/**
 * Blank images copied ahead (`<templates>/spare/`): a one-shot takes one by rename, so its
 * start copies nothing (the copy is ~14 ms here), and a new one is copied in the
 * background meanwhile. A rename is atomic: two runs never get one image. A spare is a
 * copy of the template nothing has mounted yet. Partial copies carry their maker's pid:
 * those of a process that is gone are removed at the next refill.
 */
const SPARE_DIR = "spare";
const refilling = new Set<string>();

/**
 * The image at `path` from a spare copied ahead when there is one, else as
 * {@link ensureDiskImage} makes it; then a new spare is copied in the background (one per
 * size in the cache; the promise of that copy is returned for callers that wait for it).
 */
export async function claimDiskImage(
  path: string,
  mib: number,
  templateDir: string,
  /** The caller hands the copy of the next spare to a detached cleaner (see {@link SpareRefill}). */
  options: { deferRefill?: boolean } = {},
): Promise<{ spare: boolean; refill: Promise<void>; deferred?: SpareRefill }> {
  const dir = join(templateDir, SPARE_DIR);
  const prefix = `ext4-${mib}m.`;
  const names = (await readdir(dir).catch(() => [] as string[])).filter(
    (n) => n.startsWith(prefix) && n.endsWith(".img"),
  );
  let spare = false;
  for (const n of names) {
    spare = await rename(join(dir, n), path).then(
      () => true,
      () => false, // taken by another run meanwhile
    );
    if (spare) break;
  }
  if (!spare) await ensureDiskImage(path, mib, templateDir);
  const have = names.length - (spare ? 1 : 0);
  if (options.deferRefill)
    return {
      spare,
      refill: Promise.resolve(),
      ...(have > 0 ? {} : { deferred: { template: join(templateDir, `ext4-${mib}m.img`), dir, prefix } }),
    };
  return { spare, refill: refillSpare(dir, prefix, mib, templateDir, have) };
}

/**
 * The copy of the next spare, left to a process that runs after the caller's answer (a
 * CLI one-shot's cleaner, linux/oneshot-cleaner.ts): the template, the spare directory and
 * the spares' name prefix. The copy is named as refillSpare names its partial copies
 * (`<prefix><pid>.<hex>.img.partial`, renamed when whole), so that the partial copy of a
 * cleaner killed meanwhile is removed by the next refill.
 */
export interface SpareRefill {
  template: string;
  dir: string;
  prefix: string;
}

async function refillSpare(dir: string, prefix: string, mib: number, templateDir: string, have: number) {
  const key = join(dir, prefix);
  if (refilling.has(key) || have > 0) return;
  refilling.add(key);
  try {
    const names = await readdir(dir).catch(() => [] as string[]);
    for (const n of names) {
      const pid = /\.(\d+)\.[0-9a-f]+\.img\.partial$/.exec(n)?.[1];
      if (pid && !(await stat(`/proc/${pid}`).catch(() => null))) await rm(join(dir, n), { force: true });
    }
    if (names.some((n) => n.startsWith(prefix) && n.endsWith(".img"))) return;
    await mkdir(dir, { recursive: true, mode: 0o700 });
    const template = join(templateDir, `ext4-${mib}m.img`);
    const name = `${prefix}${process.pid}.${randomBytes(4).toString("hex")}.img`;
    await copyTemplate(template, join(dir, name));
  } catch {
    // A spare is an optimisation: the next claim copies the template itself.
  } finally {
    refilling.delete(key);
  }
}
