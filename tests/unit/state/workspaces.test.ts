import { join } from "node:path";
import Database from "better-sqlite3";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { StateStore } from "../../../src/state/store.js";
import type { SecretRef } from "../../../src/state/types.js";
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

describe("workspaces", () => {
  it("creates a workspace with defaults and an expiry one TTL after creation", () => {
    const store = open();
    const ws = store.createWorkspace(
      sampleWorkspace({ name: "api", created_at: "2030-01-01T00:00:00Z", ttl_seconds: 600 }),
    );
    expect(ws.workspace_id).toMatch(/^ws_[0-9a-f]{12}$/);
    expect(ws).toMatchObject({
      name: "api",
      labels: {},
      state: "creating",
      network_policy: "off",
      created_at: "2030-01-01T00:00:00.000Z",
      last_activity_at: "2030-01-01T00:00:00.000Z",
      expires_at: "2030-01-01T00:10:00.000Z",
      reset_count: 0,
      current_snapshot: "baseline",
      error: null,
      secret_refs: [],
    });
    expect(store.getWorkspace(ws.workspace_id)).toEqual(ws);
  });

  it("rejects a second workspace with the same name as a conflict naming the name", () => {
    const store = open();
    store.createWorkspace(sampleWorkspace({ name: "api" }));
    const err = thrown(() => store.createWorkspace(sampleWorkspace({ name: "api" })));
    expect(err.code).toBe("conflict");
    expect(err.message).toContain('"api"');
    expect(store.listWorkspaces()).toHaveLength(1);
  });

  it("allows any number of unnamed workspaces", () => {
    const store = open();
    store.createWorkspace(sampleWorkspace());
    store.createWorkspace(sampleWorkspace());
    expect(store.listWorkspaces()).toHaveLength(2);
  });

  it("rejects renaming onto a taken name and keeps the old name", () => {
    const store = open();
    store.createWorkspace(sampleWorkspace({ name: "a" }));
    const b = store.createWorkspace(sampleWorkspace({ name: "b" }));
    expect(thrown(() => store.updateWorkspace(b.workspace_id, { name: "a" })).code).toBe("conflict");
    expect(store.getWorkspace(b.workspace_id)?.name).toBe("b");
  });

  it("refuses a name that looks like a workspace id", () => {
    const store = open();
    expect(thrown(() => store.createWorkspace(sampleWorkspace({ name: "ws_0123456789ab" }))).code).toBe(
      "invalid_argument",
    );
  });

  it("refuses a malformed workspace id or network policy and stores nothing", () => {
    const store = open();
    expect(thrown(() => store.createWorkspace(sampleWorkspace({ workspace_id: "alpha" }))).code).toBe(
      "invalid_argument",
    );
    const bad = "allowlist:" as `allowlist:${string}`;
    expect(thrown(() => store.createWorkspace(sampleWorkspace({ network_policy: bad }))).code).toBe(
      "invalid_argument",
    );
    expect(store.listWorkspaces()).toEqual([]);
    const ok = store.createWorkspace(sampleWorkspace({ network_policy: "allowlist:pypi.org,github.com" }));
    expect(store.getWorkspace(ok.workspace_id)?.network_policy).toBe("allowlist:pypi.org,github.com");
  });

  it("reports whether a name is taken, ignoring the workspace itself", () => {
    const store = open();
    const a = store.createWorkspace(sampleWorkspace({ name: "a" }));
    expect(store.nameTaken("a")).toBe(true);
    expect(store.nameTaken("a", a.workspace_id)).toBe(false);
    expect(store.nameTaken("b")).toBe(false);
  });

  it("resolves a workspace by id first, then by name, and returns null for neither", () => {
    const store = open();
    const a = store.createWorkspace(sampleWorkspace({ name: "alpha" }));
    expect(store.getWorkspace(a.workspace_id)?.name).toBe("alpha");
    expect(store.getWorkspace("alpha")?.workspace_id).toBe(a.workspace_id);
    expect(store.getWorkspace("nope")).toBeNull();
  });

  it("lists workspaces by most recent activity first with their command counts", () => {
    const store = open();
    const old = store.createWorkspace(sampleWorkspace({ name: "old", created_at: "2030-01-01T00:00:00Z" }));
    const mid = store.createWorkspace(sampleWorkspace({ name: "mid", created_at: "2030-01-02T00:00:00Z" }));
    const nu = store.createWorkspace(sampleWorkspace({ name: "new", created_at: "2030-01-03T00:00:00Z" }));
    store.touch(old.workspace_id, "2030-01-04T00:00:00Z");
    store.recordCommand(mid.workspace_id, {
      command: "true",
      cwd: null,
      exit_code: 0,
      timed_out: false,
      duration_ms: 1,
      started_at: "2030-01-02T00:00:00Z",
      stdout_tail: "",
      stderr_tail: "",
      truncated: false,
      execution_mode: "guest_agent",
    });
    const list = store.listWorkspaces();
    expect(list.map((w) => w.name)).toEqual(["old", "new", "mid"]);
    expect(list.map((w) => w.command_count)).toEqual([0, 0, 1]);
    expect(nu.workspace_id).toBe(list[1]?.workspace_id);
  });

  it("touch moves last activity forward and extends expires_at by the TTL", () => {
    const store = open();
    const ws = store.createWorkspace(
      sampleWorkspace({ created_at: "2030-01-01T00:00:00Z", ttl_seconds: 60 }),
    );
    const touched = store.touch(ws.workspace_id, "2030-01-01T01:00:00Z");
    expect(touched.last_activity_at).toBe("2030-01-01T01:00:00.000Z");
    expect(touched.expires_at).toBe("2030-01-01T01:01:00.000Z");
    expect(store.getWorkspace(ws.workspace_id)).toEqual(touched);
  });

  it("touch never moves last activity backwards", () => {
    const store = open();
    const ws = store.createWorkspace(
      sampleWorkspace({ created_at: "2030-01-01T00:00:00Z", ttl_seconds: 60 }),
    );
    store.touch(ws.workspace_id, "2030-01-01T01:00:00Z");
    const late = store.touch(ws.workspace_id, "2030-01-01T00:30:00Z");
    expect(late.last_activity_at).toBe("2030-01-01T01:00:00.000Z");
    expect(late.expires_at).toBe("2030-01-01T01:01:00.000Z");
  });

  it("recordActivity moves activity and expiry like touch, never backwards, without a row back", () => {
    const store = open(undefined, () => new Date("2030-01-01T02:00:00.000Z"));
    const ws = store.createWorkspace(
      sampleWorkspace({ created_at: "2030-01-01T00:00:00Z", ttl_seconds: 60 }),
    );
    const forever = store.createWorkspace(
      sampleWorkspace({ created_at: "2030-01-01T00:00:00Z", ttl_seconds: null }),
    );
    store.recordActivity(ws.workspace_id, "2030-01-01T01:00:00Z");
    expect(store.getWorkspace(ws.workspace_id)).toMatchObject({
      last_activity_at: "2030-01-01T01:00:00.000Z",
      expires_at: "2030-01-01T01:01:00.000Z",
    });
    store.recordActivity(ws.workspace_id, "2030-01-01T00:30:00Z");
    expect(store.getWorkspace(ws.workspace_id)?.last_activity_at).toBe("2030-01-01T01:00:00.000Z");
    // The store clock when no time is given; no TTL, no expiry.
    store.recordActivity(ws.workspace_id);
    store.recordActivity(forever.workspace_id);
    expect(store.getWorkspace(ws.workspace_id)?.expires_at).toBe("2030-01-01T02:01:00.000Z");
    expect(store.getWorkspace(forever.workspace_id)).toMatchObject({
      last_activity_at: "2030-01-01T02:00:00.000Z",
      expires_at: null,
    });
    expect(thrown(() => store.recordActivity("ws_000000000000"))).toMatchObject({
      code: "workspace_not_found",
    });
  });

  it("checkpoints the WAL every 4000 pages", () => {
    const store = open(join(dir, "state", "wal.db"));
    // biome-ignore lint/complexity/useLiteralKeys: db is private; the test reads the store's own connection
    expect(store["db"].pragma("wal_autocheckpoint", { simple: true })).toBe(4000);
  });

  it("touch uses the store clock when no time is given", () => {
    const store = open(undefined, () => new Date("2031-05-05T05:05:05.000Z"));
    const ws = store.createWorkspace(sampleWorkspace({ ttl_seconds: 10 }));
    expect(ws.created_at).toBe("2031-05-05T05:05:05.000Z");
    expect(store.touch(ws.workspace_id).expires_at).toBe("2031-05-05T05:05:15.000Z");
  });

  it("finds expired workspaces and never those without a TTL", () => {
    const store = open();
    const at = "2030-01-01T00:00:00Z";
    const short = store.createWorkspace(sampleWorkspace({ name: "short", created_at: at, ttl_seconds: 60 }));
    store.createWorkspace(sampleWorkspace({ name: "long", created_at: at, ttl_seconds: 3600 }));
    store.createWorkspace(sampleWorkspace({ name: "forever", created_at: at, ttl_seconds: null }));
    expect(store.expiredWorkspaces("2030-01-01T00:00:59Z")).toEqual([]);
    expect(store.expiredWorkspaces("2030-01-01T00:01:00Z").map((w) => w.name)).toEqual(["short"]);
    store.touch(short.workspace_id, "2030-01-01T00:05:00Z");
    expect(store.expiredWorkspaces("2030-01-01T00:05:30Z")).toEqual([]);
    expect(store.expiredWorkspaces("2031-01-01T00:00:00Z").map((w) => w.name)).toEqual(["short", "long"]);
  });

  it("updates fields partially, merging labels and runtime as documented", () => {
    const store = open();
    const ws = store.createWorkspace(
      sampleWorkspace({ labels: { team: "a", tier: "x" }, runtime: { pid: 10, socket: "/s" } }),
    );
    const id = ws.workspace_id;
    let next = store.updateWorkspace(id, { set_labels: { tier: "y", new: "1" }, clear_labels: ["team"] });
    expect(next.labels).toEqual({ tier: "y", new: "1" });
    next = store.updateWorkspace(id, { runtime: { pid: 11, socket: null, port: 5 } });
    expect(next.runtime).toEqual({ pid: 11, port: 5 });
    next = store.updateWorkspace(id, { state: "running", reset_count: "increment" });
    next = store.updateWorkspace(id, { reset_count: "increment", current_snapshot: "cp1" });
    expect(next).toMatchObject({ state: "running", reset_count: 2, current_snapshot: "cp1" });
    next = store.updateWorkspace(id, { labels: { only: "this" }, runtime: null });
    expect(next.labels).toEqual({ only: "this" });
    expect(next.runtime).toEqual({});
    expect(next.spec).toEqual(ws.spec);
    expect(store.getWorkspace(id)).toEqual(next);
  });

  it("recomputes expires_at when the TTL changes", () => {
    const store = open();
    const ws = store.createWorkspace(
      sampleWorkspace({ created_at: "2030-01-01T00:00:00Z", ttl_seconds: 60 }),
    );
    expect(store.updateWorkspace(ws.workspace_id, { ttl_seconds: 120 }).expires_at).toBe(
      "2030-01-01T00:02:00.000Z",
    );
    expect(store.updateWorkspace(ws.workspace_id, { ttl_seconds: null }).expires_at).toBeNull();
  });

  it("round-trips every JSON column unchanged", () => {
    const path = join(dir, "pyro.db");
    const store = open(path);
    const secret_refs: SecretRef[] = [
      { name: "TOKEN", kind: "host_env", host_var: "GH_TOKEN" },
      { name: "PASS", kind: "prompt" },
      { name: "KEY", kind: "literal" },
    ];
    const ws = store.createWorkspace(
      sampleWorkspace({
        labels: { "app.kind": "api", emoji: "🚀" },
        workspace_seed: {
          kind: "git",
          source: "https://x/y.git",
          ref: "main",
          commit: "abc",
          file_count: 3,
          bytes: 99,
        },
        spec: {
          vcpus: 2,
          memory_mib: 2048,
          pids_max: 512,
          env: { A: "1", B: "two words" },
          timeout_seconds: 30,
          published_ports: [{ host_port: 0, guest_port: 8080 }],
        },
        runtime: { pid: 42, nested: { a: [1, 2, { b: null }] } },
        secret_refs,
      }),
    );
    const withError = store.updateWorkspace(ws.workspace_id, {
      state: "error",
      error: { code: "internal", message: "boom", hint: "retry", at: "2030-01-01T00:00:00.000Z" },
    });
    store.close();
    expect(open(path).getWorkspace(ws.workspace_id)).toEqual(withError);
  });

  it("refuses a secret ref that carries a value, without echoing it", () => {
    const store = open();
    const sneaky = [{ name: "TOKEN", kind: "literal", value: "hunter2-secret" }] as unknown as SecretRef[];
    const err = thrown(() => store.createWorkspace(sampleWorkspace({ secret_refs: sneaky })));
    expect(err.code).toBe("invalid_argument");
    expect(err.message).not.toContain("hunter2-secret");
    expect(store.listWorkspaces()).toEqual([]);
  });

  it("throws workspace_not_found when updating an unknown workspace", () => {
    const store = open();
    expect(thrown(() => store.updateWorkspace("ws_000000000000", { state: "running" })).code).toBe(
      "workspace_not_found",
    );
    expect(thrown(() => store.touch("ws_000000000000")).code).toBe("workspace_not_found");
  });

  it("deletes a workspace together with its commands, events and snapshots", () => {
    const path = join(dir, "pyro.db");
    const store = open(path);
    const ws = store.createWorkspace(sampleWorkspace());
    const other = store.createWorkspace(sampleWorkspace());
    for (const id of [ws.workspace_id, other.workspace_id]) {
      store.recordCommand(id, {
        command: "ls",
        cwd: null,
        exit_code: 0,
        timed_out: false,
        duration_ms: 1,
        started_at: "2030-01-01T00:00:00Z",
        stdout_tail: "",
        stderr_tail: "",
        truncated: false,
        execution_mode: "guest_agent",
      });
      store.recordEvent(id, "exec", { command: "ls" });
      store.upsertSnapshot({
        workspace_id: id,
        name: "baseline",
        kind: "baseline",
        layer: "/l",
        bytes: 0,
        file_count: 0,
      });
    }
    expect(store.deleteWorkspace(ws.workspace_id)).toBe(true);
    expect(store.deleteWorkspace(ws.workspace_id)).toBe(false);
    expect(store.getWorkspace(ws.workspace_id)).toBeNull();
    const raw = new Database(path, { readonly: true });
    for (const table of ["commands", "events", "snapshots"]) {
      const rows = raw.prepare(`SELECT workspace_id FROM ${table}`).all() as { workspace_id: string }[];
      expect(
        rows.map((r) => r.workspace_id),
        table,
      ).toEqual([other.workspace_id]);
    }
    raw.close();
  });

  it("commits everything or nothing inside atomically", () => {
    const store = open();
    expect(() =>
      store.atomically(() => {
        const ws = store.createWorkspace(sampleWorkspace({ name: "half" }));
        store.recordEvent(ws.workspace_id, "create");
        throw new Error("abort");
      }),
    ).toThrow("abort");
    expect(store.getWorkspace("half")).toBeNull();
  });
});
