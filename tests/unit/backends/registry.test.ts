import { readdirSync, readFileSync } from "node:fs";
import { join, relative } from "node:path";
import { describe, expect, it } from "vitest";
import {
  BACKEND_NAMES,
  type BackendName,
  type BackendProbe,
  type ProbeContext,
} from "../../../src/backends/backend.js";
import {
  BACKENDS,
  type Candidate,
  chooseDefault,
  probeAll,
  type Verdict,
} from "../../../src/backends/registry.js";
import { REPO_ROOT } from "../../helpers/cli.js";

type FakeEntry = BackendProbe & Candidate;

function fake(
  name: BackendName,
  strength: number,
  available: boolean,
  options: { optIn?: boolean; probeOptIn?: boolean; isolating?: boolean } = {},
): FakeEntry {
  return {
    name,
    isolation: "fake",
    strength,
    optIn: options.optIn ?? false,
    isolating: options.isolating ?? true,
    probe: async () => ({
      available,
      version: "1",
      reason: available ? null : `${name} does not work`,
      opt_in: options.probeOptIn ?? false,
      details: {},
    }),
  };
}

/** A verdict function over fake entries that records which backends were asked. */
function verdicts(entries: readonly FakeEntry[]) {
  const asked: BackendName[] = [];
  const ctx = {} as ProbeContext;
  const verdict = async (name: BackendName): Promise<Verdict> => {
    asked.push(name);
    return entries.find((e) => e.name === name)!.probe(ctx);
  };
  return { asked, verdict };
}

const HOST = fake("host", 0, true, { optIn: true, probeOptIn: true, isolating: false });

describe("the backend registry", () => {
  it("has one entry per backend name, in the contract's order, default candidates strongest first", () => {
    expect(BACKENDS.map((e) => e.name)).toEqual([...BACKEND_NAMES]);
    const strengths = BACKENDS.filter((e) => !e.optIn).map((e) => e.strength);
    expect(strengths).toEqual([...strengths].sort((a, b) => b - a));
    expect(new Set(strengths).size).toBe(strengths.length);
    expect(BACKENDS.filter((e) => e.optIn).every((e) => e.strength === 0)).toBe(true);
  });

  it("marks host as the one backend without isolation and docker and host as opt-in", () => {
    expect(BACKENDS.filter((e) => !e.isolating).map((e) => e.name)).toEqual(["host"]);
    expect(BACKENDS.filter((e) => e.optIn).map((e) => e.name)).toEqual(["docker", "host"]);
  });

  it("names docker as its probe module does, which it imports only to probe (node:http, 7-30 ms)", async () => {
    const { dockerProbe } = await import("../../../src/backends/docker/probe.js");
    const entry = BACKENDS.find((e) => e.name === "docker")!;
    expect([entry.name, entry.isolation]).toEqual([dockerProbe.name, dockerProbe.isolation]);
    expect(readFileSync(join(REPO_ROOT, "src/backends/registry.ts"), "utf8")).not.toMatch(
      /^import .*docker\/probe/m,
    );
  });

  it("builds every backend from its entry, with the name it is registered under", async () => {
    const ctx = {
      env: {},
      kvm: async () => ({ present: false, usable: false, reason: "test" }),
      settings: {},
    };
    for (const e of BACKENDS) expect((await e.load(ctx)).name).toBe(e.name);
  });
});

