/**
 * The bodies pyro sends to the Docker Engine API, built by pure functions so unit tests
 * can pin them, and the check that the engine applied the isolation and limits asked for.
 */

import { PyroError } from "../../errors.js";
import type { SandboxSpec } from "../backend.js";
import { sandboxHostname } from "../guest.js";
import { OVERLAY_OPTIONS } from "../linux/launch.js";
import { seccompSecurityOpt } from "./seccomp.js";

/** Mount points inside the container (the same as the bwrap backend's). */
export const IN_CONTAINER = {
  workspace: "/workspace",
  runtime: "/run/pyro/runtime",
  app: "/run/pyro/app",
  snapshots: "/run/pyro/snapshots",
  sock: "/run/pyro/sock",
  net: "/run/pyro/net",
} as const;

export const LABELS = {
  workspace: "dev.pyro.workspace",
  dir: "dev.pyro.dir",
  oneshot: "dev.pyro.oneshot",
  /** The disk limit in MiB of a container with a root layer limit (docker/qgroup.ts reads it). */
  diskMib: "dev.pyro.disk_mib",
} as const;

export const CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const MiB = 1024 * 1024;

/**
 * Host-global /proc files a container sees read-only: the engine's own default list
 * (setting the list replaces it) plus /proc/pressure, whose PSI triggers uid 0 could
 * otherwise create on the host kernel.
 */
export const READONLY_PATHS = [
  "/proc/asound",
  "/proc/bus",
  "/proc/fs",
  "/proc/irq",
  "/proc/sys",
  "/proc/sysrq-trigger",
  "/proc/pressure",
];

/** The subset of the Engine API's HostConfig pyro sets (field names as the API spells them). */
export interface HostConfigBody {
  NetworkMode: "none";
  Init: true;
  Memory: number;
  MemorySwap: number;
  NanoCpus: number;
  PidsLimit: number;
  CapDrop: string[];
  SecurityOpt: string[];
  ReadonlyPaths: string[];
  Privileged: false;
  ReadonlyRootfs: false;
  IpcMode: "private";
  LogConfig: { Type: "none"; Config: Record<string, string> };
  RestartPolicy: { Name: "no" };
  Mounts: MountBody[];
  /** The root layer's size limit, in bytes (docker/disk-limit.ts); absent: no disk limit. */
  StorageOpt?: { size: string };
}

export interface MountBody {
  Type: "bind" | "volume";
  Source: string;
  Target: string;
  ReadOnly?: boolean;
  VolumeOptions?: { NoCopy: boolean };
}

export interface ContainerBody {
  name: string;
  Image: string;
  Cmd: string[];
  Env: string[];
  WorkingDir: string;
  User: string;
  Hostname: string;
  Labels: Record<string, string>;
  /** Only one-shots that pass the caller's stdin open it (workspaces never do). */
  AttachStdin: boolean;
  AttachStdout: boolean;
  AttachStderr: boolean;
  OpenStdin: boolean;
  StdinOnce?: true;
  Tty: false;
  HostConfig: HostConfigBody;
}

export interface VolumeBody {
  Name: string;
  Driver: "local";
  DriverOpts: { type: "overlay"; device: "overlay"; o: string };
  Labels: Record<string, string>;
}

/**
 * Isolation and limits every pyro container gets: no network but loopback, an init as
 * pid 1 that reaps orphans, every capability dropped, no_new_privs, pyro's seccomp
 * profile (docker/seccomp.ts: the bwrap policy, which also refuses AF_VSOCK), memory without swap, CPU bandwidth, a pids limit, and no log capture
 * (output reaches pyro through attach/exec streams only).
 */
export function hostConfig(
  limits: SandboxSpec["limits"],
  mounts: MountBody[],
  storageSize?: string,
): HostConfigBody {
  const memory = limits.memory_mib * MiB;
  return {
    NetworkMode: "none",
    Init: true,
    Memory: memory,
    MemorySwap: memory,
    NanoCpus: Math.round(limits.vcpus * 1e9),
    PidsLimit: limits.pids_max,
    CapDrop: ["ALL"],
    SecurityOpt: ["no-new-privileges", seccompSecurityOpt()],
    ReadonlyPaths: [...READONLY_PATHS],
    Privileged: false,
    ReadonlyRootfs: false,
    IpcMode: "private",
    LogConfig: { Type: "none", Config: {} },
    RestartPolicy: { Name: "no" },
    Mounts: mounts,
    ...(storageSize ? { StorageOpt: { size: storageSize } } : {}),
  };
}

export function containerEnv(extra: Record<string, string> = {}): string[] {
  const base: Record<string, string> = { PATH: CONTAINER_PATH, HOME: "/root", LANG: "C.UTF-8", ...extra };
  return Object.entries(base).map(([k, v]) => `${k}=${v}`);
}

