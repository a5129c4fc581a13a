import { randomBytes } from "node:crypto";
import type Database from "better-sqlite3";
import { PyroError } from "../errors.js";
import {
  type CommandDbRow,
  checkName,
  checkNetworkPolicy,
  checkSecretRefs,
  checkState,
  checkTtl,
  checkWorkspaceId,
  clipTail,
  decodeCommand,
  decodeEvent,
  decodeListedWorkspace,
  decodeSnapshot,
  decodeWorkspace,
  type EventDbRow,
  encodeWorkspace,
  expiry,
  iso,
  json,
  OUTPUT_BUDGET_BYTES,
  type WorkspaceDbRow,
} from "./codec.js";
import { mapWriteError, notFound, openDatabase } from "./db.js";
import type {
  CommandOutput,
  CommandRow,
  EventKind,
  EventRow,
  ListEventsOptions,
  ListOptions,
  NetworkBlockRow,
  NewCommand,
  NewSnapshot,
  NewWorkspace,
  SnapshotRow,
  WorkspaceListRow,
  WorkspacePatch,
  WorkspaceRow,
} from "./types.js";

/** A workspace's secrets redactor, by id (throws when its secrets cannot be loaded). */
export type RedactorSource = (workspaceId: string) => (text: string) => string;

/** `value` with every string in it (keys included) passed through `r`. */
function redactDeep<T>(value: T, r: (text: string) => string): T {
  if (typeof value === "string") return r(value) as T;
  if (Array.isArray(value)) return value.map((v) => redactDeep(v, r)) as T;
  if (value !== null && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [r(k), redactDeep(v, r)])) as T;
  }
  return value;
}

/** Options of `StateStore.open`. */
export interface StateStoreOptions {
  /** How long a writer waits for another process's write lock (default 10 s). */
  busyTimeoutMs?: number;
  /** Clock for default timestamps (tests pin it). */
  now?: () => Date;
}

/** A new workspace id: `ws_` + 12 hex digits. */
export function newWorkspaceId(): string {
  return `ws_${randomBytes(6).toString("hex")}`;
}

const WORKSPACE_COLUMNS = [
  "workspace_id",
  "name",
  "labels",
  "environment",
  "backend",
  "state",
  "network_policy",
  "created_at",
  "last_activity_at",
  "expires_at",
  "ttl_seconds",
  "workspace_seed",
  "spec",
  "runtime",
  "reset_count",
  "current_snapshot",
  "error",
  "secret_refs",
] as const;

const COMMAND_COUNT =
  "(SELECT COUNT(*) FROM commands c WHERE c.workspace_id = w.workspace_id) AS command_count";

/**
 * The persistent state of workspaces: one SQLite file shared by every CLI process and
 * the long-running MCP server. One instance per opened database; no module state.
 *
 * Concurrency: every write runs in a `BEGIN IMMEDIATE` transaction. In WAL mode a
 * deferred transaction that reads and then writes fails with SQLITE_BUSY (no retry) when
 * another process committed in between; taking the write lock up front makes writers
 * queue on `busy_timeout` instead, so read-modify-write steps (sequence numbers, merges)
 * are serialised across processes.
 *
 * Methods that take `id` expect an exact workspace id (resolve names with
 * `getWorkspace` first) and throw `workspace_not_found` for an unknown one.
 */
export class StateStore {
  readonly path: string;
  private readonly db: Database.Database;
  private readonly now: () => Date;
  private readonly statements = new Map<string, Database.Statement>();
  private redactors: RedactorSource | null = null;
  private transaction: Database.Transaction<(inner: () => unknown) => unknown> | null = null;

  private constructor(path: string, db: Database.Database, now: () => Date) {
    this.path = path;
    this.db = db;
    this.now = now;
  }

  /**
   * Gives the store what it needs to keep secret values out of everything it writes
   * for a workspace that has secrets: commands, their output and events pass through
   * the workspace's redactor inside the write, whatever the caller did before. Without
   * a source, such writes are refused (fail closed).
   */
  useRedactors(source: RedactorSource): void {
    this.redactors = source;
  }

