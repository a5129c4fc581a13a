import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, utimes, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { currentOwner } from "../../../src/core/recovery.js";
import { codeOf, fakePyro } from "../../helpers/engine.js";

let t: Awaited<ReturnType<typeof fakePyro>>;
beforeEach(async () => {
  t = await fakePyro();
});
afterEach(async () => {
  await t.cleanup();
});

/** An owner record of a process that has exited (a real pid, its real start time, gone). */
function deadOwner(): { pid: number; start_time: string } {
  const r = spawnSync("sh", ["-c", "echo $$ $(cut -d' ' -f22 /proc/$$/stat)"], { encoding: "utf8" });
  const [pid, start] = r.stdout.trim().split(" ");
  return { pid: Number(pid), start_time: start! };
}

const store = () => t.pyro.engine.store();
const dirOf = (id: string) => join(t.home, "workspaces", id);

describe("recovery after a killed client", () => {
  it("rolls back a create whose process died: the workspace is gone with its sandbox and files", async () => {
    const w = await t.pyro.createWorkspace({ name: "half" });
    store().updateWorkspace(w.workspace_id, { state: "creating", runtime: { owner: deadOwner() } });
    expect(await codeOf(t.pyro.execWorkspace("half", "true"))).toBe("workspace_not_found");
    expect(store().getWorkspace(w.workspace_id)).toBeNull();
    expect(existsSync(dirOf(w.workspace_id))).toBe(false);
  });

  it("leaves a create alone while its process lives", async () => {
    const w = await t.pyro.createWorkspace({ name: "busy" });
    store().updateWorkspace(w.workspace_id, { state: "creating", runtime: { owner: await currentOwner() } });
    expect(await codeOf(t.pyro.execWorkspace("busy", "true"))).toBe("conflict");
    await t.pyro.listWorkspaces();
    expect(store().getWorkspace(w.workspace_id)?.state).toBe("creating");
  });

  it("finishes a delete whose process died, at the next listing", async () => {
    const w = await t.pyro.createWorkspace({ name: "going" });
    store().updateWorkspace(w.workspace_id, { state: "deleting", runtime: { owner: deadOwner() } });
    const list = await t.pyro.listWorkspaces();
    expect(list.workspaces.map((x) => x.workspace_id)).not.toContain(w.workspace_id);
    expect(existsSync(dirOf(w.workspace_id))).toBe(false);
  });

  it("records the creating process while a create runs and clears it when done", async () => {
    const w = await t.pyro.createWorkspace({});
    expect(store().getWorkspace(w.workspace_id)?.runtime.owner ?? null).toBeNull();
  });

  it("removes a directory a killed create left without a row, and keeps one whose creator lives", async () => {
    const orphan = join(t.home, "workspaces", "ws_0123456789ab");
    await mkdir(join(orphan, "snapshots", "baseline"), { recursive: true });
    await writeFile(join(orphan, "creator"), JSON.stringify(deadOwner()));
    const live = join(t.home, "workspaces", "ws_ba9876543210");
    await mkdir(live, { recursive: true });
    await writeFile(join(live, "creator"), JSON.stringify(await currentOwner()));
    const young = join(t.home, "workspaces", "ws_aaaaaaaaaaaa");
    await mkdir(young, { recursive: true });
    const old = join(t.home, "workspaces", "ws_bbbbbbbbbbbb");
    await mkdir(old, { recursive: true });
    await utimes(old, new Date(Date.now() - 3600_000), new Date(Date.now() - 3600_000));
    await t.pyro.listWorkspaces();
    expect(existsSync(orphan)).toBe(false);
    expect(existsSync(live)).toBe(true);
    // No creator file: a create between mkdir and writing it, unless it is old.
    expect(existsSync(young)).toBe(true);
    expect(existsSync(old)).toBe(false);
  });
});
