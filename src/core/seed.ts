import {
  chmod,
  copyFile,
  cp,
  lstat,
  mkdir,
  mkdtemp,
  readdir,
  readlink,
  realpath,
  rm,
  stat,
  symlink,
} from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { PyroError } from "../errors.js";
import type { SeedSkipped, WorkspaceSeed } from "../state/types.js";
import { treeSize } from "../util/fs.js";
import { run } from "../util/run.js";
import { cloneRepo, copyRepository, gitToplevel, headCommit, SAFE_GIT } from "./git.js";

export interface SeedSource {
  seed_path?: string | undefined;
  repo_url?: string | undefined;
  repo_ref?: string | undefined;
}

/**
 * Fills `dest` (an empty directory: the baseline snapshot) from a seed. A Git checkout
 * contributes its tracked and untracked-not-ignored files (working-tree content) and its
 * repository as `.git`; a plain directory is copied whole;
 * a repository URL is cloned first. Nothing here runs code from the seed.
 *
 * `exclude`: host paths never seeded even when the seed contains them: pyro's own home
 * (other workspaces' files and secrets, and the baseline being written: a seed of `~`
 * would copy into itself) and the secrets key.
 */
export async function seedInto(
  dest: string,
  source: SeedSource,
  signal?: AbortSignal,
  exclude: readonly string[] = [],
  /** Where a repository URL is cloned and kept (the workspace's commits go there). */
  cloneAt?: string,
): Promise<WorkspaceSeed> {
  await mkdir(dest, { recursive: true });
  if (source.repo_url) return seedFromRepoUrl(dest, source.repo_url, source.repo_ref, signal, cloneAt);
  if (!source.seed_path) return { kind: "empty", source: null, file_count: 0, bytes: 0 };
  const src = resolve(source.seed_path);
  const st = await stat(src).catch(() => null);
  if (!st?.isDirectory()) {
    throw new PyroError(
      "invalid_argument",
      `seed path ${src} is not a directory`,
      "pass a directory or a Git checkout",
    );
  }
  const excluded = await realPaths(exclude);
  // The clones pyro keeps (beside `cloneAt`) may be seeded even though they are in its home:
  // `mcp serve --repo-url` seeds its workspaces from one.
  const repos = cloneAt ? await realPaths([dirname(cloneAt)]) : [];
  const keep = (path: string) =>
    repos.some((r) => path.startsWith(`${r}/`)) ||
    !excluded.some((e) => path === e || path.startsWith(`${e}/`));
  // A seed inside what is left out would be copied as an empty tree: refuse it instead
  // (the 100 MB export bench once timed an empty workspace seeded from inside its home).
  if (!keep(src) || !keep(await realpath(src))) {
    throw new PyroError(
      "invalid_argument",
      `seed path ${src} is inside pyro's own files (its home, the environment cache or the secrets key), which are never copied into a workspace`,
      "seed from a directory outside them",
    );
  }
  if (await isGitCheckout(src)) return seedFromGitCheckout(dest, src, src, signal, undefined, keep);
  await copyTree(await realpath(src), dest, await realpath(dest), keep);
  const size = await treeSize(dest);
  return { kind: "directory", source: src, file_count: size.files, bytes: size.bytes };
}

/**
 * Copies the tree `src` into `dest` (fs.cp: symlinks as they are, timestamps kept) except
 * what `keep` refuses. fs.cp refuses outright to copy a directory into its own subtree
 * (a seed of `~` holds the home, which holds `dest`): directories on the way to `dest`
 * are walked here instead, and only the branches beside it are handed to fs.cp.
 */
async function copyTree(
  src: string,
  dest: string,
  realDest: string,
  keep: (path: string) => boolean,
): Promise<void> {
  if (!realDest.startsWith(`${src}/`)) {
    await cp(src, dest, {
      recursive: true,
      verbatimSymlinks: true,
      preserveTimestamps: true,
      errorOnExist: false,
      filter: keep,
    });
    return;
  }
  await mkdir(dest, { recursive: true });
  for (const entry of await readdir(src, { withFileTypes: true })) {
    const from = join(src, entry.name);
    if (!keep(from)) continue;
    const to = join(dest, entry.name);
    if (entry.isDirectory()) await copyTree(from, to, realDest, keep);
    else await cp(from, to, { verbatimSymlinks: true, preserveTimestamps: true, errorOnExist: false });
  }
}

/** Real paths of those that exist (a symlinked home is excluded where it really is). */
async function realPaths(paths: readonly string[]): Promise<string[]> {
  const out: string[] = [];
  for (const p of paths) {
    out.push(resolve(p));
    const real = await realpath(p).catch(() => null);
    if (real && real !== resolve(p)) out.push(real);
  }
  return out;
}

async function isGitCheckout(dir: string): Promise<boolean> {
  // A checkout's top level holds `.git` (a directory, or a file in a worktree): without
  // one, no git process (~5-10 ms of every create seeded from a plain directory).
  if (!(await lstat(join(dir, ".git")).catch(() => null))) return false;
  return (await gitToplevel(dir)) === dir;
}

