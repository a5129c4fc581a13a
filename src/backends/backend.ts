/**
 * The backend interface: the narrow waist between the core and an isolation technology.
 * Every backend can be probed (does it work on this host, and why not); later issues add
 * `create(spec)` returning a handle with a byte channel to the guest agent.
 */
import type { BackendName, ExecutionMode } from "../names.js";

export { BACKEND_NAMES, type BackendName, type ExecutionMode } from "../names.js";

export interface ProbeResult {
  name: BackendName;
  /** What kind of boundary it gives. */
  isolation: string;
  /** The host can run this backend right now (proved by trying, not by a file existing). */
  available: boolean;
  /** Version of the underlying tool, when it could be read. */
  version: string | null;
  /** Why it is not available (or a caveat when it is). */
  reason: string | null;
  /** Only used when asked for explicitly (host always; qemu under TCG; docker). */
  opt_in: boolean;
  /** Extra facts (KVM state, platform, socket path). */
  details: Record<string, unknown>;
  probe_ms: number;
}

/**
 * Configuration a backend is given (src/core/config.ts reads it; backends never read
 * `PYRO_*` variables themselves).
 */
export interface BackendSettings {
  /** PYRO_FIRECRACKER_BIN: the firecracker binary, a path or a name on PATH. */
  firecrackerBin?: string | undefined;
}

export interface ProbeContext {
  /** The environment to probe in (PATH, DOCKER_HOST); the engine's, not necessarily process.env. */
  env: NodeJS.ProcessEnv;
  settings: BackendSettings;
  /** Scratch directory for probes that need files (a probe kernel, an OCI bundle). */
  scratchDir: string;
  timeoutMs: number;
  /** Shared KVM verdict: several backends need it, it is probed once. */
  kvm: () => Promise<KvmStatus>;
}

export interface KvmStatus {
  present: boolean;
  usable: boolean;
  reason: string | null;
}

/** How to find out whether a backend works here (its rank and constructor are in registry.ts). */
export interface BackendProbe {
  readonly name: BackendName;
  readonly isolation: string;
  probe(ctx: ProbeContext): Promise<Omit<ProbeResult, "name" | "isolation" | "probe_ms">>;
}

/** What the core hands a backend to start a workspace's sandbox. */
export interface SandboxSpec {
  workspace_id: string;
  /** Host directory owned by this workspace; every backend file lives below it. */
  dir: string;
  /** The cached environment's root filesystem (never written). */
  rootfs: string;
  /** Host directory of snapshot trees, one directory per snapshot name (never written by the sandbox). */
  snapshotsDir: string;
  /** The snapshot `/workspace` starts from when the writable layer is fresh. */
  snapshot: string;
  /** `disk_mib`: size of the writable layers' disk (backends that have one; default 10 GiB). */
  limits: { vcpus: number; memory_mib: number; pids_max: number; disk_mib?: number };
  /** Host directory that holds the built pyro package (dist/ and node_modules/) for the agent. */
  appDir: string;
  /** Cache directory for the injected Node runtime. */
  runtimeCacheDir: string;
  /**
   * Host directory where the workspace's egress proxy socket lives (core/network.ts);
   * backends with `connectPort` bind it read-only into the sandbox at /run/pyro/net.
   */
  netDir?: string;
}

/** Live facts about a started sandbox; persisted in the state store so any process can reattach. */
export type SandboxState = Record<string, unknown> & { backend: BackendName };

/** A one-shot command in a throwaway sandbox (no workspace, no agent, no state). */
export interface OneShotSpec {
  rootfs: string;
  /** Directory for the throwaway layer; removed afterwards. */
  scratchDir: string;
  /** Cache directory for host-built helpers (the Node runtime, gVisor's statx shim). */
  runtimeCacheDir: string;
  command: string;
  env: Record<string, string>;
  limits: SandboxSpec["limits"];
  timeoutMs: number;
  maxOutputBytes: number;
  signal?: AbortSignal;
  /** Receives the command's output as it is produced. */
  onOutput?: (stream: "stdout" | "stderr", chunk: Buffer) => void;
  /** The command's stdin (default: empty); not every backend takes one (see runOnce). */
  stdin?: AsyncIterable<Uint8Array> | import("node:stream").Readable;
  /** Where the backend may keep a launch prepared for the next run (the engine's pool is on). */
  keep?: import("./launch-keeper.js").LaunchKeeper;
  /**
   * The caller exits right after the answer (the CLI): the backend may leave the removal
   * of the run's leftovers to a detached cleaner (linux/oneshot-cleaner.ts).
   */
  detachCleanup?: boolean;
}

