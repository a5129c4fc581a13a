import type { BackendName, WorkspaceBackend } from "./backend.js";
import { type BackendContext, backendEntry } from "./registry.js";

/**
 * One backend's implementation, loaded on demand: for a process that needs a single
 * backend (the network helper, core/netd.ts, one per workspace) and should not load every
 * backend's dependencies (the Docker client alone is tens of MiB of memory).
 */
export function loadBackend(name: BackendName, ctx: BackendContext): Promise<WorkspaceBackend> {
  return backendEntry(name).load(ctx);
}