  /** The redactor for workspace `id` (identity when it has no secrets). Inside a write. */
  private redactorOf(id: string): (text: string) => string {
    const row = this.sql("SELECT secret_refs FROM workspaces WHERE workspace_id = ?").get(id) as
      | { secret_refs: string }
      | undefined;
    if (row === undefined) throw notFound(id);
    if (row.secret_refs === "[]" || row.secret_refs === "") return (t) => t;
    if (!this.redactors)
      throw new PyroError(
        "internal",
        `refusing to store history of workspace ${id} without its secrets to redact`,
      );
    return this.redactors(id);
  }

  /**
   * Opens (creating if needed) the database at `path` and migrates it. The directory
   * is created with mode 0700 and the file is kept at 0600 (SQLite gives its -wal and
   * -shm files the same mode). `":memory:"` opens a private in-memory database.
   * Throws `conflict` for a database written by a newer pyro.
   */
  static open(path: string, options: StateStoreOptions = {}): StateStore {
    const db = openDatabase(path, options.busyTimeoutMs ?? 10_000);
    return new StateStore(path, db, options.now ?? (() => new Date()));
  }

  /**
   * Runs `fn` in one write transaction (`BEGIN IMMEDIATE`): all its store calls commit
   * together or not at all, e.g. creating a workspace with its baseline snapshot and its
   * `create` event. Nested calls become savepoints.
   */
  atomically<T>(fn: () => T): T {
    return this.write(fn);
  }

  /** Inserts a workspace. Throws `conflict` when the name (or id) is taken. */
  createWorkspace(input: NewWorkspace): WorkspaceRow {
    const created_at = iso(input.created_at ?? this.now(), "created_at");
    const ttl = checkTtl(input.ttl_seconds);
    const state = input.state ?? "creating";
    checkState(state);
    const row: WorkspaceRow = {
      workspace_id:
        input.workspace_id === undefined ? newWorkspaceId() : checkWorkspaceId(input.workspace_id),
      name: checkName(input.name ?? null),
      labels: { ...(input.labels ?? {}) },
      environment: input.environment,
      backend: input.backend,
      state,
      network_policy: checkNetworkPolicy(input.network_policy ?? "off"),
      created_at,
      last_activity_at: created_at,
      expires_at: expiry(created_at, ttl),
      ttl_seconds: ttl,
      workspace_seed: input.workspace_seed,
      spec: input.spec,
      runtime: { ...(input.runtime ?? {}) },
      reset_count: 0,
      current_snapshot: input.current_snapshot === undefined ? "baseline" : input.current_snapshot,
      error: null,
      secret_refs: checkSecretRefs(input.secret_refs ?? []),
    };
    const cols = WORKSPACE_COLUMNS.join(", ");
    const params = WORKSPACE_COLUMNS.map((c) => `@${c}`).join(", ");
    this.write(() => {
      this.sql(`INSERT INTO workspaces (${cols}) VALUES (${params})`).run(encodeWorkspace(row));
    }, row);
    return row;
  }

  /** Resolves an id first, then a name; null when neither matches. */
  getWorkspace(idOrName: string): WorkspaceRow | null {
    const r = (this.sql("SELECT * FROM workspaces WHERE workspace_id = ?").get(idOrName) ??
      this.sql("SELECT * FROM workspaces WHERE name = ?").get(idOrName)) as WorkspaceDbRow | undefined;
    return r ? decodeWorkspace(r) : null;
  }

  /** All workspaces, most recent activity first, each with its `command_count`. */
  listWorkspaces(): WorkspaceListRow[] {
    const rows = this.sql(
      `SELECT w.*, ${COMMAND_COUNT} FROM workspaces w
         ORDER BY w.last_activity_at DESC, w.created_at DESC, w.workspace_id`,
    ).all() as WorkspaceDbRow[];
    return rows.map(decodeListedWorkspace);
  }

