// Runs the CLI's CommonJS bundle (dist/cli-bundle/main.cjs, scripts/bundle-cli.mjs) with a
// V8 code cache: the compiled code of a previous run, so a one-shot `pyro run` does not
// parse and compile its ~430 KB of JavaScript again on every call (issue 18's row of whole
// processes; Node 20 keeps no compiled code between processes for ES modules, and its
// module.enableCompileCache() is Node 22's). docs/architecture.md "CLI start".
//
// The cache can never pair with other code:
// - main.cjs runs only when its SHA-256 is the one its build's stamp holds.
// - The cache is named by the SHA-256 of the very bytes compiled (V8's own check is only the
//   source's length), Node's version, the architecture and NODE_OPTIONS; V8 itself
//   rejects a cache of another V8 version or other flags (`cachedDataRejected`).
// - Its own SHA-256 heads the file: a damaged or foreign file is not handed to V8.
// - It lives in `<PYRO_HOME>/runtime/cli-code/` (mode 0700), is used only when owned by
//   this user and not writable by others, and is written whole (a temporary file renamed).
// Whatever fails here (no home, a read-only disk, a rejected cache) only costs the
// compile: the bundle runs without a cache, and the cache is written again after the run.
import { createHash } from "node:crypto";
import {
  closeSync,
  fstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { createRequire } from "node:module";
import { homedir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { Script } from "node:vm";

/** `<PYRO_HOME>/runtime/cli-code`, with PYRO_HOME's default as src/core/config.ts has it. */
export function cacheDir(env = process.env) {
  const home = env.PYRO_HOME
    ? resolve(env.PYRO_HOME)
    : join(env.XDG_CACHE_HOME ? env.XDG_CACHE_HOME : join(homedir(), ".cache"), "pyro");
  return join(home, "runtime", "cli-code");
}

/** The cache file's name for a bundle (the SHA-256 of its bytes) under this Node and its options. */
export function cacheName(bundleSha256, env = process.env) {
  const key = createHash("sha256")
    .update(`${bundleSha256}\0${process.version}\0${process.arch}\0${env.NODE_OPTIONS ?? ""}`)
    .digest("hex");
  return `${key.slice(0, 32)}.v8`;
}

/** The cached data in `path` when it is intact and this user's alone, else undefined. */
export function readCache(path) {
  let fd;
  try {
    fd = openSync(path, "r");
    const st = fstatSync(fd);
    if (st.uid !== process.getuid?.() || (st.mode & 0o022) !== 0) return undefined;
    const file = readFileSync(fd);
    const data = file.subarray(32);
    return createHash("sha256").update(data).digest().equals(file.subarray(0, 32)) ? data : undefined;
  } catch {
    return undefined;
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
}

/** Writes `data` as `path` (whole, by rename) and removes the directory's other caches. */
export function writeCache(path, data) {
  const dir = dirname(path);
  try {
    // The home and runtime/ as pyro makes them (modes of their own); only ours is 0700.
    mkdirSync(dirname(dir), { recursive: true });
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    const tmp = `${path}.${process.pid}.tmp`;
    writeFileSync(tmp, Buffer.concat([createHash("sha256").update(data).digest(), data]), { mode: 0o600 });
    renameSync(tmp, path);
    // Caches of other builds (or Node versions) are not used again: at most one stays.
    for (const name of readdirSync(dir))
      if (join(dir, name) !== path && !name.endsWith(".tmp")) rmSync(join(dir, name), { force: true });
  } catch {
    // No cache: the next run compiles again.
  }
}

/**
 * Compiles and evaluates `bundle` (with the cache when there is a usable one), when its
 * bytes are those of `expectedSha256` (the bundle's stamp): its
 * `main`, and `saveCache()` to call after the run, which writes the cache when there was
 * none (or V8 rejected it): the code compiled by then (the command's whole path) is what
 * the next run needs. Throws only before anything of the CLI ran (the caller then runs
 * the ES module bundle); an error of `main` is the CLI's own.
 */
export function loadCached(bundle, expectedSha256) {
  // latin1: main.cjs is ASCII (scripts/bundle-cli.mjs), and a one-byte string is what V8 keeps.
  const bytes = readFileSync(bundle);
  const sha = createHash("sha256").update(bytes).digest("hex");
  // The bytes the stamp names, not those of another build written over them meanwhile.
  if (sha !== expectedSha256) throw new Error(`${bundle} is not the stamped build`);
  const path = join(cacheDir(), cacheName(sha));
  const cachedData = readCache(path);
  const wrapped = `(function (exports, require, module, __filename, __dirname) {${bytes.toString("latin1")}\n})`;
  const script = new Script(wrapped, { filename: bundle, ...(cachedData ? { cachedData } : {}) });
  const module = { exports: {} };
  script.runInThisContext()(module.exports, createRequire(bundle), module, bundle, dirname(bundle));
  if (typeof module.exports.main !== "function") throw new Error(`${bundle} exports no main`);
  return {
    main: module.exports.main,
    saveCache: () => {
      if (!cachedData || script.cachedDataRejected) writeCache(path, script.createCachedData());
    },
  };
}
