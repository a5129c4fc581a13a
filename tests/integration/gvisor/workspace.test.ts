import { randomBytes } from "node:crypto";
import { readFile, symlink } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  errorOf,
  gvisorSkipReason,
  type Harness,
  hostProcesses,
  openHarness,
  suiteTitle,
  writeTree,
} from "../../helpers/sandbox.js";

/**
 * The daily loop on one real gVisor workspace: commands, file tools and their escape
 * refusals, patches, diff, snapshots, reset, export and sync push. One workspace for the
 * whole file (a gVisor start costs about a second), reset where a test needs the seed.
 */
const skip = gvisorSkipReason();
const MiB = 1024 * 1024;
const HOST_ONLY_VAR = "PYRO_IT_GVISOR_HOST_ONLY";
const SEED = { "README.md": "hello\n", "src/main.py": "a = 1\nb = 2\nc = 3\n", "sub/dir/.keep": "" };

describe.skipIf(skip !== "")(suiteTitle("the workspace loop on gvisor", skip), () => {
  let h: Harness;
  let id: string;
  let host: string;
  const sh = async (command: string) => {
    const r = await h.pyro.execWorkspace(id, command);
    expect(r.exit_code, `workspace ${id}: \`${command}\` failed: ${r.stderr}`).toBe(0);
    return r.stdout;
  };

  beforeAll(async () => {
    process.env[HOST_ONLY_VAR] = "must-not-leak";
    h = await openHarness("gvisor-ws", { backend: "gvisor" });
    host = await h.tempDir("gvisor-ws-host");
    const seed = join(host, "seed");
    await writeTree(seed, SEED);
    await symlink("/etc", join(seed, "etc-link"));
    const w = await h.create({ seedPath: seed, env: { FORWARDED: "from-create" } });
    expect(w).toMatchObject({ backend: "gvisor", execution_mode: "guest_agent", state: "running" });
    id = w.workspace_id;
  });
  afterAll(async () => {
    delete process.env[HOST_ONLY_VAR];
    await h?.cleanup();
  });

  it("returns exit codes, keeps stdout and stderr apart, and reports signals as 128+N", async () => {
    expect(await h.pyro.execWorkspace(id, "echo out; echo err >&2")).toMatchObject({
      exit_code: 0,
      stdout: "out\n",
      stderr: "err\n",
      timed_out: false,
      truncated: false,
      execution_mode: "guest_agent",
    });
    expect((await h.pyro.execWorkspace(id, "exit 3")).exit_code).toBe(3);
    const missing = await h.pyro.execWorkspace(id, "no-such-command-here");
    expect([missing.exit_code, missing.stderr.includes("not found")]).toEqual([127, true]);
    expect((await h.pyro.execWorkspace(id, "kill -TERM $$")).exit_code).toBe(143);
  });

  it("gives commands the workspace's and the call's env, nothing from the host, and runs in /workspace", async () => {
    const r = await h.pyro.execWorkspace(id, "env", { env: { PER_CALL: "yes" } });
    expect(r.stdout).toContain("FORWARDED=from-create\n");
    expect(r.stdout).toContain("PER_CALL=yes\n");
    expect(r.stdout).toContain("HOME=/root\n");
    expect(r.stdout).not.toContain("must-not-leak");
    expect(r.stdout).not.toContain("PYRO_HOME");
    expect(await sh("pwd")).toBe("/workspace\n");
    expect((await h.pyro.execWorkspace(id, "pwd", { cwd: "sub/dir" })).stdout).toBe("/workspace/sub/dir\n");
    expect((await errorOf(h.pyro.execWorkspace(id, "pwd", { cwd: "/etc" }))).code).toBe(
      "path_outside_workspace",
    );
  });

  it("kills the whole process tree at the timeout, setsid children included, and stays usable", async () => {
    const started = Date.now();
    const r = await h.pyro.execWorkspace(id, "sleep 1000 & setsid sleep 1000 & sleep 1000", {
      timeoutSeconds: 2,
    });
    expect(r).toMatchObject({ timed_out: true, exit_code: 124 });
    expect(Date.now() - started).toBeLessThan(15_000);
    // Guest processes exist only inside gVisor's kernel: look there, and on the host too.
    const left = await sh(
      "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 1000' || true",
    );
    expect(left.trim()).toBe("0");
    expect(hostProcesses((argv) => argv[0]?.endsWith("sleep") === true && argv[1] === "1000")).toEqual([]);
  });

  it("caps each output stream at 1 MiB, head and tail, and says truncated", async () => {
    const r = await h.pyro.execWorkspace(id, "head -c 3000000 /dev/zero; head -c 2000000 /dev/zero >&2");
    expect([r.exit_code, r.stdout_bytes, r.stderr_bytes, r.truncated]).toEqual([0, 3000000, 2000000, true]);
    expect(r.stdout.replace(/\n\[\.\.\. 1951424 bytes omitted \.\.\.\]\n/, "").length).toBe(MiB);
    expect(r.stderr.replace(/\n\[\.\.\. 951424 bytes omitted \.\.\.\]\n/, "").length).toBe(MiB);
  });

  it("writes, reads, lists and round-trips binary files", async () => {
    await h.pyro.writeWorkspaceFile(id, "new/deep/file.txt", "written\n");
    expect((await h.pyro.readWorkspaceFile(id, "new/deep/file.txt")).content).toBe("written\n");
    expect(await sh("cat new/deep/file.txt")).toBe("written\n");
    const blob = randomBytes(200_000);
    await h.pyro.writeWorkspaceFile(id, "blob.bin", blob);
    const out = join(host, "blob-out.bin");
    await h.pyro.exportWorkspace(id, "blob.bin", out);
    expect((await readFile(out)).equals(blob)).toBe(true);
    const list = await h.pyro.listWorkspaceFiles(id, "/workspace");
    expect(list.entries.map((e) => [e.path, e.artifact_type])).toEqual(
      expect.arrayContaining([
        ["README.md", "file"],
        ["etc-link", "symlink"],
        ["new", "directory"],
      ]),
    );
  });

  it("refuses paths that leave /workspace, through the tools and through a symlink, changing nothing", async () => {
    const before = (await h.pyro.diffWorkspace(id)).entries;
    for (const p of ["../x", "/etc/passwd", "etc-link/passwd"]) {
      expect((await errorOf(h.pyro.readWorkspaceFile(id, p))).code, p).toBe("path_outside_workspace");
      expect((await errorOf(h.pyro.writeWorkspaceFile(id, p, "x"))).code, p).toBe("path_outside_workspace");
    }
    expect((await h.pyro.diffWorkspace(id)).entries).toEqual(before);
  });

  it("applies a patch all-or-nothing and diffs against the seed", async () => {
    await h.pyro.resetWorkspace(id);
    const good = [
      "--- a/src/main.py",
      "+++ b/src/main.py",
      "@@ -1,3 +1,3 @@",
      " a = 1",
      "-b = 2",
      "+b = 20",
      " c = 3",
      "",
    ].join("\n");
    const bad = `${good}--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-not there\n+x\n`;
    expect((await errorOf(h.pyro.applyWorkspacePatch(id, bad))).code).toBe("patch_rejected");
    expect((await h.pyro.diffWorkspace(id)).changed).toBe(false);
    expect(await h.pyro.applyWorkspacePatch(id, good)).toMatchObject({ changed: true });
    const d = await h.pyro.diffWorkspace(id);
    expect(d.entries).toEqual([{ path: "src/main.py", status: "modified" }]);
    expect(d.patch).toContain("-b = 2\n+b = 20\n");
  });

  it("snapshots, diffs against the snapshot, resets to it and to the baseline exactly", async () => {
    await sh("echo cp > checkpoint.txt && rm README.md");
    await h.pyro.createSnapshot(id, "cp1");
    await sh("echo later > later.txt");
    expect((await h.pyro.diffWorkspace(id, { snapshot: "cp1" })).entries).toEqual([
      { path: "later.txt", status: "added" },
    ]);
    await h.pyro.resetWorkspace(id, { snapshot: "cp1" });
    expect(
      await sh("cat checkpoint.txt; test -e later.txt || echo no-later; test -e README.md || echo no-readme"),
    ).toBe("cp\nno-later\nno-readme\n");
    const r = await h.pyro.resetWorkspace(id);
    expect(r).toMatchObject({ current_snapshot: "baseline", workspace_reset: { snapshot_name: "baseline" } });
    expect(await sh("cat README.md src/main.py; test -e checkpoint.txt || echo gone")).toBe(
      "hello\na = 1\nb = 2\nc = 3\ngone\n",
    );
    expect((await h.pyro.diffWorkspace(id)).changed).toBe(false);
  });

  it("exports a directory and pushes a host directory into /workspace", async () => {
    const src = join(host, "push");
    await writeTree(src, { "a.txt": "pushed\n", "nested/b.txt": "deeper\n" });
    await h.pyro.syncPushWorkspace(id, src, { dest: "incoming" });
    expect(await sh("cat incoming/a.txt incoming/nested/b.txt")).toBe("pushed\ndeeper\n");
    const out = join(host, "export-out");
    await h.pyro.exportWorkspace(id, "incoming", out);
    expect(await readFile(join(out, "nested", "b.txt"), "utf8")).toBe("deeper\n");
  });
});
