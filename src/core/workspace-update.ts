import { PyroError } from "../errors.js";
import type { WorkspaceRow } from "../state/types.js";
import { assertAllowed } from "./lifecycle.js";
import { approvedPolicy, checkNetworkSupport, parseNetworkPolicy } from "./network.js";
import { workspaceView } from "./views.js";
import { label, type WorkspaceInternals } from "./workspace-deps.js";
import { validateName } from "./workspace-spec.js";

/** What `update` may change of a workspace. */
export interface WorkspaceUpdate {
  name?: string;
  set_labels?: Record<string, string>;
  clear_labels?: string[];
  network_policy?: string;
}

/** Renames, relabels or changes the network policy of a workspace, journaled as one event. */
export async function updateWorkspace(inner: WorkspaceInternals, idOrName: string, patch: WorkspaceUpdate) {
  const { ws, deps } = inner;
  const w = await ws.get(idOrName);
  assertAllowed(w.state, "update", w.workspace_id);
  const policy = patch.network_policy === undefined ? undefined : parseNetworkPolicy(patch.network_policy);
  if (policy !== undefined)
    checkNetworkSupport(deps.backend(w.backend), policy, w.spec.published_ports ?? []);
  if (patch.name !== undefined) {
    validateName(patch.name);
    if (inner.deps.store().nameTaken(patch.name, w.workspace_id))
      throw new PyroError("conflict", `a workspace named '${patch.name}' already exists`);
  }
  const backend = deps.backend(w.backend);
  // The network first (the helper reads the policy per connection: starting or stopping
  // it is all a change needs): a policy the helper cannot apply changes nothing at all.
  if (policy !== undefined && w.state === "running")
    await inner.startNetwork({ ...w, network_policy: policy }, backend).catch(async (err) => {
      await inner.startNetwork(w, backend).catch(() => {});
      throw err;
    });
  const updated = ws.journal(w.workspace_id, (store) => {
    const row = store.updateWorkspace(w.workspace_id, {
      ...(patch.name !== undefined ? { name: patch.name } : {}),
      ...(patch.set_labels ? { set_labels: patch.set_labels } : {}),
      ...(patch.clear_labels ? { clear_labels: patch.clear_labels } : {}),
      ...(policy !== undefined ? { network_policy: policy } : {}),
    });
    store.recordEvent(w.workspace_id, "update", patch as Record<string, unknown>);
    return row;
  });
  return workspaceView(updated, backend.executionMode);
}

/** The capability blocks of a workspace: destinations its proxy refused. */
export async function networkBlocks(inner: WorkspaceInternals, idOrName: string) {
  const w = await inner.ws.get(idOrName);
  const blocks = inner.deps
    .store()
    .listNetworkBlocks(w.workspace_id)
    .map((b) => ({
      kind: b.kind,
      target: b.target,
      reason: b.reason,
      count: b.count,
      first_at: b.first_at,
      last_at: b.last_at,
    }));
  return { workspace_id: w.workspace_id, network_policy: w.network_policy, count: blocks.length, blocks };
}

/**
 * A human's approval of `target` (`host[:port]`): allowed from the next connection
 * on (the helper reads the row per connection). Never an MCP tool: a model must not
 * approve its own egress.
 */
export async function approveNetwork(inner: WorkspaceInternals, idOrName: string, target: string) {
  const { ws } = inner;
  const w = await ws.get(idOrName);
  assertAllowed(w.state, "update", w.workspace_id);
  const next = approvedPolicy(w, target);
  const updated = ws.journal(w.workspace_id, (store) => {
    const row = store.updateWorkspace(w.workspace_id, {
      network_policy: next.policy,
      spec: { ...w.spec, network_approved: next.approved },
    });
    store.recordEvent(w.workspace_id, "network_approve", { target: next.target });
    return row;
  });
  return {
    workspace_id: w.workspace_id,
    target: next.target,
    network_policy: updated.network_policy,
    approved: next.approved,
  };
}

/**
 * Reports the connections the workspace's proxy refused since `since` (an ISO time),
 * after a command that may have dialled out: one warning per refused destination.
 */
export function reportNetworkBlocks(inner: WorkspaceInternals, w: WorkspaceRow, since: string): void {
  if (!inner.deps.events?.listening || w.network_policy === "off") return;
  for (const b of inner.deps.store().listNetworkBlocks(w.workspace_id)) {
    if (b.last_at < since) break; // most recent first
    inner.ws.emit({
      level: "warning",
      kind: "network",
      message: `workspace ${label(w)}: network policy ${w.network_policy} refused ${b.target} (${b.reason}; ${b.count} time(s) so far); a person can approve it with \`pyro workspace network approve ${w.workspace_id} ${b.target}\``,
      workspace_id: w.workspace_id,
      data: { target: b.target, count: b.count, reason: b.reason },
    });
  }
}
