import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import Database from "better-sqlite3";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { StateStore } from "../../../src/state/store.js";
import { compileStateModule, sampleCommand, sampleWorkspace, tempDir, thrown } from "./helpers.js";

let dir: string;
let cleanup: () => void;

beforeEach(() => {
  ({ dir, cleanup } = tempDir());
});

afterEach(() => cleanup());

/** Sequence numbers are exactly 1..n. */
function expectGapFree(seqs: number[]): void {
  expect([...seqs].sort((x, y) => x - y)).toEqual(Array.from({ length: seqs.length }, (_, i) => i + 1));
}

describe("two stores on one file in the same process", () => {
  it("interleaves 200 commands each into 400 gap-free sequence numbers", () => {
    const path = join(dir, "pyro.db");
    const one = StateStore.open(path);
    const two = StateStore.open(path);
    try {
      const id = one.createWorkspace(sampleWorkspace()).workspace_id;
      for (let i = 0; i < 200; i++) {
        one.recordCommand(id, sampleCommand(`one ${i}`));
        two.recordCommand(id, sampleCommand(`two ${i}`));
      }
      const rows = two.listCommands(id);
      expect(rows).toHaveLength(400);
      expectGapFree(rows.map((r) => r.seq));
      expect(one.listWorkspaces()[0]?.command_count).toBe(400);
    } finally {
      one.close();
      two.close();
    }
  });
});

describe("a write lock held too long", () => {
  it("fails a write with timeout once the busy timeout runs out", () => {
    const path = join(dir, "pyro.db");
    const store = StateStore.open(path, { busyTimeoutMs: 100 });
    const id = store.createWorkspace(sampleWorkspace()).workspace_id;
    const holder = new Database(path);
    holder.exec("BEGIN IMMEDIATE");
    try {
      expect(thrown(() => store.recordCommand(id, sampleCommand("x"))).code).toBe("timeout");
    } finally {
      holder.exec("ROLLBACK");
      holder.close();
    }
    expect(store.recordCommand(id, sampleCommand("y"))).toBe(1);
    store.close();
  });
});

/**
 * Child processes load the store transpiled to JavaScript. In recording mode each says
 * "ready" and waits for "go" on stdin, so their writes overlap however slow start-up is.
 */
const CHILD = `
const { StateStore } = await import(process.env.STORE_URL);
const store = StateStore.open(process.env.DB_PATH);
const id = process.env.WS_ID;
const tag = process.env.TAG;
const n = Number(process.env.COUNT);
if (!id) {
  // Fresh-file mode: every child creates its own workspace.
  const ws = store.createWorkspace(JSON.parse(process.env.WS_INPUT));
  process.stdout.write(ws.workspace_id);
} else {
  // Barrier: say ready, then wait for the parent's go on stdin.
  process.stdout.write("ready\\n");
  await new Promise((resolve) => process.stdin.once("data", resolve));
  process.stdin.pause();
  for (let i = 0; i < n; i++) {
    store.recordCommand(id, { ...JSON.parse(process.env.CMD), command: tag + " " + i });
    if (i % 4 === 0) store.recordEvent(id, "exec", { tag, i });
    // Let go of the CPU now and then so the other process gets the lock between our
    // transactions: the test wants interleaved writers, not one after the other.
    if (i % 2 === 0) await new Promise((resolve) => setTimeout(resolve, 1));
  }
}
store.close();
`;

interface Child {
  /** Resolves when a recording child is at the barrier. */
  ready: Promise<void>;
  /** Releases the barrier. */
  go(): void;
  done: Promise<{ code: number | null; stdout: string; stderr: string }>;
}

