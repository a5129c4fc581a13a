import { createHash, randomBytes } from "node:crypto";
import { mkdir, rename, rm, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { run, which } from "../../util/run.js";

/**
 * Debian 12's runsc (20221219) rejects `AT_NO_AUTOMOUNT` in statx and newfstatat with
 * EINVAL, and coreutils 9 always passes it: `ls -l` and `stat` fail inside gVisor. The
 * flag only matters for automount points, which a sandbox has none of, so a tiny library
 * preloaded into every guest process (through the guest's /etc/ld.so.preload) clears it.
 * Built from this source with the host's C compiler, once per source version.
 */
export const SHIM_SOURCE = `#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
int statx(int fd, const char *path, int flags, unsigned int mask, struct statx *buf) {
  return (int)syscall(SYS_statx, fd, path, flags & ~AT_NO_AUTOMOUNT, mask, buf);
}
int fstatat(int fd, const char *path, struct stat *buf, int flags) {
  return (int)syscall(SYS_newfstatat, fd, path, buf, flags & ~AT_NO_AUTOMOUNT);
}
int fstatat64(int fd, const char *path, struct stat64 *buf, int flags) {
  return (int)syscall(SYS_newfstatat, fd, path, buf, flags & ~AT_NO_AUTOMOUNT);
}
`;

/** Where the shim appears inside the sandbox. */
export const SHIM_IN_SANDBOX = "/run/pyro/statx-shim.so";

/** Builds (or finds) the shim; null when no C compiler is available. */
export async function prepareStatxShim(cacheDir: string): Promise<string | null> {
  const key = createHash("sha256").update(SHIM_SOURCE).digest("hex").slice(0, 12);
  const out = join(cacheDir, `gvisor-statx-${key}.so`);
  if (await stat(out).catch(() => null)) return out;
  const cc = (await which("cc")) ?? (await which("gcc"));
  if (!cc) return null;
  await mkdir(cacheDir, { recursive: true });
  const tmp = join(cacheDir, `.statx-${process.pid}-${randomBytes(3).toString("hex")}`);
  try {
    await writeFile(`${tmp}.c`, SHIM_SOURCE);
    const r = await run([cc, "-O2", "-shared", "-fPIC", "-o", `${tmp}.so`, `${tmp}.c`], {
      timeoutMs: 60_000,
    });
    if (r.exitCode !== 0) return null;
    await rename(`${tmp}.so`, out); // atomic; a racing builder made the same bytes
    return out;
  } finally {
    await rm(`${tmp}.c`, { force: true });
    await rm(`${tmp}.so`, { force: true });
  }
}

/** Where the preload entry appears inside the sandbox (a read-only bind of a host file). */
export const PRELOAD_IN_SANDBOX = "/etc/ld.so.preload";

/**
 * The host file bound at /etc/ld.so.preload (read-only) next to the shim: the guest's root
 * layer is never written from the host (it lives in the sandbox's disk image).
 */
export async function preparePreloadFile(shim: string): Promise<string> {
  const file = `${shim}.preload`;
  if (await stat(file).catch(() => null)) return file;
  const tmp = `${file}.${process.pid}-${randomBytes(3).toString("hex")}`;
  await writeFile(tmp, `${SHIM_IN_SANDBOX}\n`, { mode: 0o644 });
  await rename(tmp, file);
  return file;
}
