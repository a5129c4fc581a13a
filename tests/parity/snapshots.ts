import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { expect } from "vitest";
import { patchSession } from "./patches.js";
import type { Scenario, ScenarioContext } from "./scenarios.js";
import { code, lsOf, sandboxed, sh, withWorkspace } from "./util.js";

/**
 * Patches, snapshots, resets and stop/start on every backend, following one editing
 * session in one workspace: each step builds on the state the previous one left.
 */

async function snapshotAndDiff(ctx: ScenarioContext, id: string) {
  const p = ctx.pyro;
  await sh(p, id, "rm bin/run.sh && echo cp > checkpoint.txt");
  // bin/ stays in the snapshot, emptied of run.sh; directories do not count, symlinks do.
  expect(await p.createSnapshot(id, "cp1")).toMatchObject({
    workspace_id: id,
    snapshot_name: "cp1",
    kind: "named",
    file_count: 4,
  });
  await sh(p, id, "echo later > later.txt && rm checkpoint.txt && echo again >> app.py");
  if (sandboxed(ctx)) await sh(p, id, "touch /root/in-rootfs");
  const d = await p.diffWorkspace(id, { snapshot: "cp1" });
  expect(d).toMatchObject({ base_snapshot: "cp1", summary: { total: 3, added: 1, modified: 1, deleted: 1 } });
  expect(d.entries).toEqual([
    { path: "app.py", status: "modified" },
    { path: "checkpoint.txt", status: "deleted" },
    { path: "later.txt", status: "added" },
  ]);
  expect((await p.listSnapshots(id)).snapshots.map((s) => [s.snapshot_name, s.kind])).toEqual([
    ["baseline", "baseline"],
    ["cp1", "named"],
  ]);
}

async function resetToSnapshot(ctx: ScenarioContext, id: string) {
  const p = ctx.pyro;
  expect(await p.resetWorkspace(id, { snapshot: "cp1" })).toMatchObject({
    workspace_id: id,
    reset_count: 2,
    current_snapshot: "cp1",
    workspace_reset: { snapshot_name: "cp1" },
    state: "running",
  });
  expect(await sh(p, id, "ls -A | sort; ls -A bin; cat app.py checkpoint.txt")).toBe(
    `${lsOf(ctx, ["app.py", "bin", "checkpoint.txt", "link", "src"])}print('hello')\ncp\n`,
  );
  // A reset discards the sandbox root's changes too.
  if (sandboxed(ctx))
    expect(await sh(p, id, "test ! -e /root/in-rootfs && echo root-clean")).toBe("root-clean\n");
  expect((await p.diffWorkspace(id, { snapshot: "cp1" })).changed).toBe(false);
  // The workspace still knows how far it is from the baseline.
  expect((await p.diffWorkspace(id)).summary).toEqual({ total: 2, added: 1, modified: 0, deleted: 1 });
  expect(await code(p.deleteSnapshot(id, "cp1"))).toBe("conflict");
  // An absolute symlink is snapshotted and restored as it was. (No diff against this
  // snapshot: on qemu that fails, path_outside_workspace, as the snapshot is sent into the VM
  // through the agent's safe extraction, which refuses the link; reported, not yet fixed.)
  await sh(p, id, "ln -s /etc/hostname host-link");
  expect(await p.createSnapshot(id, "with-link")).toMatchObject({ snapshot_name: "with-link" });
  await sh(p, id, "rm host-link");
  await p.resetWorkspace(id, { snapshot: "with-link" });
  expect(await sh(p, id, "readlink host-link")).toBe("/etc/hostname\n");
}

/** Back to the baseline: the fourth reset of the session (the patch session's was the first). */
async function resetToBaseline(ctx: ScenarioContext, id: string) {
  const p = ctx.pyro;
  expect(await p.resetWorkspace(id)).toMatchObject({
    reset_count: 4,
    current_snapshot: "baseline",
    workspace_reset: { snapshot_name: "baseline" },
  });
  expect(await sh(p, id, "cat app.py; stat -c %a bin/run.sh; ./bin/run.sh; ls -A | sort")).toBe(
    `print('hello')\n755\nrun\n${lsOf(ctx, ["app.py", "bin", "link", "src"])}`,
  );
  expect(await p.diffWorkspace(id)).toMatchObject({ changed: false, summary: { total: 0 } });
  expect((await p.getWorkspace(id)).reset_count).toBe(4);
  expect((await p.summarizeWorkspace(id)).outcome).toMatchObject({
    reset_count: 4,
    snapshot_count: expect.any(Number),
  });
  expect(await code(p.resetWorkspace(id, { snapshot: "missing" }))).toBe("not_found");
  expect(await code(p.deleteSnapshot(id, "baseline"))).toBe("conflict");
  expect(await p.deleteSnapshot(id, "cp1")).toMatchObject({ snapshot_name: "cp1", deleted: true });
  expect(await code(p.diffWorkspace(id, { snapshot: "cp1" }))).toBe("not_found");
  expect((await p.deleteSnapshot(id, "with-link")).deleted).toBe(true);
  expect((await p.listSnapshots(id)).snapshots.map((s) => s.snapshot_name)).toEqual(["baseline"]);
  expect((await p.getWorkspace(id)).reset_count).toBe(4);
  // The snapshot trees are host directories that resets never write.
  expect(await readFile(join(ctx.home, "workspaces", id, "snapshots", "baseline", "app.py"), "utf8")).toBe(
    "print('hello')\n",
  );
}

async function stopStart(ctx: ScenarioContext, id: string) {
  const p = ctx.pyro;
  await p.writeWorkspaceFile(id, "kept.txt", "kept\n");
  // The root filesystem's writes are kept too, where there is a sandbox root to write.
  if (sandboxed(ctx)) await p.execWorkspace(id, "echo root-layer > /root/kept");
  expect(await p.stopWorkspace(id)).toMatchObject({ workspace_id: id, state: "stopped" });
  expect((await p.getWorkspace(id)).state).toBe("stopped");
  expect(await code(p.execWorkspace(id, "true"))).toBe("workspace_stopped");
  expect(await code(p.readWorkspaceFile(id, "kept.txt"))).toBe("workspace_stopped");
  expect(await p.startWorkspace(id)).toMatchObject({ workspace_id: id, state: "running" });
  expect(await sh(p, id, "cat kept.txt src/lib.txt")).toBe("kept\none\ntwo\n");
  if (sandboxed(ctx)) expect(await sh(p, id, "cat /root/kept")).toBe("root-layer\n");
  expect((await p.diffWorkspace(id)).entries).toEqual([{ path: "kept.txt", status: "added" }]);
}

/** One workspace for the whole session: a workspace start is the dear part on qemu. */
export const SNAPSHOT_SCENARIOS: Scenario[] = [
  {
    name: "patch, diff, export, snapshots, reset, stop and start: all-or-nothing patches (unified and as models write them), exact restores (root and absolute symlinks too), refusals, workspace_stopped",
    run: (ctx) =>
      withWorkspace(ctx, async (id) => {
        await patchSession(ctx, id);
        await snapshotAndDiff(ctx, id);
        await resetToSnapshot(ctx, id);
        await resetToBaseline(ctx, id);
        await stopStart(ctx, id);
      }),
  },
];
