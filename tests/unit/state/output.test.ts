import { join } from "node:path";
import Database from "better-sqlite3";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { OUTPUT_BUDGET_BYTES, TAIL_BYTES } from "../../../src/state/codec.js";
import { StateStore } from "../../../src/state/store.js";
import { sampleCommand, sampleWorkspace, tempDir } from "./helpers.js";

let store: StateStore;
let cleanup: () => void;
let a: string;

beforeEach(() => {
  const t = tempDir();
  cleanup = t.cleanup;
  store = StateStore.open(join(t.dir, "pyro.db"));
  a = store.createWorkspace(sampleWorkspace({ name: "a" })).workspace_id;
});

afterEach(() => {
  store.close();
  cleanup();
});

const MiB = 1024 * 1024;

describe("kept command output", () => {
  it("keeps a command's whole output and full sizes beside its tails", () => {
    const out = `${"x".repeat(100_000)}\nend\n`;
    const seq = store.recordCommand(a, sampleCommand("big", { stdout_tail: out }), {
      stdout: out,
      stderr: "err\n",
      stdout_bytes: 5_000_000,
      stderr_bytes: 4,
    });
    expect(store.listCommands(a)[0]!.stdout_tail).toBe(out.slice(-TAIL_BYTES));
    expect(store.commandOutput(a, seq)).toEqual({
      stdout: out,
      stderr: "err\n",
      stdout_bytes: 5_000_000,
      stderr_bytes: 4,
    });
    expect(store.commandOutputSizes(a)).toEqual(
      new Map([[seq, { stdout_bytes: 5_000_000, stderr_bytes: 4 }]]),
    );
    expect(store.getCommand(a, seq)).toMatchObject({ seq, command: "big" });
    expect(store.getCommand(a, seq + 1)).toBeUndefined();
  });

  it("has no kept output for a command recorded without one", () => {
    const seq = store.recordCommand(a, sampleCommand("old"));
    expect(store.commandOutput(a, seq)).toBeUndefined();
  });

  it("prunes the oldest outputs past the workspace's budget, keeping their sizes and tails", () => {
    const big = "y".repeat(2 * MiB);
    const n = Math.ceil(OUTPUT_BUDGET_BYTES / big.length) + 3;
    for (let i = 0; i < n; i++) {
      store.recordCommand(a, sampleCommand(`c${i}`, { stdout_tail: big }), {
        stdout: big,
        stderr: "",
        stdout_bytes: big.length,
        stderr_bytes: 0,
      });
    }
    const kept = Array.from({ length: n }, (_, i) => store.commandOutput(a, i + 1)!);
    const full = kept.filter((o) => o.stdout !== null);
    expect(full.length * big.length).toBeLessThanOrEqual(OUTPUT_BUDGET_BYTES);
    expect(full.length).toBeGreaterThanOrEqual(OUTPUT_BUDGET_BYTES / big.length - 1);
    // The newest are the ones kept; every command keeps its sizes and tails.
    expect(kept.at(-1)!.stdout).toBe(big);
    expect(kept[0]).toEqual({ stdout: null, stderr: null, stdout_bytes: big.length, stderr_bytes: 0 });
    expect(store.listCommands(a)[0]!.stdout_tail).toHaveLength(TAIL_BYTES);
  });

  it("prunes the same with commands of no output in between (they skip the prune)", () => {
    const big = "z".repeat(2 * MiB);
    const n = Math.ceil(OUTPUT_BUDGET_BYTES / big.length) + 3;
    const outputs: number[] = [];
    for (let i = 0; i < n; i++) {
      const keep = (stdout: string) => ({ stdout, stderr: "", stdout_bytes: stdout.length, stderr_bytes: 0 });
      outputs.push(store.recordCommand(a, sampleCommand(`c${i}`), keep(big)));
      store.recordCommand(a, sampleCommand("true"), keep(""));
    }
    const full = outputs.filter((seq) => store.commandOutput(a, seq)!.stdout !== null);
    expect(full.length * big.length).toBeLessThanOrEqual(OUTPUT_BUDGET_BYTES);
    expect(full.length).toBeGreaterThanOrEqual(OUTPUT_BUDGET_BYTES / big.length - 1);
    expect(full.at(-1)).toBe(outputs.at(-1));
    expect(store.commandOutput(a, outputs[0]!)!.stdout).toBeNull();
  });

  it("counts the outputs a database kept before it kept their total (migration 4)", () => {
    const big = "w".repeat(2 * MiB);
    const keep = { stdout: big, stderr: "", stdout_bytes: big.length, stderr_bytes: 0 };
    // Under the budget by two outputs.
    const n = OUTPUT_BUDGET_BYTES / big.length - 1;
    for (let i = 0; i < n; i++) store.recordCommand(a, sampleCommand(`c${i}`), keep);
    const path = store.path;
    store.close();
    // The database as migration 3 left it: no totals.
    const raw = new Database(path);
    raw.exec("DROP TABLE output_totals");
    raw.pragma("user_version = 3");
    raw.close();
    store = StateStore.open(path);
    // Two more take the workspace past the budget: the oldest output goes, only it.
    store.recordCommand(a, sampleCommand("x"), keep);
    store.recordCommand(a, sampleCommand("y"), keep);
    expect(store.commandOutput(a, 1)!.stdout).toBeNull();
    expect(store.commandOutput(a, 2)!.stdout).toBe(big);
    expect(store.commandOutput(a, n + 2)!.stdout).toBe(big);
  });

  it("drops kept output with its workspace", () => {
    const seq = store.recordCommand(a, sampleCommand("x"), {
      stdout: "o",
      stderr: "",
      stdout_bytes: 1,
      stderr_bytes: 0,
    });
    store.deleteWorkspace(a);
    expect(store.commandOutput(a, seq)).toBeUndefined();
  });
});
