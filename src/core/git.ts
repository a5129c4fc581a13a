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
  const r = await run(["git", "-C", dir, "rev-parse", "--show-toplevel"], { timeoutMs: 10_000 });
  return r.exitCode === 0 && r.stdout.trim() !== "" ? resolve(r.stdout.trim()) : null;
}

/** HEAD's commit of a checkout, or undefined. */
export async function headCommit(dir: string): Promise<string | undefined> {
  const head = await run(["git", "-C", dir, "rev-parse", "HEAD"], { timeoutMs: 10_000 });
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
  const argv = ["git", "clone", "--quiet", "--no-hardlinks"];
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
    const co = await run(["git", "-C", dest, "checkout", "--quiet", "--detach", ref], {
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

function lastLine(text: string): string {
  return text.trim().split("\n").pop() ?? "";
}
