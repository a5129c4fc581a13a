import { createHash } from "node:crypto";
import { constants } from "node:fs";
import { access, chmod, mkdir, mkdtemp, rename, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { firstLine, run, which } from "../../util/run.js";

/**
 * Small C helpers for VM guests (the vsock bridge, the RNG reseeder), compiled on the host
 * with its `cc` (a guest has the host's architecture) and linked statically, so they run
 * on any guest root. Cached by a hash of the source and flags.
 */
const CFLAGS = ["-static", "-O2"] as const;
const COMPILE_TIMEOUT_MS = 120_000;

export type StaticBuild = { path: string; reason: null } | { path: null; reason: string };

/** Cache file name of `name` built from `source`. */
export function staticBinaryName(name: string, source: string): string {
  const hash = createHash("sha256").update(CFLAGS.join(" ")).update("\0").update(source).digest("hex");
  return `${name}-${hash.slice(0, 16)}`;
}

/**
 * Builds `source` into `cacheDir` (once per source version) and returns its path, or
 * `null` with the reason when it cannot be built here (no C compiler, no static libc).
 * Concurrent builders are safe: each compiles in its own temp directory and renames the
 * result into place atomically.
 */
export async function buildStaticBinary(
  cacheDir: string,
  name: string,
  source: string,
  options: { cc?: string; signal?: AbortSignal } = {},
): Promise<StaticBuild> {
  const target = join(cacheDir, staticBinaryName(name, source));
  try {
    await access(target, constants.X_OK);
    return { path: target, reason: null };
  } catch {
    // not built yet
  }
  const cc = options.cc ?? (await which("cc"));
  if (!cc) return { path: null, reason: `no C compiler (cc) on PATH to build ${name}` };
  await mkdir(cacheDir, { recursive: true });
  const tmp = await mkdtemp(join(cacheDir, `.${name}-`));
  try {
    const src = join(tmp, `${name}.c`);
    const out = join(tmp, name);
    await writeFile(src, source);
    const r = await run([cc, ...CFLAGS, "-o", out, src], {
      timeoutMs: COMPILE_TIMEOUT_MS,
      ...(options.signal ? { signal: options.signal } : {}),
    });
    if (r.spawnError) return { path: null, reason: `cannot run ${cc}: ${r.spawnError.message}` };
    if (r.exitCode !== 0) {
      const why = r.timedOut
        ? `timed out after ${COMPILE_TIMEOUT_MS} ms`
        : firstLine(r.stderr) || `exit ${r.exitCode}`;
      return { path: null, reason: `compiling ${name} with ${cc} failed: ${why}` };
    }
    await chmod(out, 0o755);
    await rename(out, target);
    return { path: target, reason: null };
  } finally {
    await rm(tmp, { recursive: true, force: true });
  }
}
