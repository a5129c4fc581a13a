import { readdir } from "node:fs/promises";
import { join } from "node:path";
import { StateStore } from "../state/store.js";
import { makeDirsSync } from "../util/fs.js";
import { type ConfigOptions, resolvePaths } from "./config.js";
import { workspaceListItem } from "./list-item.js";

/** What `workspace list` returns (Workspaces.list). */
export interface WorkspaceList {
  count: number;
  workspaces: ReturnType<typeof workspaceListItem>[];
}

/**
 * `workspace list` from the state store alone, without importing the engine (issue 18:
 * the workspace service's module graph was most of a `pyro workspace list`). A list
 * through the engine reaps first (workspace-removal.ts reapExpired): expired workspaces,
 * creates and deletes whose process died, directories a killed create left. This looks
 * for anything such a reap could act on, more broadly than the reap itself (any row
 * creating or deleting, any expired row, any entry of the workspaces directory that is
 * not a listed workspace's); when there is something, it returns null and the caller
 * lists through the engine, so the answer is the same either way.
 */
export async function listIfNothingToReap(options: ConfigOptions): Promise<WorkspaceList | null> {
  const { home } = resolvePaths(options);
  // As Engine.store() opens it.
  makeDirsSync(home, 0o700);
  const store = StateStore.open(join(home, "state.db"));
  try {
    const rows = store.listWorkspaces();
    if (rows.some((w) => w.state === "creating" || w.state === "deleting")) return null;
    if (store.expiredWorkspaces().length > 0) return null;
    const ids = new Set(rows.map((w) => w.workspace_id));
    const dirs = await readdir(join(home, "workspaces")).catch(() => [] as string[]);
    if (dirs.some((name) => !ids.has(name))) return null;
    return { count: rows.length, workspaces: rows.map(workspaceListItem) };
  } finally {
    store.close();
  }
}
