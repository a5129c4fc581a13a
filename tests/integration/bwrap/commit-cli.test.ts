import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { pyro as cli } from "../../helpers/cli.js";
import { git as gitIn, makeGitRepo } from "../../helpers/git.js";
import { bwrapSkipReason, type Harness, openHarness, suiteTitle } from "../../helpers/sandbox.js";

/** `pyro workspace commit` as a user types it, on bwrap: --json, human output, refusals as one line. */
const skip = bwrapSkipReason();
const git = (repo: string, ...a: string[]) => gitIn(repo, ...a).trim();

describe.skipIf(skip !== "")(suiteTitle("pyro workspace commit on bwrap", skip), () => {
  let h: Harness;
  let env: NodeJS.ProcessEnv;
  let dir: string;
  beforeAll(async () => {
    h = await openHarness("commit");
    env = { ...h.cliEnv, PYRO_BACKEND: "bwrap" };
    dir = await mkdtemp(join(tmpdir(), "pyro-commit-cli-"));
  });
  afterAll(async () => {
    await h?.cleanup();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it("commits to a new branch with --json and in words, refuses a bad or existing branch in one line, and --force moves it", async () => {
    const repo = join(dir, "repo");
    const { commit: seed } = await makeGitRepo(repo, { "a.txt": "one\n" }, "seed");
    const id = cli(
      ["workspace", "create", "debian:12", "--seed-path", repo, "--name", "cli-commit", "--id-only"],
      env,
    ).stdout.trim();
    expect(id).toMatch(/^ws_/);
    expect(
      cli(["workspace", "exec", id, "--", "sh", "-c", "echo two > a.txt && chmod +x a.txt"], env).code,
    ).toBe(0);

    const r = cli(["workspace", "commit", id, "--message", "Two", "--json"], env);
    expect(r.code, r.stderr).toBe(0);
    expect(r.json()).toMatchObject({
      branch: "pyro/cli-commit",
      parent: seed,
      repository: repo,
      files: [{ path: "a.txt", status: "modified" }],
    });
    expect(git(repo, "ls-tree", "pyro/cli-commit", "a.txt").split(" ")[0]).toBe("100755");

    const again = cli(["workspace", "commit", id], env);
    expect(again.code).toBe(1);
    expect(again.stderr).toMatch(/^pyro: error \[conflict\]: branch 'pyro\/cli-commit' already exists/);
    expect(again.stdout).toBe("");

    const bad = cli(["workspace", "commit", id, "--branch", "a..b", "--json"], env);
    expect(bad.code).toBe(1);
    expect(bad.json().error.code).toBe("invalid_argument");

    const forced = cli(["workspace", "commit", id, "--force", "--branch", "pyro/cli-commit"], env);
    expect(forced.code, forced.stderr).toBe(0);
    expect(forced.stdout).toMatch(
      /^committed 1 changed file\(s\) as [0-9a-f]{12} on branch pyro\/cli-commit \(was /,
    );
    expect(git(repo, "rev-parse", "HEAD")).toBe(seed);
    expect(cli(["workspace", "delete", id], env).code).toBe(0);
  });
});
