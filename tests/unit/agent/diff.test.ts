import { execFileSync } from "node:child_process";
import { chmod, cp, mkdir, readFile, rm, symlink, truncate, writeFile } from "node:fs/promises";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { AgentError } from "../../../src/agent/errors.js";
import { MAX_DIFF_FILE_BYTES } from "../../../src/agent/guest/ops/diff.js";
import { type AgentFixture, startAgent } from "./helpers.js";

let fx: AgentFixture;
let base: string;
beforeEach(async () => {
  fx = await startAgent();
  await mkdir(path.join(fx.root, "src"));
  await writeFile(path.join(fx.root, "src/app.py"), "line1\nline2\nline3\n");
  await writeFile(path.join(fx.root, "gone.txt"), "remove me\n");
  await writeFile(path.join(fx.root, "same.txt"), "unchanged\n");
  await writeFile(path.join(fx.root, "logo.bin"), Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x00, 0xff]));
  await symlink("src/app.py", path.join(fx.root, "link"));
  base = path.join(fx.outside, "baseline");
  await cp(fx.root, base, { recursive: true, verbatimSymlinks: true });
});
afterEach(() => fx.cleanup());

describe("diff", () => {
  it("reports no change against an identical baseline", async () => {
    const r = await fx.client.request("diff", { base });
    expect(r).toEqual({
      changed: false,
      patch: "",
      summary: { total: 0, added: 0, modified: 0, deleted: 0 },
      entries: [],
      truncated: false,
    });
  });

  it("lists added, modified, deleted and binary changes with a unified diff", async () => {
    await writeFile(path.join(fx.root, "src/app.py"), "line1\nLINE2\nline3\n");
    await rm(path.join(fx.root, "gone.txt"));
    await writeFile(path.join(fx.root, "src/new.py"), "print('new')\n");
    await writeFile(path.join(fx.root, "logo.bin"), Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x00, 0xfe]));
    await rm(path.join(fx.root, "link"));
    await symlink("same.txt", path.join(fx.root, "link"));
    const r = await fx.client.request("diff", { base });
    expect(r.changed).toBe(true);
    expect(r.entries).toEqual([
      { path: "gone.txt", status: "deleted" },
      { path: "link", status: "modified" },
      { path: "logo.bin", status: "modified" },
      { path: "src/app.py", status: "modified" },
      { path: "src/new.py", status: "added" },
    ]);
    expect(r.summary).toEqual({ total: 5, added: 1, modified: 3, deleted: 1 });
    expect(r.patch).toContain(
      "diff --git a/src/app.py b/src/app.py\n--- a/src/app.py\n+++ b/src/app.py\n@@ -1,3 +1,3 @@\n line1\n-line2\n+LINE2\n line3\n",
    );
    expect(r.patch).toContain(
      "diff --git a/src/new.py b/src/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/src/new.py\n",
    );
    expect(r.patch).toContain(
      "deleted file mode 100644\n--- a/gone.txt\n+++ /dev/null\n@@ -1,1 +0,0 @@\n-remove me\n",
    );
    expect(r.patch).toMatch(
      /diff --git a\/logo.bin b\/logo.bin\nindex [0-9a-f]{40}\.\.[0-9a-f]{40} 100644\nGIT binary patch\nliteral 6\n/,
    );
    expect(r.patch).toContain("-src/app.py\n\\ No newline at end of file\n+same.txt\n");
  });

  it("produces a patch that patch_apply can replay onto the baseline", async () => {
    await writeFile(path.join(fx.root, "src/app.py"), "line1\nline2 changed\nline3\nline4\n");
    await rm(path.join(fx.root, "gone.txt"));
    await mkdir(path.join(fx.root, "docs"));
    await writeFile(path.join(fx.root, "docs/readme.md"), "# hi\n");
    const { patch } = await fx.client.request("diff", { base });
    // Replay on a second agent whose root is a copy of the baseline.
    const other = await startAgent();
    try {
      await rm(other.root, { recursive: true });
      await cp(base, other.root, { recursive: true, verbatimSymlinks: true });
      await other.client.request("patch_apply", { patch });
      const again = await fx.client.request("diff", { base: other.root });
      expect(again.changed).toBe(false);
    } finally {
      await other.cleanup();
    }
  });

  it("renders a file too big to read whole as a binary change, compares big ones in chunks, and never reads one whole", async () => {
    // Sparse: a 3 GiB file costs no disk. Read whole, it failed the call (Node reads at
    // most 2 GiB at once); under 2 GiB it took the agent past a workspace's memory.
    const sparse = async (file: string, size: number) => {
      await writeFile(file, "");
      await truncate(file, size);
    };
    await sparse(path.join(fx.root, "huge.img"), 3 * 1024 ** 3);
    const big = 20 * 1024 * 1024;
    for (const dir of [fx.root, base]) {
      await sparse(path.join(dir, "same.img"), big);
      await sparse(path.join(dir, "moved.img"), big);
    }
    await writeFile(path.join(fx.root, "moved.img"), "x", { flag: "r+" });
    const r = await fx.client.request("diff", { base });
    expect(r.entries).toEqual([
      { path: "huge.img", status: "added" },
      { path: "moved.img", status: "modified" },
    ]);
    expect(r.patch).toContain(
      "diff --git a/huge.img b/huge.img\nnew file mode 100644\nBinary files /dev/null and b/huge.img differ\n",
    );
    expect(r.patch).toContain("Binary files a/moved.img and b/moved.img differ\n");
    expect(MAX_DIFF_FILE_BYTES).toBeLessThan(big);
  });

  it("refuses a relative, missing or overlapping baseline", async () => {
    const codes = await Promise.all(
      ["baseline", path.join(fx.outside, "nope"), fx.root, path.join(fx.root, "src")].map((b) =>
        fx.client.request("diff", { base: b }).then(
          () => "ok",
          (e: AgentError) => e.code,
        ),
      ),
    );
    expect(codes).toEqual(["invalid_argument", "not_found", "invalid_argument", "invalid_argument"]);
  });

  it("leaves out .git and what the workspace's .gitignore files ignore, and sees edits to them", async () => {
    await mkdir(path.join(fx.root, ".git"));
    await writeFile(path.join(fx.root, ".git/index"), "guest git state");
    await mkdir(path.join(fx.root, "src/__pycache__"));
    await writeFile(path.join(fx.root, "src/__pycache__/app.cpython-311.pyc"), Buffer.from([0, 1, 2]));
    await writeFile(path.join(fx.root, ".gitignore"), "__pycache__/\n*.log\n!keep.log\n");
    await writeFile(path.join(fx.root, "build.log"), "noise\n");
    await writeFile(path.join(fx.root, "keep.log"), "kept\n");
    await writeFile(path.join(fx.root, "src/.gitignore"), "local.txt\n");
    await writeFile(path.join(fx.root, "src/local.txt"), "ignored below src\n");
    await writeFile(path.join(fx.root, "local.txt"), "not ignored at the root\n");
    // A baseline file that now matches a pattern is still compared (Git: tracked).
    await writeFile(path.join(fx.root, "same.log"), "x\n");
    await cp(path.join(fx.root, "same.log"), path.join(base, "same.log"));
    await writeFile(path.join(fx.root, "same.log"), "changed\n");
    const r = await fx.client.request("diff", { base });
    expect(r.entries).toEqual([
      { path: ".gitignore", status: "added" },
      { path: "keep.log", status: "added" },
      { path: "local.txt", status: "added" },
      { path: "same.log", status: "modified" },
      { path: "src/.gitignore", status: "added" },
    ]);
    // The agent un-ignores the logs: the next diff shows them.
    await writeFile(path.join(fx.root, ".gitignore"), "__pycache__/\n");
    const again = await fx.client.request("diff", { base });
    expect(again.entries.map((e) => e.path)).toContain("build.log");
    expect(again.entries.map((e) => e.path)).not.toContain("src/__pycache__/app.cpython-311.pyc");
  });

  it("writes a patch that git apply takes: binary, mode change, symlink, type change, empty file", async () => {
    const git = (cwd: string, ...args: string[]) =>
      execFileSync("git", ["-c", "core.hooksPath=/dev/null", ...args], { cwd, encoding: "utf8" });
    await writeFile(path.join(fx.root, "logo.bin"), Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x00, 0xfe, 0x01]));
    await writeFile(path.join(fx.root, "new.bin"), Buffer.concat([Buffer.from([0]), Buffer.alloc(5000, 7)]));
    await chmod(path.join(fx.root, "same.txt"), 0o755);
    await rm(path.join(fx.root, "link"));
    await writeFile(path.join(fx.root, "link"), "now a file\n");
    await writeFile(path.join(fx.root, "empty"), "");
    await rm(path.join(fx.root, "gone.txt"));
    await symlink("../same.txt", path.join(fx.root, "src/up"));
    const { patch } = await fx.client.request("diff", { base });
    const repo = path.join(fx.outside, "repo");
    await cp(base, repo, { recursive: true, verbatimSymlinks: true });
    git(repo, "init", "-q");
    execFileSync("git", ["apply", "--check", "-"], { cwd: repo, input: patch });
    execFileSync("git", ["apply", "-"], { cwd: repo, input: patch });
    const again = await fx.client.request("diff", { base: repo });
    expect(again.entries).toEqual([]);
    expect(await readFile(path.join(repo, "new.bin"))).toEqual(await readFile(path.join(fx.root, "new.bin")));
  });
});
