/**
 * The layout of a pyro microVM guest, shared by the host side (src/backends/vm) and the
 * agent's vm_* ops. It lives with the agent because the agent is the lowest layer.
 */

/** Virtio serials of the guest's disks. */
export const DISK_SERIAL = {
  /** ext4 image of the environment's root filesystem; read-only, shared by every VM of that environment. */
  env: "pyro-env",
  /** ext4 image holding the Node runtime, the built agent and the guest helpers; read-only. */
  agent: "pyro-agent",
  /** The workspace's only writable disk: the root filesystem's and /workspace's upper layers. */
  state: "pyro-state",
  /** ext4 image of the snapshot tree /workspace starts from; read-only, mounted by the agent after start. */
  seed: "pyro-seed",
} as const;

/**
 * The guest's setup helper, `<agent disk>/bin/<name>` (backends/vm/setup-helper.ts): one
 * static program for vm_setup's clock, entropy, hostname and mounts.
 */
export const SETUP_HELPER = "pyro-vmsetup";

/** Where things are inside the guest. */
export const GUEST = {
  agentDir: "/run/pyro/agent",
  stateDir: "/run/pyro/state",
  seedDir: "/run/pyro/seed",
  /** Snapshot trees other than the current one, pushed on demand (diff against them). */
  snapshotsDir: "/run/pyro/snapshots",
  workspace: "/workspace",
  /** /workspace's upper layer and overlay work directory, on the state disk. */
  workspaceUpper: "/run/pyro/state/ws/upper",
  workspaceWork: "/run/pyro/state/ws/work",
  /** The setup helper's server socket (SETUP_HELPER --serve, started by stage 2). */
  setupSocket: "/run/pyro/setup.sock",
  /** The agent's unix socket (vsock channel: the bridge forwards vsock connections here). */
  agentSocket: "/run/pyro/agent.sock",
  /** The network mux's unix socket (vsock channel: a second bridge forwards NET_VSOCK_PORT here). */
  netSocket: "/run/pyro/net.sock",
} as const;
