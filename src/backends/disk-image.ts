import { randomBytes } from "node:crypto";
import { mkdir, open, rename, rm, stat } from "node:fs/promises";
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
