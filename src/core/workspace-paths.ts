import { join } from "node:path";
import type { SandboxSpec, WorkspaceBackend } from "../backends/backend.js";
import type { WorkspaceRow } from "../state/types.js";
import type { WorkspaceNetwork } from "./network.js";
import type { WorkspaceDeps } from "./workspace-deps.js";
import { DEFAULTS, sandboxDiskMib } from "./workspace-spec.js";

/** Where workspace `id`'s files live: `$PYRO_HOME/workspaces/<id>/`. */
export function workspaceDirOf(home: string, id: string): string {
  return join(home, "workspaces", id);
}

/**
 * What a backend is given to start, stop or reset `w`'s sandbox: its directories, the
 * snapshot it starts on, its limits (defaults filled in) and its network wiring.
 */
export function sandboxSpecOf(
  deps: Pick<WorkspaceDeps, "paths" | "appDir" | "backend">,
  net: WorkspaceNetwork,
  w: WorkspaceRow,
  snapshot: string,
  rootfs: string,
): SandboxSpec {
  const dir = workspaceDirOf(deps.paths.home, w.workspace_id);
  return {
    workspace_id: w.workspace_id,
    dir: join(dir, "sandbox"),
    rootfs,
    snapshotsDir: join(dir, "snapshots"),
    snapshot,
    limits: {
      vcpus: w.spec.vcpus,
      memory_mib: w.spec.memory_mib,
      pids_max: w.spec.pids_max ?? DEFAULTS.pids_max,
      disk_mib: sandboxDiskMib(w),
    },
    appDir: deps.appDir,
    runtimeCacheDir: join(deps.paths.home, "runtime"),
    ...net.specFor(w.workspace_id, backendOrNull(deps, w)),
  };
}

/** `w`'s backend, or none when its row names none or one this engine cannot load (a rollback's row). */
function backendOrNull(deps: Pick<WorkspaceDeps, "backend">, w: WorkspaceRow): WorkspaceBackend | undefined {
  try {
    return w.backend ? deps.backend(w.backend) : undefined;
  } catch {
    return undefined;
  }
}
