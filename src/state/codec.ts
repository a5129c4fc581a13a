/**
 * Conversions between typed rows and SQLite columns, and the checks that keep bad
 * values out of the database. Internal to `src/state`.
 */
import { PyroError } from "../errors.js";
import type {
  CommandRow,
  EventKind,
  EventRow,
  SecretRef,
  SnapshotKind,
  SnapshotRow,
  WorkspaceListRow,
  WorkspaceRow,
} from "./types.js";
import { WORKSPACE_STATES } from "./types.js";

/** Bytes of stdout/stderr kept per command: enough for `logs` and `summary`. */
export const TAIL_BYTES = 4096;

/**
 * Bytes of whole command outputs (see `CommandOutput`) a workspace keeps: past it, the
 * oldest outputs are pruned to their tails.
 */
export const OUTPUT_BUDGET_BYTES = 32 * 1024 * 1024;

/** Workspace ids look like `ws_` + 12 hex digits. */
export const WORKSPACE_ID_PATTERN = /^ws_[0-9a-f]{12}$/;

/**
 * Normalises a timestamp to `toISOString()` form. Every timestamp column uses this one
 * form so that SQL string comparison (ORDER BY, `<=`) agrees with time order.
 */
export function iso(value: string | Date, field = "timestamp"): string {
  const d = typeof value === "string" ? new Date(value) : value;
  if (Number.isNaN(d.getTime()))
    throw new PyroError("invalid_argument", `${field} is not a valid time: ${String(value)}`);
  return d.toISOString();
}

/** `at` plus `seconds`, or null when there is no TTL. */
export function expiry(at: string, ttlSeconds: number | null): string | null {
  return ttlSeconds === null ? null : new Date(Date.parse(at) + ttlSeconds * 1000).toISOString();
}

export function checkTtl(ttl: number | null): number | null {
  if (ttl !== null && !(Number.isInteger(ttl) && ttl > 0)) {
    throw new PyroError("invalid_argument", `ttl_seconds must be a positive integer or null, got ${ttl}`);
  }
  return ttl;
}

export function checkState(state: string): void {
  if (!(WORKSPACE_STATES as readonly string[]).includes(state)) {
    throw new PyroError("invalid_argument", `unknown workspace state: ${state}`);
  }
}

/**
 * Names must not look like ids: `getWorkspace` resolves an id first, so such a name
 * could shadow (or be shadowed by) another workspace.
 */
export function checkName(name: string | null): string | null {
  if (name === null) return null;
  if (name.trim() === "") throw new PyroError("invalid_argument", "a workspace name must not be empty");
  if (WORKSPACE_ID_PATTERN.test(name)) {
    throw new PyroError(
      "invalid_argument",
      `the name "${name}" looks like a workspace id`,
      "choose another name",
    );
  }
  return name;
}

export function checkWorkspaceId(id: string): string {
  if (!WORKSPACE_ID_PATTERN.test(id)) {
    throw new PyroError(
      "invalid_argument",
      `not a workspace id: ${id}`,
      "ids look like ws_ followed by 12 hex digits",
    );
  }
  return id;
}

export function checkNetworkPolicy<T extends string>(policy: T): T {
  if (policy !== "off" && policy !== "egress" && !/^allowlist:[^,\s]+(,[^,\s]+)*$/.test(policy)) {
    throw new PyroError(
      "invalid_argument",
      `unknown network policy: ${policy}`,
      "use off, egress or allowlist:HOST[,HOST...]",
    );
  }
  return policy;
}

const SECRET_REF_KEYS: Record<SecretRef["kind"], readonly string[]> = {
  host_env: ["name", "kind", "host_var"],
  prompt: ["name", "kind"],
  literal: ["name", "kind"],
};

/**
 * Run-time guard behind the `SecretRef` type: casts and JSON from elsewhere get past the
 * compiler, so any key beyond the known ones (a `value`, a `secret`...) is refused
 * rather than written to disk.
 */
