import { describe, expect, it } from "vitest";
import { BACKEND_NAMES } from "../../../src/backends/backend.js";
import { kvmCheck } from "../../../src/backends/kvm.js";
import { loadBackend } from "../../../src/backends/load.js";
import { backendEntry } from "../../../src/backends/registry.js";

describe("loadBackend", () => {
  it("builds, for every backend, what the registry builds (same class, name and execution mode)", async () => {
    const ctx = { env: {}, kvm: kvmCheck({}), settings: {} };
    for (const name of BACKEND_NAMES) {
      const lazy = await loadBackend(name, ctx);
      const eager = backendEntry(name).create(ctx);
      expect(lazy.constructor).toBe(eager.constructor);
      expect([lazy.name, lazy.executionMode]).toEqual([eager.name, eager.executionMode]);
    }
  });
});