/** Docker's container names: `pyro-<workspace id>`. */
export function containerName(workspaceId: string): string {
  return `pyro-${workspaceId}`;
}

/** The overlay volume that is the workspace's /workspace. */
export function volumeName(workspaceId: string): string {
  return `pyro-${workspaceId}-workspace`;
}

export function hostnameFor(id: string): string {
  return sandboxHostname(id);
}

/**
 * A workspace's long-lived container: its main process is the agent, serving a socket in
 * the bound socket directory (or, without one, an idle command, with agents coming and
 * going through exec); Docker's init is pid 1 and reaps. /workspace is the overlay
 * volume; the runtime, the pyro package and the snapshot trees are read-only binds.
 */
export function workspaceContainerBody(p: {
  spec: SandboxSpec;
  image: string;
  runtimeDir: string;
  /** The agent's copy of the package (agent-app.ts), bound at /run/pyro/app. */
  appDir: string;
  /** The container's main process: the agent (listen mode) or an idle command. */
  mainCmd: string[];
  /** `uid:gid` the workspace runs as (see {@link workspaceUser}). */
  user: string;
  /** Host directory for the network helper's published-port socket (with spec.netDir). */
  sockDir?: string;
  /** The container's and /workspace volume's names (default: the workspace's; a standby's differ). */
  name?: string;
  volume?: string;
  /** The root layer's size limit (docker/disk-limit.ts storageSize). */
  storageSize?: string;
  /** More binds: /etc's network files on /workspace's image (docker/disk-limit.ts etcBinds). */
  binds?: MountBody[];
  /** The layer also needs an exclusive limit (btrfs full qgroups, qgroup.ts). */
  exclusive?: boolean;
}): ContainerBody {
  const { spec } = p;
  return {
    name: p.name ?? containerName(spec.workspace_id),
    Image: p.image,
    Cmd: p.mainCmd,
    // Docker would put the container's hostname in its first process's environment
    // (the agent's, /proc/1/environ): a pool's spare keeps its own name there when handed
    // out, so every workspace container gets the same fixed value instead.
    Env: containerEnv({ HOSTNAME: "pyro" }),
    WorkingDir: IN_CONTAINER.workspace,
    User: p.user,
    Hostname: hostnameFor(spec.workspace_id),
    Labels: {
      [LABELS.workspace]: spec.workspace_id,
      [LABELS.dir]: spec.dir,
      // The exclusive limit createContainer must set (qgroup.ts): full qgroups only.
      ...(p.storageSize && p.exclusive && spec.limits.disk_mib
        ? { [LABELS.diskMib]: String(spec.limits.disk_mib) }
        : {}),
    },
    AttachStdin: false,
    AttachStdout: false,
    AttachStderr: false,
    OpenStdin: false,
    Tty: false,
    HostConfig: hostConfig(
      spec.limits,
      [
        { Type: "bind", Source: p.runtimeDir, Target: IN_CONTAINER.runtime, ReadOnly: true },
        { Type: "bind", Source: p.appDir, Target: IN_CONTAINER.app, ReadOnly: true },
        { Type: "bind", Source: spec.snapshotsDir, Target: IN_CONTAINER.snapshots, ReadOnly: true },
        {
          Type: "volume",
          Source: p.volume ?? volumeName(spec.workspace_id),
          Target: IN_CONTAINER.workspace,
          VolumeOptions: { NoCopy: true },
        },
        // The network (docs/network.md): the proxy socket's directory read-only, and where
        // the network helper serves published ports.
        ...(spec.netDir && p.sockDir
          ? [
              { Type: "bind" as const, Source: spec.netDir, Target: IN_CONTAINER.net, ReadOnly: true },
              { Type: "bind" as const, Source: p.sockDir, Target: IN_CONTAINER.sock, ReadOnly: false },
            ]
          : []),
        ...(p.binds ?? []),
      ],
      p.storageSize,
    ),
  };
}

/**
 * Who commands run as in a workspace container: the same uid:gid as the pyro process.
 * With every capability dropped, root in the container cannot write files it does not
 * own, and /workspace (the overlay's upper directory, the snapshot trees) belongs to
 * the pyro user: as root (the usual case here) that is uid 0, as a member of the docker
 * group it is that user, who can then also delete what the workspace wrote.
 */
export function workspaceUser(ids: { uid: number; gid: number } | null): string {
  return ids ? `${ids.uid}:${ids.gid}` : "0:0";
}

