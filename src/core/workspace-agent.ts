import type { AgentClient } from "../agent/client.js";
import { AgentError } from "../agent/errors.js";
import type { WorkspaceBackend } from "../backends/backend.js";
import { PyroError, toPyroError } from "../errors.js";
import type { WorkspaceRow } from "../state/types.js";
import { stillRunningAfterBreak } from "./connections.js";
import { assertAllowed, type Operation } from "./lifecycle.js";
import { redactError } from "./secrets.js";
import { type JournalWriter, sandboxState, type WorkspaceInternals } from "./workspace-deps.js";
import { refreshState } from "./workspace-starts.js";

/** What `withAgent` runs: a request to the agent that journals what it did through `journal`. */
export type AgentCall<T> = (
  agent: AgentClient,
  w: WorkspaceRow,
  journal: <R>(write: (store: JournalWriter) => R) => R,
) => Promise<T>;

/**
 * Runs `fn` with a connected agent of a running workspace; reconnects once on a dead
 * channel. `fn` records what it did through `journal` (one transaction, activity
 * included); a call that journals nothing still counts as activity. Errors leave
 * redacted of the workspace's secrets.
 */
export async function withAgent<T>(
  inner: WorkspaceInternals,
  idOrName: string,
  op: Operation,
  fn: AgentCall<T>,
): Promise<T> {
  let w = await inner.ws.get(idOrName);
  assertAllowed(w.state, op, w.workspace_id);
  w = await refreshState(inner, w);
  const backend = inner.deps.backend(w.backend);
  for (let attempt = 0; ; attempt++) {
    let client: AgentClient;
    try {
      client = await inner.client(w, backend);
      // A cached connection whose sandbox went away (restarted by another process, or
      // died): reconnect before sending anything.
      if (client.closed) throw new PyroError("backend_unavailable", "the cached agent connection is closed");
    } catch (err) {
      await inner.dropClient(w.workspace_id);
      if (attempt > 0) throw toPyroError(err);
      w = await refreshState(inner, inner.deps.store().getWorkspace(w.workspace_id) ?? w);
      continue;
    }
    try {
      return await callJournaled(inner, client, w, fn);
    } catch (err) {
      const e = isBroken(err) ? await brokenConnection(inner, w, backend, err as Error) : toPyroError(err);
      throw redactError(e, await inner.ws.secretValues(w));
    }
  }
}

/** Runs `fn`, counting the call as activity when it journaled nothing itself. */
async function callJournaled<T>(
  inner: WorkspaceInternals,
  client: AgentClient,
  w: WorkspaceRow,
  fn: AgentCall<T>,
): Promise<T> {
  let journaled = false;
  const id = w.workspace_id;
  const journal = <R>(write: (store: JournalWriter) => R): R => {
    journaled = true;
    return inner.ws.journal(id, write);
  };
  const result = await fn(client, w, journal);
  if (!journaled) inner.deps.store().recordActivity(id);
  return result;
}

/** Whether the agent connection broke while the request was in flight. */
function isBroken(err: unknown): boolean {
  return (
    err instanceof AgentError && (err.code === "agent_disconnected" || err.code === "protocol_violation")
  );
}

/**
 * The error for a connection that broke mid-request: it may have run in part, so it is
 * not run again. The next request finds the sandbox dead and restarts it.
 */
async function brokenConnection(
  inner: WorkspaceInternals,
  w: WorkspaceRow,
  backend: WorkspaceBackend,
  err: Error,
): Promise<PyroError> {
  await inner.dropClient(w.workspace_id);
  const state = sandboxState(w);
  const alive = state ? await stillRunningAfterBreak(backend, state) : false;
  return new PyroError(
    "backend_unavailable",
    alive
      ? `the connection to workspace ${w.workspace_id}'s agent broke during the request (${err.message})`
      : `workspace ${w.workspace_id}'s sandbox died during the request`,
    alive
      ? "retry the request"
      : "retry: the next request restarts the sandbox with the workspace's files kept",
  );
}
