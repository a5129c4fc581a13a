import type { WorkspaceListRow } from "../state/types.js";

/** One row of `workspace list`. */
export function workspaceListItem(w: WorkspaceListRow) {
  return {
    workspace_id: w.workspace_id,
    name: w.name,
    labels: w.labels,
    environment: w.environment,
    backend: w.backend,
    state: w.state,
    created_at: w.created_at,
    last_activity_at: w.last_activity_at,
    expires_at: w.expires_at,
    command_count: w.command_count,
    // The kept definitions (spec.services): the services a running workspace runs, and
    // the ones a `workspace start` starts again.
    service_count: w.spec.services?.length ?? 0,
    running_service_count: w.state === "running" ? (w.spec.services?.length ?? 0) : 0,
  };
}