function startChild(env: Record<string, string>): Child {
  const child = spawn(process.execPath, ["--input-type=module", "-e", CHILD], {
    env: { ...process.env, ...env },
    stdio: ["pipe", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  let markReady: () => void = () => {};
  const ready = new Promise<void>((resolve) => {
    markReady = resolve;
  });
  child.stdout.on("data", (d) => {
    stdout += d;
    if (stdout.includes("ready\n")) markReady();
  });
  child.stderr.on("data", (d) => {
    stderr += d;
  });
  const done = new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve, reject) => {
    const timer = setTimeout(() => child.kill("SIGKILL"), 30_000);
    child.on("error", reject);
    child.on("close", (code) => {
      clearTimeout(timer);
      markReady(); // never leave a waiter hanging on a child that died early
      resolve({ code, stdout, stderr });
    });
  });
  return { ready, go: () => child.stdin.end("go\n"), done };
}

describe("separate Node processes on one file", () => {
  let storeUrl: string;
  let removeCompiled: () => void;

  beforeAll(() => {
    ({ storeUrl, cleanup: removeCompiled } = compileStateModule());
  });

  afterAll(() => removeCompiled?.());

  it("two processes recording 200 commands each end with 400 rows numbered 1..400", async () => {
    const path = join(dir, "state", "pyro.db");
    const setup = StateStore.open(path);
    const id = setup.createWorkspace(sampleWorkspace({ name: "shared" })).workspace_id;
    setup.close();

    const common = {
      STORE_URL: storeUrl,
      DB_PATH: path,
      WS_ID: id,
      COUNT: "200",
      CMD: JSON.stringify(sampleCommand("")),
    };
    const children = [startChild({ ...common, TAG: "p1" }), startChild({ ...common, TAG: "p2" })];
    await Promise.all(children.map((c) => c.ready));
    for (const c of children) c.go();
    const results = await Promise.all(children.map((c) => c.done));
    for (const r of results) expect(r.stderr).toBe("");
    expect(results.map((r) => r.code)).toEqual([0, 0]);

    const store = StateStore.open(path);
    try {
      const rows = store.listCommands(id);
      expect(rows).toHaveLength(400);
      expectGapFree(rows.map((r) => r.seq));
      // The writers really overlapped: the history switches between them more than once.
      const switches = rows.filter(
        (r, i) => i > 0 && r.command.slice(0, 2) !== rows[i - 1]?.command.slice(0, 2),
      );
      expect(switches.length).toBeGreaterThan(1);
      // Each process's own commands keep their order.
      for (const tag of ["p1", "p2"]) {
        const mine = rows
          .filter((r) => r.command.startsWith(`${tag} `))
          .map((r) => Number(r.command.split(" ")[1]));
        expect(mine).toEqual(Array.from({ length: 200 }, (_, i) => i));
      }
      const events = store.listEvents(id);
      expect(events).toHaveLength(100);
      expectGapFree(events.map((e) => e.seq));
    } finally {
      store.close();
    }
  });

  it("several processes opening a fresh file at once all migrate and write to it", async () => {
    const path = join(dir, "fresh", "pyro.db");
    const results = await Promise.all(
      ["a", "b", "c", "d"].map(
        (name) =>
          startChild({
            STORE_URL: storeUrl,
            DB_PATH: path,
            WS_ID: "",
            TAG: name,
            COUNT: "0",
            WS_INPUT: JSON.stringify(sampleWorkspace({ name })),
          }).done,
      ),
    );
    for (const r of results) expect(r.stderr).toBe("");
    const store = StateStore.open(path);
    try {
      expect(
        store
          .listWorkspaces()
          .map((w) => w.name)
          .sort(),
      ).toEqual(["a", "b", "c", "d"]);
      expect(results.map((r) => r.stdout).sort()).toEqual(
        store
          .listWorkspaces()
          .map((w) => w.workspace_id)
          .sort(),
      );
    } finally {
      store.close();
    }
  });

  it("waits for another process's lock while switching a fresh file to WAL", async () => {
    // A raw connection holds a write lock on a new, still rollback-mode file; SQLite's
    // busy timeout does not cover the WAL switch, so open() must retry by itself.
    const path = join(dir, "locked.db");
    const holder = `
      const Database = (await import(process.env.SQLITE_URL)).default;
      const db = new Database(process.env.DB_PATH);
      db.exec("CREATE TABLE held (x)");
      db.exec("BEGIN IMMEDIATE");
      db.exec("INSERT INTO held VALUES (1)");
      process.stdout.write("locked\\n");
      setTimeout(() => { db.exec("COMMIT"); db.close(); }, 400);
    `;
    const sqliteUrl = pathToFileURL(createRequire(import.meta.url).resolve("better-sqlite3")).href;
    const child = spawn(process.execPath, ["--input-type=module", "-e", holder], {
      env: { ...process.env, SQLITE_URL: sqliteUrl, DB_PATH: path },
      stdio: ["ignore", "pipe", "inherit"],
    });
    await new Promise<void>((resolve, reject) => {
      child.stdout.on("data", (d: Buffer) => d.toString().includes("locked") && resolve());
      child.on("error", reject);
      child.on("exit", (code) => reject(new Error(`lock holder exited early (${code})`)));
    });
    const started = Date.now();
    const store = StateStore.open(path);
    try {
      expect(Date.now() - started).toBeGreaterThanOrEqual(200);
      expect(store.createWorkspace(sampleWorkspace({ name: "after-wait" })).name).toBe("after-wait");
    } finally {
      store.close();
      await new Promise((resolve) => (child.exitCode === null ? child.on("exit", resolve) : resolve(null)));
    }
  });
});
