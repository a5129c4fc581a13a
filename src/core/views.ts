import type { ExecutionMode } from "../backends/backend.js";
import { DISK_LIMITED } from "../backends/disk-image.js";
import type { WorkspaceRow } from "../state/types.js";

/** The workspace object every surface returns for create/status/update (snake_case). */
export function workspaceView(w: WorkspaceRow, executionMode: ExecutionMode) {
  return {
    workspace_id: w.workspace_id,
    name: w.name,
    labels: w.labels,
    environment: w.environment,
    backend: w.backend,
    execution_mode: executionMode,
    state: w.state,
    network_policy: w.network_policy,
    /** Host ports as bound (127.0.0.1) and the guest ports they reach. */
    published_ports: w.spec.published_ports ?? [],
    created_at: w.created_at,
    last_activity_at: w.last_activity_at,
    expires_at: w.expires_at,
    workspace_seed: w.workspace_seed,
    current_snapshot: w.current_snapshot,
    reset_count: w.reset_count,
    limits: {
      vcpus: w.spec.vcpus,
      memory_mib: w.spec.memory_mib,
      pids_max: w.spec.pids_max ?? null,
      // Where the backend enforces one (DISK_LIMITED, or docker on an engine that can);
      // null for workspaces made before it.
      disk_mib: DISK_LIMITED.includes(w.backend) || w.spec.disk_enforced ? (w.spec.disk_mib ?? null) : null,
    },
    error: w.error,
    /** Names and kinds only; values never leave the encrypted store. */
    secrets: w.secret_refs.map((r) => ({ name: r.name, kind: r.kind })),
    env_names: Object.keys(w.spec.env),
  };
}

export type WorkspaceView = ReturnType<typeof workspaceView>;

// One row of `workspace list`: in list-item.ts, which `workspace list` loads without
// this module's imports (the engine-free list of core/workspace-list.ts).
export { workspaceListItem } from "./list-item.js";
