import { statSync } from "node:fs";
import { join } from "node:path";
import Database from "better-sqlite3";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { MIGRATIONS, type Migration, migrate, SCHEMA_VERSION } from "../../../src/state/migrations.js";
import { StateStore } from "../../../src/state/store.js";
import { sampleWorkspace, tempDir, thrown } from "./helpers.js";

let dir: string;
let cleanup: () => void;
const stores: StateStore[] = [];

function open(path = join(dir, "state", "pyro.db"), now?: () => Date): StateStore {
  const s = StateStore.open(path, now ? { now } : {});
  stores.push(s);
  return s;
}

beforeEach(() => {
  ({ dir, cleanup } = tempDir());
});

afterEach(() => {
  for (const s of stores.splice(0)) s.close();
  cleanup();
});

describe("opening the database", () => {
  it("applies the migrations once and reopening changes nothing", () => {
    const path = join(dir, "pyro.db");
    const store = open(path);
    const ws = store.createWorkspace(sampleWorkspace({ name: "keep" }));
    store.close();

    const raw = new Database(path);
    expect(raw.pragma("user_version", { simple: true })).toBe(SCHEMA_VERSION);
    raw.close();

    const again = open(path);
    expect(again.getWorkspace("keep")?.workspace_id).toBe(ws.workspace_id);
    const raw2 = new Database(path);
    expect(raw2.pragma("user_version", { simple: true })).toBe(SCHEMA_VERSION);
    raw2.close();
  });

  it("runs each migration step exactly once however often migrate is called", () => {
    const db = new Database(":memory:");
    let runs = 0;
    const steps: Migration[] = [
      {
        version: 1,
        description: "t",
        up: (d) => {
          d.exec("CREATE TABLE t (x)");
          runs++;
        },
      },
      {
        version: 2,
        description: "u",
        up: (d) => {
          d.exec("CREATE TABLE u (x)");
          runs++;
        },
      },
    ];
    expect(migrate(db, steps)).toEqual({ from: 0, to: 2 });
    expect(migrate(db, steps)).toEqual({ from: 2, to: 2 });
    expect(runs).toBe(2);
    db.close();
  });

  it("rolls back a failing migration step with its version bump", () => {
    const db = new Database(":memory:");
    const steps: Migration[] = [
      { version: 1, description: "ok", up: (d) => d.exec("CREATE TABLE t (x)") },
      {
        version: 2,
        description: "boom",
        up: (d) => {
          d.exec("CREATE TABLE u (x)");
          throw new Error("boom");
        },
      },
    ];
    expect(() => migrate(db, steps)).toThrow("boom");
    expect(db.pragma("user_version", { simple: true })).toBe(1);
    expect(db.prepare("SELECT name FROM sqlite_master WHERE name = 'u'").get()).toBeUndefined();
    db.close();
  });

  it("numbers the shipped migrations 1, 2, 3... without gaps", () => {
    expect(MIGRATIONS.map((m) => m.version)).toEqual(MIGRATIONS.map((_, i) => i + 1));
  });

  it("refuses a database written by a newer schema", () => {
    const path = join(dir, "pyro.db");
    open(path).close();
    const raw = new Database(path);
    raw.pragma(`user_version = ${SCHEMA_VERSION + 1}`);
    raw.close();
    const err = thrown(() => StateStore.open(path));
    expect(err.code).toBe("conflict");
    expect(err.message).toContain(`${SCHEMA_VERSION + 1}`);
  });

  it("turns on WAL, foreign keys and a busy timeout", () => {
    const path = join(dir, "pyro.db");
    open(path);
    // journal_mode is persistent in the file; check it from a separate connection.
    const raw = new Database(path);
    expect(raw.pragma("journal_mode", { simple: true })).toBe("wal");
    raw.close();
    const db = (stores[0] as unknown as { db: Database.Database }).db;
    expect(db.pragma("foreign_keys", { simple: true })).toBe(1);
    expect(db.pragma("busy_timeout", { simple: true })).toBe(10_000);
    expect(db.pragma("synchronous", { simple: true })).toBe(1); // NORMAL
  });

  it("creates the directory as 0700 and the database and its WAL as 0600", () => {
    const stateDir = join(dir, "nested", "state");
    const path = join(stateDir, "pyro.db");
    const store = open(path);
    store.createWorkspace(sampleWorkspace());
    expect(statSync(stateDir).mode & 0o777).toBe(0o700);
    expect(statSync(path).mode & 0o777).toBe(0o600);
    expect(statSync(`${path}-wal`).mode & 0o777).toBe(0o600);
  });
});
