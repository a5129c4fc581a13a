import { ACTIONS, PyroError } from "../errors.js";
import type { WorkspaceState } from "../state/types.js";

/**
 * The workspace lifecycle in one place: which operations each state allows and which
 * state changes are possible. A call in the wrong state fails with its own error code
 * (workspace_stopped or conflict); a state change the table does not list is a bug
 * (`internal`), caught where the state is written (Workspaces.setState).
 *
 *   creating ──▶ running ◀──▶ stopped
 *                 │  ▲           │
 *                 ▼  │           │
 *                 error ─────────┤
 *                   │            ▼
 *                   └──────▶ deleting ──▶ (gone)
 *
 * `error`: the sandbox could not be (re)started; the row's `error` says why. The
 * workspace keeps its files, and the next use (or `start`) tries again: a success makes
 * it `running`, a failure keeps it in `error` with the new reason.
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
  error: ["exec", "files", "snapshot", "reset", "stop", "delete", "update", "read", "start"],
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

const TRANSITIONS: Record<WorkspaceState, readonly WorkspaceState[]> = {
  creating: ["running", "deleting"],
  running: ["running", "stopped", "error", "deleting"],
  stopped: ["running", "stopped", "error", "deleting"],
  error: ["running", "stopped", "error", "deleting"],
  deleting: ["deleting"],
};

/** Refuses a state change the lifecycle does not have (a bug, not a user error). */
export function assertTransition(from: WorkspaceState, to: WorkspaceState, id: string): void {
  if (!TRANSITIONS[from].includes(to))
    throw new PyroError("internal", `workspace ${id} cannot go from ${from} to ${to}`, "this is a pyro bug");
}

export function allowedOperations(state: WorkspaceState): readonly Operation[] {
  return ALLOWED[state];
}
