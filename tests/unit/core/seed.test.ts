import { execFileSync } from "node:child_process";
import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { assertAllowed } from "../../../src/core/lifecycle.js";
import { seedInto } from "../../../src/core/seed.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "pyro-seed-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe("seeding", () => {
  it("copies a Git checkout's tracked files with their working-tree content, not untracked ones", async () => {
    const repo = join(dir, "repo");
    const git = (...a: string[]) =>
      execFileSync("git", ["-C", repo, ...a], {
        env: {
          ...process.env,
          GIT_AUTHOR_NAME: "t",
          GIT_AUTHOR_EMAIL: "t@t",
          GIT_COMMITTER_NAME: "t",
          GIT_COMMITTER_EMAIL: "t@t",
        },
      });
    execFileSync("git", ["init", "-q", repo]);
    await writeFile(join(repo, "tracked.txt"), "v1");
    git("add", ".");
    git("commit", "-qm", "init");
    await writeFile(join(repo, "tracked.txt"), "v2 (working tree)");
    await writeFile(join(repo, "untracked.txt"), "no");
    const dest = join(dir, "dest");
    const seed = await seedInto(dest, { seed_path: repo });
    expect(seed).toMatchObject({
      kind: "git",
      source: repo,
      file_count: 1,
      commit: expect.stringMatching(/^[0-9a-f]{40}$/),
    });
    expect(await readdir(dest)).toEqual(["tracked.txt"]);
    expect(await readFile(join(dest, "tracked.txt"), "utf8")).toBe("v2 (working tree)");

    const cloned = await seedInto(join(dir, "cloned"), { repo_url: repo });
    expect(cloned).toMatchObject({ kind: "git", source: repo, file_count: 1 });
    expect(await readFile(join(dir, "cloned", "tracked.txt"), "utf8")).toBe("v1");
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
