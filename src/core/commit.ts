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
import { createWriteStream } from "node:fs";
import { mkdir, mkdtemp, open, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as tar from "tar";
import { PyroError } from "../errors.js";
import type { WorkspaceRow, WorkspaceSeed } from "../state/types.js";
import { run } from "../util/run.js";
import { commitTree, gitDirOf, HostGit, refuseCheckedOut } from "./host-git.js";
import type { Workspaces } from "./workspaces.js";

export interface CommitOptions {
  /** Branch to create (default `pyro/<name or id>`). */
  branch?: string | undefined;
  message?: string | undefined;
  /** Move the branch when it exists (never the branch checked out in a work tree). */
  force?: boolean | undefined;
  signal?: AbortSignal | undefined;
  /** The most bytes the sandbox's tar of the changed files may have (default COMMIT_ARCHIVE_MAX_BYTES). */
  max_archive_bytes?: number | undefined;
}

/**
 * The largest tar of changed files a commit takes from the sandbox (it lands in the
 * host's temporary directory): a workspace cannot fill the host's disk through a commit.
 */
export const COMMIT_ARCHIVE_MAX_BYTES = 4 * 1024 ** 3;

type Status = "added" | "modified" | "deleted";

const ZERO = "0".repeat(40);

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
  // Failures are collected by Promise.all after the parse; none is unhandled meanwhile.
  const track = (p: Promise<void>) => {
    p.catch(() => {});
    writes.push(p);
  };
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
        track(writeFile(file, entry.linkpath ?? "", { mode: 0o600 }));
        entry.resume();
        return;
      }
      if (entry.type !== "File" && entry.type !== "OldFile" && entry.type !== "ContiguousFile") {
        problems.push(`'${name}' of type ${entry.type}`);
        entry.resume();
        return;
      }
      taken.set(name, { mode: (entry.mode ?? 0o644) & 0o100 ? "100755" : "100644", file });
      // Streamed to its scratch file: a large file is never held in memory whole.
      const out = createWriteStream(file, { mode: 0o600, flags: "wx" });
      track(
        new Promise<void>((resolve, reject) => {
          out.on("finish", resolve);
          out.on("error", (err) => {
            // Keep the parser going (it waits for the entry to drain); the error fails the commit.
            entry.unpipe(out);
            entry.resume();
            reject(err);
          });
          entry.on("error", reject);
        }),
      );
      entry.pipe(out);
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

interface Preflight {
  w: WorkspaceRow;
  seed: Required<Pick<WorkspaceSeed, "commit" | "repository">>;
  branch: string;
  ref: string;
  seedTree: string;
  /** The branch's commit when it exists (only with force), else "". */
  old: string;
}

/** Everything checked before the sandbox is asked for anything: seed, name, repository, branch. */
async function preflight(ws: Workspaces, idOrName: string, options: CommitOptions) {
  const w = await ws.get(idOrName);
  const seed = w.workspace_seed;
  if (seed.kind !== "git" || !seed.repository || !seed.commit) {
    throw new PyroError(
      "conflict",
      `workspace ${w.name ?? w.workspace_id} was not seeded from a Git repository`,
      "create the workspace from a Git checkout ({action}) or a repository URL to commit; otherwise export its files",
      { action: { cli: "--seed-path", tool: "seed_path" } },
    );
  }
  const branch = options.branch ?? defaultBranch(w);
  const ref = `refs/heads/${branch}`;
  const fmt = await run(["git", "check-ref-format", ref], { timeoutMs: 10_000 });
  if (fmt.exitCode !== 0 || branch.startsWith("-") || branch === "HEAD")
    throw new PyroError(
      "invalid_argument",
      `'${branch}' is not a valid branch name`,
      "see git check-ref-format",
    );
  const gitDir = await gitDirOf(seed.repository, options.signal);
  return { w, seed: { commit: seed.commit, repository: seed.repository }, branch, ref, gitDir };
}

/** The seed commit's tree and the branch's current commit, in one look-up; refusals as in the module comment. */
async function lookUp(git: HostGit, p: Omit<Preflight, "seedTree" | "old">, force: boolean) {
  // "<id> <type> <size>" or "<name> missing", one line per name.
  const [seedLine = "", treeLine = "", refLine = ""] = (
    await git.must(["cat-file", "--batch-check"], {
      input: `${p.seed.commit}^{commit}\n${p.seed.commit}^{tree}\n${p.ref}\n`,
    })
  ).split("\n");
  if (seedLine.split(" ")[1] !== "commit")
    throw new PyroError(
      "conflict",
      `the seed commit ${p.seed.commit.slice(0, 12)} is not in ${p.seed.repository}`,
      "the repository was rewritten since the workspace was created",
    );
  const old = refLine.endsWith(" missing") ? "" : refLine.split(" ")[0]!;
  if (old && !force)
    throw new PyroError(
      "conflict",
      `branch '${p.branch}' already exists in ${p.seed.repository}`,
      "choose another branch, or move it with {action}",
      { action: { cli: "--force", tool: "force: true" } },
    );
  if (old) await refuseCheckedOut(git, p.ref, p.branch);
  return { seedTree: treeLine.split(" ")[0]!, old };
}

/**
 * The changed paths (the agent's diff against the baseline) and the contents of those not
 * deleted (a tar of exactly them, read into numbered files under `scratch`).
 */