export interface OneShotResult {
  exit_code: number;
  /** Head, marker line and tail past `maxOutputBytes` (src/agent/capture.ts). */
  stdout: string;
  stderr: string;
  /** Full sizes of the streams in bytes. */
  stdout_bytes: number;
  stderr_bytes: number;
  duration_ms: number;
  timed_out: boolean;
  truncated: boolean;
}

/**
 * A backend that hosts workspaces. The core never spawns sandbox processes itself: it asks
 * the backend to start one, then talks to the guest agent over `connect()`'s byte stream.
 * A started sandbox must outlive the process that started it.
 */
export interface WorkspaceBackend {
  readonly name: BackendName;
  readonly executionMode: ExecutionMode;
  /**
   * For a backend whose disk limit depends on the host (docker: the engine's storage
   * driver): null when new workspaces and one-shots get one, otherwise why not. Backends
   * without it either always limit (disk-image.ts DISK_LIMITED) or never do.
   */
  diskLimitSupport?(): Promise<{ message: string; hint: string } | null>;
  /** Starts the sandbox and its agent; resolves once the agent answers a connection. */
  start(spec: SandboxSpec, options?: { signal?: AbortSignal }): Promise<SandboxState>;
  /** A new byte channel to the agent (the caller does the protocol handshake). */
  connect(state: SandboxState, options?: { timeoutMs?: number }): Promise<import("node:stream").Duplex>;
  /** True when the sandbox recorded in `state` is still alive. */
  isRunning(state: SandboxState): Promise<boolean>;
  /**
   * Stops every process of the sandbox; the writable layer stays. `discarding`: the caller
   * discards the writable layers next (a reset) or removes everything (a delete), so
   * nothing needs flushing first: a backend may end the sandbox at once.
   */
  stop(state: SandboxState, options?: { discarding?: boolean }): Promise<void>;
  /** Discards the writable layers, so the next start shows `spec.snapshot` exactly. */
  discardChanges(spec: SandboxSpec): Promise<void>;
  /**
   * Optional: resets a running sandbox onto `spec.snapshot` without restarting it (its
   * processes but the agent ended, both writable layers as a restart would leave them).
   * Returns the state to record, or null when it could not, leaving the sandbox in any
   * state: the caller then stops it and restarts it. While it runs, the core records the
   * state with `in_place_reset: true`, which makes it not running for every other reader
   * (a process killed mid-reset leaves a sandbox the next use replaces).
   */
  resetInPlace?(
    spec: SandboxSpec,
    state: SandboxState,
    agent: import("../agent/client.js").AgentClient,
  ): Promise<SandboxState | null>;
  /**
   * Optional: makes a spare sandbox (started earlier on `spare`, a spec of the pool's own
   * directories; core/pool.ts) the sandbox of `spec`'s new workspace, in place. Returns
   * the state to record, or `declined` with why when the workspace must start its own
   * (the spare is then ended). `agent` is a connection to the spare's agent.
   */
  adoptSpare?(
    spare: SandboxSpec,
    state: SandboxState,
    spec: SandboxSpec,
    agent: import("../agent/client.js").AgentClient,
  ): Promise<SandboxState | { declined: string }>;
  /** Removes every host file and process the workspace had. */
  destroy(spec: SandboxSpec, state: SandboxState | null): Promise<void>;
  /** Where the agent sees `/workspace` (its `--root`). */
  agentRoot(spec: SandboxSpec): string;
  /** Where the agent sees a snapshot tree (for diff). */
  agentSnapshotPath(spec: SandboxSpec, name: string): string;
  /**
   * Optional: makes snapshot `name` readable by the agent at agentSnapshotPath(), for
   * backends whose guest cannot see the host's snapshot trees (VMs). Called before a diff.
   */
  exposeSnapshot?(
    spec: SandboxSpec,
    state: SandboxState,
    name: string,
    agent: import("../agent/client.js").AgentClient,
  ): Promise<void>;
  /**
   * Optional: a new byte channel to 127.0.0.1:`port` inside the sandbox (published
   * ports). A backend with it also binds `spec.netDir` into the sandbox and has its
   * agent serve egress on 127.0.0.1:3128 (agent/guest/net.ts); one without it supports
   * only the `off` policy and no published ports.
   */
  connectPort?(
    state: SandboxState,
    port: number,
    options?: { timeoutMs?: number },
  ): Promise<import("node:stream").Duplex>;
  /**
   * Optional: a process in the sandbox's own network namespace (pid and start time), for
   * a backend whose agent does not serve egress: the workspace's network helper listens
   * on 127.0.0.1:3128 in that namespace itself (core/netd-attach.ts), attached after
   * every start. Null when the state names no such process.
   */
  egressNamespace?(state: SandboxState): Promise<{ pid: number; start_time: string } | null>;
  /**
   * Optional, for VMs (nothing can be bound into them): the byte channel of the network
   * mux (agent/netmux.ts) that carries the VM's egress and published ports. One session
   * at a time, held by the workspace's network helper (core/netd.ts).
   */
  connectNet?(state: SandboxState, options?: { timeoutMs?: number }): Promise<import("node:stream").Duplex>;
  /**
   * Optional: a byte channel to a read-only guest agent (`--stdio --read-only`) serving
   * the files of a STOPPED workspace at /workspace (its snapshot `spec.snapshot` under its
   * writable layer) without starting it: nothing of the workspace runs, nothing it has is
   * written. The reader runs no more powerful than the workspace's own agent (inside
   * bwrap where the files are on this host). Everything it made (mounts, temp images,
   * containers) goes when the channel closes, or when this process dies. The core holds
   * the workspace's start lock while the channel is open. Backends without it answer
   * `backend_unavailable` for the disk tools.
   */
  openDisk?(
    spec: SandboxSpec,
    options?: { signal?: AbortSignal; timeoutMs?: number },
  ): Promise<import("node:stream").Duplex>;
  /**
   * Optional fast path for exports of a running workspace: a tar archive of
   * /workspace/`rel` (`rel` normalised: no `.`, `..` or empty component; "" is the root)
   * made on the host side without the agent, by a reader no more powerful than the
   * agent. Only for the plain case (bwrap/pack.ts); `finished` is null otherwise, and the
   * caller then exports through the agent. Null when the backend cannot now.
   */
  packWorkspacePath?(spec: SandboxSpec, state: SandboxState, rel: string): Promise<PackedPath | null>;
  /**
   * Optional fast path for pushes into a running workspace (core/push-direct.ts,
   * bwrap/unpack.ts): a view of its /workspace for the host's checks, and GNU tar
   * extracting into it without the agent, in a sandbox no more powerful than the agent.
   * Null when the backend cannot now.
   */
  workspaceWriter?(spec: SandboxSpec, state: SandboxState): Promise<WorkspaceWriter | null>;
  /**
   * Optional fast path for `pyro run`: the command as the sandbox's only process, with the
   * same isolation as a workspace. Backends without it run one-shots as
   * create + exec + delete.
   */
  runOnce?(spec: OneShotSpec): Promise<OneShotResult>;
}

