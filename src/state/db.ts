/**
 * SQLite plumbing of the state store: opening a database file safely and mapping
 * SQLite errors to pyro errors. Internal to `src/state`.
 */
import { chmodSync, closeSync, fstatSync, mkdirSync, openSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname } from "node:path";
import type Sqlite from "better-sqlite3";
import { ACTIONS, PyroError } from "../errors.js";
import { migrate } from "./migrations.js";

/**
 * Required, not imported: an `import` of a CommonJS package first parses its source for
 * the names it exports, which was a measurable part of a `pyro workspace list` (issue 18).
 * Required on first use: a process that imports the store but never opens it (a
 * `pyro run`) does not load it.
 */
let sqlite: typeof Sqlite | undefined;
function sqliteModule(): typeof Sqlite {
  sqlite ??= createRequire(import.meta.url)("better-sqlite3") as typeof Sqlite;
  return sqlite;
}

/**
 * Opens `path` with the settings every store connection needs, then migrates it.
 * `":memory:"` skips the file handling (and WAL, which memory databases lack).
 */
export function openDatabase(path: string, busyTimeoutMs: number): Sqlite.Database {
  const memory = path === ":memory:";
  if (!memory) prepareFile(path);
  const db = new (sqliteModule())(path, { timeout: busyTimeoutMs });
  try {
    db.pragma(`busy_timeout = ${Math.trunc(busyTimeoutMs)}`);
    retryWhileBusy(busyTimeoutMs, () => configure(db, path, memory));
  } catch (err) {
    db.close();
    throw err;
  }
  return db;
}

function configure(db: Sqlite.Database, path: string, memory: boolean): void {
  const mode = db.pragma("journal_mode = WAL", { simple: true });
  // WAL is what lets the server read while a CLI process writes; refuse to run
  // without it rather than degrade into lock errors under load.
  if (!memory && mode !== "wal")
    throw new PyroError("internal", `could not enable WAL on ${path} (got ${mode})`);
  // NORMAL is safe against application crashes in WAL mode; only a power loss can
  // drop the last commits, an acceptable trade for disposable workspaces.
  db.pragma("synchronous = NORMAL");
  // A checkpoint (two fsyncs under NORMAL) every 1000 WAL pages, SQLite's default, landed
  // in every ~110th exec's journal write and cost 0.1-0.15 ms per exec on average here;
  // every 4000 pages (a WAL of at most ~16 MiB; the last connection to close, e.g. each
  // CLI process, checkpoints and removes it) costs a quarter of that.
  db.pragma("wal_autocheckpoint = 4000");
  db.pragma("foreign_keys = ON");
  // Deleted rows (command output, events, a deleted workspace's history) are overwritten
  // with zeros, not left in free pages for anyone who copies the file.
  db.pragma("secure_delete = ON");
  migrate(db);
}

/**
 * SQLite does not apply `busy_timeout` to switching a fresh file into WAL: while
 * another process holds a lock on the still rollback-mode file, the switch fails at
 * once with SQLITE_BUSY. Every step of `configure` is idempotent, so retry it with a
 * short back-off until the busy timeout runs out. This only happens when several
 * processes open a brand-new database together; the blocking sleep is acceptable there.
 */
function retryWhileBusy(timeoutMs: number, fn: () => void): void {
  const deadline = Date.now() + timeoutMs;
  for (let attempt = 1; ; attempt++) {
    try {
      fn();
      return;
    } catch (err) {
      const busy = isSqliteError(err) && err.code.startsWith("SQLITE_BUSY");
      if (!busy || Date.now() >= deadline) throw err;
      sleepSync(Math.min(10 * attempt, 100) + Math.random() * 10);
    }
  }
}

function sleepSync(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

/**
 * Creates the parent directory (0700) and the database file (0600) before SQLite
 * does, so the file never exists with umask-derived permissions, and tightens a file
 * left readable by others. SQLite gives its -wal and -shm files the database's mode.
 * An existing directory keeps its mode: it may be a shared PYRO_HOME.
 */
function prepareFile(path: string): void {
  mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
  const fd = openSync(path, "a", 0o600);
  try {
    if ((fstatSync(fd).mode & 0o777) !== 0o600) chmodSync(path, 0o600);
  } finally {
    closeSync(fd);
  }
}

export function notFound(id: string): PyroError {
  return new PyroError("workspace_not_found", `no workspace ${id}`, "see {action}", {
    action: ACTIONS.listWorkspaces,
  });
}

/**
 * Maps a unique-key violation on workspaces to `conflict` naming the name, and a write
 * lock still held by another process after the busy timeout to `timeout`; anything
 * else passes through unchanged.
 */
export function mapWriteError(err: unknown, name: string | null): unknown {
  if (!isSqliteError(err)) return err;
  if (err.code.startsWith("SQLITE_BUSY")) {
    return new PyroError("timeout", "the state database stayed locked by another pyro process", "retry", {
      cause: err,
    });
  }
  if (err.code !== "SQLITE_CONSTRAINT_UNIQUE" && err.code !== "SQLITE_CONSTRAINT_PRIMARYKEY") return err;
  if (err.message.includes("workspaces.name")) {
    return new PyroError("conflict", `a workspace named "${name}" already exists`, "choose another name", {
      cause: err,
    });
  }
  if (err.message.includes("workspaces.workspace_id")) {
    return new PyroError("conflict", "a workspace with this id already exists", undefined, { cause: err });
  }
  return err;
}

/** An error of SQLite itself (never one before the module was loaded: none could be thrown). */
function isSqliteError(err: unknown): err is InstanceType<typeof Sqlite.SqliteError> {
  return sqlite !== undefined && err instanceof sqlite.SqliteError;
}
