import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bwrapSkipReason, type Harness, openHarness, suiteTitle, writeTree } from "../../helpers/sandbox.js";
import { git, launchStdio, PYTHON_PROJECT, pythonCheckout, RUN_TESTS } from "./helpers.js";

/**
 * Where `workspace_create` without seed_path gets its files when the host does not start
 * the server in the project: --repo-url (a clean clone, here of a local bare repository)
 * and --project-path; and nothing at all from a directory that is not a checkout.
 */
const skip = bwrapSkipReason();

describe.skipIf(skip !== "")(suiteTitle("default seeds of pyro mcp serve, on bwrap", skip), () => {
  let h: Harness;
  let checkout: string;
  let bare: string;
  let elsewhere: string;
  let firstCommit: string;
  let secondCommit: string;

  beforeAll(async () => {
    h = await openHarness("mcp-seeds");
    checkout = await h.tempDir("checkout");
    ({ commit: firstCommit } = await pythonCheckout(checkout));
    git(checkout, "tag", "v1");
    await writeTree(checkout, { "calc.py": "def add(a, b):\n    return a + b\n" });
    git(checkout, "commit", "--quiet", "-am", "fix add");
    secondCommit = git(checkout, "rev-parse", "HEAD");
    const remotes = await h.tempDir("remotes");
    bare = join(remotes, "calc.git");
    git(remotes, "clone", "--quiet", "--bare", checkout, bare);
    // A host that starts servers in some unrelated directory (not a checkout).
    elsewhere = await h.tempDir("elsewhere");
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("--repo-url seeds every workspace from one clean clone of the repository", async () => {
    const server = await launchStdio({ cwd: elsewhere, env: h.cliEnv, args: ["--repo-url", bare] });
    try {
      const a = await server.ok("workspace_create", { backend: "bwrap" });
      expect(a.default_seed).toMatchObject({ origin: "repo_url", repo_url: bare, commit: secondCommit });
      expect(a.workspace_seed).toMatchObject({
        kind: "git",
        commit: secondCommit,
        file_count: Object.keys(PYTHON_PROJECT).length,
      });
      // A clean clone: the checkout's untracked scratch file is not there.
      const files = await server.ok("workspace_file_list", { workspace_id: a.workspace_id });
      expect(files.entries.map((e: { path: string }) => e.path)).not.toContain("scratch.txt");
      expect(
        (await server.ok("workspace_exec", { workspace_id: a.workspace_id, command: RUN_TESTS })).exit_code,
      ).toBe(0);
      // The second create reuses the server's clone.
      const b = await server.ok("workspace_create", { backend: "bwrap" });
      expect(b.default_seed.path).toBe(a.default_seed.path);
    } finally {
      await server.close();
    }
  });

  it("--repo-ref picks the tag (or branch, or commit) to start from", async () => {
    const server = await launchStdio({
      cwd: elsewhere,
      env: h.cliEnv,
      args: ["--repo-url", bare, "--repo-ref", "v1"],
    });
    try {
      const w = await server.ok("workspace_create", { backend: "bwrap" });
      expect(w.default_seed).toMatchObject({ origin: "repo_url", repo_ref: "v1", commit: firstCommit });
      const r = await server.ok("workspace_exec", { workspace_id: w.workspace_id, command: RUN_TESTS });
      expect(r.exit_code).not.toBe(0);
    } finally {
      await server.close();
    }
  });

  it("--project-path seeds from the project when the server starts elsewhere", async () => {
    const server = await launchStdio({ cwd: elsewhere, env: h.cliEnv, args: ["--project-path", checkout] });
    try {
      const w = await server.ok("workspace_create", { backend: "bwrap" });
      expect(w.default_seed).toEqual({ origin: "project_path", path: checkout });
      expect(w.workspace_seed).toMatchObject({ kind: "git", source: checkout, commit: secondCommit });
    } finally {
      await server.close();
    }
  });

  it("starts workspaces empty outside a checkout, and seeds from an explicit seed_path", async () => {
    // The checkout is outside the directory the server started in: MCP may name it only once allowed.
    const server = await launchStdio({
      cwd: elsewhere,
      env: h.cliEnv,
      args: ["--allow-host-path", checkout],
    });
    try {
      const empty = await server.ok("workspace_create", { backend: "bwrap" });
      expect(empty.workspace_seed).toMatchObject({ kind: "empty", file_count: 0 });
      expect(empty).not.toHaveProperty("default_seed");
      const seeded = await server.ok("workspace_create", { backend: "bwrap", seed_path: checkout });
      expect(seeded.workspace_seed).toMatchObject({ kind: "git", source: checkout });
    } finally {
      await server.close();
    }
  });
});
