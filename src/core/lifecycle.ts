import { ACTIONS, PyroError } from "../errors.js";
import type { WorkspaceState } from "../state/types.js";

/**
 * The workspace lifecycle in one place: which operations each state allows. A call in the
 * wrong state fails with its own error code (workspace_stopped or conflict).
 *
 *   creating ──▶ running ◀──▶ stopped
 *       │           │            │
 *       ▼           ▼            ▼
 *     error ──▶ deleting ──▶ (gone)
 */
export type Operation =
  | "exec"
  | "files"
  | "snapshot"
  | "reset"
  | "stop"
  | "start"
  | "delete"
  | "update"
  | "read";

const ALLOWED: Record<WorkspaceState, readonly Operation[]> = {
  creating: ["delete", "read"],
  running: ["exec", "files", "snapshot", "reset", "stop", "delete", "update", "read"],
  stopped: ["start", "delete", "update", "read", "reset"],
  error: ["delete", "read", "update", "start"],
  deleting: ["delete", "read"],
};

export function assertAllowed(state: WorkspaceState, op: Operation, id: string): void {
  if (ALLOWED[state].includes(op)) return;
  if (state === "stopped") {
    throw new PyroError("workspace_stopped", `workspace ${id} is stopped`, "start it first with {action}", {
      action: ACTIONS.startWorkspace(id),
    });
  }
  throw new PyroError("conflict", `workspace ${id} is ${state}; '${op}' is not possible now`);
}

export function allowedOperations(state: WorkspaceState): readonly Operation[] {
  return ALLOWED[state];
}
