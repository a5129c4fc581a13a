import { PyroError } from "../errors.js";
import { run } from "../util/run.js";
import { SAFE_GIT } from "./git.js";

/**
 * Git on a host repository for `workspace commit`: one repository (GIT_DIR), a scratch
 * directory as the working directory, nothing from the caller's environment that could
 * point Git elsewhere, and SAFE_GIT's settings (no hooks, no fsmonitor, no prompts).
 */
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

export class HostGit {
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
export async function gitDirOf(top: string, signal?: AbortSignal): Promise<string> {
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

/** Refuses to move a branch checked out in any work tree of the repository (its files would not follow). */
export async function refuseCheckedOut(git: HostGit, ref: string, branch: string): Promise<void> {
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
export async function commitTree(
  git: HostGit,
  tree: string,
  parent: string,
  message: string,
): Promise<string> {
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
