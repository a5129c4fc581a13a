import { join } from "node:path";
import type { WorkspaceBackend } from "../backends/backend.js";
import { PyroError } from "../errors.js";
import type { WorkspaceRow } from "../state/types.js";
import { acquireLock } from "../util/lock.js";
import { assertAllowed } from "./lifecycle.js";
import { restartServices } from "./services.js";
import { workspaceView } from "./views.js";
import { label, sandboxState, type WorkspaceInternals } from "./workspace-deps.js";

/** Stops a workspace's sandbox and its network helper; its files are kept. */
export async function stopWorkspace(inner: WorkspaceInternals, idOrName: string) {
  const { ws, deps } = inner;
  const w = await ws.get(idOrName);
  assertAllowed(w.state, "stop", w.workspace_id);
  await inner.dropClient(w.workspace_id);
  const state = sandboxState(w);
  if (state) await deps.backend(w.backend).stop(state);
  await ws.net.stop(w.workspace_id);
  const updated = inner.setState(w.workspace_id, "stopped", { runtime: { sandbox: null } });
  inner.deps.store().recordEvent(w.workspace_id, "stop", {});
  ws.emit({
    level: "info",
    kind: "sandbox",
    message: `workspace ${label(w)}: sandbox stopped`,
    workspace_id: w.workspace_id,
  });
  return workspaceView(updated, deps.backend(w.backend).executionMode);
}

/** Starts a stopped (or failed) workspace's sandbox; a running one is shown as it is. */
export async function startWorkspace(inner: WorkspaceInternals, idOrName: string) {
  const { ws, deps } = inner;
  const w = await ws.get(idOrName);
  if (w.state === "running") return ws.status(idOrName);
  assertAllowed(w.state, "start", w.workspace_id);
  const started = await ensureStarted(inner, w, true);
  inner.deps.store().recordEvent(w.workspace_id, "start", {});
  return workspaceView(started, deps.backend(w.backend).executionMode);
}

/**
 * A workspace marked running whose sandbox died (host reboot, OOM of the sandbox) is
 * restarted on its kept writable layer; one marked stopped stays stopped.
 */
export async function refreshState(inner: WorkspaceInternals, w: WorkspaceRow): Promise<WorkspaceRow> {
  // An `error` workspace is one whose last start failed: every use tries again.
  if (w.state !== "running" && w.state !== "error") return w;
  const state = sandboxState(w);
  const backend = inner.deps.backend(w.backend);
  if ((w.state === "running" && (await stillLive(inner, w))) || (state && (await backend.isRunning(state)))) {
    // A helper that died (killed, host restarted it away) is started again on its own.
    if (inner.ws.net.needed(w) && !(await inner.ws.net.running(w.workspace_id)))
      return inner.startNetwork(w, backend);
    return w;
  }
  return ensureStarted(inner, w, false);
}

/**
 * Whether an open agent connection shows `w`'s sandbox running. One turn of the event
 * loop first: a sandbox that died since the last call has closed its end, and that close
 * is seen in the turn, so the death is found here and the sandbox restarted, as the
 * backend's own check would (without the turn, the request went out on the dead
 * connection and came back as a sandbox that died during it).
 */
async function stillLive(inner: WorkspaceInternals, w: WorkspaceRow): Promise<boolean> {
  if (!inner.liveClient(w)) return false;
  await new Promise<void>((resolve) => setImmediate(resolve));
  return inner.liveClient(w);
}

/**
 * Starts `w`'s sandbox unless it runs, under the workspace's start lock (two clients never
 * start two sandboxes for it). `explicit`: a `start` asked for it; otherwise a use found
 * the sandbox dead, which only a running (or failed) workspace may revive.
 */
async function ensureStarted(
  inner: WorkspaceInternals,
  w: WorkspaceRow,
  explicit: boolean,
): Promise<WorkspaceRow> {
  const { ws } = inner;
  const release = await acquireLock(join(ws.workspaceDir(w.workspace_id), "start.lock"), {
    timeoutMs: 60_000,
  });
  try {
    const fresh = inner.deps.store().getWorkspace(w.workspace_id);
    if (!fresh) throw new PyroError("workspace_not_found", `workspace ${w.workspace_id} was deleted`);
    const backend = inner.deps.backend(fresh.backend);
    const state = sandboxState(fresh);
    if (state && (await backend.isRunning(state))) return fresh;
    if (!explicit && fresh.state !== "running") assertAllowed(fresh.state, "exec", fresh.workspace_id);
    if (state) await backend.stop(state);
    const started = await inner.startSandbox(fresh, ws.sandboxSpec(fresh));
    const services = (started.spec.services ?? []).length > 0;
    ws.emit(
      explicit
        ? {
            level: "info",
            kind: "sandbox",
            message: `workspace ${label(fresh)}: sandbox started on ${fresh.backend}`,
            workspace_id: fresh.workspace_id,
          }
        : {
            level: "warning",
            kind: "sandbox",
            message: `workspace ${label(fresh)}: its sandbox was not running (${fresh.state === "error" ? "its last start failed" : "it died"}); restarted on its kept files${services ? ", services starting again" : ""}`,
            workspace_id: fresh.workspace_id,
          },
    );
    // Its services died with the sandbox: the kept ones start again (core/services.ts).
    if (services) {
      await inner.dropClient(started.workspace_id);
      await restartServices(ws, await inner.client(started, backend), started);
    }
    return started;
  } finally {
    await release();
  }
}

/**
 * Starts (or stops) the workspace's network helper to match its row, recording the
 * published ports as bound (a host port 0 becomes the one picked, kept for restarts).
 */
export async function syncNetwork(
  inner: WorkspaceInternals,
  w: WorkspaceRow,
  backend: WorkspaceBackend,
): Promise<WorkspaceRow> {
  const bound = await inner.ws.net.ensure(w, backend);
  const asked = w.spec.published_ports ?? [];
  if (!bound || JSON.stringify(bound) === JSON.stringify(asked)) return w;
  return inner.deps.store().updateWorkspace(w.workspace_id, { spec: { ...w.spec, published_ports: bound } });
}