describe("chooseDefault (the one default choice of the engine and doctor)", () => {
  it("picks the strongest backend that works, whatever order the candidates come in", async () => {
    const entries = [
      fake("bwrap", 10, true),
      fake("gvisor", 20, true),
      fake("qemu", 30, false),
      fake("firecracker", 40, false),
      HOST,
    ];
    const { verdict } = verdicts(entries);
    const r = await chooseDefault(verdict, { candidates: entries });
    expect(r.name).toBe("gvisor");
    expect(r.failures).toEqual(["firecracker: firecracker does not work", "qemu: qemu does not work"]);
  });

  it("stops probing at the first that works (the engine probes lazily)", async () => {
    const entries = [fake("firecracker", 40, false), fake("qemu", 30, true), fake("bwrap", 10, true)];
    const { asked, verdict } = verdicts(entries);
    expect((await chooseDefault(verdict, { candidates: entries })).name).toBe("qemu");
    expect(asked).toEqual(["firecracker", "qemu"]);
  });

  it("skips backends that are opt-in, by the registry (never probed) or by their probe (qemu under TCG)", async () => {
    const entries = [
      fake("qemu", 30, true, { probeOptIn: true }),
      fake("docker", 0, true, { optIn: true }),
      fake("bwrap", 10, true),
    ];
    const { asked, verdict } = verdicts(entries);
    expect((await chooseDefault(verdict, { candidates: entries })).name).toBe("bwrap");
    expect(asked).toEqual(["qemu", "bwrap"]);
  });

  it("never chooses host unless host-compat is allowed", async () => {
    const entries = [fake("bwrap", 10, false), fake("docker", 0, true, { optIn: true }), HOST];
    const { asked, verdict } = verdicts(entries);
    const refused = await chooseDefault(verdict, { candidates: entries });
    expect(refused.name).toBeNull();
    expect(refused.reason).toMatch(/--allow-host-compat/);
    expect(refused.failures).toEqual(["bwrap: bwrap does not work"]);
    expect(asked).not.toContain("host");
    const allowed = await chooseDefault(verdict, { candidates: entries, allowHostCompat: true });
    expect(allowed.name).toBe("host");
  });

  it("prefers any isolating backend that works over host, even when host-compat is allowed", async () => {
    const entries = [HOST, fake("bwrap", 10, true)];
    const { verdict } = verdicts(entries);
    expect((await chooseDefault(verdict, { candidates: entries, allowHostCompat: true })).name).toBe("bwrap");
  });

  it("walks the real registry when given no candidates", async () => {
    const asked: BackendName[] = [];
    const r = await chooseDefault((name) => {
      asked.push(name);
      return { available: false, opt_in: false, reason: "no" };
    });
    expect(r.name).toBeNull();
    expect(asked).toEqual(["firecracker", "qemu", "gvisor", "bwrap"]);
  });
});

describe("probeAll (doctor)", () => {
  it("marks the default chooseDefault picks", async () => {
    const entries = [
      fake("firecracker", 40, false),
      fake("qemu", 30, true, { probeOptIn: true }),
      fake("gvisor", 20, true),
      fake("bwrap", 10, true),
      HOST,
    ];
    const r = await probeAll({ entries, kvm: async () => ({ present: false, usable: false, reason: "x" }) });
    expect(r.default_backend).toBe("gvisor");
    expect(r.default_reason).toBe("strongest isolating backend that works here");
    expect(r.backends.filter((b) => b.default).map((b) => b.name)).toEqual(["gvisor"]);
    expect(r.backends.every((b) => b.implemented)).toBe(true);
  });

  it("never makes host the default", async () => {
    const r = await probeAll({
      entries: [fake("bwrap", 10, false), HOST],
      kvm: async () => ({ present: false, usable: false, reason: "x" }),
    });
    expect(r.default_backend).toBeNull();
    expect(r.default_reason).toMatch(/--allow-host-compat/);
  });

  it("reports a crashing probe as unavailable with its reason instead of failing", async () => {
    const boom: FakeEntry = {
      ...fake("docker", 0, false, { optIn: true }),
      probe: async () => Promise.reject(new Error("kaput")),
    };
    const r = await probeAll({
      entries: [boom],
      kvm: async () => ({ present: false, usable: false, reason: "x" }),
    });
    expect(r.backends[0]).toMatchObject({ name: "docker", available: false, reason: "probe failed: kaput" });
  });

  it("hands every probe the settings it was given (PYRO_FIRECRACKER_BIN reaches the probe as a value)", async () => {
    const seen: unknown[] = [];
    const spy: FakeEntry = {
      ...fake("firecracker", 40, false),
      probe: async (ctx) => {
        seen.push(ctx.settings);
        return { available: false, version: null, reason: "spy", opt_in: false, details: {} };
      },
    };
    await probeAll({
      entries: [spy],
      settings: { firecrackerBin: "/opt/fc" },
      kvm: async () => ({ present: false, usable: false, reason: "x" }),
    });
    expect(seen).toEqual([{ firecrackerBin: "/opt/fc" }]);
  });
});

describe("one KVM probe", () => {
  it("probeKvm is called only in src/backends/kvm.ts; everything else asks a shared kvmCheck", () => {
    const src = join(REPO_ROOT, "src");
    const walk = (dir: string): string[] =>
      readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
        e.isDirectory() ? walk(join(dir, e.name)) : e.name.endsWith(".ts") ? [join(dir, e.name)] : [],
      );
    const callers = walk(src)
      .filter((f) => /\bprobeKvm\s*\(/.test(readFileSync(f, "utf8")))
      .map((f) => relative(src, f));
    expect(callers).toEqual(["backends/kvm.ts"]);
  });
});
