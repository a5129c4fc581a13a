import type Database from "better-sqlite3";
import { PyroError } from "../errors.js";

/**
 * One schema step. `up` runs inside a write transaction together with the
 * `user_version` bump, so a crash leaves the database at the previous version, never
 * half-migrated.
 *
 * Migrations are append-only: never edit a released one, add the next number. A step
 * that rebuilds a table must cope with `foreign_keys=ON` (the pragma is a no-op inside
 * a transaction), e.g. by creating the new table, copying, and renaming.
 */
export interface Migration {
  version: number;
  description: string;
  up(db: Database.Database): void;
}

/** The schema, oldest step first. Versions are 1, 2, 3... without gaps. */
export const MIGRATIONS: readonly Migration[] = [
  {
    version: 1,
    description: "workspaces, commands, events, snapshots",
    up(db) {
      // STRICT tables make SQLite refuse a value of the wrong storage class instead of
      // silently storing it. Enumerations (state, kind, backend) are checked in code,
      // not with CHECK constraints, so adding a value needs no table rebuild.
      db.exec(`
        CREATE TABLE workspaces (
          workspace_id     TEXT PRIMARY KEY,
          name             TEXT UNIQUE,
          labels           TEXT NOT NULL DEFAULT '{}',
          environment      TEXT NOT NULL,
          backend          TEXT NOT NULL,
          state            TEXT NOT NULL,
          network_policy   TEXT NOT NULL,
          created_at       TEXT NOT NULL,
          last_activity_at TEXT NOT NULL,
          expires_at       TEXT,
          ttl_seconds      INTEGER,
          workspace_seed   TEXT NOT NULL,
          spec             TEXT NOT NULL,
          runtime          TEXT NOT NULL DEFAULT '{}',
          reset_count      INTEGER NOT NULL DEFAULT 0,
          current_snapshot TEXT,
          error            TEXT,
          secret_refs      TEXT NOT NULL DEFAULT '[]'
        ) STRICT;
        CREATE INDEX workspaces_by_activity ON workspaces (last_activity_at DESC);
        CREATE INDEX workspaces_by_expiry ON workspaces (expires_at) WHERE expires_at IS NOT NULL;

        CREATE TABLE commands (
          workspace_id   TEXT NOT NULL REFERENCES workspaces (workspace_id) ON DELETE CASCADE,
          seq            INTEGER NOT NULL,
          command        TEXT NOT NULL,
          cwd            TEXT,
          exit_code      INTEGER,
          timed_out      INTEGER NOT NULL,
          duration_ms    INTEGER NOT NULL,
          started_at     TEXT NOT NULL,
          stdout_tail    TEXT NOT NULL,
          stderr_tail    TEXT NOT NULL,
          truncated      INTEGER NOT NULL,
          execution_mode TEXT NOT NULL,
          PRIMARY KEY (workspace_id, seq)
        ) STRICT;

        CREATE TABLE events (
          workspace_id TEXT NOT NULL REFERENCES workspaces (workspace_id) ON DELETE CASCADE,
          seq          INTEGER NOT NULL,
          kind         TEXT NOT NULL,
          at           TEXT NOT NULL,
          detail       TEXT NOT NULL DEFAULT '{}',
          PRIMARY KEY (workspace_id, seq)
        ) STRICT;
        CREATE INDEX events_by_kind ON events (workspace_id, kind, seq);

        CREATE TABLE snapshots (
          workspace_id TEXT NOT NULL REFERENCES workspaces (workspace_id) ON DELETE CASCADE,
          name         TEXT NOT NULL,
          kind         TEXT NOT NULL,
          created_at   TEXT NOT NULL,
          layer        TEXT NOT NULL,
          bytes        INTEGER NOT NULL,
          file_count   INTEGER NOT NULL,
          PRIMARY KEY (workspace_id, name)
        ) STRICT;
      `);
    },
  },
  {
    version: 2,
    description: "command_output: full sizes and the kept output of each command",
    up(db) {
      // Apart from `commands` so that listing the history never loads whole outputs.
      // `stdout`/`stderr` become NULL when the workspace's output budget prunes them;
      // the sizes stay.
      db.exec(`
        CREATE TABLE command_output (
          workspace_id TEXT NOT NULL REFERENCES workspaces (workspace_id) ON DELETE CASCADE,
          seq          INTEGER NOT NULL,
          stdout       TEXT,
          stderr       TEXT,
          stdout_bytes INTEGER NOT NULL,
          stderr_bytes INTEGER NOT NULL,
          kept_bytes   INTEGER NOT NULL,
          PRIMARY KEY (workspace_id, seq)
        ) STRICT;
      `);
    },
  },
  {
    version: 3,
    description: "network capability blocks",
    up(db) {
      // One row per refused destination of a workspace, counted (the egress proxy of
      // core/netd.ts writes them; `network blocks` reads them).
      db.exec(`
        CREATE TABLE network_blocks (
          workspace_id TEXT NOT NULL REFERENCES workspaces (workspace_id) ON DELETE CASCADE,
          kind         TEXT NOT NULL,
          target       TEXT NOT NULL,
          reason       TEXT NOT NULL,
          count        INTEGER NOT NULL,
          first_at     TEXT NOT NULL,
          last_at      TEXT NOT NULL,
          PRIMARY KEY (workspace_id, kind, target)
        ) STRICT;
      `);
    },
  },
  {
    version: 4,
    description: "output_totals: each workspace's kept output bytes",
    up(db) {
      // The sum of command_output.kept_bytes per workspace, kept by the store with every
      // output it keeps and prunes, so that a command learns whether the budget needs a
      // prune without reading the workspace's whole history (store.ts keepOutput).
      db.exec(`
        CREATE TABLE output_totals (
          workspace_id TEXT PRIMARY KEY REFERENCES workspaces (workspace_id) ON DELETE CASCADE,
          kept_bytes   INTEGER NOT NULL
        ) STRICT;
        INSERT INTO output_totals (workspace_id, kept_bytes)
          SELECT workspace_id, SUM(kept_bytes) FROM command_output GROUP BY workspace_id;
      `);
    },
  },
];

