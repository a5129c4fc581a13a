import { rm } from "node:fs/promises";
import { ACTIONS, PyroError } from "../errors.js";
import type { WorkspaceRow } from "../state/types.js";
import { treeSize } from "../util/fs.js";
import { assertAllowed } from "./lifecycle.js";
import { ExportWriter } from "./transfer.js";
import { workspaceView } from "./views.js";
import { sandboxDiskMib } from "./workspace-spec.js";
import type { Workspaces } from "./workspaces.js";

const SNAPSHOT_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;

/**
 * The most bytes of file data an archive out of /workspace (a snapshot, an export) is
 * accepted with: what /workspace can hold, its disk limit over the snapshot it runs on.
 * The host writes a sparse file in full (untrusted-tar.ts tooLarge); without a bound a
 * file that held no block in /workspace filled the host's disk. None without a limit.
 */
export function workspaceArchiveBudget(ws: Workspaces, w: WorkspaceRow): number | undefined {
  const mib = sandboxDiskMib(w);
  if (mib === undefined) return undefined;
  const lower = ws.history.getSnapshot(w.workspace_id, w.current_snapshot ?? "baseline")?.bytes ?? 0;
  return mib * 1024 * 1024 + lower;
}

/**
 * Named snapshots: a full copy of /workspace, taken through the agent and stored on the
 * host as a read-only tree. Reset to a snapshot starts the sandbox on a fresh writable
 * layer over that tree (copy-on-write: nothing is copied back).
 */
export async function createSnapshot(ws: Workspaces, idOrName: string, name: string) {
  if (!SNAPSHOT_NAME.test(name) || name === "baseline") {
    throw new PyroError(
      "invalid_argument",
      `invalid snapshot name '${name}'`,
      "use letters, digits, '.', '_' or '-'; 'baseline' is reserved",
    );
  }
  return ws.withAgent(idOrName, "snapshot", async (agent, w, journal) => {
    if (ws.history.getSnapshot(w.workspace_id, name)) {
      throw new PyroError(
        "conflict",
        `snapshot '${name}' already exists`,
        "delete it first or choose another name",
      );
    }
    const dir = ws.snapshotDir(w, name);
    const writer = new ExportWriter(dir, "snapshot", workspaceArchiveBudget(ws, w));
    await writer.begin();
    try {
      const r = await agent.request(
        "tar_out",
        { path: "/workspace" },
        { onData: (c: Buffer) => writer.write(c), timeoutMs: 30 * 60_000, signal: writer.refused },
      );
      await writer.commit(r.artifact_type);
    } catch (err) {
      const why = await writer.refusalOr(err);
      await writer.abort();
      throw why;
    }
    const size = await treeSize(dir);
    const row = journal((store) => {
      const made = store.upsertSnapshot({
        workspace_id: w.workspace_id,
        name,
        kind: "named",
        layer: dir,
        bytes: size.bytes,
        file_count: size.files,
      });
      store.recordEvent(w.workspace_id, "snapshot_create", {
        snapshot_name: name,
        bytes: size.bytes,
        file_count: size.files,
      });
      return made;
    });
    return snapshotView(row, w.workspace_id);
  });
}

export async function listSnapshots(ws: Workspaces, idOrName: string) {
  const w = await ws.get(idOrName);
  const rows = ws.history.listSnapshots(w.workspace_id);
  return {
    workspace_id: w.workspace_id,
    count: rows.length,
    snapshots: rows.map((r) => snapshotView(r, w.workspace_id)),
  };
}

export async function deleteSnapshot(ws: Workspaces, idOrName: string, name: string) {
  const w = await ws.get(idOrName);
  const row = ws.history.getSnapshot(w.workspace_id, name);
  if (!row) throw new PyroError("not_found", `workspace ${w.workspace_id} has no snapshot '${name}'`);
  if (row.kind === "baseline") throw new PyroError("conflict", "the baseline snapshot cannot be deleted");
  if (w.current_snapshot === name) {
    throw new PyroError(
      "conflict",
      `snapshot '${name}' is the layer the workspace currently runs on`,
      "reset to another snapshot first",
    );
  }
  ws.journal(w.workspace_id, (store) => {
    store.deleteSnapshot(w.workspace_id, name);
    store.recordEvent(w.workspace_id, "snapshot_delete", { snapshot_name: name });
  });
  await rm(ws.snapshotDir(w, name), { recursive: true, force: true });
  return { workspace_id: w.workspace_id, snapshot_name: name, deleted: true };
}

/** Restores /workspace exactly to the baseline or a named snapshot, deletions included. */
export async function resetWorkspace(ws: Workspaces, idOrName: string, options: { snapshot?: string } = {}) {
  const w = await ws.get(idOrName);
  assertAllowed(w.state, "reset", w.workspace_id);
  const snapshot = options.snapshot ?? "baseline";
  if (!ws.history.getSnapshot(w.workspace_id, snapshot)) {
    throw new PyroError(
      "not_found",
      `workspace ${w.workspace_id} has no snapshot '${snapshot}'`,
      "list them with {action}",
      { action: ACTIONS.listSnapshots },
    );
  }
  const started = performance.now();
  await ws.restartOn(w, snapshot);
  const updated = ws.journal(w.workspace_id, (store) => {
    const row = store.updateWorkspace(w.workspace_id, { reset_count: "increment" });
    store.recordEvent(w.workspace_id, "reset", { snapshot_name: snapshot });
    return row;
  });
  return {
    ...workspaceView(updated, ws.executionMode(updated)),
    workspace_reset: { snapshot_name: snapshot, duration_ms: Math.round(performance.now() - started) },
  };
}

function snapshotView(
  r: { name: string; kind: string; created_at: string; bytes: number; file_count: number },
  workspaceId: string,
) {
  return {
    workspace_id: workspaceId,
    snapshot_name: r.name,
    kind: r.kind,
    created_at: r.created_at,
    size_bytes: r.bytes,
    file_count: r.file_count,
  };
}