  /**
   * Applies a partial update (see `WorkspacePatch` for which fields merge) and returns
   * the new row. Throws `conflict` for a taken name.
   */
  updateWorkspace(id: string, patch: WorkspacePatch): WorkspaceRow {
    return this.write(() => {
      const cur = this.mustGet(id);
      const next: WorkspaceRow = { ...cur };
      if (patch.name !== undefined) next.name = checkName(patch.name);
      if (patch.labels !== undefined) next.labels = { ...patch.labels };
      if (patch.set_labels !== undefined) next.labels = { ...next.labels, ...patch.set_labels };
      for (const k of patch.clear_labels ?? []) delete next.labels[k];
      if (patch.environment !== undefined) next.environment = patch.environment;
      if (patch.backend !== undefined) next.backend = patch.backend;
      if (patch.state !== undefined) {
        checkState(patch.state);
        next.state = patch.state;
      }
      if (patch.network_policy !== undefined) next.network_policy = checkNetworkPolicy(patch.network_policy);
      if (patch.ttl_seconds !== undefined) {
        next.ttl_seconds = checkTtl(patch.ttl_seconds);
        next.expires_at = expiry(next.last_activity_at, next.ttl_seconds);
      }
      if (patch.workspace_seed !== undefined) next.workspace_seed = patch.workspace_seed;
      if (patch.spec !== undefined) next.spec = patch.spec;
      if (patch.runtime === null) next.runtime = {};
      else if (patch.runtime !== undefined) next.runtime = mergeShallow(cur.runtime, patch.runtime);
      if (patch.reset_count === "increment") next.reset_count = cur.reset_count + 1;
      else if (patch.reset_count !== undefined) next.reset_count = patch.reset_count;
      if (patch.current_snapshot !== undefined) next.current_snapshot = patch.current_snapshot;
      if (patch.error !== undefined) next.error = patch.error;
      if (patch.secret_refs !== undefined) next.secret_refs = checkSecretRefs(patch.secret_refs);
      const sets = WORKSPACE_COLUMNS.filter((c) => c !== "workspace_id")
        .map((c) => `${c} = @${c}`)
        .join(", ");
      this.sql(`UPDATE workspaces SET ${sets} WHERE workspace_id = @workspace_id`).run(encodeWorkspace(next));
      return next;
    }, patch);
  }

  /**
   * Records activity: `last_activity_at` becomes `at` (default now) and `expires_at`
   * moves to `at + ttl_seconds`. Activity never moves backwards, so a late touch from a
   * slow process cannot shorten a workspace's life.
   */
  touch(id: string, at?: string | Date): WorkspaceRow {
    const when = iso(at ?? this.now(), "at");
    return this.write(() => {
      const cur = this.mustGet(id);
      // biome-ignore lint/complexity/useMathMinMax: these are ISO strings, compared as text
      const last = when > cur.last_activity_at ? when : cur.last_activity_at;
      const expires_at = expiry(last, cur.ttl_seconds);
      this.sql("UPDATE workspaces SET last_activity_at = ?, expires_at = ? WHERE workspace_id = ?").run(
        last,
        expires_at,
        id,
      );
      return { ...cur, last_activity_at: last, expires_at };
    });
  }

  /**
   * `touch` for the journal of an operation, which needs no row back: reads the two
   * columns the new times depend on rather than decoding the whole row (its spec, runtime
   * and labels are JSON), on every exec.
   */
  recordActivity(id: string, at?: string | Date): void {
    const when = iso(at ?? this.now(), "at");
    this.write(() => {
      const cur = this.sql("SELECT last_activity_at, ttl_seconds FROM workspaces WHERE workspace_id = ?").get(
        id,
      ) as { last_activity_at: string; ttl_seconds: number | null } | undefined;
      if (!cur) throw notFound(id);
      // biome-ignore lint/complexity/useMathMinMax: these are ISO strings, compared as text
      const last = when > cur.last_activity_at ? when : cur.last_activity_at;
      this.sql("UPDATE workspaces SET last_activity_at = ?, expires_at = ? WHERE workspace_id = ?").run(
        last,
        expiry(last, cur.ttl_seconds),
        id,
      );
    });
  }

  /** Deletes a workspace and (by cascade) its commands, events and snapshots. */
  deleteWorkspace(id: string): boolean {
    const deleted = this.write(
      () => this.sql("DELETE FROM workspaces WHERE workspace_id = ?").run(id).changes > 0,
    );
    // secure_delete zeroes the freed pages, but the WAL still holds the frames that wrote
    // them: fold it into the database and truncate it (best effort: a reader in another
    // process can hold it back; the next delete tries again).
    if (deleted && this.path !== ":memory:") this.db.pragma("wal_checkpoint(TRUNCATE)");
    return deleted;
  }

  /**
   * Workspaces whose `expires_at` is at or before `now`, oldest expiry first, in any
   * state (a `deleting` one is a reap that did not finish and is worth retrying).
   */
  expiredWorkspaces(now: string | Date = this.now()): WorkspaceRow[] {
    const rows = this.sql(
      "SELECT * FROM workspaces WHERE expires_at IS NOT NULL AND expires_at <= ? ORDER BY expires_at",
    ).all(iso(now, "now")) as WorkspaceDbRow[];
    return rows.map(decodeWorkspace);
  }