/** The schema version this code writes. */
export const SCHEMA_VERSION: number = MIGRATIONS[MIGRATIONS.length - 1]?.version ?? 0;

/** Reads `PRAGMA user_version`, where the schema version is tracked. */
export function schemaVersion(db: Database.Database): number {
  return db.pragma("user_version", { simple: true }) as number;
}

/**
 * Brings the database up to `SCHEMA_VERSION`. Safe when several processes open the same
 * fresh file at once: each step re-reads the version after taking the write lock
 * (`BEGIN IMMEDIATE`), so a step another process already applied is skipped.
 *
 * Throws `conflict` for a database written by a newer pyro: reading it with an older
 * schema could silently drop data the newer code relies on.
 */
export function migrate(
  db: Database.Database,
  migrations: readonly Migration[] = MIGRATIONS,
): { from: number; to: number } {
  const latest = migrations[migrations.length - 1]?.version ?? 0;
  const from = schemaVersion(db);
  refuseNewer(from, latest);
  for (const m of migrations) {
    if (m.version <= from) continue;
    db.transaction(() => {
      const current = schemaVersion(db);
      refuseNewer(current, latest);
      if (current >= m.version) return;
      if (current !== m.version - 1) {
        throw new PyroError("internal", `state migration ${m.version} found schema version ${current}`);
      }
      m.up(db);
      // user_version lives in the database header and is covered by the transaction.
      db.pragma(`user_version = ${m.version}`);
    }).immediate();
  }
  return { from, to: Math.max(from, latest) };
}

function refuseNewer(found: number, known: number): void {
  if (found > known) {
    throw new PyroError(
      "conflict",
      `the state database has schema version ${found}, newer than this pyro knows (${known})`,
      "upgrade pyro, or point PYRO_HOME at another directory",
    );
  }
}
