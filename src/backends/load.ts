import type { BackendName, WorkspaceBackend } from "./backend.js";
import type { BackendContext } from "./registry.js";

/**
 * One backend's implementation, loaded on demand: for a process that needs a single
 * backend (the network helper, core/netd.ts, one per workspace) and should not load every
 * backend's dependencies (the Docker client alone is tens of MiB of memory). Keyed by
 * BackendName, so a backend without a loader does not compile; each line builds it as
 * registry.ts's `create` does.
 */
const LOADERS: { readonly [N in BackendName]: (c: BackendContext) => Promise<WorkspaceBackend> } = {
  firecracker: async (c) =>
    new (await import("./firecracker/backend.js")).FirecrackerBackend({
      env: c.env,
      ...(c.settings.firecrackerBin ? { binName: c.settings.firecrackerBin } : {}),
    }),
  qemu: async (c) => new (await import("./qemu/backend.js")).QemuBackend({ kvm: c.kvm }),
  gvisor: async (c) => new (await import("./gvisor/backend.js")).GvisorBackend({ kvm: c.kvm }),
  docker: async (c) => new (await import("./docker/backend.js")).DockerBackend(c.env),
  bwrap: async () => new (await import("./bwrap/backend.js")).BwrapBackend(),
  host: async () => new (await import("./host/backend.js")).HostBackend(),
};

export function loadBackend(name: BackendName, ctx: BackendContext): Promise<WorkspaceBackend> {
  return LOADERS[name](ctx);
}
