/**
 * Row types of the state store. Field names are snake_case and match the public
 * contract (the product contract's result objects), so core can hand rows to every surface without renaming.
 * Timestamps are ISO-8601 UTC strings as produced by `Date.prototype.toISOString()`;
 * the store normalises every timestamp it is given to that form so that ordering by
 * string comparison in SQL is ordering by time.
 */
import type { BackendName } from "../backends/backend.js";
import type { ExecutionMode } from "../names.js";

/** Lifecycle states a workspace row can be in. Transitions are core's business. */
export const WORKSPACE_STATES = ["creating", "running", "stopped", "error", "deleting"] as const;
export type WorkspaceState = (typeof WORKSPACE_STATES)[number];

/** `off` (default), `egress`, or `allowlist:host1,host2`. */
export type NetworkPolicy = "off" | "egress" | `allowlist:${string}`;

export type { ExecutionMode } from "../names.js";

/** Where the workspace's files came from; its content is the baseline snapshot. */
export interface WorkspaceSeed {
  kind: "directory" | "git" | "empty";
  /** Directory path or repository URL; null for an empty seed. */
  source: string | null;
  /** Git ref asked for (branch, tag, sha), when kind is "git". */
  ref?: string;
  /** Resolved commit, when kind is "git". */
  commit?: string;
  /**
   * The host repository `workspace commit` writes branches to (its top directory), when
   * kind is "git": the seed checkout, or the clone pyro keeps for a repository URL.
   */
  repository?: string;
  /** What seeding left out, counted by reason (Git seeds). */
  skipped?: SeedSkipped;
  file_count: number;
  bytes: number;
}

/** Counts of what a Git seed did not copy, by reason. */
export interface SeedSkipped {
  /** Untracked paths the checkout's ignore rules ignore (an ignored directory counts once). */
  ignored: number;
  /** Submodules (gitlinks): their content is another repository. */
  submodules: number;
  /** Tracked files deleted from the working tree. */
  missing: number;
  /** Paths pyro never seeds: its own home and the secrets key. */
  excluded: number;
  /** Sockets, FIFOs and devices. */
  special: number;
}

/** A published port: host port 0 asks for a free one; status reports the real port. */
export interface PublishedPort {
  host_port: number;
  guest_port: number;
}

/** A service the workspace keeps (core/services.ts): started again by `workspace start`. */
export interface ServiceSpec {
  name: string;
  command: string;
  cwd?: string;
  /** Forwarded env of this service (never secrets: those come from the vault at start). */
  env: Record<string, string>;
  ready:
    | { kind: "file"; path: string }
    | { kind: "tcp"; port: number }
    | { kind: "http"; url: string }
    | { kind: "command"; command: string }
    | null;
  ready_timeout_seconds: number;
}

/**
 * What the workspace was created with. `env` is forwarded, non-secret environment
 * (`--env NAME=VALUE`): it is stored as given. Secrets never go here; see `SecretRef`.
 */
export interface WorkspaceSpec {
  vcpus: number;
  memory_mib: number;
  pids_max?: number;
  /** Disk limit of the writable layers (absent: the default of its backend). */
  disk_mib?: number;
  /**
   * Set where the limit depends on the host and was applied (docker: an engine whose
   * storage driver limits a layer); such a backend's workspace without it has no limit.
   */
  disk_enforced?: true;
  env: Record<string, string>;
  /** Default command timeout for exec. */
  timeout_seconds: number;
  published_ports?: PublishedPort[];
  /**
   * Targets (`host[:port]`) a human approved with `network approve` on an `egress`
   * workspace: allowed even where they resolve to a private address (core/network.ts).
   */
  network_approved?: string[];
  /** Services to start again with the workspace (core/services.ts). */
  services?: ServiceSpec[];
}

/**
 * Backend-specific live facts (supervisor pid, socket path, upper-layer dir...). Opaque
 * to the store; `updateWorkspace` merges it shallowly.
 */
export type WorkspaceRuntime = Record<string, unknown>;

/** The last failure that put a workspace in the `error` state. */
export interface WorkspaceErrorInfo {
  code: string;
  message: string;
  hint?: string;
  at: string;
}

/**
 * A reference to a secret, never its value. The `value?: never` members make the
 * compiler reject an object that carries a `value`, and the store checks again at run
 * time (a cast or a JSON blob from elsewhere can defeat the types), refusing any key
 * not listed here.
 *
 * - `host_env`: `NAME=${HOST_VAR}`; read from the host environment when needed.
 * - `prompt`: `NAME=?`; asked on a TTY at create.
 * - `literal`: `NAME=literal`; the value lives only in the memory of the process that
 *   created the workspace (and whatever the backend keeps inside the sandbox). After a
 *   restart core must ask again or treat the secret as unavailable.
 */
export type SecretRef =
  | { name: string; kind: "host_env"; host_var: string; value?: never }
  | { name: string; kind: "prompt"; value?: never }
  | { name: string; kind: "literal"; value?: never };

/** A workspace as stored. */
export interface WorkspaceRow {
  workspace_id: string;
  name: string | null;
  labels: Record<string, string>;
  environment: string;
  backend: BackendName;
  state: WorkspaceState;
  network_policy: NetworkPolicy;
  created_at: string;
  last_activity_at: string;
  /** null when the workspace never expires (ttl_seconds null). */
  expires_at: string | null;
  ttl_seconds: number | null;
  workspace_seed: WorkspaceSeed;
  spec: WorkspaceSpec;
  runtime: WorkspaceRuntime;
  reset_count: number;
  /** Name of the snapshot the current upper layer sits on ("baseline" after create). */
  current_snapshot: string | null;
  error: WorkspaceErrorInfo | null;
  secret_refs: SecretRef[];
}

