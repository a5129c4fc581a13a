import { resolve } from "node:path";
import { PyroError } from "../errors.js";
import { run, which } from "../util/run.js";

/**
 * The host-side Git that seeding needs, in one place (workspace seeds from a checkout or
 * a URL, and the MCP server's default seed from its checkout or --repo-url).
 */

/** A full commit id or an abbreviation: cannot be cloned with --branch. */
const COMMIT = /^[0-9a-f]{7,40}$/;

/** The top directory (absolute) of the Git checkout containing `dir`, or null (also without git). */
export async function gitToplevel(dir: string): Promise<string | null> {
  if (!(await which("git"))) return null;
  const r = await run([...SAFE_GIT, "-C", dir, "rev-parse", "--show-toplevel"], { timeoutMs: 10_000 });
  return r.exitCode === 0 && r.stdout.trim() !== "" ? resolve(r.stdout.trim()) : null;
}

/** HEAD's commit of a checkout, or undefined. */
export async function headCommit(dir: string): Promise<string | undefined> {
  const head = await run([...SAFE_GIT, "-C", dir, "rev-parse", "HEAD"], { timeoutMs: 10_000 });
  return head.exitCode === 0 ? head.stdout.trim() : undefined;
}

/**
 * Clones `url` into `dest` (which must not exist) at `ref`: a branch or tag is cloned
 * shallow (`--depth 1 --branch`), as is the default branch; a commit id is cloned fully
 * and checked out detached. Never prompts for credentials. Returns HEAD's commit.
 * Failures are `invalid_argument` naming the URL and Git's last line; `hint` says where
 * the URL came from.
 */
export async function cloneRepo(
  url: string,
  ref: string | undefined,
  dest: string,
  options: { signal?: AbortSignal | undefined; hint?: string } = {},
): Promise<{ commit: string | undefined }> {
  if (!(await which("git")))
    throw new PyroError(
      "invalid_argument",
      "git is not installed on the host",
      "install git to clone a repository",
    );
  const env = { ...process.env, GIT_TERMINAL_PROMPT: "0" };
  const signal = options.signal ? { signal: options.signal } : {};
  const isCommit = ref !== undefined && COMMIT.test(ref);
  const argv: string[] = [...SAFE_GIT, "clone", "--quiet", "--no-hardlinks"];
  if (!isCommit) argv.push("--depth", "1", ...(ref ? ["--branch", ref] : []));
  argv.push("--", url, dest);
  const r = await run(argv, { timeoutMs: 10 * 60_000, env, ...signal });
  if (r.exitCode !== 0)
    throw new PyroError(
      "invalid_argument",
      `cannot clone ${url}${ref ? ` at ${ref}` : ""}: ${lastLine(r.stderr)}`,
      options.hint,
    );
  if (isCommit) {
    const co = await run([...SAFE_GIT, "-C", dest, "checkout", "--quiet", "--detach", ref], {
      timeoutMs: 60_000,
      env,
      ...signal,
    });
    if (co.exitCode !== 0)
      throw new PyroError(
        "invalid_argument",
        `cannot check out ${ref}: ${lastLine(co.stderr)}`,
        options.hint,
      );
  }
  return { commit: await headCommit(dest) };
}

/**
 * Git run by pyro on a host repository: never a hook, never an fsmonitor daemon, never
 * a credential or terminal prompt, never a pager. (Repository config is the user's own
 * and otherwise honoured.)
 */
export const SAFE_GIT = ["git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false"] as const;
const QUIET_ENV = { GIT_TERMINAL_PROMPT: "0", GIT_PAGER: "cat", GIT_OPTIONAL_LOCKS: "0" };

/**
 * Puts the repository of `checkout` at `dest` (a new `.git` directory) so Git works in a
 * workspace: a bare, local clone without hard links (nothing shared with the host's
 * object files, which the sandbox could otherwise write through), turned non-bare, HEAD
 * on the checkout's branch (or detached at its commit), the index at HEAD's tree (files
 * the seed changed show as modified inside). It has no remotes: the host's remote URLs
 * and credentials stay on the host. The host repository is only read.
 */
export async function copyRepository(checkout: string, dest: string, signal?: AbortSignal): Promise<void> {
  const opts = {
    timeoutMs: 30 * 60_000,
    env: { ...process.env, ...QUIET_ENV },
    ...(signal ? { signal } : {}),
  };
  const must = async (argv: string[], what: string) => {
    const r = await run(argv, opts);
    if (r.exitCode !== 0)
      throw new PyroError(
        "invalid_argument",
        `cannot copy the repository of ${checkout} (${what}): ${lastLine(r.stderr)}`,
      );
    return r.stdout.trim();
  };
  const gitDir = [...SAFE_GIT, `--git-dir=${dest}`];
  await must([...SAFE_GIT, "clone", "--quiet", "--bare", "--no-hardlinks", "--", checkout, dest], "clone");
  await must([...gitDir, "config", "core.bare", "false"], "config");
  await run([...gitDir, "remote", "remove", "origin"], opts);
  const branch = await run([...SAFE_GIT, "-C", checkout, "symbolic-ref", "-q", "HEAD"], opts);
  const commit = await headCommit(checkout);
  if (branch.exitCode === 0 && branch.stdout.trim() !== "")
    await must([...gitDir, "symbolic-ref", "HEAD", branch.stdout.trim()], "HEAD");
  else if (commit) await must([...gitDir, "update-ref", "--no-deref", "HEAD", commit], "HEAD");
  if (commit) await must([...gitDir, "read-tree", commit], "index");
}

function lastLine(text: string): string {
  return text.trim().split("\n").pop() ?? "";
}
