/**
 * OCI runtime configs (config.json) for runsc. Pure functions, so unit tests pin them.
 */
import { SANDBOX_PATH } from "../linux/launch.js";
import { PRELOAD_IN_SANDBOX, SHIM_IN_SANDBOX } from "./statx-shim.js";

/** Mount points inside a gVisor sandbox (the same names as bwrap's). */
export const GVISOR_IN_SANDBOX = {
  workspace: "/workspace",
  runtime: "/run/pyro/runtime",
  app: "/run/pyro/app",
  snapshots: "/run/pyro/snapshots",
  sock: "/run/pyro/sock",
  net: "/run/pyro/net",
} as const;

/** Where the hostname helper (hostname-helper.ts) appears inside a workspace sandbox. */
export const HOSTNAME_HELPER_IN_SANDBOX = "/run/pyro/set-hostname";

export interface OciMount {
  destination: string;
  type: string;
  source: string;
  options?: string[];
}

/** The subset of the OCI runtime spec pyro writes. */
export interface OciConfig {
  ociVersion: string;
  process: {
    terminal: false;
    user: { uid: number; gid: number };
    args: string[];
    env: string[];
    cwd: string;
    capabilities: Record<"bounding" | "effective" | "inheritable" | "permitted" | "ambient", string[]>;
    noNewPrivileges: true;
    rlimits: { type: string; soft: number; hard: number }[];
  };
  root: { path: string; readonly: boolean };
  hostname: string;
  mounts: OciMount[];
  linux: {
    namespaces: { type: string }[];
    cgroupsPath: string;
    resources: {
      memory: { limit: number };
      cpu: { quota: number; period: number };
      pids: { limit: number };
    };
  };
}

export interface Limits {
  vcpus: number;
  memory_mib: number;
  pids_max: number;
}

const CPU_PERIOD_US = 100_000;

/**
 * The init of a workspace sandbox: a shell that starts the agent and waits for it. While
 * `wait` blocks, the shell reaps every child it is given, so orphans of commands (which
 * gVisor reparents to the container's init) never pile up as zombies; when the agent
 * exits the shell does too, the container stops, and the core sees a dead sandbox.
 * Node cannot be init itself: it only reaps its own children.
 */
export const INIT_SCRIPT = '"$@" & wait $!';

/** Environment of every process pyro starts in a sandbox (before per-command env). */
export function sandboxEnv(extra: Record<string, string> = {}): string[] {
  const env: Record<string, string> = { PATH: SANDBOX_PATH, HOME: "/root", LANG: "C.UTF-8", ...extra };
  return Object.entries(env).map(([k, v]) => `${k}=${v}`);
}

/** /proc, /dev (gVisor fills it), /dev/shm and a read-only /sys: gVisor's own, never the host's. */
function systemMounts(): OciMount[] {
  return [
    { destination: "/proc", type: "proc", source: "proc" },
    {
      destination: "/dev",
      type: "tmpfs",
      source: "tmpfs",
      options: ["nosuid", "strictatime", "mode=755", "size=65536k"],
    },
    {
      destination: "/dev/shm",
      type: "tmpfs",
      source: "shm",
      options: ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
    },
    { destination: "/sys", type: "sysfs", source: "sysfs", options: ["nosuid", "noexec", "nodev", "ro"] },
  ];
}

function bind(source: string, destination: string, readonly: boolean): OciMount {
  return { destination, type: "bind", source, options: ["rbind", readonly ? "ro" : "rw"] };
}

/**
 * The common part: no capabilities at all, no_new_privs, uid 0 (root in gVisor's kernel,
 * which is the boundary), pid/ipc/uts/mount/network namespaces (runsc --network=none
 * leaves only lo), limits. RLIMIT_NPROC is what bounds the number of processes inside:
 * gVisor enforces it, while the host pids cgroup only backstops gVisor's own threads.
 */