  /** True when another workspace (not `exceptId`) already has this name. */
  nameTaken(name: string, exceptId?: string): boolean {
    const r = this.sql("SELECT 1 FROM workspaces WHERE name = ? AND workspace_id IS NOT ?").get(
      name,
      exceptId ?? null,
    );
    return r !== undefined;
  }

  /**
   * Appends a command to the workspace's history and returns its sequence number
   * (1, 2, 3... per workspace, gap-free across processes). Output tails are clipped to
   * the last few KiB here; redact them before calling, the store never sees secrets.
   */
  recordCommand(id: string, cmd: NewCommand, output?: CommandOutput): number {
    return this.write(() => {
      const r = this.redactorOf(id);
      const seq = this.nextSeq("commands", id);
      this.sql(
        `INSERT INTO commands (workspace_id, seq, command, cwd, exit_code, timed_out, duration_ms, started_at,
             stdout_tail, stderr_tail, truncated, execution_mode)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
      ).run(
        id,
        seq,
        r(cmd.command),
        cmd.cwd === null ? null : r(cmd.cwd),
        cmd.exit_code,
        cmd.timed_out ? 1 : 0,
        Math.max(0, Math.round(cmd.duration_ms)),
        iso(cmd.started_at, "started_at"),
        clipTail(r(cmd.stdout_tail)),
        clipTail(r(cmd.stderr_tail)),
        cmd.truncated ? 1 : 0,
        cmd.execution_mode,
      );
      if (output)
        this.keepOutput(id, seq, {
          ...output,
          stdout: output.stdout === null ? null : r(output.stdout),
          stderr: output.stderr === null ? null : r(output.stderr),
        });
      return seq;
    });
  }

  /**
   * Stores a command's output (see `CommandOutput`), then prunes the workspace's oldest
   * outputs past `OUTPUT_BUDGET_BYTES` (the newest is always kept). Inside a write.
   */
  private keepOutput(id: string, seq: number, output: CommandOutput): void {
    const kept = Buffer.byteLength(output.stdout ?? "") + Buffer.byteLength(output.stderr ?? "");
    this.sql(
      `INSERT INTO command_output (workspace_id, seq, stdout, stderr, stdout_bytes, stderr_bytes, kept_bytes)
         VALUES (?, ?, ?, ?, ?, ?, ?)`,
    ).run(id, seq, output.stdout, output.stderr, output.stdout_bytes, output.stderr_bytes, kept);
    // Nothing kept changes no sum.
    if (kept === 0) return;
    // The prune reads every output row of the workspace: run it only when the workspace's
    // total (output_totals, kept with every insert and prune) is over the budget, since
    // no output's running sum exceeds the total. Running it after every command made
    // each exec slower the longer the history (0.6 ms at 500 commands, 3-4 ms at 3000).
    const total = this.sql(
      `INSERT INTO output_totals (workspace_id, kept_bytes) VALUES (?, ?)
         ON CONFLICT (workspace_id) DO UPDATE SET kept_bytes = kept_bytes + excluded.kept_bytes
         RETURNING kept_bytes`,
    ).get(id, kept) as { kept_bytes: number };
    if (total.kept_bytes <= OUTPUT_BUDGET_BYTES) return;
    this.sql(
      `UPDATE command_output SET stdout = NULL, stderr = NULL, kept_bytes = 0
         WHERE workspace_id = ? AND seq IN (
           SELECT seq FROM (
             SELECT seq, SUM(kept_bytes) OVER (ORDER BY seq DESC) AS running
               FROM command_output WHERE workspace_id = ? AND kept_bytes > 0)
           WHERE running > ? AND seq < ?)`,
    ).run(id, id, OUTPUT_BUDGET_BYTES, seq);
    this.sql(
      `UPDATE output_totals SET kept_bytes =
         (SELECT COALESCE(SUM(kept_bytes), 0) FROM command_output WHERE workspace_id = ?)
         WHERE workspace_id = ?`,
    ).run(id, id);
  }

  /** What the store kept of one command's output; undefined for commands recorded without it. */
  commandOutput(id: string, seq: number): CommandOutput | undefined {
    return this.sql(
      "SELECT stdout, stderr, stdout_bytes, stderr_bytes FROM command_output WHERE workspace_id = ? AND seq = ?",
    ).get(id, seq) as CommandOutput | undefined;
  }

  /** Full output sizes of the workspace's commands with seq >= `fromSeq`, by seq. */
  commandOutputSizes(id: string, fromSeq = 1): Map<number, { stdout_bytes: number; stderr_bytes: number }> {
    const rows = this.sql(
      "SELECT seq, stdout_bytes, stderr_bytes FROM command_output WHERE workspace_id = ? AND seq >= ?",
    ).all(id, fromSeq) as { seq: number; stdout_bytes: number; stderr_bytes: number }[];
    return new Map(rows.map((r) => [r.seq, { stdout_bytes: r.stdout_bytes, stderr_bytes: r.stderr_bytes }]));
  }

  /** The workspace's commands in order; with `limit`, only the newest `limit`. */
  listCommands(id: string, options: ListOptions = {}): CommandRow[] {
    const rows = this.sql(
      `SELECT * FROM (SELECT * FROM commands WHERE workspace_id = ? ORDER BY seq DESC LIMIT ?) ORDER BY seq`,
    ).all(id, limitOf(options)) as CommandDbRow[];
    return rows.map(decodeCommand);
  }

  /** One command of the workspace's history, or undefined. */
  getCommand(id: string, seq: number): CommandRow | undefined {
    const row = this.sql("SELECT * FROM commands WHERE workspace_id = ? AND seq = ?").get(id, seq) as
      | CommandDbRow
      | undefined;
    return row ? decodeCommand(row) : undefined;
  }

  /** Number of commands run in the workspace. */
  countCommands(id: string): number {
    return (this.sql("SELECT COUNT(*) AS n FROM commands WHERE workspace_id = ?").get(id) as { n: number }).n;
  }

  /**
   * Appends a review event and returns its sequence number (per workspace, gap-free).
   * `detail` is stored as JSON, every string in it passed through the workspace's
   * secrets redactor (see useRedactors).
   */
  recordEvent(id: string, kind: EventKind, detail: Record<string, unknown> = {}, at?: string | Date): number {
    const when = iso(at ?? this.now(), "at");
    return this.write(() => {
      const body = json(redactDeep(detail, this.redactorOf(id)));
      const seq = this.nextSeq("events", id);
      this.sql("INSERT INTO events (workspace_id, seq, kind, at, detail) VALUES (?, ?, ?, ?, ?)").run(
        id,
        seq,
        kind,
        when,
        body,
      );
      return seq;
    });
  }

  /** The workspace's events in order, optionally only some kinds and the newest `limit`. */
  listEvents(id: string, options: ListEventsOptions = {}): EventRow[] {
    const rows = this.sql(
      `SELECT * FROM (
           SELECT * FROM events WHERE workspace_id = ?
             AND (? IS NULL OR kind IN (SELECT value FROM json_each(?)))
           ORDER BY seq DESC LIMIT ?)
         ORDER BY seq`,
    ).all(id, ...kindsParams(options.kinds), limitOf(options)) as EventDbRow[];
    return rows.map(decodeEvent);
  }

  /** Number of events, optionally of some kinds only (e.g. `["export"]` for export_count). */
  countEvents(id: string, kinds?: readonly EventKind[]): number {
    const r = this.sql(
      `SELECT COUNT(*) AS n FROM events WHERE workspace_id = ?
           AND (? IS NULL OR kind IN (SELECT value FROM json_each(?)))`,
    ).get(id, ...kindsParams(kinds)) as { n: number };
    return r.n;
  }

  /** Creates or replaces the snapshot `name` of a workspace and returns it. */
  upsertSnapshot(input: NewSnapshot): SnapshotRow {
    const row: SnapshotRow = { ...input, created_at: iso(input.created_at ?? this.now(), "created_at") };
    return this.write(() => {
      this.mustExist(row.workspace_id);
      this.sql(
        `INSERT INTO snapshots (workspace_id, name, kind, created_at, layer, bytes, file_count)
           VALUES (@workspace_id, @name, @kind, @created_at, @layer, @bytes, @file_count)
           ON CONFLICT (workspace_id, name) DO UPDATE SET kind = excluded.kind, created_at = excluded.created_at,
             layer = excluded.layer, bytes = excluded.bytes, file_count = excluded.file_count`,
      ).run(row);
      return row;
    });
  }

  getSnapshot(id: string, name: string): SnapshotRow | null {
    const r = this.sql("SELECT * FROM snapshots WHERE workspace_id = ? AND name = ?").get(id, name) as
      | SnapshotRow
      | undefined;
    return r ? decodeSnapshot(r) : null;
  }

  /** The workspace's snapshots, oldest first (the baseline normally leads). */
  listSnapshots(id: string): SnapshotRow[] {
    const rows = this.sql("SELECT * FROM snapshots WHERE workspace_id = ? ORDER BY created_at, rowid").all(
      id,
    ) as SnapshotRow[];
    return rows.map(decodeSnapshot);
  }

  /** Removes a snapshot row; false when there was none. Whether it may go is core's call. */
  deleteSnapshot(id: string, name: string): boolean {
    return this.write(
      () => this.sql("DELETE FROM snapshots WHERE workspace_id = ? AND name = ?").run(id, name).changes > 0,
    );
  }

  /** Counts one refusal of `target` (a new row, or count + 1 and a new `last_at`). */
  recordNetworkBlock(
    id: string,
    block: { kind: "network"; target: string; reason: string },
    at?: string | Date,
  ): void {
    const when = iso(at ?? this.now(), "at");
    this.write(() => {
      this.mustExist(id);
      this.sql(
        `INSERT INTO network_blocks (workspace_id, kind, target, reason, count, first_at, last_at)
           VALUES (?, ?, ?, ?, 1, ?, ?)
           ON CONFLICT (workspace_id, kind, target) DO UPDATE SET count = count + 1,
             last_at = excluded.last_at, reason = excluded.reason`,
      ).run(id, block.kind, block.target, block.reason, when, when);
    });
  }

  /** The workspace's capability blocks, most recent first. */
  listNetworkBlocks(id: string): NetworkBlockRow[] {
    return this.sql("SELECT * FROM network_blocks WHERE workspace_id = ? ORDER BY last_at DESC, target").all(
      id,
    ) as NetworkBlockRow[];
  }

  /** Closes the database. The instance is unusable afterwards. */
  close(): void {
    if (this.db.open) this.db.close();
  }

  /**
   * Runs `fn` under the write lock; maps a taken name to `conflict`, a lock wait that ran out to `timeout`.
   * One transaction function for the store's life: `db.transaction()` builds five wrappers
   * per call, paid by every write of every exec's journal.
   */
  private write<T>(fn: () => T, attempted?: { name?: string | null }): T {
    try {
      this.transaction ??= this.db.transaction((inner: () => unknown) => inner());
      return this.transaction.immediate(fn) as T;
    } catch (err) {
      throw mapWriteError(err, attempted?.name ?? null);
    }
  }

  /** Statements are compiled once per store and reused. */
  private sql(source: string): Database.Statement {
    let stmt = this.statements.get(source);
    if (!stmt) {
      stmt = this.db.prepare(source);
      this.statements.set(source, stmt);
    }
    return stmt;
  }

  private mustGet(id: string): WorkspaceRow {
    const r = this.sql("SELECT * FROM workspaces WHERE workspace_id = ?").get(id) as
      | WorkspaceDbRow
      | undefined;
    if (!r) throw notFound(id);
    return decodeWorkspace(r);
  }

  private mustExist(id: string): void {
    if (this.sql("SELECT 1 FROM workspaces WHERE workspace_id = ?").get(id) === undefined) throw notFound(id);
  }

  /** Next per-workspace sequence number; only correct under the write lock. */
  private nextSeq(table: "commands" | "events", id: string): number {
    const r = this.sql(`SELECT COALESCE(MAX(seq), 0) + 1 AS next FROM ${table} WHERE workspace_id = ?`).get(
      id,
    ) as { next: number };
    return r.next;
  }
}

function mergeShallow(
  base: Record<string, unknown>,
  patch: Record<string, unknown>,
): Record<string, unknown> {
  const out = { ...base };
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = v;
  }
  return out;
}

/** SQLite treats a negative LIMIT as "no limit". */
function limitOf(options: ListOptions): number {
  return options.limit === undefined ? -1 : Math.max(0, Math.trunc(options.limit));
}

function kindsParams(kinds: readonly EventKind[] | undefined): [string | null, string | null] {
  const k = kinds === undefined ? null : json(kinds);
  return [k, k];
}
