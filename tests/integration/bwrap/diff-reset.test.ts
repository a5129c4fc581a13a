import { chmod } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  bwrapSkipReason,
  errorOf,
  type Harness,
  openHarness,
  suiteTitle,
  writeTree,
} from "../../helpers/sandbox.js";

/**
 * Diff, snapshots, reset and stop/start on one real bwrap workspace. The tests follow one
 * editing session in order: each builds on the state the previous one left.
 */
const skip = bwrapSkipReason();

describe.skipIf(skip !== "")(suiteTitle("diff, snapshots, reset and stop/start on bwrap", skip), () => {
  let h: Harness;
  let id: string;
  const sh = async (command: string) => {
    const r = await h.pyro.execWorkspace(id, command);
    expect(r.exit_code, `workspace ${id}: \`${command}\` failed: ${r.stderr}`).toBe(0);
    return r.stdout;
  };

  beforeAll(async () => {
    h = await openHarness("diff");
    const seed = join(await h.tempDir("diff-seed"), "seed");
    await writeTree(seed, {
      "keep.txt": "keep\n",
      "edit.txt": "before\n",
      "gone.txt": "precious\n",
      "bin/run.sh": "#!/bin/sh\necho run\n",
    });
    await chmod(join(seed, "bin/run.sh"), 0o755);
    id = (await h.create({ seedPath: seed })).workspace_id;
  });
  afterAll(async () => {
    await h?.cleanup();
  });

  it("reports nothing changed right after seeding", async () => {
    expect(await h.pyro.diffWorkspace(id)).toMatchObject({
      base_snapshot: "baseline",
      changed: false,
      patch: "",
      summary: { total: 0, added: 0, modified: 0, deleted: 0 },
      entries: [],
    });
  });

  it("reports added, modified and deleted files with a summary and a unified patch", async () => {
    await h.pyro.writeWorkspaceFile(id, "edit.txt", "after\n");
    await sh("rm gone.txt bin/run.sh && echo fresh > added.txt");
    const d = await h.pyro.diffWorkspace(id);
    expect(d.changed).toBe(true);
    expect(d.summary).toEqual({ total: 4, added: 1, modified: 1, deleted: 2 });
    expect(d.entries).toEqual([
      { path: "added.txt", status: "added" },
      { path: "bin/run.sh", status: "deleted" },
      { path: "edit.txt", status: "modified" },
      { path: "gone.txt", status: "deleted" },
    ]);
    expect(d.patch).toContain("--- a/edit.txt\n+++ b/edit.txt\n");
    expect(d.patch).toContain("-before\n+after\n");
    expect(d.patch).toContain("+fresh\n");
    expect(d.patch).toContain("-precious\n");
  });

  it("takes a snapshot, and a diff against it shows only the later changes", async () => {
    const snap = await h.pyro.createSnapshot(id, "cp1");
    expect(snap).toMatchObject({ workspace_id: id, snapshot_name: "cp1", kind: "named", file_count: 3 });
    await sh("echo later > later.txt && echo again >> edit.txt");
    const d = await h.pyro.diffWorkspace(id, { snapshot: "cp1" });
    expect(d).toMatchObject({
      base_snapshot: "cp1",
      summary: { total: 2, added: 1, modified: 1, deleted: 0 },
    });
    expect(d.entries).toEqual([
      { path: "edit.txt", status: "modified" },
      { path: "later.txt", status: "added" },
    ]);
    expect((await h.pyro.listSnapshots(id)).snapshots.map((s) => [s.snapshot_name, s.kind])).toEqual([
      ["baseline", "baseline"],
      ["cp1", "named"],
    ]);
  });

  it("resets to the snapshot exactly, and counts the reset", async () => {
    const r = await h.pyro.resetWorkspace(id, { snapshot: "cp1" });
    expect(r).toMatchObject({
      workspace_id: id,
      reset_count: 1,
      current_snapshot: "cp1",
      workspace_reset: { snapshot_name: "cp1" },
      state: "running",
    });
    // bin/ stays: the snapshot holds it, emptied of run.sh.
    expect(await sh("ls -A | sort; ls -A bin; cat edit.txt")).toBe(
      "added.txt\nbin\nedit.txt\nkeep.txt\nafter\n",
    );
    expect((await h.pyro.diffWorkspace(id, { snapshot: "cp1" })).changed).toBe(false);
    // The workspace still knows how far it is from the baseline.
    expect((await h.pyro.diffWorkspace(id)).summary).toEqual({ total: 4, added: 1, modified: 1, deleted: 2 });
    expect((await errorOf(h.pyro.deleteSnapshot(id, "cp1"))).code).toBe("conflict");
  });

  it("resets to the baseline, restoring deleted files with their content and mode", async () => {
    const r = await h.pyro.resetWorkspace(id);
    expect(r).toMatchObject({
      reset_count: 2,
      current_snapshot: "baseline",
      workspace_reset: { snapshot_name: "baseline" },
    });
    expect(await sh("cat gone.txt edit.txt; stat -c %a bin/run.sh; ./bin/run.sh; ls -A | sort")).toBe(
      "precious\nbefore\n755\nrun\nbin\nedit.txt\ngone.txt\nkeep.txt\n",
    );
    expect(await h.pyro.diffWorkspace(id)).toMatchObject({ changed: false, summary: { total: 0 } });
    expect((await h.pyro.getWorkspace(id)).reset_count).toBe(2);
    expect((await h.pyro.summarizeWorkspace(id)).outcome).toMatchObject({
      reset_count: 2,
      snapshot_count: expect.any(Number),
    });
  });

  it("refuses a reset to an unknown snapshot and can delete a snapshot it no longer runs on", async () => {
    expect((await errorOf(h.pyro.resetWorkspace(id, { snapshot: "missing" }))).code).toBe("not_found");
    expect((await errorOf(h.pyro.deleteSnapshot(id, "baseline"))).code).toBe("conflict");
    expect(await h.pyro.deleteSnapshot(id, "cp1")).toMatchObject({ snapshot_name: "cp1", deleted: true });
    expect((await errorOf(h.pyro.diffWorkspace(id, { snapshot: "cp1" }))).code).toBe("not_found");
    expect((await h.pyro.getWorkspace(id)).reset_count).toBe(2);
  });

  // BUG (src/core/transfer.ts, ExportWriter in "snapshot" mode): safeEntry() lets absolute
  // symlinks through for snapshots, but tar.Unpack (strict, no preservePaths) then strips
  // the leading "/" and, being strict, turns that TAR_ENTRY_INFO warning into an error.
  // The `done` promise from begin() rejects while nobody awaits it: an SDK or MCP process
  // dies of an unhandled rejection, and the CLI reports `internal: TAR_ENTRY_INFO: stripping
  // / from absolute linkpath`. Any workspace with e.g. a venv or `ln -s /usr/bin/python3`
  // cannot be snapshotted. Snapshot extraction needs preservePaths (the filter already vets
  // entry names) and `done` needs a handler until commit() awaits it.
  it("snapshots a workspace holding an absolute symlink and restores the link on reset", async () => {
    await sh("ln -s /etc/hostname host-link");
    expect(await h.pyro.createSnapshot(id, "with-link")).toMatchObject({ snapshot_name: "with-link" });
    await sh("rm host-link");
    await h.pyro.resetWorkspace(id, { snapshot: "with-link" });
    expect(await sh("readlink host-link")).toBe("/etc/hostname\n");
    await h.pyro.resetWorkspace(id);
    expect((await h.pyro.deleteSnapshot(id, "with-link")).deleted).toBe(true);
  });

  it("keeps the files across stop and start, and refuses commands while stopped with workspace_stopped", async () => {
    await h.pyro.writeWorkspaceFile(id, "survives.txt", "still here\n");
    expect(await h.pyro.stopWorkspace(id)).toMatchObject({ workspace_id: id, state: "stopped" });
    expect((await h.pyro.getWorkspace(id)).state).toBe("stopped");
    expect((await errorOf(h.pyro.execWorkspace(id, "true"))).code).toBe("workspace_stopped");
    expect((await errorOf(h.pyro.readWorkspaceFile(id, "survives.txt"))).code).toBe("workspace_stopped");
    expect(await h.pyro.startWorkspace(id)).toMatchObject({ workspace_id: id, state: "running" });
    expect(await sh("cat survives.txt gone.txt")).toBe("still here\nprecious\n");
    expect((await h.pyro.diffWorkspace(id)).entries).toEqual([{ path: "survives.txt", status: "added" }]);
  });
});
