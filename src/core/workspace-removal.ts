import { join } from "node:path";
import type { WorkspaceRow } from "../state/types.js";
import { removeTree } from "../util/mounts.js";
import { poolDirOf, reapSpares } from "./pool-records.js";
import { currentOwner, recoverInterrupted } from "./recovery.js";
import { label, sandboxState, type WorkspaceInternals } from "./workspace-deps.js";

/** Deletes a workspace: its sandbox, its helper, its files and its row. */
export async function deleteWorkspace(inner: WorkspaceInternals, idOrName: string) {
  const w = await inner.ws.get(idOrName);
  await destroyWorkspace(inner, w);
  inner.ws.emit({
    level: "info",
    kind: "workspace",
    message: `workspace ${label(w)} deleted`,
    workspaces_changed: true,
    data: { workspace_id: w.workspace_id },
  });
  return { workspace_id: w.workspace_id, name: w.name, deleted: true };
}

/**
 * Removes everything of `w`, recording `deleting` (with this process as owner) first so a
 * delete killed half-way is finished by the next client (recovery.ts).
 */
export async function destroyWorkspace(inner: WorkspaceInternals, w: WorkspaceRow): Promise<void> {
  const { ws } = inner;
  inner.setState(w.workspace_id, "deleting", { runtime: { owner: await currentOwner() } });
  await inner.dropClient(w.workspace_id);
  await ws.net.stop(w.workspace_id);
  const backend = inner.deps.backend(w.backend);
  await backend.destroy(ws.sandboxSpec(w), sandboxState(w));
  await removeTree(ws.workspaceDir(w.workspace_id));
  inner.deps.store().deleteWorkspace(w.workspace_id);
  inner.secrets.forget(w.workspace_id);
}

/**
 * Deletes workspaces whose TTL ran out, and cleans up after clients that died mid-create
 * or mid-delete (recovery.ts) and pools whose process died (pool-records.ts). Errors on one do not block the others.
 */
export async function reapExpired(inner: WorkspaceInternals): Promise<string[]> {
  const { ws } = inner;
  const store = inner.deps.store();
  const reaped: string[] = await recoverInterrupted({
    rows: () => store.listWorkspaces(),
    row: (id) => store.getWorkspace(id),
    workspacesDir: join(inner.deps.paths.home, "workspaces"),
    destroy: (w) => destroyWorkspace(inner, w),
  });
  // A pool's spares whose owner died (a killed `mcp serve`): any process that reaps
  // ends them, not only the next one with a pool on, which a CLI-only user never runs.
  await reapSpares({ dir: poolDirOf(inner.deps.paths.home), backend: (n) => inner.deps.backend(n) }).catch(
    () => 0,
  );
  for (const id of reaped)
    ws.emit({
      level: "notice",
      kind: "workspace",
      message: `workspace ${id} removed: an interrupted create or delete was cleaned up`,
      workspaces_changed: true,
      data: { workspace_id: id, reason: "interrupted" },
    });
  for (const w of store.expiredWorkspaces()) {
    try {
      await destroyWorkspace(inner, w);
      reaped.push(w.workspace_id);
      ws.emit({
        level: "notice",
        kind: "workspace",
        message: `workspace ${label(w)} reaped: it expired at ${w.expires_at}`,
        workspaces_changed: true,
        data: { workspace_id: w.workspace_id, reason: "expired" },
      });
    } catch {
      // retried at the next reap
    }
  }
  return reaped;
}

/** When the next opportunistic reap is due: at most one per `everyMs` per client. */
export class ReapSchedule {
  private last = 0;

  constructor(private readonly everyMs: number) {}

  /** True at most once per `everyMs`, and then counts as the reap. */
  due(): boolean {
    const now = Date.now();
    if (now - this.last < this.everyMs) return false;
    this.last = now;
    return true;
  }
}
