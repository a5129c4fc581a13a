import { describe, expect, it } from "vitest";
import type { BackendName, BackendProbe, ProbeResult } from "../../../src/backends/backend.js";
import { BACKEND_PROBES, chooseDefault, probeAll } from "../../../src/backends/registry.js";

function fakeProbe(name: BackendName, strength: number, available: boolean, optIn = false): BackendProbe {
  return {
    name,
    isolation: "fake",
    strength,
    probe: async () => ({
      available,
      version: "1",
      reason: available ? null : "nope",
      opt_in: optIn,
      details: {},
    }),
  };
}

describe("backend registry", () => {
  it("covers every backend of the contract, strongest first", () => {
    expect(BACKEND_PROBES.map((p) => p.name)).toEqual([
      "firecracker",
      "qemu",
      "gvisor",
      "docker",
      "bwrap",
      "host",
    ]);
  });

  it("picks the strongest available, implemented, non-opt-in backend", async () => {
    const probes = [
      fakeProbe("firecracker", 40, false),
      fakeProbe("qemu", 30, true, true),
      fakeProbe("gvisor", 20, true),
      fakeProbe("bwrap", 10, true),
      fakeProbe("host", 0, true, true),
    ];
    const all = new Set<BackendName>(["firecracker", "qemu", "gvisor", "bwrap", "host"]);
    const r = await probeAll({ probes, implemented: all });
    expect(r.default_backend).toBe("gvisor");
    expect(r.backends.find((b) => b.name === "gvisor")?.default).toBe(true);
    const onlyBwrap = await probeAll({ probes, implemented: new Set<BackendName>(["bwrap", "host"]) });
    expect(onlyBwrap.default_backend).toBe("bwrap");
  });

  it("never chooses host (or any opt-in backend) silently", () => {
    const results: ProbeResult[] = [
      {
        name: "host",
        isolation: "",
        available: true,
        version: null,
        reason: null,
        opt_in: true,
        details: {},
        probe_ms: 0,
      },
      {
        name: "qemu",
        isolation: "",
        available: true,
        version: null,
        reason: null,
        opt_in: true,
        details: {},
        probe_ms: 0,
      },
    ];
    const r = chooseDefault(results, BACKEND_PROBES, new Set<BackendName>(["host", "qemu"]));
    expect(r.name).toBeNull();
    expect(r.reason).toMatch(/--allow-host-compat/);
  });

  it("reports a crashing probe as unavailable with its reason instead of failing", async () => {
    const boom: BackendProbe = {
      name: "docker",
      isolation: "x",
      strength: 0,
      probe: async () => Promise.reject(new Error("kaput")),
    };
    const r = await probeAll({ probes: [boom], implemented: new Set() });
    expect(r.backends[0]).toMatchObject({ name: "docker", available: false, reason: "probe failed: kaput" });
  });
});
