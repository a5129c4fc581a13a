/**
 * The agent's package as the namespace backends (bwrap, gVisor, docker) bind it into a
 * sandbox at /run/pyro/app: only what the agent runs. Binding the installed package
 * itself showed a workspace everything beside the agent: in a checkout that is the whole
 * repository (sources, tests, `.git` with its config and hooks, every npm package of
 * the host side); installed, the host side's code and modules. The sandbox sees none of
 * the host but what it needs, so it gets a copy holding:
 *
 * - `package.json` saying `"type": "module"` (the bundle is ES modules);
 * - `dist/agent/bundle/` (the agent, bundled: scripts/bundle-agent.mjs);
 * - node-pty's loader (`lib/`, `package.json`) and the addon built on this host
 *   (`build/Release/pty.node`): the one package the bundle leaves external, loaded by PTY
 *   shells only. Without a built addon the copy has none, and shells report it as they
 *   did before;
 * - `bin/pyro-spawn`, the agent's command starter (spawn-helper.ts), built with the
 *   host's `cc`; without one the agent starts commands itself.
 *
 * The copy lives in the runtime cache (`agent-app-<hash>/`), keyed by a hash of those
 * files, made once in a private directory and renamed into place (two processes making
 * it at once both succeed; one copy stays). Copies are kept (about 1 MB each, one per
 * build): a running sandbox holds its copy bound and its agent loads chunks from it
 * lazily, so removing one could break a workspace started long ago. Leftovers of a make
 * that was killed are removed after an hour. The VM backends ship their own closure on the agent disk
 * (vm/agent-disk.ts); host-compat runs the package where it is.
 */
import { createHash, randomBytes } from "node:crypto";
import { mkdir, readdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import { basename, dirname, join, relative } from "node:path";
import { prepareSpawnHelper } from "./spawn-helper.js";

/** What the copy holds, relative to the package. */
const PARTS = [
  "dist/agent/bundle",
  "node_modules/node-pty/package.json",
  "node_modules/node-pty/lib",
  "node_modules/node-pty/build/Release/pty.node",
] as const;

const PACKAGE_JSON = '{"type":"module"}\n';
/** Where the agent looks for its command starter (agent/guest/spawner.ts HELPER_PATH). */
const SPAWN_HELPER_IN_APP = "bin/pyro-spawn";
const STALE_MS = 3600 * 1000;

const made = new Map<string, Promise<string>>();

/** The agent's copy of `appDir` in `cacheDir` (made when missing), once per process. */
export function agentApp(spec: { appDir: string; runtimeCacheDir: string }): Promise<string> {
  const key = `${spec.appDir}\0${spec.runtimeCacheDir}`;
  let p = made.get(key);
  if (!p) {
    p = makeAgentApp(spec.appDir, spec.runtimeCacheDir);
    made.set(key, p);
    p.catch(() => made.delete(key));
  }
  return p;
}

async function makeAgentApp(appDir: string, cacheDir: string): Promise<string> {
  const contents = await readParts(appDir);
  // The agent's command starter, built here; without a C compiler the agent spawns itself.
  const helper = await prepareSpawnHelper(join(cacheDir, "helpers"));
  // The name is the hash of exactly the bytes the copy is written from; the helper's own
  // file name is already its source's hash (static-binary.ts), so it is not read for it.
  const h = createHash("sha256").update(PACKAGE_JSON);
  for (const [f, { bytes, mode }] of contents) h.update(`${f}\0${mode}\0`).update(bytes);
  h.update(`${SPAWN_HELPER_IN_APP}\0${helper ? basename(helper) : "-"}\0`);
  const out = join(cacheDir, `agent-app-${h.digest("hex").slice(0, 16)}`);
  if (await stat(out).catch(() => null)) return out;
  if (helper) contents.set(SPAWN_HELPER_IN_APP, { bytes: await readFile(helper), mode: 0o755 });
  await mkdir(cacheDir, { recursive: true, mode: 0o700 });
  const stage = join(cacheDir, `.agent-app-${process.pid}-${randomBytes(4).toString("hex")}`);
  try {
    await mkdir(stage, { mode: 0o755 });
    await writeFile(join(stage, "package.json"), PACKAGE_JSON, { mode: 0o644 });
    for (const [f, { bytes, mode }] of contents) {
      await mkdir(dirname(join(stage, f)), { recursive: true, mode: 0o755 });
      await writeFile(join(stage, f), bytes, { mode });
    }
    await rename(stage, out).catch(async (err: NodeJS.ErrnoException) => {
      // Made by another process meanwhile: theirs is the same bytes.
      if (!(await stat(out).catch(() => null))) throw err;
    });
  } finally {
    await rm(stage, { recursive: true, force: true });
  }
  await sweepStale(cacheDir);
  return out;
}

/**
 * The files of PARTS and their bytes, read while nothing rewrote them: a build writing
 * the bundle meanwhile (a checkout rebuilt while pyro runs) would otherwise give a copy
 * of mixed chunks, found broken only when a lazily loaded one is imported. The listing
 * and each file's size and modification time are taken again after reading; a change
 * reads again, a few times, then fails.
 */
async function readParts(appDir: string): Promise<Map<string, { bytes: Buffer; mode: number }>> {
  for (let attempt = 0; attempt < 5; attempt++) {
    const before = await partFiles(appDir);
    if (!before.some((f) => f.path.startsWith("dist/agent/bundle/")))
      throw new Error(`the agent bundle is missing from ${appDir}/dist/agent/bundle (run npm run build)`);
    const contents = new Map<string, { bytes: Buffer; mode: number }>();
    for (const f of before)
      contents.set(f.path, { bytes: await readFile(join(appDir, f.path)), mode: f.mode & 0o755 });
    const after = await partFiles(appDir);
    if (JSON.stringify(after) === JSON.stringify(before)) return contents;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`the agent bundle in ${appDir} kept changing while it was copied (a build running?)`);
}

interface PartFile {
  path: string;
  size: number;
  mtime: number;
  mode: number;
}

/** The files of PARTS that exist, relative to `appDir`, sorted, with what tells a rewrite. */
async function partFiles(appDir: string): Promise<PartFile[]> {
  const files: PartFile[] = [];
  const walk = async (abs: string): Promise<void> => {
    const st = await stat(abs).catch(() => null);
    if (!st) return;
    if (st.isFile()) {
      files.push({ path: relative(appDir, abs), size: st.size, mtime: st.mtimeMs, mode: st.mode });
      return;
    }
    if (!st.isDirectory()) return;
    for (const name of await readdir(abs)) await walk(join(abs, name));
  };
  for (const part of PARTS) await walk(join(appDir, part));
  return files.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
}

/** Leftovers of makes that were killed (an hour old: no make takes that long). */
async function sweepStale(cacheDir: string): Promise<void> {
  for (const name of await readdir(cacheDir).catch(() => [] as string[])) {
    const path = join(cacheDir, name);
    if (!name.startsWith(".agent-app-")) continue;
    const st = await stat(path).catch(() => null);
    if (st && Date.now() - st.mtimeMs > STALE_MS) await rm(path, { recursive: true, force: true });
  }
}