/** A throwaway container whose only process is `/bin/sh -c command` (pyro run). */
export function oneShotContainerBody(p: {
  id: string;
  image: string;
  command: string;
  env: Record<string, string>;
  limits: SandboxSpec["limits"];
  /** The command reads a stdin the caller sends through the attach (closed at its end). */
  stdin?: boolean;
  /** The root layer's size limit (docker/disk-limit.ts storageSize). */
  storageSize?: string;
  /** /etc's network files (docker/disk-limit.ts etcBinds). */
  binds?: MountBody[];
}): ContainerBody {
  return {
    name: `pyro-${p.id}`,
    Image: p.image,
    Cmd: ["/bin/sh", "-c", p.command],
    Env: containerEnv(p.env),
    WorkingDir: IN_CONTAINER.workspace,
    User: "0:0",
    Hostname: hostnameFor(p.id),
    Labels: { [LABELS.oneshot]: p.id },
    AttachStdin: p.stdin === true,
    AttachStdout: true,
    AttachStderr: true,
    OpenStdin: p.stdin === true,
    ...(p.stdin ? { StdinOnce: true } : {}),
    Tty: false,
    HostConfig: hostConfig(p.limits, p.binds ?? [], p.storageSize),
  };
}

/**
 * The copy-on-write /workspace: a `local`-driver volume of type overlay. The engine
 * mounts it when the container starts and unmounts it when it stops, so pyro itself
 * mounts nothing on the host. Lower: the snapshot tree (never written); upper and work:
 * per-workspace directories on disk.
 */
export function overlayVolumeBody(p: {
  name: string;
  lower: string;
  upper: string;
  work: string;
  labels: Record<string, string>;
}): VolumeBody {
  for (const path of [p.lower, p.upper, p.work]) {
    // The mount option string is comma-separated and lowerdir is colon-separated.
    if (/[,:\\\s]/.test(path)) {
      throw new PyroError(
        "backend_unavailable",
        `the docker backend cannot use a path containing ',', ':', '\\' or blanks: ${path}`,
        "use a PYRO_HOME whose path has none of them",
      );
    }
  }
  return {
    Name: p.name,
    Driver: "local",
    DriverOpts: {
      type: "overlay",
      device: "overlay",
      o: `lowerdir=${p.lower},upperdir=${p.upper},workdir=${p.work},${OVERLAY_OPTIONS}`,
    },
    Labels: p.labels,
  };
}

/** What `GET /containers/{id}/json` says about the settings pyro relies on. */
export interface InspectedHostConfig {
  NetworkMode?: string;
  Init?: boolean | null;
  Memory?: number;
  MemorySwap?: number;
  NanoCpus?: number;
  PidsLimit?: number | null;
  CapDrop?: string[] | null;
  CapAdd?: string[] | null;
  SecurityOpt?: string[] | null;
  ReadonlyPaths?: string[] | null;
  Privileged?: boolean;
  StorageOpt?: Record<string, string> | null;
}

/**
 * Differences between what was asked and what the engine recorded. An engine that cannot
 * enforce a limit drops it (and only warns): pyro refuses to run then (fail closed).
 */
export function unappliedSettings(asked: HostConfigBody, got: InspectedHostConfig): string[] {
  const problems: string[] = [];
  const same = (what: string, a: unknown, b: unknown) => {
    if (a !== b) problems.push(`${what} is ${JSON.stringify(b ?? null)}, asked for ${JSON.stringify(a)}`);
  };
  same("network mode", asked.NetworkMode, got.NetworkMode);
  same("init", asked.Init, got.Init);
  same("memory limit", asked.Memory, got.Memory);
  same("memory+swap limit", asked.MemorySwap, got.MemorySwap);
  same("CPU limit (NanoCpus)", asked.NanoCpus, got.NanoCpus);
  same("pids limit", asked.PidsLimit, got.PidsLimit);
  if (asked.StorageOpt) same("disk limit (StorageOpt size)", asked.StorageOpt.size, got.StorageOpt?.size);
  same("privileged", false, got.Privileged ?? false);
  if (!(got.CapDrop ?? []).some((c) => c.toUpperCase() === "ALL"))
    problems.push("capabilities were not dropped");
  if ((got.CapAdd ?? []).length > 0) problems.push(`capabilities were added: ${got.CapAdd!.join(", ")}`);
  if (!(got.SecurityOpt ?? []).some((o) => /^no-new-privileges(:true|=true)?$/.test(o)))
    problems.push("no-new-privileges is not set");
  if (!(got.SecurityOpt ?? []).some((o) => o.startsWith("seccomp=") && o !== "seccomp=unconfined"))
    problems.push("pyro's seccomp profile is not set");
  const ro = new Set(got.ReadonlyPaths ?? []);
  const notRo = asked.ReadonlyPaths.filter((p) => !ro.has(p));
  if (notRo.length > 0) problems.push(`not read-only: ${notRo.join(", ")}`);
  return problems;
}
