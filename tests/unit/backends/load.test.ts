import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import {
  BACKEND_NAMES,
  type OneShotResult,
  type OneShotSpec,
  type SandboxSpec,
  type WorkspaceBackend,
} from "../../../src/backends/backend.js";
import { FakeBackend } from "../../../src/backends/fake/backend.js";
import { kvmCheck } from "../../../src/backends/kvm.js";
import { BACKEND_FEATURES, LazyBackend } from "../../../src/backends/lazy.js";
import { loadBackend } from "../../../src/backends/load.js";
import { backendEntry } from "../../../src/backends/registry.js";

const ctx = { env: {}, kvm: kvmCheck({}), settings: {} };

describe("lazily loaded backends", () => {
  it("the registry's data about each backend is what its loaded class has (execution mode, optional methods)", async () => {
    for (const name of BACKEND_NAMES) {
      const entry = backendEntry(name);
      const real = await loadBackend(name, ctx);
      expect(real.name).toBe(name);
      expect(entry.executionMode, name).toBe(real.executionMode);
      const has = BACKEND_FEATURES.filter((f) => typeof real[f] === "function");
      expect([...entry.features].sort(), name).toEqual([...has].sort());
      // The facade shows the same presence before anything is loaded.
      const lazy = new LazyBackend(entry, () => entry.load(ctx));
      expect(BACKEND_FEATURES.filter((f) => typeof lazy[f] === "function").sort(), name).toEqual(
        [...has].sort(),
      );
    }
  });

  it("imports nothing until an asynchronous method is called, then forwards to one instance", async () => {
    const spec = { dir: "/tmp/x", snapshotsDir: "/tmp/x/snapshots" } as SandboxSpec;
    let loads = 0;
    const real = new FakeBackend();
    const lazy = new LazyBackend({ name: "bwrap", executionMode: "guest_agent", features: [] }, async () => {
      loads++;
      return real as WorkspaceBackend;
    });
    expect(lazy.name).toBe("bwrap");
    expect(() => lazy.agentSnapshotPath(spec, "s")).toThrow(/before it was loaded/);
    expect(loads).toBe(0);
    await lazy.discardChanges(spec);
    await lazy.discardChanges(spec);
    expect(loads).toBe(1);
    expect(lazy.agentSnapshotPath(spec, "s")).toBe(real.agentSnapshotPath(spec, "s"));
    expect(await lazy.load()).toBe(real);
  });

  it("retries an import that failed instead of keeping the failure", async () => {
    let calls = 0;
    const lazy = new LazyBackend({ name: "qemu", executionMode: "guest_agent", features: [] }, async () => {
      calls++;
      if (calls === 1) throw new Error("import failed");
      return new FakeBackend() as WorkspaceBackend;
    });
    await expect(lazy.load()).rejects.toThrow("import failed");
    await expect(lazy.load()).resolves.toBeInstanceOf(FakeBackend);
  });
});

describe("a backend's one-shot runner", () => {
  it("runs a one-shot without loading the backend, and through the backend once it is loaded", async () => {
    const spec = { command: "true" } as unknown as OneShotSpec;
    const result = (by: string) => ({ by }) as unknown as OneShotResult;
    let loads = 0;
    let runnerLoads = 0;
    const real = new FakeBackend() as WorkspaceBackend;
    real.runOnce = async () => result("backend");
    const lazy = new LazyBackend(
      {
        name: "bwrap",
        executionMode: "guest_agent",
        features: ["runOnce"],
        oneShot: async () => {
          runnerLoads++;
          return async () => result("runner");
        },
      },
      async () => {
        loads++;
        return real;
      },
    );
    expect(await lazy.runOnce?.(spec)).toEqual({ by: "runner" });
    expect(await lazy.runOnce?.(spec)).toEqual({ by: "runner" });
    expect([loads, runnerLoads]).toEqual([0, 1]);
    await lazy.load();
    expect(await lazy.runOnce?.(spec)).toEqual({ by: "backend" });
  });

  it("bwrap's runner is the function its backend's runOnce calls", async () => {
    const entry = backendEntry("bwrap");
    expect(entry.oneShot).toBeTypeOf("function");
    expect(await entry.oneShot?.()).toBeTypeOf("function");
    // The backend's own method delegates to the same module function (one implementation).
    const source = readFileSync(new URL("../../../src/backends/bwrap/backend.ts", import.meta.url), "utf8");
    expect(source).toMatch(
      /runOnce\(spec: OneShotSpec\)[^{]*\{\s*return bwrapRunOnce\(spec, await this\.launchTools\(\)\);/,
    );
  });
});