/** A running workspace's path as a tar archive made without the agent (packWorkspacePath). */
export interface PackedPath {
  /** The archive (GNU format), as GNU tar writes it. */
  stream: import("node:stream").Readable;
  /** Once the reader has ended: the path's type when it was the plain case and read cleanly, else null. */
  finished: Promise<{ artifact_type: "file" | "directory" } | null>;
  /** Ends the reader early (it stops once it next writes). */
  stop(): void;
}

/** A push's way into a running workspace without its agent (workspaceWriter). */
export interface WorkspaceWriter {
  /**
   * A host path that shows /workspace as the sandbox sees it, for lstat and readdir only:
   * never written through, and a symlink on the way may lead anywhere on the host.
   */
  view: string;
  /**
   * Extracts the archive `archive()` makes into /workspace/`rel` as the agent's `tar_in`
   * does (GNU tar, `--no-same-owner`), first making the directories `missing` (relative
   * to /workspace, parents first, each name up to 99 bytes); `archive` is called once
   * GNU tar runs. `started`: false when it could not start (nothing was written, the
   * caller may ask the agent); else GNU tar's exit code and its last words.
   */
  unpack(
    rel: string,
    archive: () => Promise<import("node:stream").Readable>,
    missing: string[],
    signal?: AbortSignal,
  ): Promise<{ started: boolean; code: number | null; said: string }>;
}