function baseConfig(options: {
  rootfs: string;
  hostname: string;
  args: string[];
  env: string[];
  cgroupsPath: string;
  limits: Limits;
  mounts: OciMount[];
}): OciConfig {
  const { limits } = options;
  return {
    ociVersion: "1.0.2",
    process: {
      terminal: false,
      user: { uid: 0, gid: 0 },
      args: options.args,
      env: options.env,
      cwd: GVISOR_IN_SANDBOX.workspace,
      capabilities: { bounding: [], effective: [], inheritable: [], permitted: [], ambient: [] },
      noNewPrivileges: true,
      rlimits: [{ type: "RLIMIT_NPROC", soft: limits.pids_max, hard: limits.pids_max }],
    },
    root: { path: options.rootfs, readonly: false },
    hostname: options.hostname,
    mounts: [...systemMounts(), ...options.mounts],
    linux: {
      namespaces: [{ type: "pid" }, { type: "ipc" }, { type: "uts" }, { type: "mount" }, { type: "network" }],
      cgroupsPath: options.cgroupsPath,
      resources: {
        memory: { limit: limits.memory_mib * 1024 * 1024 },
        cpu: { quota: Math.round(limits.vcpus * CPU_PERIOD_US), period: CPU_PERIOD_US },
        pids: { limit: limits.pids_max },
      },
    },
  };
}

export interface WorkspaceConfigInput {
  /** Merged root overlay (host path, inside the launch step's mount namespace). */
  rootfs: string;
  /** Merged workspace overlay. */
  workspace: string;
  runtimeDir: string;
  appDir: string;
  snapshotsDir: string;
  /** Host directory (mode 0700) where the agent's socket appears. */
  sockDir: string;
  /** Host directory of the egress proxy socket, bound read-only (core/network.ts). */
  netDir?: string;
  hostname: string;
  /** The agent's argv as seen inside the sandbox. */
  agentArgv: string[];
  cgroupsPath: string;
  limits: Limits;
  /** The statx shim (statx-shim.ts) and its preload file, for the guest's /etc/ld.so.preload. */
  shim?: { so: string; preload: string } | null;
  /** The hostname helper (hostname-helper.ts), bound read-only at HOSTNAME_HELPER_IN_SANDBOX. */
  hostnameHelper?: string | null;
}

/** Read-only binds of the statx shim and of the preload entry that loads it. */
function shimMounts(shim: { so: string; preload: string } | null | undefined): OciMount[] {
  return shim ? [bind(shim.so, SHIM_IN_SANDBOX, true), bind(shim.preload, PRELOAD_IN_SANDBOX, true)] : [];
}

/** config.json of a workspace sandbox: the init shell running the guest agent. */
export function workspaceConfig(input: WorkspaceConfigInput): OciConfig {
  return baseConfig({
    rootfs: input.rootfs,
    hostname: input.hostname,
    args: ["/bin/sh", "-c", INIT_SCRIPT, "pyro-init", ...input.agentArgv],
    env: sandboxEnv(),
    cgroupsPath: input.cgroupsPath,
    limits: input.limits,
    mounts: [
      bind(input.workspace, GVISOR_IN_SANDBOX.workspace, false),
      bind(input.runtimeDir, GVISOR_IN_SANDBOX.runtime, true),
      bind(input.appDir, GVISOR_IN_SANDBOX.app, true),
      bind(input.snapshotsDir, GVISOR_IN_SANDBOX.snapshots, true),
      bind(input.sockDir, GVISOR_IN_SANDBOX.sock, false),
      ...(input.netDir ? [bind(input.netDir, GVISOR_IN_SANDBOX.net, true)] : []),
      ...shimMounts(input.shim),
      ...(input.hostnameHelper ? [bind(input.hostnameHelper, HOSTNAME_HELPER_IN_SANDBOX, true)] : []),
    ],
  });
}

export interface OneShotConfigInput {
  rootfs: string;
  hostname: string;
  command: string;
  env: Record<string, string>;
  cgroupsPath: string;
  limits: Limits;
  shim?: { so: string; preload: string } | null;
}

/** config.json of a one-shot: `/bin/sh -c COMMAND` is the container's only process. */
export function oneShotConfig(input: OneShotConfigInput): OciConfig {
  return baseConfig({
    rootfs: input.rootfs,
    hostname: input.hostname,
    args: ["/bin/sh", "-c", input.command],
    env: sandboxEnv(input.env),
    cgroupsPath: input.cgroupsPath,
    limits: input.limits,
    mounts: shimMounts(input.shim),
  });
}
