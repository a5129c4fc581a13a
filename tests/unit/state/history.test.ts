import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { PyroError } from "../../../src/errors.js";
import { TAIL_BYTES } from "../../../src/state/codec.js";
import { StateStore } from "../../../src/state/store.js";
import { sampleCommand, sampleWorkspace, tempDir } from "./helpers.js";

let store: StateStore;
let cleanup: () => void;
let a: string;
let b: string;

beforeEach(() => {
  const t = tempDir();
  cleanup = t.cleanup;
  store = StateStore.open(join(t.dir, "pyro.db"));
  a = store.createWorkspace(sampleWorkspace({ name: "a" })).workspace_id;
  b = store.createWorkspace(sampleWorkspace({ name: "b" })).workspace_id;
});

afterEach(() => {
  store.close();
  cleanup();
});

describe("command history", () => {
  it("numbers commands per workspace starting at 1", () => {
    expect(store.recordCommand(a, sampleCommand("a1"))).toBe(1);
    expect(store.recordCommand(b, sampleCommand("b1"))).toBe(1);
    expect(store.recordCommand(a, sampleCommand("a2"))).toBe(2);
    expect(store.listCommands(a).map((c) => [c.seq, c.command])).toEqual([
      [1, "a1"],
      [2, "a2"],
    ]);
    expect(store.countCommands(b)).toBe(1);
  });

  it("returns the newest commands in chronological order when limited", () => {
    for (let i = 1; i <= 5; i++) store.recordCommand(a, sampleCommand(`c${i}`));
    expect(store.listCommands(a, { limit: 2 }).map((c) => c.command)).toEqual(["c4", "c5"]);
  });

  it("round-trips a command row with booleans and nulls", () => {
    store.recordCommand(
      a,
      sampleCommand("sleep 999", {
        cwd: null,
        exit_code: null,
        timed_out: true,
        truncated: true,
        duration_ms: 1500.6,
        stdout_tail: "out",
        stderr_tail: "err",
        execution_mode: "host_compat",
      }),
    );
    expect(store.listCommands(a)[0]).toEqual({
      workspace_id: a,
      seq: 1,
      command: "sleep 999",
      cwd: null,
      exit_code: null,
      timed_out: true,
      duration_ms: 1501,
      started_at: "2030-01-01T00:00:00.000Z",
      stdout_tail: "out",
      stderr_tail: "err",
      truncated: true,
      execution_mode: "host_compat",
    });
  });

  it("keeps only the last few KiB of output, cut on a character boundary", () => {
    // The cut falls inside the two-byte "é": it must be dropped whole.
    const suffix = `${"y".repeat(TAIL_BYTES - 4)}END`;
    store.recordCommand(a, sampleCommand("big", { stdout_tail: `${"x".repeat(TAIL_BYTES)}é${suffix}` }));
    expect(store.listCommands(a)[0]!.stdout_tail).toBe(suffix);
  });

  it("refuses a command for an unknown workspace", () => {
    const err = (() => {
      try {
        store.recordCommand("ws_000000000000", sampleCommand("x"));
      } catch (e) {
        return e as PyroError;
      }
      return null;
    })();
    expect(err?.code).toBe("workspace_not_found");
  });
});

describe("review events", () => {
  it("numbers events per workspace and filters them by kind", () => {
    expect(store.recordEvent(a, "create", { environment: "debian:12" })).toBe(1);
    expect(store.recordEvent(b, "create")).toBe(1);
    expect(store.recordEvent(a, "file_write", { path: "x.txt" })).toBe(2);
    expect(store.recordEvent(a, "export", { output_path: "/tmp/o" })).toBe(3);
    expect(store.recordEvent(a, "file_write", { path: "y.txt" })).toBe(4);

    expect(store.listEvents(a).map((e) => e.kind)).toEqual(["create", "file_write", "export", "file_write"]);
    expect(store.listEvents(a, { kinds: ["file_write"] }).map((e) => e.detail)).toEqual([
      { path: "x.txt" },
      { path: "y.txt" },
    ]);
    expect(store.listEvents(a, { kinds: ["file_write", "export"], limit: 2 }).map((e) => e.seq)).toEqual([
      3, 4,
    ]);
    expect(store.listEvents(a, { kinds: [] })).toEqual([]);
    expect(store.countEvents(a, ["export"])).toBe(1);
    expect(store.countEvents(a)).toBe(4);
  });

  it("stores the event time given, normalised", () => {
    store.recordEvent(a, "reset", { snapshot_name: "baseline" }, "2030-02-03T04:05:06Z");
    expect(store.listEvents(a)[0]).toEqual({
      workspace_id: a,
      seq: 1,
      kind: "reset",
      at: "2030-02-03T04:05:06.000Z",
      detail: { snapshot_name: "baseline" },
    });
  });
});

describe("snapshots", () => {
  it("creates, replaces, lists and deletes snapshots per workspace", () => {
    const base = { workspace_id: a, kind: "baseline" as const, layer: "/layers/0", bytes: 10, file_count: 1 };
    store.upsertSnapshot({ ...base, name: "baseline", created_at: "2030-01-01T00:00:00Z" });
    store.upsertSnapshot({ ...base, name: "cp", kind: "named", created_at: "2030-01-02T00:00:00Z" });
    store.upsertSnapshot({ ...base, workspace_id: b, name: "cp", kind: "named" });
    const replaced = store.upsertSnapshot({
      ...base,
      name: "cp",
      kind: "named",
      layer: "/layers/2",
      bytes: 20,
      created_at: "2030-01-03T00:00:00Z",
    });

    expect(store.getSnapshot(a, "cp")).toEqual(replaced);
    expect(store.listSnapshots(a).map((s) => [s.name, s.layer])).toEqual([
      ["baseline", "/layers/0"],
      ["cp", "/layers/2"],
    ]);
    expect(store.deleteSnapshot(a, "cp")).toBe(true);
    expect(store.deleteSnapshot(a, "cp")).toBe(false);
    expect(store.getSnapshot(a, "cp")).toBeNull();
    expect(store.getSnapshot(b, "cp")?.workspace_id).toBe(b);
  });
});
