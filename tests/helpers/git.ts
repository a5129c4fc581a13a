/**
 * Git for tests: one fixed identity (a commit works on a machine with no user.name),
 * a runner, and a repository made in one call. Tests that need a checkout to seed from
 * or commit to build it here rather than by hand.
 */
import { execFileSync } from "node:child_process";
import { mkdir, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";

export const GIT_ENV = {
  ...process.env,
  GIT_AUTHOR_NAME: "Test Author",
  GIT_AUTHOR_EMAIL: "author@example.invalid",
  GIT_COMMITTER_NAME: "Test Author",
  GIT_COMMITTER_EMAIL: "author@example.invalid",
};

/** Runs git in `repo` (stdout as text, untrimmed). */
export function git(repo: string, ...args: string[]): string {
  return execFileSync("git", ["-C", repo, ...args], { encoding: "utf8", env: GIT_ENV });
}

/** Runs git in `repo` (stdout as bytes). */
export function gitBytes(repo: string, ...args: string[]): Buffer {
  return execFileSync("git", ["-C", repo, ...args], { env: GIT_ENV });
}

/** An empty repository at `repo` (made if missing) on branch `main`. */
export async function initGitRepo(repo: string): Promise<void> {
  await mkdir(repo, { recursive: true });
  git(repo, "init", "-q", "-b", "main");
}

/**
 * A repository at `repo` on branch `main` whose one commit (`message`) holds `files`
 * (paths relative to it, parents made) and whatever was already in the directory.
 * Returns the commit and a runner bound to the repository.
 */
export async function makeGitRepo(
  repo: string,
  files: Record<string, string | Buffer> = {},
  message = "init",
): Promise<{ commit: string; git: (...args: string[]) => string }> {
  await initGitRepo(repo);
  for (const [rel, content] of Object.entries(files)) {
    await mkdir(dirname(join(repo, rel)), { recursive: true });
    await writeFile(join(repo, rel), content);
  }
  git(repo, "add", "-A");
  git(repo, "commit", "-q", "--allow-empty", "-m", message);
  return { commit: git(repo, "rev-parse", "HEAD").trim(), git: (...args) => git(repo, ...args) };
}
