/**
 * `workspace commit`: the workspace's changes since its baseline become one commit on a
 * new branch of the seed repository on the host, parented on the seed commit.
 *
 * Everything that comes out of the sandbox is hostile. So:
 * - The set of changes is the agent's diff (gitignore-aware, `.git` left out), but every
 *   path is checked here as a Git path (no `..`, no empty or `.git` component in any
 *   case) and Git checks it again when it enters the index.
 * - Contents come as a tar of exactly those paths (tar_out with `paths`). Entries are
 *   never written under their own names: each file's bytes (or a symlink's target) go
 *   to a numbered scratch file, so the sandbox chooses no host path and no symlink is
 *   ever created or followed on the host.
 * - The commit is built with plumbing only, on a temporary index (GIT_INDEX_FILE):
 *   `read-tree` of the seed commit, `hash-object --no-filters` (no clean filters,
 *   whatever .gitattributes says), `update-index --index-info`, `write-tree`,
 *   `commit-tree`, and `update-ref` with the expected old value. No hooks run
 *   (core.hooksPath=/dev/null), no fsmonitor; the host's working tree, index, HEAD and
 *   other branches are not touched. The workspace's own `.git` (which the guest
 *   controls: config, hooks, alternates) is never read.
 */
import { mkdir, mkdtemp, open, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as tar from "tar";
import { PyroError } from "../errors.js";
import type { WorkspaceRow } from "../state/types.js";
import { run } from "../util/run.js";
import { SAFE_GIT } from "./git.js";
import type { Workspaces } from "./workspaces.js";

export interface CommitOptions {
  /** Branch to create (default `pyro/<name or id>`). */
  branch?: string | undefined;
  message?: string | undefined;
  /** Move the branch when it exists (never the branch checked out in a work tree). */
  force?: boolean | undefined;
  signal?: AbortSignal | undefined;
}

type Status = "added" | "modified" | "deleted";

const ZERO = "0".repeat(40);

/** Environment variables that would point Git elsewhere than where pyro says. */
const GIT_LOCATION_VARS = [
  "GIT_DIR",
  "GIT_WORK_TREE",
  "GIT_INDEX_FILE",
  "GIT_OBJECT_DIRECTORY",
  "GIT_ALTERNATE_OBJECT_DIRECTORIES",
  "GIT_COMMON_DIR",
  "GIT_NAMESPACE",
  "GIT_CONFIG_PARAMETERS",
  "GIT_CONFIG_COUNT",
];

/** A path as Git may store it, refusing anything a hostile sandbox could smuggle in. */
export function checkGitPath(path: string): void {
  const parts = path.split("/");
  const bad =
    path === "" ||
    path.includes("\0") ||
    parts.some(
      (p) => p === "" || p === "." || p === ".." || p.toLowerCase().replace(/[. ]+$/, "") === ".git",
    );
  if (bad)
    throw new PyroError(
      "path_outside_workspace",
      `the workspace reported a change to '${path}', which cannot be committed`,
      "paths with '..', empty parts or a .git part never go into a commit",
    );
}

/** The default branch name for a workspace: `pyro/<name or id>`. */
export function defaultBranch(w: WorkspaceRow): string {
  return `pyro/${w.name ?? w.workspace_id}`;
}

class HostGit {
  constructor(
    private readonly gitDir: string,
    private readonly cwd: string,
    private readonly signal: AbortSignal | undefined,
    private readonly extraEnv: Record<string, string> = {},
  ) {}

  env(more: Record<string, string> = {}): NodeJS.ProcessEnv {
    const env: NodeJS.ProcessEnv = { ...process.env };
    for (const v of GIT_LOCATION_VARS) delete env[v];
    return {
      ...env,
      GIT_DIR: this.gitDir,
      GIT_TERMINAL_PROMPT: "0",
      GIT_OPTIONAL_LOCKS: "0",
      ...this.extraEnv,
      ...more,
    };
  }

  async run(args: string[], options: { input?: string; env?: Record<string, string> } = {}) {
    return run([...SAFE_GIT, ...args], {
      cwd: this.cwd,
      env: this.env(options.env),
      timeoutMs: 10 * 60_000,
      maxCapture: 256 * 1024 * 1024,
      ...(options.input !== undefined ? { input: options.input } : {}),
      ...(this.signal ? { signal: this.signal } : {}),
    });
  }

  async must(
    args: string[],
    options: { input?: string; env?: Record<string, string> } = {},
  ): Promise<string> {
    const r = await this.run(args, options);
    if (r.exitCode !== 0)
      throw new PyroError(
        "conflict",
        `git ${args[0]} failed in ${this.gitDir}: ${r.stderr.trim().split("\n").pop() ?? ""}`,
      );
    return r.stdout;
  }
}

/** The absolute git directory of the repository at `top`, or a `conflict` saying why not. */
async function gitDirOf(top: string, signal?: AbortSignal): Promise<string> {
  const r = await run([...SAFE_GIT, "-C", top, "rev-parse", "--absolute-git-dir"], {
    timeoutMs: 30_000,
    ...(signal ? { signal } : {}),
  });
  if (r.exitCode !== 0 || r.stdout.trim() === "")
    throw new PyroError(
      "conflict",
      `the workspace's seed repository ${top} is no longer a Git repository`,
      "export the files with workspace export instead",
    );
  return r.stdout.trim();
}

interface Taken {
  mode: "100644" | "100755" | "120000";
  file: string;
}

/**
 * Reads the agent's tar of the changed paths, entry by entry (node-tar's parser), into
 * numbered scratch files. Only regular files and symlinks named in `wanted` are taken.
 */
async function readChanged(
  archive: string,
  scratch: string,
  wanted: Set<string>,
): Promise<Map<string, Taken>> {
  const taken = new Map<string, Taken>();
  const problems: string[] = [];
  const writes: Promise<void>[] = [];
  await tar.t({
    file: archive,
    onReadEntry: (entry) => {
      const name = entry.path.replace(/^(\.\/)+/, "");
      if (!wanted.has(name) || taken.has(name)) {
        problems.push(`an entry '${name}' that was not asked for`);
        entry.resume();
        return;
      }
      const file = join(scratch, String(taken.size));
      if (entry.type === "SymbolicLink") {
        taken.set(name, { mode: "120000", file });
        writes.push(writeFile(file, entry.linkpath ?? "", { mode: 0o600 }));
        entry.resume();
        return;
      }
      if (entry.type !== "File" && entry.type !== "OldFile" && entry.type !== "ContiguousFile") {
        problems.push(`'${name}' of type ${entry.type}`);
        entry.resume();
        return;
      }
      taken.set(name, { mode: (entry.mode ?? 0o644) & 0o100 ? "100755" : "100644", file });
      const chunks: Buffer[] = [];
      entry.on("data", (c: Buffer) => chunks.push(c));
      writes.push(
        new Promise<void>((resolve, reject) => {
          entry.on("end", () => {
            writeFile(file, Buffer.concat(chunks), { mode: 0o600 }).then(resolve, reject);
          });
          entry.on("error", reject);
        }),
      );
    },
  });
  await Promise.all(writes);
  if (problems.length > 0)
    throw new PyroError(
      "path_outside_workspace",
      `refused the workspace's files for the commit: ${problems.slice(0, 5).join("; ")}`,
      "only the changed files and symlinks are taken",
    );
  return taken;
}

/** Builds the commit; see the module comment. */
export async function commitWorkspace(ws: Workspaces, idOrName: string, options: CommitOptions = {}) {
  const w0 = await ws.get(idOrName);
  const seed = w0.workspace_seed;
  if (seed.kind !== "git" || !seed.repository || !seed.commit) {
    throw new PyroError(
      "conflict",
      `workspace ${w0.name ?? w0.workspace_id} was not seeded from a Git repository`,
      "create the workspace from a Git checkout (--seed-path) or a --repo-url to commit; otherwise use workspace export",
    );
  }
  const branch = options.branch ?? defaultBranch(w0);
  const ref = `refs/heads/${branch}`;
  const fmt = await run(["git", "check-ref-format", ref], { timeoutMs: 10_000 });
  if (fmt.exitCode !== 0 || branch.startsWith("-") || branch === "HEAD")
    throw new PyroError(
      "invalid_argument",
      `'${branch}' is not a valid branch name`,
      "see git check-ref-format",
    );
  const gitDir = await gitDirOf(seed.repository, options.signal);
  const scratch = await mkdtemp(join(tmpdir(), "pyro-commit-"));
  try {
    const git = new HostGit(gitDir, scratch, options.signal);
    // One look-up for the seed commit, its tree and the branch: "<id> <type> <size>" or "<name> missing".
    const [seedLine = "", treeLine = "", refLine = ""] = (
      await git.must(["cat-file", "--batch-check"], {
        input: `${seed.commit}^{commit}\n${seed.commit}^{tree}\n${ref}\n`,
      })
    ).split("\n");
    if (seedLine.split(" ")[1] !== "commit")
      throw new PyroError(
        "conflict",
        `the seed commit ${seed.commit.slice(0, 12)} is not in ${seed.repository}`,
        "the repository was rewritten since the workspace was created",
      );
    const seedTree = treeLine.split(" ")[0]!;
    const old = refLine.endsWith(" missing") ? "" : refLine.split(" ")[0]!;
    if (old && !options.force)
      throw new PyroError(
        "conflict",
        `branch '${branch}' already exists in ${seed.repository}`,
        "choose another --branch, or pass --force to move it",
      );
    if (old) await refuseCheckedOut(git, ref, branch);

    const changes = await ws.withAgent(w0.workspace_id, "files", async (agent, w, journal) => {
      await ws.exposeSnapshot(w, "baseline", agent);
      const d = await agent.request("diff", { base: ws.agentSnapshotPath(w, "baseline"), patch: false });
      for (const e of d.entries) checkGitPath(e.path);
      const wanted = d.entries.filter((e) => e.status !== "deleted").map((e) => e.path);
      const archive = join(scratch, "changed.tar");
      const fh = await open(archive, "wx", 0o600);
      let taken = new Map<string, Taken>();
      try {
        if (wanted.length > 0) {
          let pending = Promise.resolve();
          await agent.request(
            "tar_out",
            { path: ".", paths: wanted },
            {
              onData: (c: Buffer) => {
                pending = pending.then(() => fh.write(c).then(() => {}));
              },
              timeoutMs: 30 * 60_000,
              ...(options.signal ? { signal: options.signal } : {}),
            },
          );
          await pending;
        }
      } finally {
        await fh.close();
      }
      if (wanted.length > 0) {
        const blobs = join(scratch, "blobs");
        await mkdir(blobs, { mode: 0o700 });
        taken = await readChanged(archive, blobs, new Set(wanted));
      }
      const gone = wanted.filter((p) => !taken.has(p));
      if (gone.length > 0)
        throw new PyroError(
          "conflict",
          `the workspace changed while committing (${gone.slice(0, 3).join(", ")}${gone.length > 3 ? ", ..." : ""})`,
          "run the commit again once the workspace is quiet",
        );
      return { entries: d.entries, taken, journal, w };
    });

    // Objects: one hash-object for every file taken, in order.
    const order = [...changes.taken.entries()];
    const ids =
      order.length === 0
        ? []
        : (
            await git.must(["hash-object", "-w", "--no-filters", "--stdin-paths"], {
              input: `${order.map(([, t]) => t.file).join("\n")}\n`,
            })
          )
            .trim()
            .split("\n");
    if (ids.length !== order.length)
      throw new PyroError("conflict", "git hash-object returned the wrong count");
    const index = { GIT_INDEX_FILE: join(scratch, "index") };
    await git.must(["read-tree", seed.commit], { env: index });
    // Deletions first: a file that became a directory (or back) frees its path first.
    const lines = [
      ...changes.entries.filter((e) => e.status === "deleted").map((e) => `0 ${ZERO}\t${e.path}\0`),
      ...order.map(([path, t], i) => `${t.mode} ${ids[i]}\t${path}\0`),
    ];
    await git.must(["update-index", "-z", "--index-info"], { input: lines.join(""), env: index });
    const tree = (await git.must(["write-tree"], { env: index })).trim();
    if (tree === seedTree)
      throw new PyroError(
        "conflict",
        `workspace ${w0.name ?? w0.workspace_id} has no changes since its baseline to commit`,
        "change files first; workspace diff shows what would be committed",
      );
    const message =
      options.message ??
      `Changes from pyro workspace ${w0.name ?? w0.workspace_id}\n\nWorkspace ${w0.workspace_id} (${w0.environment} on ${w0.backend}).\n`;
    const commit = await commitTree(
      git,
      tree,
      seed.commit,
      message.endsWith("\n") ? message : `${message}\n`,
    );
    const upd = await git.run([
      "update-ref",
      "-m",
      `pyro: workspace commit ${w0.workspace_id}`,
      ref,
      commit,
      old || ZERO,
    ]);
    if (upd.exitCode !== 0)
      throw new PyroError(
        "conflict",
        `branch '${branch}' changed while committing: ${upd.stderr.trim().split("\n").pop() ?? ""}`,
        "run the commit again",
      );
    const files = changes.entries.map((e) => ({ path: e.path, status: e.status as Status }));
    changes.journal((store) =>
      store.recordEvent(w0.workspace_id, "commit", {
        branch,
        commit,
        repository: seed.repository,
        files: files.length,
        ...(old ? { replaced: old } : {}),
      }),
    );
    return {
      workspace_id: w0.workspace_id,
      branch,
      commit,
      parent: seed.commit,
      repository: seed.repository,
      replaced: old || null,
      files,
    };
  } finally {
    await rm(scratch, { recursive: true, force: true });
  }
}

/** Refuses to move a branch checked out in any work tree of the repository (its files would not follow). */
async function refuseCheckedOut(git: HostGit, ref: string, branch: string): Promise<void> {
  const list = await git.run(["worktree", "list", "--porcelain"]);
  const out = list.exitCode === 0 ? list.stdout : "";
  if (out.split("\n").some((l) => l === `branch ${ref}`))
    throw new PyroError(
      "conflict",
      `branch '${branch}' is checked out in a work tree; pyro never moves it`,
      "commit to another branch",
    );
}

/**
 * `commit-tree` as the user: the identity Git would use here; where Git has none (no
 * user.name/email anywhere), as pyro.
 */
async function commitTree(git: HostGit, tree: string, parent: string, message: string): Promise<string> {
  const argv = ["commit-tree", tree, "-p", parent, "-F", "-"];
  const first = await git.run(argv, { input: message });
  if (first.exitCode === 0) return first.stdout.trim();
  if (!/ident|tell me who you are|email/i.test(first.stderr)) await git.must(argv, { input: message });
  const pyro = { NAME: "pyro", EMAIL: "pyro@localhost" };
  const env: Record<string, string> = {};
  for (const who of ["AUTHOR", "COMMITTER"])
    for (const [k, v] of Object.entries(pyro)) env[`GIT_${who}_${k}`] = process.env[`GIT_${who}_${k}`] || v;
  return (await git.must(argv, { input: message, env })).trim();
}
