import { execFileSync } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { checkGitPath, commitWorkspace } from "../../../src/core/commit.js";
import { fakePyro } from "../../helpers/engine.js";
import { git, makeRepo, notFromGit, roundTrip } from "../../helpers/git-roundtrip.js";

let t: Awaited<ReturnType<typeof fakePyro>>;
let dir: string;
beforeAll(async () => {
  t = await fakePyro();
  dir = await mkdtemp(join(tmpdir(), "pyro-commit-"));
});
afterAll(async () => {
  await t.cleanup();
  await rm(dir, { recursive: true, force: true });
});

describe("workspace commit (fake backend, real Git repositories)", () => {
  it("round-trips created, modified, deleted, renamed, executable, binary and nested files to a new branch, leaving the host as it was", async () => {
    await roundTrip(t.pyro, join(dir, "repo"), {});
  });

  it("refuses a workspace not seeded from Git with conflict and a hint", async () => {
    await notFromGit(t.pyro, join(dir, "plain"), {});
  });

  it("commits a --repo-url workspace to the clone pyro keeps, and says where", async () => {
    const upstream = join(dir, "upstream");
    const { seedCommit } = await makeRepo(upstream);
    const w = await t.pyro.createWorkspace({ repoUrl: upstream, name: "from-url" });
    expect(w.workspace_seed.repository).toBe(join(t.home, "repos", w.workspace_id));
    await t.pyro.writeWorkspaceFile(w.workspace_id, "added.txt", "new\n");
    const c = await t.pyro.commitWorkspace(w.workspace_id);
    expect(c).toMatchObject({
      branch: "pyro/from-url",
      parent: seedCommit,
      repository: w.workspace_seed.repository,
    });
    expect(git(c.repository, "show", "pyro/from-url:added.txt")).toBe("new\n");
    // The upstream repository is untouched.
    expect(() => git(upstream, "rev-parse", "--verify", "-q", "pyro/from-url")).toThrow();
    // Nothing to commit after a reset is a conflict, not an empty commit.
    await t.pyro.resetWorkspace(w.workspace_id);
    const err = await t.pyro.commitWorkspace(w.workspace_id, { branch: "pyro/empty" }).catch((e) => e);
    expect(err.code).toBe("conflict");
    await t.pyro.deleteWorkspace(w.workspace_id);
    // The kept clone outlives the workspace: its branches are the user's.
    expect(git(c.repository, "rev-parse", "pyro/from-url").trim()).toBe(c.commit);
    execFileSync("git", ["-C", c.repository, "fsck", "--no-progress"]);
  });

  it("caps the tar of changed files a commit takes from the sandbox (F6), and streams large files whole", async () => {
    const repo = join(dir, "capped");
    await makeRepo(repo);
    const w = await t.pyro.createWorkspace({ seedPath: repo, name: "capped" });
    const big = Buffer.alloc(3 * 1024 * 1024, 0x61);
    big.write("end", big.length - 3);
    await t.pyro.writeWorkspaceFile(w.workspace_id, "big.bin", big.toString("latin1"));
    const ws = t.pyro.engine.workspaces;
    const err = await commitWorkspace(ws, w.workspace_id, {
      branch: "pyro/capped",
      max_archive_bytes: 1024 * 1024,
    }).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: "conflict" });
    expect((err as Error).message).toContain("more than 1048576 bytes");
    expect(() => git(repo, "rev-parse", "--verify", "-q", "pyro/capped")).toThrow();
    // Under the cap the same change commits, byte for byte.
    const c = await commitWorkspace(ws, w.workspace_id, {
      branch: "pyro/capped",
      max_archive_bytes: 8 * 1024 * 1024,
    });
    const blob = execFileSync("git", ["-C", repo, "cat-file", "blob", `${c.commit}:big.bin`], {
      maxBuffer: 64 * 1024 * 1024,
    });
    expect(blob.equals(Buffer.from(big.toString("latin1"), "latin1"))).toBe(true);
    await t.pyro.deleteWorkspace(w.workspace_id);
  });

  it("refuses paths a hostile agent could report: .., empty parts, .git in any case", () => {
    for (const bad of ["../x", "a/../b", "/abs", "a//b", ".git/config", "sub/.GIT/hooks/x", ".git. /x", ""]) {
      expect(() => checkGitPath(bad), bad).toThrow(
        expect.objectContaining({ code: "path_outside_workspace" }),
      );
    }
    for (const ok of ["a", "src/.gitignore", ".github/x", "a.git/b"])
      expect(() => checkGitPath(ok)).not.toThrow();
  });
});