async function gitLines(
  checkout: string,
  args: string[],
  signal: AbortSignal | undefined,
): Promise<string[]> {
  const r = await run([...SAFE_GIT, "-C", checkout, ...args], {
    timeoutMs: 5 * 60_000,
    maxCapture: 256 * 1024 * 1024,
    ...(signal ? { signal } : {}),
  });
  if (r.exitCode !== 0)
    throw new PyroError("invalid_argument", `git ${args[0]} failed in ${checkout}: ${r.stderr.trim()}`);
  return r.stdout.split("\0").filter(Boolean);
}

/**
 * Copies the listed paths of a checkout (files as they are in the working tree, symlinks
 * as links) into `dest`, counting what it leaves out in `skipped`.
 */
async function copyListed(
  checkout: string,
  dest: string,
  files: Iterable<string>,
  keep: (path: string) => boolean,
  skipped: SeedSkipped,
): Promise<{ count: number; bytes: number }> {
  let bytes = 0;
  let count = 0;
  // The file list comes from the checkout's index, which need not match its working tree
  // (an untrusted .git): a listed path under a symlinked directory would be read through
  // the link, outside the checkout. Parents must resolve inside it.
  const top = await realpath(checkout);
  const parents = new Map<string, boolean>();
  const insideParent = async (from: string): Promise<boolean> => {
    const dir = dirname(from);
    let ok = parents.get(dir);
    if (ok === undefined) {
      const real = await realpath(dir).catch(() => null);
      ok = real !== null && (real === top || real.startsWith(`${top}/`));
      parents.set(dir, ok);
    }
    return ok;
  };
  for (const rel of files) {
    const from = join(checkout, rel);
    if (!keep(from)) {
      skipped.excluded++;
      continue;
    }
    if (!(await insideParent(from))) {
      skipped.special++;
      continue;
    }
    const st = await lstat(from).catch(() => null);
    if (!st) {
      skipped.missing++; // tracked but deleted in the working tree: the seed has it deleted too
      continue;
    }
    const to = join(dest, rel);
    if (st.isSymbolicLink()) {
      await mkdir(dirname(to), { recursive: true });
      await symlink(await readlink(from), to);
    } else if (st.isFile()) {
      await mkdir(dirname(to), { recursive: true });
      await copyFile(from, to);
      await chmod(to, st.mode & 0o777);
      bytes += st.size;
    } else {
      skipped.special++;
      continue;
    }
    count++;
  }
  return { count, bytes };
}

/**
 * A Git checkout: its tracked files and its untracked files that are not ignored (as
 * `git add -A` would see them, working-tree content), plus the repository itself at
 * `/workspace/.git` (repository.ts), so Git works inside. `skipped` counts the rest.
 */
async function seedFromGitCheckout(
  dest: string,
  checkout: string,
  reported: string,
  signal?: AbortSignal,
  ref?: string,
  keep: (path: string) => boolean = () => true,
): Promise<WorkspaceSeed> {
  const [staged, untracked, ignored] = await Promise.all([
    gitLines(checkout, ["ls-files", "-z", "--stage"], signal),
    gitLines(checkout, ["ls-files", "-z", "--others", "--exclude-standard"], signal),
    gitLines(
      checkout,
      ["ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory"],
      signal,
    ),
  ]);
  const skipped: SeedSkipped = {
    ignored: ignored.length,
    submodules: 0,
    missing: 0,
    excluded: 0,
    special: 0,
  };
  const files = new Set<string>();
  for (const line of staged) {
    // "<mode> <object> <stage>\t<path>"; a conflicted file has several stages.
    const tab = line.indexOf("\t");
    const path = line.slice(tab + 1);
    if (line.startsWith("160000 ")) {
      if (!files.has(path)) skipped.submodules++;
      continue;
    }
    files.add(path);
  }
  for (const path of untracked) files.add(path);
  const { count, bytes } = await copyListed(checkout, dest, files, keep, skipped);
  const seed: WorkspaceSeed = { kind: "git", source: reported, file_count: count, bytes };
  const commit = await headCommit(checkout);
  if (commit) seed.commit = commit;
  if (ref) seed.ref = ref;
  await copyRepository(checkout, join(dest, ".git"), signal);
  seed.repository = checkout;
  seed.skipped = skipped;
  return seed;
}

/**
 * A repository URL is cloned to `keepAt` (kept after the workspace is gone: `workspace
 * commit` writes its branches there), or to a temporary directory without one.
 */
async function seedFromRepoUrl(
  dest: string,
  url: string,
  ref: string | undefined,
  signal?: AbortSignal,
  keepAt?: string,
): Promise<WorkspaceSeed> {
  if (keepAt) {
    await mkdir(dirname(keepAt), { recursive: true });
    try {
      await cloneRepo(url, ref, keepAt, { signal });
      const seed = await seedFromGitCheckout(dest, keepAt, url, signal, ref);
      return seed;
    } catch (err) {
      await rm(keepAt, { recursive: true, force: true });
      throw err;
    }
  }
  const tmp = await mkdtemp(join(tmpdir(), "pyro-clone-"));
  try {
    await cloneRepo(url, ref, join(tmp, "repo"), { signal });
    const seed = await seedFromGitCheckout(dest, join(tmp, "repo"), url, signal, ref);
    delete seed.repository;
    return seed;
  } finally {
    await rm(tmp, { recursive: true, force: true });
  }
}
