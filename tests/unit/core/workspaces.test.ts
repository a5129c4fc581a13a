import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { FakeBackend } from "../../../src/backends/fake/backend.js";
import { Engine } from "../../../src/core/engine.js";
import type { PyroError } from "../../../src/errors.js";
import type { Pyro } from "../../../src/sdk/pyro.js";
import { codeOf, fakePyro } from "../../helpers/engine.js";

let t: Awaited<ReturnType<typeof fakePyro>>;
let pyro: Pyro;
let seed: string;

beforeEach(async () => {
  t = await fakePyro();
  pyro = t.pyro;
  seed = await mkdtemp(join(tmpdir(), "pyro-seed-"));
  await writeFile(join(seed, "app.py"), "print('hello')\n");
  await mkdir(join(seed, "src"));
  await writeFile(join(seed, "src", "lib.txt"), "one\ntwo\n");
});
afterEach(async () => {
  await t.cleanup();
  await rm(seed, { recursive: true, force: true });
});

describe("workspace core on the fake backend", () => {
  it("creates a seeded, named, labelled workspace and reports the contract's fields", async () => {
    const w = await pyro.createWorkspace({ seedPath: seed, name: "alpha", labels: { team: "a" } });
    expect(w).toMatchObject({
      workspace_id: expect.stringMatching(/^ws_[0-9a-f]{12}$/),
      name: "alpha",
      labels: { team: "a" },
      environment: "debian:12",
      backend: "bwrap",
      state: "running",
      network_policy: "off",
      execution_mode: "guest_agent",
      workspace_seed: { kind: "directory", source: seed, file_count: 2 },
    });
    expect(Date.parse(w.expires_at!)).toBeGreaterThan(Date.parse(w.last_activity_at));
    expect((await pyro.getWorkspace("alpha")).workspace_id).toBe(w.workspace_id);
    const list = await pyro.listWorkspaces();
    expect(list.count).toBe(1);
    expect(list.workspaces[0]).toMatchObject({
      workspace_id: w.workspace_id,
      command_count: 0,
      service_count: 0,
    });
  });

  it("refuses a duplicate name, a bad name and an unknown workspace with their codes", async () => {
    await pyro.createWorkspace({ name: "dup" });
    expect(await codeOf(pyro.createWorkspace({ name: "dup" }))).toBe("conflict");
    expect(await codeOf(pyro.createWorkspace({ name: "../x" }))).toBe("invalid_argument");
    expect(await codeOf(pyro.execWorkspace("nope", "true"))).toBe("workspace_not_found");
    expect(await codeOf(pyro.createWorkspace({ environment: "nope:1" }))).toBe("environment_not_found");
    expect((await pyro.listWorkspaces()).count).toBe(1);
  });

  it("runs commands, records them in logs, and summarises the session", async () => {
    const w = await pyro.createWorkspace({ seedPath: seed });
    const ok = await pyro.execWorkspace(w.workspace_id, "cat app.py && echo err >&2");
    expect(ok).toMatchObject({
      exit_code: 0,
      stdout: "print('hello')\n",
      stderr: "err\n",
      timed_out: false,
      truncated: false,
      execution_mode: "guest_agent",
      seq: 1,
    });
    const bad = await pyro.execWorkspace(w.workspace_id, "exit 3");
    expect(bad.exit_code).toBe(3);
    const logs = await pyro.workspaceLogs(w.workspace_id);
    expect(logs.commands.map((c) => [c.seq, c.command, c.exit_code])).toEqual([
      [1, "cat app.py && echo err >&2", 0],
      [2, "exit 3", 3],
    ]);
    await pyro.writeWorkspaceFile(w.workspace_id, "notes.md", "# notes\n");
    const s = await pyro.summarizeWorkspace(w.workspace_id);
    expect(s.outcome).toMatchObject({
      command_count: 2,
      last_command: { command: "exit 3", exit_code: 3 },
      reset_count: 0,
    });
    expect(s.edits.recent).toEqual([expect.objectContaining({ kind: "file_write", path: "notes.md" })]);
    expect(s.changes).toMatchObject({
      available: true,
      changed: true,
      entries: [{ path: "notes.md", status: "added" }],
    });
  });

  it("a reset that restarts the sandbox tells the backend its layers are discarded; a stop keeps them", async () => {
    const stops: ({ discarding?: boolean } | undefined)[] = [];
    const realStop = t.backend.stop.bind(t.backend);
    t.backend.stop = async (state, options) => {
      stops.push(options);
      return realStop(state, options);
    };
    const id = (await pyro.createWorkspace({ seedPath: seed })).workspace_id;
    await pyro.resetWorkspace(id);
    expect(stops).toEqual([{ discarding: true }]);
    await pyro.stopWorkspace(id);
    expect(stops[1]?.discarding).toBeFalsy();
  });

  it("edits, diffs, snapshots and resets exactly, deletions included", async () => {
    const w = await pyro.createWorkspace({ seedPath: seed });
    const id = w.workspace_id;
    await pyro.writeWorkspaceFile(id, "app.py", "print('changed')\n");
    await pyro.execWorkspace(id, "rm src/lib.txt && echo new > added.txt");
    const d = await pyro.diffWorkspace(id);
    expect(d.summary).toEqual({ total: 3, added: 1, modified: 1, deleted: 1 });
    await pyro.createSnapshot(id, "cp1");
    await pyro.execWorkspace(id, "echo later > later.txt");
    expect((await pyro.diffWorkspace(id, { snapshot: "cp1" })).entries).toEqual([
      { path: "later.txt", status: "added" },
    ]);

    const r1 = await pyro.resetWorkspace(id, { snapshot: "cp1" });
    expect(r1).toMatchObject({ reset_count: 1, workspace_reset: { snapshot_name: "cp1" } });
    expect((await pyro.execWorkspace(id, "ls")).stdout.split("\n").filter(Boolean).sort()).toEqual([
      "added.txt",
      "app.py",
      "src",
    ]);

    const r2 = await pyro.resetWorkspace(id);
    expect(r2.workspace_reset.snapshot_name).toBe("baseline");
    expect((await pyro.readWorkspaceFile(id, "src/lib.txt")).content).toBe("one\ntwo\n");
    expect((await pyro.diffWorkspace(id)).changed).toBe(false);
    expect(await codeOf(pyro.resetWorkspace(id, { snapshot: "missing" }))).toBe("not_found");
    expect(await codeOf(pyro.deleteSnapshot(id, "baseline"))).toBe("conflict");
    expect((await pyro.deleteSnapshot(id, "cp1")).deleted).toBe(true);
  });

  it("applies a patch all-or-nothing and names the rejected hunk", async () => {
    const w = await pyro.createWorkspace({ seedPath: seed });
    const good = [
      "--- a/src/lib.txt",
      "+++ b/src/lib.txt",
      "@@ -1,2 +1,2 @@",
      " one",
      "-two",
      "+three",
      "",
    ].join("\n");
    const applied = await pyro.applyWorkspacePatch(w.workspace_id, good);
    expect(applied).toMatchObject({ changed: true, files: [{ path: "src/lib.txt", status: "modified" }] });
    const bad = [
      "--- a/app.py",
      "+++ b/app.py",
      "@@ -1 +1 @@",
      "-print('hello')",
      "+print('bye')",
      "--- a/src/lib.txt",
      "+++ b/src/lib.txt",
      "@@ -1,2 +1,2 @@",
      " one",
      "-two",
      "+four",
      "",
    ].join("\n");
    try {
      await pyro.applyWorkspacePatch(w.workspace_id, bad);
      expect.unreachable();
    } catch (err) {
      expect((err as PyroError).code).toBe("patch_rejected");
      expect((err as PyroError).message).toContain("src/lib.txt");
    }
    expect((await pyro.readWorkspaceFile(w.workspace_id, "app.py")).content).toBe("print('hello')\n");
  });

  it("refuses paths that leave the workspace and changes nothing", async () => {
    const w = await pyro.createWorkspace({ seedPath: seed });
    expect(await codeOf(pyro.writeWorkspaceFile(w.workspace_id, "../escape.txt", "x"))).toBe(
      "path_outside_workspace",
    );
    expect(await codeOf(pyro.readWorkspaceFile(w.workspace_id, "/etc/passwd"))).toBe(
      "path_outside_workspace",
    );
    await pyro.execWorkspace(w.workspace_id, `ln -s ${tmpdir()} out`);
    expect(await codeOf(pyro.writeWorkspaceFile(w.workspace_id, "out/x.txt", "x"))).toBe(
      "path_outside_workspace",
    );
    expect((await pyro.diffWorkspace(w.workspace_id)).entries).toEqual([{ path: "out", status: "added" }]);
  });

  it("exports files and directories and pushes host directories in", async () => {
    const w = await pyro.createWorkspace({ seedPath: seed });
    const out = await mkdtemp(join(tmpdir(), "pyro-out-"));
    try {
      const f = await pyro.exportWorkspace(w.workspace_id, "app.py", join(out, "app.py"));
      // The file's own size, not the archive's that carried it (a 15-byte file once said 10.0 KiB).
      expect(f).toMatchObject({ artifact_type: "file", output_path: join(out, "app.py"), bytes: 15 });
      expect(await readFile(join(out, "app.py"), "utf8")).toBe("print('hello')\n");
      const d = await pyro.exportWorkspace(w.workspace_id, "src", join(out, "srcdir"));
      expect(d).toMatchObject({ artifact_type: "directory", bytes: 8 });
      expect(await readFile(join(out, "srcdir", "lib.txt"), "utf8")).toBe("one\ntwo\n");
      const pushed = await pyro.syncPushWorkspace(w.workspace_id, seed, { dest: "/workspace/copy" });
      expect(pushed.files).toBe(2);
      expect((await pyro.readWorkspaceFile(w.workspace_id, "copy/src/lib.txt")).content).toBe("one\ntwo\n");
      const s = await pyro.summarizeWorkspace(w.workspace_id);
      expect(s.artifacts.exports).toHaveLength(2);
      expect(s.outcome.export_count).toBe(2);
    } finally {
      await rm(out, { recursive: true, force: true });
    }
  });

  it("asks the backend whether the sandbox runs only while no open agent connection shows it", async () => {
    const w = await pyro.createWorkspace({});
    let asked = 0;
    const isRunning = t.backend.isRunning.bind(t.backend);
    t.backend.isRunning = (state) => {
      asked++;
      return isRunning(state);
    };
    await pyro.execWorkspace(w.workspace_id, "true");
    asked = 0;
    for (let i = 0; i < 3; i++) await pyro.execWorkspace(w.workspace_id, "true");
    expect(asked).toBe(0);
    await t.backend.closeAll(); // the sandbox dies: the closed connection sends the next call to the backend
    expect((await pyro.execWorkspace(w.workspace_id, "echo back")).stdout).toBe("back\n");
    expect(asked).toBeGreaterThan(0);
  });

  it("restarts a sandbox that died while marked running, and refuses exec on a stopped one", async () => {
    const w = await pyro.createWorkspace({ seedPath: seed });
    await pyro.writeWorkspaceFile(w.workspace_id, "keep.txt", "kept");
    await t.backend.closeAll(); // the sandbox dies under us
    expect((await pyro.readWorkspaceFile(w.workspace_id, "keep.txt")).content).toBe("kept");
    await pyro.stopWorkspace(w.workspace_id);
    expect(await codeOf(pyro.execWorkspace(w.workspace_id, "true"))).toBe("workspace_stopped");
    await pyro.startWorkspace(w.workspace_id);
    expect((await pyro.execWorkspace(w.workspace_id, "cat keep.txt")).stdout).toBe("kept");
  });

  it("a sandbox that cannot be restarted puts the workspace in the error state, which the next use leaves", async () => {
    const w = await pyro.createWorkspace({ seedPath: seed });
    await pyro.writeWorkspaceFile(w.workspace_id, "keep.txt", "kept");
    await t.backend.closeAll(); // the sandbox dies
    const realStart = t.backend.start.bind(t.backend);
    t.backend.start = async () => {
      throw new Error("the sandbox would not start");
    };
    expect(await codeOf(pyro.execWorkspace(w.workspace_id, "true"))).toBe("internal");
    const broken = await pyro.getWorkspace(w.workspace_id);
    expect(broken.state).toBe("error");
    expect(broken.error).toMatchObject({ code: "internal", message: "the sandbox would not start" });
    expect((await pyro.listWorkspaces()).workspaces[0]?.state).toBe("error");
    // Still failing: still error, with the reason of the latest attempt.
    expect(await codeOf(pyro.execWorkspace(w.workspace_id, "true"))).toBe("internal");
    t.backend.start = realStart;
    // The next use starts it again, files kept; the error is cleared.
    expect((await pyro.execWorkspace(w.workspace_id, "cat keep.txt")).stdout).toBe("kept");
    const fixed = await pyro.getWorkspace(w.workspace_id);
    expect(fixed).toMatchObject({ state: "running", error: null });
    // From error, stop and delete work too.
    await t.backend.closeAll();
    t.backend.start = async () => {
      throw new Error("again");
    };
    await codeOf(pyro.execWorkspace(w.workspace_id, "true"));
    expect((await pyro.stopWorkspace(w.workspace_id)).state).toBe("stopped");
    t.backend.start = realStart;
    await pyro.deleteWorkspace(w.workspace_id);
  });

  it("a sandbox that dies mid-request is reported dead even when its death shows after the broken connection", async () => {
    // A killed sandbox closes its sockets before the kernel reports it gone: the core
    // must not call that "the connection broke" (retry) when the sandbox died (restart).
    const w = await pyro.createWorkspace({ seedPath: seed });
    await pyro.writeWorkspaceFile(w.workspace_id, "keep.txt", "kept");
    const inFlight = pyro.execWorkspace(w.workspace_id, "sleep 30").then(
      () => null,
      (err: PyroError) => err,
    );
    await new Promise((r) => setTimeout(r, 300));
    const realIsRunning = t.backend.isRunning.bind(t.backend);
    const reportedDeadAt = Date.now() + 400;
    t.backend.isRunning = async (state) => Date.now() < reportedDeadAt || realIsRunning(state);
    await t.backend.closeAll();
    const err = await inFlight;
    expect(err?.code).toBe("backend_unavailable");
    expect(err?.message).toMatch(/died during the request/);
    expect((await pyro.readWorkspaceFile(w.workspace_id, "keep.txt")).content).toBe("kept");
  });

  it("deletes a workspace with every file it had", async () => {
    const w = await pyro.createWorkspace({ seedPath: seed, name: "gone" });
    const dir = pyro.engine.workspaces.workspaceDir(w.workspace_id);
    await pyro.deleteWorkspace("gone");
    expect(await codeOf(pyro.getWorkspace("gone"))).toBe("workspace_not_found");
    await expect(readFile(join(dir, "snapshots", "baseline", "app.py"))).rejects.toThrow();
  });

  it("reaps workspaces whose TTL ran out", async () => {
    const w = await pyro.createWorkspace({ ttlSeconds: 1 });
    await new Promise((r) => setTimeout(r, 1100));
    expect((await pyro.listWorkspaces()).count).toBe(0);
    expect(await codeOf(pyro.getWorkspace(w.workspace_id))).toBe("workspace_not_found");
  });

  it("never falls back to the host backend silently", async () => {
    const e = new Engine({
      home: t.home,
      environmentsDir: join(t.home, "envs"),
      backends: {},
      env: { PATH: "/nonexistent" },
    });
    expect(await codeOf(e.chooseBackend(undefined, false))).toBe("backend_unavailable");
    expect(await codeOf(e.chooseBackend("host", false))).toBe("backend_unavailable");
    expect((await e.chooseBackend(undefined, true)).name).toBe("host");
    await e.close();
    expect(new FakeBackend().executionMode).toBe("guest_agent");
  });
});