async function takeChanges(
  ws: Workspaces,
  id: string,
  scratch: string,
  signal: AbortSignal | undefined,
  maxBytes: number,
) {
  return ws.withAgent(id, "files", async (agent, w, journal) => {
    await ws.exposeSnapshot(w, "baseline", agent);
    const d = await agent.request("diff", { base: ws.agentSnapshotPath(w, "baseline"), patch: false });
    for (const e of d.entries) checkGitPath(e.path);
    const wanted = d.entries.filter((e) => e.status !== "deleted").map((e) => e.path);
    let taken = new Map<string, Taken>();
    if (wanted.length > 0) {
      const archive = join(scratch, "changed.tar");
      const fh = await open(archive, "wx", 0o600);
      // Past maxBytes the request is cancelled (the agent stops sending) and nothing more is written.
      const tooLarge = new AbortController();
      let received = 0;
      let pending = Promise.resolve();
      try {
        await agent
          .request(
            "tar_out",
            { path: ".", paths: wanted },
            {
              onData: (c: Buffer) => {
                if (tooLarge.signal.aborted) return;
                received += c.length;
                if (received > maxBytes) {
                  tooLarge.abort();
                  return;
                }
                pending = pending.then(() => fh.write(c).then(() => {}));
              },
              timeoutMs: 30 * 60_000,
              signal: signal ? AbortSignal.any([signal, tooLarge.signal]) : tooLarge.signal,
            },
          )
          .catch((err: unknown) => {
            if (tooLarge.signal.aborted && !signal?.aborted)
              throw new PyroError(
                "conflict",
                `the workspace's changed files come to more than ${formatLimit(maxBytes)}, the most a commit takes`,
                "leave large build outputs out (.gitignore) and commit again; workspace export copies large trees",
              );
            throw err;
          });
        await pending;
      } finally {
        // Writes still queued when the request failed finish before the file closes.
        await pending.catch(() => {});
        await fh.close();
      }
      await mkdir(join(scratch, "blobs"), { mode: 0o700 });
      taken = await readChanged(archive, join(scratch, "blobs"), new Set(wanted));
    }
    const gone = wanted.filter((p) => !taken.has(p));
    if (gone.length > 0)
      throw new PyroError(
        "conflict",
        `the workspace changed while committing (${gone.slice(0, 3).join(", ")}${gone.length > 3 ? ", ..." : ""})`,
        "run the commit again once the workspace is quiet",
      );
    return { entries: d.entries, taken, journal };
  });
}

function formatLimit(bytes: number): string {
  return bytes >= 1024 ** 3 ? `${(bytes / 1024 ** 3).toFixed(0)} GiB` : `${bytes} bytes`;
}

/** The tree of the seed commit with the changes applied, built on a temporary index. */
async function buildTree(
  git: HostGit,
  scratch: string,
  seedCommit: string,
  entries: readonly { path: string; status: string }[],
  taken: Map<string, Taken>,
): Promise<string> {
  // Objects: one hash-object for every file taken, in order.
  const order = [...taken.entries()];
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
  await git.must(["read-tree", seedCommit], { env: index });
  // Deletions first: a file that became a directory (or back) frees its path first.
  const lines = [
    ...entries.filter((e) => e.status === "deleted").map((e) => `0 ${ZERO}\t${e.path}\0`),
    ...order.map(([path, t], i) => `${t.mode} ${ids[i]}\t${path}\0`),
  ];
  await git.must(["update-index", "-z", "--index-info"], { input: lines.join(""), env: index });
  return (await git.must(["write-tree"], { env: index })).trim();
}

/** Builds the commit; see the module comment. */
export async function commitWorkspace(ws: Workspaces, idOrName: string, options: CommitOptions = {}) {
  const p = await preflight(ws, idOrName, options);
  const { w, seed, branch, ref } = p;
  const label = w.name ?? w.workspace_id;
  const scratch = await mkdtemp(join(tmpdir(), "pyro-commit-"));
  try {
    const git = new HostGit(p.gitDir, scratch, options.signal);
    const { seedTree, old } = await lookUp(git, p, options.force === true);
    const changes = await takeChanges(
      ws,
      w.workspace_id,
      scratch,
      options.signal,
      options.max_archive_bytes ?? COMMIT_ARCHIVE_MAX_BYTES,
    );
    const tree = await buildTree(git, scratch, seed.commit, changes.entries, changes.taken);
    if (tree === seedTree)
      throw new PyroError(
        "conflict",
        `workspace ${label} has no changes since its baseline to commit`,
        "change files first; workspace diff shows what would be committed",
      );
    const message =
      options.message ??
      `Changes from pyro workspace ${label}\n\nWorkspace ${w.workspace_id} (${w.environment} on ${w.backend}).\n`;
    const commit = await commitTree(
      git,
      tree,
      seed.commit,
      message.endsWith("\n") ? message : `${message}\n`,
    );
    const upd = await git.run([
      "update-ref",
      "-m",
      `pyro: workspace commit ${w.workspace_id}`,
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
      store.recordEvent(w.workspace_id, "commit", {
        branch,
        commit,
        repository: seed.repository,
        files: files.length,
        ...(old ? { replaced: old } : {}),
      }),
    );
    return {
      workspace_id: w.workspace_id,
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
