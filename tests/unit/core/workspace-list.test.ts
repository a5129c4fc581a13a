import { mkdir } from "node:fs/promises";
import { join } from "node:path";
import Database from "better-sqlite3";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { listIfNothingToReap } from "../../../src/core/workspace-list.js";
import type { Pyro } from "../../../src/sdk/pyro.js";
import { fakePyro } from "../../helpers/engine.js";

/**
 * `pyro workspace list` reads the store alone when a reap would do nothing (issue 18):
 * its answer must be the engine's, and every state the engine's list would reap first
 * must send it to the engine (null).
 */
let t: Awaited<ReturnType<typeof fakePyro>>;
let pyro: Pyro;
beforeEach(async () => {
  t = await fakePyro();
  pyro = t.pyro;
});
afterEach(() => t.cleanup());

/** Changes rows behind the engine's back, as another process (or time) would. */
function sql(statement: string): void {
  const db = new Database(join(t.home, "state.db"));
  try {
    db.prepare(statement).run();
  } finally {
    db.close();
  }
}

describe("workspace list without the engine", () => {
  it("answers what the engine's list answers when there is nothing to reap", async () => {
    await pyro.createWorkspace({ name: "a", labels: { team: "x" } });
    const b = await pyro.createWorkspace({});
    await pyro.execWorkspace(b.workspace_id, "true");
    const quick = await listIfNothingToReap({ home: t.home });
    expect(quick?.count).toBe(2);
    expect(quick).toEqual(await pyro.listWorkspaces());
  });

  it("defers to the engine when a workspace expired, and agrees once the engine reaped it", async () => {
    const w = await pyro.createWorkspace({});
    await pyro.createWorkspace({ name: "kept" });
    sql(
      `UPDATE workspaces SET expires_at = '2000-01-01T00:00:00.000Z' WHERE workspace_id = '${w.workspace_id}'`,
    );
    expect(await listIfNothingToReap({ home: t.home })).toBeNull();
    const reaped = await pyro.listWorkspaces();
    expect(reaped.count).toBe(1);
    expect(await listIfNothingToReap({ home: t.home })).toEqual(reaped);
  });

  for (const state of ["creating", "deleting"]) {
    it(`defers to the engine when a workspace is ${state} (an interrupted one is rolled back there)`, async () => {
      const w = await pyro.createWorkspace({});
      sql(`UPDATE workspaces SET state = '${state}' WHERE workspace_id = '${w.workspace_id}'`);
      expect(await listIfNothingToReap({ home: t.home })).toBeNull();
    });
  }

  it("defers to the engine when the workspaces directory holds one without a row (a killed create)", async () => {
    await pyro.createWorkspace({});
    expect(await listIfNothingToReap({ home: t.home })).not.toBeNull();
    await mkdir(join(t.home, "workspaces", "ws_0123456789ab"), { recursive: true });
    expect(await listIfNothingToReap({ home: t.home })).toBeNull();
  });
});