/**
 * A row of `listWorkspaces()`. Service counts are not here: services are live guest
 * processes the store does not track; core adds `service_count` and
 * `running_service_count` from the backend.
 */
export interface WorkspaceListRow extends WorkspaceRow {
  command_count: number;
}

/**
 * Input of `createWorkspace`. Omitted fields get defaults: a fresh id, `created_at` now,
 * `last_activity_at = created_at`, `expires_at = last_activity_at + ttl_seconds`,
 * empty labels/runtime/secret_refs, `reset_count` 0, `current_snapshot` "baseline",
 * no error.
 */
export interface NewWorkspace {
  workspace_id?: string;
  name?: string | null;
  labels?: Record<string, string>;
  environment: string;
  backend: BackendName;
  state?: WorkspaceState;
  network_policy?: NetworkPolicy;
  created_at?: string;
  /** Seconds of inactivity before the workspace expires; null: never. */
  ttl_seconds: number | null;
  workspace_seed: WorkspaceSeed;
  spec: WorkspaceSpec;
  runtime?: WorkspaceRuntime;
  current_snapshot?: string | null;
  secret_refs?: SecretRef[];
}

/**
 * A partial update. Plain fields and `spec`, `workspace_seed`, `error`, `secret_refs`
 * and `labels` are replaced wholesale. Merges, done inside one write transaction so
 * concurrent writers do not lose each other's keys:
 * - `set_labels` is merged over the labels, then `clear_labels` keys are removed
 *   (applied after `labels` when both are given).
 * - `runtime`: an object is merged shallowly (a key set to null is removed); null
 *   empties it.
 * - `reset_count: "increment"` adds one to the stored count.
 * - Changing `ttl_seconds` recomputes `expires_at` from `last_activity_at`.
 */
export interface WorkspacePatch {
  name?: string | null;
  labels?: Record<string, string>;
  set_labels?: Record<string, string>;
  clear_labels?: string[];
  environment?: string;
  backend?: BackendName;
  state?: WorkspaceState;
  network_policy?: NetworkPolicy;
  ttl_seconds?: number | null;
  workspace_seed?: WorkspaceSeed;
  spec?: WorkspaceSpec;
  runtime?: WorkspaceRuntime | null;
  reset_count?: number | "increment";
  current_snapshot?: string | null;
  error?: WorkspaceErrorInfo | null;
  secret_refs?: SecretRef[];
}

/**
 * One command of a workspace's history. Output tails are clipped to the last
 * `TAIL_BYTES` bytes by the store; they must already be redacted (the store never sees
 * secret values, so it cannot redact).
 */
export interface CommandRow {
  workspace_id: string;
  /** 1, 2, 3... per workspace, gap-free. */
  seq: number;
  command: string;
  cwd: string | null;
  /** null when the command did not exit by itself (timeout, killed). */
  exit_code: number | null;
  timed_out: boolean;
  duration_ms: number;
  started_at: string;
  stdout_tail: string;
  stderr_tail: string;
  /** The command's output went over the capture cap (the exec result's `truncated`). */
  truncated: boolean;
  execution_mode: ExecutionMode;
}

/** Input of `recordCommand`: everything but the sequence number. */
export type NewCommand = Omit<CommandRow, "workspace_id" | "seq">;

/**
 * What the store keeps of a command's output beyond the tails: the streams as the
 * command history captured them (already cut and redacted by the caller) and their full
 * sizes. `stdout`/`stderr` are null once the workspace's output budget pruned them.
 */
export interface CommandOutput {
  stdout: string | null;
  stderr: string | null;
  stdout_bytes: number;
  stderr_bytes: number;
}

/** Kinds of review events. Every mutating operation records one. */
export const EVENT_KINDS = [
  "create",
  "update",
  "exec",
  "file_write",
  "patch_apply",
  "sync_push",
  "export",
  "reset",
  "snapshot_create",
  "snapshot_delete",
  "stop",
  "start",
  "service_start",
  "service_stop",
  "shell_open",
  "shell_write",
  "shell_signal",
  "shell_close",
  "network_approve",
  "commit",
  "error",
] as const;
export type EventKind = (typeof EVENT_KINDS)[number];

/** A review event. `detail` is free-form JSON chosen by the recorder (already redacted). */
export interface EventRow {
  workspace_id: string;
  /** 1, 2, 3... per workspace, gap-free. */
  seq: number;
  kind: EventKind;
  at: string;
  detail: Record<string, unknown>;
}

export type SnapshotKind = "baseline" | "named";

/**
 * A capability block: a destination the workspace's egress proxy refused, counted.
 * `target` is `host:port` as asked for; `reason` says why (not allowed by the policy, or
 * the address it resolves to).
 */
export interface NetworkBlockRow {
  workspace_id: string;
  kind: "network";
  target: string;
  reason: string;
  count: number;
  first_at: string;
  last_at: string;
}

/** A snapshot of a workspace's files. "baseline" is the seed. */
export interface SnapshotRow {
  workspace_id: string;
  name: string;
  kind: SnapshotKind;
  created_at: string;
  /** Backend-specific storage reference (a directory, an image, a tarball path). */
  layer: string;
  bytes: number;
  file_count: number;
}

/** Input of `upsertSnapshot`; `created_at` defaults to now. */
export type NewSnapshot = Omit<SnapshotRow, "created_at"> & { created_at?: string };

/** Options of the list queries. */
export interface ListOptions {
  /** Return only the newest `limit` rows (still in chronological order). */
  limit?: number;
}

export interface ListEventsOptions extends ListOptions {
  kinds?: readonly EventKind[];
}