export function checkSecretRefs(refs: readonly SecretRef[]): SecretRef[] {
  if (!Array.isArray(refs)) throw new PyroError("invalid_argument", "secret_refs must be an array");
  const seen = new Set<string>();
  return refs.map((ref: unknown) => {
    if (typeof ref !== "object" || ref === null)
      throw new PyroError("invalid_argument", "a secret ref must be an object");
    const r = ref as Record<string, unknown>;
    const allowed = SECRET_REF_KEYS[r.kind as SecretRef["kind"]];
    if (!allowed) throw new PyroError("invalid_argument", `unknown secret ref kind: ${String(r.kind)}`);
    const extra = Object.keys(r).filter((k) => !allowed.includes(k));
    if (extra.length > 0) {
      // Name the keys, never their values: the value may be the secret itself.
      throw new PyroError(
        "invalid_argument",
        `a secret ref may only hold ${allowed.join(", ")}; refusing to store ${extra.join(", ")}`,
        "the state store keeps secret names and references, never values",
      );
    }
    if (typeof r.name !== "string" || r.name === "")
      throw new PyroError("invalid_argument", "a secret ref needs a name");
    if (r.kind === "host_env" && (typeof r.host_var !== "string" || r.host_var === "")) {
      throw new PyroError("invalid_argument", `secret ${r.name}: host_var must name a host variable`);
    }
    if (seen.has(r.name)) throw new PyroError("invalid_argument", `secret ${r.name} is given twice`);
    seen.add(r.name);
    return { ...r } as SecretRef;
  });
}

/**
 * The last `maxBytes` bytes of `text` in UTF-8, cut at a character boundary so a
 * multi-byte character is dropped whole rather than turned into U+FFFD.
 */
export function clipTail(text: string, maxBytes = TAIL_BYTES): string {
  const buf = Buffer.from(text, "utf8");
  if (buf.length <= maxBytes) return text;
  let start = buf.length - maxBytes;
  // Skip continuation bytes (10xxxxxx) so the slice starts on a character.
  while (start < buf.length && ((buf[start] ?? 0) & 0xc0) === 0x80) start++;
  return buf.subarray(start).toString("utf8");
}

export function json(value: unknown): string {
  return JSON.stringify(value);
}

function parse<T>(text: string | null): T {
  return (text === null ? null : JSON.parse(text)) as T;
}

/** A workspaces row as SQLite returns it. */
export interface WorkspaceDbRow {
  workspace_id: string;
  name: string | null;
  labels: string;
  environment: string;
  backend: string;
  state: string;
  network_policy: string;
  created_at: string;
  last_activity_at: string;
  expires_at: string | null;
  ttl_seconds: number | null;
  workspace_seed: string;
  spec: string;
  runtime: string;
  reset_count: number;
  current_snapshot: string | null;
  error: string | null;
  secret_refs: string;
  command_count?: number;
}

export function decodeWorkspace(r: WorkspaceDbRow): WorkspaceRow {
  return {
    workspace_id: r.workspace_id,
    name: r.name,
    labels: parse(r.labels),
    environment: r.environment,
    backend: r.backend as WorkspaceRow["backend"],
    state: r.state as WorkspaceRow["state"],
    network_policy: r.network_policy as WorkspaceRow["network_policy"],
    created_at: r.created_at,
    last_activity_at: r.last_activity_at,
    expires_at: r.expires_at,
    ttl_seconds: r.ttl_seconds,
    workspace_seed: parse(r.workspace_seed),
    spec: parse(r.spec),
    runtime: parse(r.runtime),
    reset_count: r.reset_count,
    current_snapshot: r.current_snapshot,
    error: parse(r.error),
    secret_refs: parse(r.secret_refs),
  };
}

export function decodeListedWorkspace(r: WorkspaceDbRow): WorkspaceListRow {
  return { ...decodeWorkspace(r), command_count: r.command_count ?? 0 };
}

/** The columns of `WorkspaceRow` in SQLite form, for INSERT and UPDATE. */
export function encodeWorkspace(w: WorkspaceRow): Omit<WorkspaceDbRow, "command_count"> {
  return {
    ...w,
    labels: json(w.labels),
    workspace_seed: json(w.workspace_seed),
    spec: json(w.spec),
    runtime: json(w.runtime),
    error: w.error === null ? null : json(w.error),
    secret_refs: json(w.secret_refs),
  };
}

export interface CommandDbRow extends Omit<CommandRow, "timed_out" | "truncated"> {
  timed_out: number;
  truncated: number;
}

export function decodeCommand(r: CommandDbRow): CommandRow {
  return { ...r, timed_out: r.timed_out !== 0, truncated: r.truncated !== 0 };
}

export interface EventDbRow {
  workspace_id: string;
  seq: number;
  kind: string;
  at: string;
  detail: string;
}

export function decodeEvent(r: EventDbRow): EventRow {
  return {
    workspace_id: r.workspace_id,
    seq: r.seq,
    kind: r.kind as EventKind,
    at: r.at,
    detail: parse(r.detail),
  };
}

export function decodeSnapshot(r: SnapshotRow): SnapshotRow {
  return { ...r, kind: r.kind as SnapshotKind };
}
