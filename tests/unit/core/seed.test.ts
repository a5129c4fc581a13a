import { execFileSync } from "node:child_process";
import { lstat, mkdir, mkdtemp, readdir, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { assertAllowed } from "../../../src/core/lifecycle.js";
import { seedInto } from "../../../src/core/seed.js";
import { makeGitRepo } from "../../helpers/git.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "pyro-seed-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe("seeding", () => {
  it("copies a Git checkout's tracked and untracked-not-ignored files, its repository, and counts what it left out", async () => {
    const repo = join(dir, "repo");
    const { git } = await makeGitRepo(repo, {
      "tracked.txt": "v1",
      "gone.txt": "tracked, then deleted",
      ".gitignore": "*.pyc\nbuild/\n",
    });
    git("config", "remote.origin.url", "https://user:token@example.invalid/r.git");
    await writeFile(join(repo, "tracked.txt"), "v2 (working tree)");
    await writeFile(join(repo, "untracked.txt"), "yes");
    await writeFile(join(repo, "x.pyc"), "ignored");
    await mkdir(join(repo, "build"));
    await writeFile(join(repo, "build", "out"), "ignored dir");
    await rm(join(repo, "gone.txt"));
    const dest = join(dir, "dest");
    const seed = await seedInto(dest, { seed_path: repo });
    expect(seed).toMatchObject({
      kind: "git",
      source: repo,
      repository: repo,
      file_count: 3,
      commit: expect.stringMatching(/^[0-9a-f]{40}$/),
      skipped: { ignored: 2, submodules: 0, missing: 1, excluded: 0, special: 0 },
    });
    expect((await readdir(dest)).sort()).toEqual([".git", ".gitignore", "tracked.txt", "untracked.txt"]);
    expect(await readFile(join(dest, "tracked.txt"), "utf8")).toBe("v2 (working tree)");
    // Git works inside: HEAD on the checkout's branch at its commit, the seed's changes
    // show as changes, and the host's remotes (and their credentials) stay behind.
    const inside = (...a: string[]) => execFileSync("git", ["-C", dest, ...a], { encoding: "utf8" });
    expect(inside("rev-parse", "HEAD").trim()).toBe(seed.commit);
    expect(inside("symbolic-ref", "HEAD").trim()).toBe("refs/heads/main");
    expect(inside("status", "--porcelain").split("\n").filter(Boolean).sort()).toEqual([
      " D gone.txt",
      " M tracked.txt",
      "?? untracked.txt",
    ]);
    expect(inside("remote").trim()).toBe("");
    expect(git("status", "--porcelain").split("\n").filter(Boolean).sort()).toEqual([
      " D gone.txt",
      " M tracked.txt",
      "?? untracked.txt",
    ]);

    const cloned = await seedInto(join(dir, "cloned"), { repo_url: repo }, undefined, [], join(dir, "kept"));
    expect(cloned).toMatchObject({ kind: "git", source: repo, repository: join(dir, "kept"), file_count: 3 });
    expect(await readFile(join(dir, "cloned", "tracked.txt"), "utf8")).toBe("v1");
    expect(await readFile(join(dir, "kept", "tracked.txt"), "utf8")).toBe("v1");
  });

  it("runs nothing the seed's own Git config names (core.fsmonitor, hooks) while reading it", async () => {
    const repo = join(dir, "hostile");
    const { git } = await makeGitRepo(repo, { "a.txt": "a" });
    // A seed directory whose .git came from somewhere untrusted (an archive, an export).
    const marker = join(dir, "PWNED");
    git("config", "core.fsmonitor", `touch ${marker}`);
    await mkdir(join(repo, ".git", "hooks"), { recursive: true });
    await writeFile(join(repo, ".git", "hooks", "post-checkout"), `#!/bin/sh\ntouch ${marker}\n`, {
      mode: 0o755,
    });
    await writeFile(join(repo, "untracked.txt"), "u");
    const seed = await seedInto(join(dir, "dest-hostile"), { seed_path: repo });
    expect(seed).toMatchObject({ kind: "git", file_count: 2 });
    expect(await readdir(dir)).not.toContain("PWNED");
  });

  it("does not read a listed file through a directory that became a symlink out of the checkout", async () => {
    const repo = join(dir, "swapped");
    await makeGitRepo(repo, { "d/secret.txt": "committed", "ok.txt": "ok" });
    // The index still lists d/secret.txt; the working tree's d now leads outside.
    const outside = join(dir, "host-secrets");
    await mkdir(outside);
    await writeFile(join(outside, "secret.txt"), "a host file");
    await rm(join(repo, "d"), { recursive: true });
    await symlink(outside, join(repo, "d"));
    const dest = join(dir, "dest-swapped");
    await seedInto(dest, { seed_path: repo });
    expect(await readFile(join(dest, "ok.txt"), "utf8")).toBe("ok");
    // d is seeded as what it is now, a link (whose target the sandbox cannot see): never a
    // directory holding the host file's bytes.
    expect((await lstat(join(dest, "d"))).isSymbolicLink()).toBe(true);
  });

  it("copies a plain directory whole, and an absent seed gives an empty workspace", async () => {
    const src = join(dir, "plain");
    await (await import("node:fs/promises")).mkdir(join(src, "sub"), { recursive: true });
    await writeFile(join(src, "sub", "a"), "a");
    expect(await seedInto(join(dir, "d1"), { seed_path: src })).toMatchObject({
      kind: "directory",
      file_count: 1,
      bytes: 1,
    });
    expect(await seedInto(join(dir, "d2"), {})).toEqual({
      kind: "empty",
      source: null,
      file_count: 0,
      bytes: 0,
    });
    await expect(seedInto(join(dir, "d3"), { seed_path: join(dir, "missing") })).rejects.toMatchObject({
      code: "invalid_argument",
    });
  });
});

describe("lifecycle", () => {
  it("refuses exec on a stopped workspace with workspace_stopped and other wrong states with conflict", () => {
    expect(() => assertAllowed("stopped", "exec", "ws_1")).toThrow(
      expect.objectContaining({ code: "workspace_stopped" }),
    );
    expect(() => assertAllowed("creating", "exec", "ws_1")).toThrow(
      expect.objectContaining({ code: "conflict" }),
    );
    expect(() => assertAllowed("running", "exec", "ws_1")).not.toThrow();
    expect(() => assertAllowed("stopped", "reset", "ws_1")).not.toThrow();
  });
});

describe("seeding a directory that holds pyro's own files", () => {
  it("refuses a seed inside pyro's home instead of seeding an empty workspace", async () => {
    const { fakePyro, codeOf } = await import("../../helpers/engine.js");
    const t = await fakePyro();
    try {
      const inside = join(t.home, "project");
      await mkdir(inside, { recursive: true });
      await writeFile(join(inside, "app.py"), "print(1)\n");
      expect(await codeOf(t.pyro.createWorkspace({ seedPath: inside }))).toBe("invalid_argument");
      expect((await t.pyro.listWorkspaces()).count).toBe(0);
    } finally {
      await t.cleanup();
    }
  });

  it("leaves out the pyro home (other workspaces, the baseline being written) and the secrets key", async () => {
    // `pyro workspace create --seed-path ~` with the default home under ~/.cache: the copy
    // once failed ("cannot copy to a subdirectory of self") and would have carried every
    // other workspace's files and the secrets key into the new one.
    const { fakePyro } = await import("../../helpers/engine.js");
    const t = await fakePyro();
    try {
      const user = join(dir, "user");
      await mkdir(join(user, "project"), { recursive: true });
      await writeFile(join(user, "project", "app.py"), "print(1)\n");
      const { Pyro } = await import("../../../src/sdk/pyro.js");
      const { FakeBuilder } = await import("../../helpers/fake-builder.js");
      const pyro = new Pyro({
        home: join(user, ".cache", "pyro"),
        environmentsDir: join(user, ".cache", "pyro", "environments"),
        builders: [new FakeBuilder()],
        backends: { bwrap: t.backend },
        env: { PYRO_BACKEND: "bwrap", XDG_CONFIG_HOME: join(user, ".config") },
      });
      try {
        const other = await pyro.createWorkspace({ secrets: { TOKEN: "other-s3cret" } });
        await pyro.writeWorkspaceFile(other.workspace_id, "private.txt", "other workspace's\n");
        const w = await pyro.createWorkspace({ seedPath: user });
        const files = (
          await pyro.listWorkspaceFiles(w.workspace_id, "/workspace", { recursive: true })
        ).entries.map((e: { path: string }) => e.path);
        expect(files).toContain("project/app.py");
        // ~/.cache stays (other programs' caches are the user's files); pyro's home in it does not.
        expect(
          files.filter((p: string) => p.startsWith(".cache/pyro") || p.startsWith(".config/pyro/secrets")),
        ).toEqual([]);
        expect(files.some((p: string) => p.startsWith(".config/pyro"))).toBe(true);
      } finally {
        await pyro.close();
      }
    } finally {
      await t.cleanup();
    }
  });
});
