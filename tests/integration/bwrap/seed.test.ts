import { execFileSync } from "node:child_process";
import { chmod, mkdir, readdir, rm, symlink, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  bwrapSkipReason,
  errorOf,
  type Harness,
  onPath,
  openHarness,
  suiteTitle,
  writeTree,
} from "../../helpers/sandbox.js";

/** Seeding /workspace from a plain directory and from a Git checkout, on bwrap. */
const skip = bwrapSkipReason() || (onPath("git") ? "" : "git is not installed on the host");

describe.skipIf(skip !== "")(suiteTitle("workspace seeding on bwrap", skip), () => {
  let h: Harness;
  let host: string;

  beforeAll(async () => {
    h = await openHarness("seed");
    host = await h.tempDir("seed-host");
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("copies a plain directory whole, with modes, symlinks, hidden and empty directories", async () => {
    const dir = join(host, "plain");
    const files = {
      "a.txt": "alpha\n",
      "nested/deep/b.txt": "beta\n",
      "run.sh": "#!/bin/sh\necho ran\n",
      ".hidden": "h\n",
    };
    await writeTree(dir, files);
    await chmod(join(dir, "run.sh"), 0o755);
    await symlink("a.txt", join(dir, "link"));
    await mkdir(join(dir, "empty"));

    const w = await h.create({ seedPath: dir });
    const id = w.workspace_id;
    expect(w.workspace_seed).toEqual({
      kind: "directory",
      source: dir,
      file_count: 5,
      bytes: Object.values(files).join("").length,
    });
    const r = await h.pyro.execWorkspace(
      id,
      "cat a.txt nested/deep/b.txt .hidden; ./run.sh; stat -c %a run.sh; readlink link; test -d empty && echo empty-dir",
    );
    expect(r.stdout, `workspace ${id}: ${r.stderr}`).toBe("alpha\nbeta\nh\nran\n755\na.txt\nempty-dir\n");
    expect((await h.pyro.diffWorkspace(id)).changed).toBe(false);
    // The seed is a copy: editing the workspace leaves the host directory alone.
    await h.pyro.writeWorkspaceFile(id, "a.txt", "changed inside\n");
    expect(execFileSync("cat", [join(dir, "a.txt")], { encoding: "utf8" })).toBe("alpha\n");
    await h.pyro.deleteWorkspace(id);
  });

  it("seeds a Git checkout as `git add -A` would see it: tracked files as in the working tree, untracked ones not ignored, and the repository as .git", async () => {
    const repo = join(host, "repo");
    await mkdir(repo);
    const git = (...args: string[]) =>
      execFileSync(
        "git",
        [
          "-C",
          repo,
          "-c",
          "user.name=pyro-test",
          "-c",
          "user.email=pyro-test@example.invalid",
          "-c",
          "commit.gpgsign=false",
          ...args,
        ],
        {
          encoding: "utf8",
        },
      ).trim();
    git("init", "--quiet");
    await writeTree(repo, {
      "tracked.txt": "v1 committed\n",
      "src/lib.py": "VALUE = 1\n",
      "removed.txt": "bye\n",
      ".gitignore": "*.log\n",
    });
    git("add", ".");
    git("commit", "--quiet", "-m", "initial");
    const head = git("rev-parse", "HEAD");
    await writeFile(join(repo, "tracked.txt"), "v2 from the working tree\n"); // modified, not committed
    await rm(join(repo, "removed.txt")); // tracked, deleted in the working tree
    await writeTree(repo, {
      "untracked.txt": "seeded: not ignored\n",
      "build.log": "ignored\n",
      "staged.txt": "added to the index\n",
    });
    git("add", "staged.txt");

    const w = await h.create({ seedPath: repo });
    const id = w.workspace_id;
    const seeded = {
      ".gitignore": 6,
      "src/lib.py": 10,
      "staged.txt": 19,
      "tracked.txt": 25,
      "untracked.txt": 20,
    };
    expect(w.workspace_seed).toEqual({
      kind: "git",
      source: repo,
      repository: repo,
      commit: head,
      file_count: Object.keys(seeded).length,
      bytes: Object.values(seeded).reduce((a, b) => a + b, 0),
      // build.log matches .gitignore; removed.txt is tracked but gone from the working tree.
      skipped: { ignored: 1, missing: 1, excluded: 0, special: 0, submodules: 0 },
    });
    const files = await h.pyro.listWorkspaceFiles(id, "/workspace", { recursive: true });
    expect(
      files.entries
        .filter((e) => e.artifact_type === "file" && !e.path.startsWith(".git/"))
        .map((e) => e.path),
    ).toEqual(Object.keys(seeded));
    // The repository itself, at the seed commit: Git works inside.
    const log = await h.pyro.execWorkspace(id, "git log --format=%H -1 && git status --porcelain");
    expect(log.stdout.split("\n")[0]).toBe(head);
    expect((await h.pyro.readWorkspaceFile(id, "tracked.txt")).content).toBe("v2 from the working tree\n");
    expect((await h.pyro.diffWorkspace(id)).changed).toBe(false);
    await h.pyro.deleteWorkspace(id);
  });

  it("refuses a seed path that is not a directory, creating nothing", async () => {
    const before = (await h.pyro.listWorkspaces()).count;
    const dirs = join(h.home, "workspaces");
    const dirsBefore = await readdir(dirs).catch(() => []);
    const file = join(host, "not-a-dir.txt");
    await writeFile(file, "x");
    expect((await errorOf(h.create({ seedPath: file }))).code).toBe("invalid_argument");
    expect((await errorOf(h.create({ seedPath: join(host, "missing") }))).code).toBe("invalid_argument");
    expect((await h.pyro.listWorkspaces()).count).toBe(before);
    expect(await readdir(dirs).catch(() => [])).toEqual(dirsBefore);
  });
});
