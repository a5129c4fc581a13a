import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  BACKEND_NAMES,
  type BackendName,
  type BackendProbe,
  type BackendSettings,
  type ExecutionMode,
  type KvmStatus,
  type ProbeResult,
  type WorkspaceBackend,
} from "./backend.js";
import { bwrapProbe } from "./bwrap/probe.js";
import { firecrackerProbe } from "./firecracker/probe.js";
import { gvisorProbe } from "./gvisor/probe.js";
import { hostProbe } from "./host/probe.js";
import { type KvmCheck, kvmCheck } from "./kvm.js";
import type { BackendFeature, OneShotRunner } from "./lazy.js";
import { qemuProbe } from "./qemu/probe.js";

/** What the engine hands every backend it builds. */
export interface BackendContext {
  /** The engine's environment (PATH, DOCKER_HOST), not necessarily process.env. */
  env: NodeJS.ProcessEnv;
  /** The engine's one KVM verdict. */
  kvm: KvmCheck;
  settings: BackendSettings;
}

/**
 * One backend: everything the engine, the default choice and doctor know about it. Only
 * data and the probe (small modules) are here; the implementation is imported by `load`
 * on first use, so a process that lists workspaces or runs one backend never loads the
 * others (the VM backends alone are ~40 modules).
 */
export interface BackendEntry extends BackendProbe {
  /** Rank for the default choice; higher is stronger. 0 for opt-in backends (never a default). */
  readonly strength: number;
  /** Never a default: used only when asked for by name (docker, host). */
  readonly optIn: boolean;
  /** False for `host`: no isolation, so only with allowHostCompat (--allow-host-compat). */
  readonly isolating: boolean;
  /** Its WorkspaceBackend.executionMode, known without loading it (workspace views). */
  readonly executionMode: ExecutionMode;
  /**
   * The optional WorkspaceBackend methods it has whose presence the core tests before
   * loading it (a unit test compares this with the loaded class).
   */
  readonly features: readonly BackendFeature[];
  /** Imports the implementation and builds it. */
  load(ctx: BackendContext): Promise<WorkspaceBackend>;
  /** Imports its one-shot runner alone, where it has one that needs nothing else (LazyTraits). */
  readonly oneShot?: () => Promise<OneShotRunner>;
}

const ENTRIES: { readonly [N in BackendName]: BackendEntry } = {
  firecracker: {
    ...firecrackerProbe,
    strength: 40,
    optIn: false,
    isolating: true,
    executionMode: "guest_agent",
    features: ["connectNet", "openDisk"],
    load: async (c) =>
      new (await import("./firecracker/backend.js")).FirecrackerBackend({
        env: c.env,
        ...(c.settings.firecrackerBin ? { binName: c.settings.firecrackerBin } : {}),
      }),
  },
  qemu: {
    ...qemuProbe,
    strength: 30,
    optIn: false,
    isolating: true,
    executionMode: "guest_agent",
    features: ["connectNet", "openDisk"],
    load: async (c) => new (await import("./qemu/backend.js")).QemuBackend({ kvm: c.kvm }),
  },
  gvisor: {
    ...gvisorProbe,
    strength: 20,
    optIn: false,
    isolating: true,
    executionMode: "guest_agent",
    features: ["connectPort", "openDisk", "runOnce", "adoptSpare"],
    load: async (c) => new (await import("./gvisor/backend.js")).GvisorBackend({ kvm: c.kvm }),
  },
  docker: {
    name: "docker",
    isolation: "containers (Docker Engine API)",
    // Its module is imported when Docker is probed: it loads node:http (7-30 ms here),
    // which a bwrap `pyro run` paid on every call without ever asking Docker.
    probe: async (ctx) => (await import("./docker/probe.js")).dockerProbe.probe(ctx),
    strength: 0,
    optIn: true,
    isolating: true,
    executionMode: "guest_agent",
    features: ["connectPort", "openDisk", "runOnce", "adoptSpare", "diskLimitSupport"],
    load: async (c) => new (await import("./docker/backend.js")).DockerBackend(c.env),
  },
  bwrap: {
    ...bwrapProbe,
    strength: 10,
    optIn: false,
    isolating: true,
    executionMode: "guest_agent",
    features: ["connectPort", "openDisk", "runOnce", "adoptSpare", "egressNamespace"],
    load: async () => new (await import("./bwrap/backend.js")).BwrapBackend(),
    oneShot: async () => {
      const [{ bwrapRunOnce }, { detectLaunchTools }] = await Promise.all([
        import("./bwrap/oneshot.js"),
        import("./linux/launch.js"),
      ]);
      const tools = detectLaunchTools();
      return async (spec) => bwrapRunOnce(spec, await tools);
    },
  },
  host: {
    ...hostProbe,
    strength: 0,
    optIn: true,
    isolating: false,
    executionMode: "host_compat",
    features: ["connectPort", "openDisk"],
    load: async () => new (await import("./host/backend.js")).HostBackend(),
  },
};

/**
 * Every backend of contract §2 in the order of BACKEND_NAMES (strongest isolation first):
 * the one list the engine builds its backends from, doctor probes and the default choice
 * walks (by `strength`). Keyed by BackendName above, so a name without an entry (or an
 * entry for no name) does not compile.
 */
export const BACKENDS: readonly BackendEntry[] = BACKEND_NAMES.map((n) => ENTRIES[n]);

/** The registry entry of a backend. */
export function backendEntry(name: BackendName): BackendEntry {
  return ENTRIES[name];
}

/** What a default choice needs to know of a backend (tests pass their own). */
export type Candidate = Pick<BackendEntry, "name" | "strength" | "optIn" | "isolating">;

/** A probe's verdict as the default choice reads it. */
export type Verdict = Pick<ProbeResult, "available" | "opt_in" | "reason">;

export interface DefaultChoice {
  /** The backend to use, or null when nothing may be used. */
  name: BackendName | null;
  reason: string;
  /** `name: reason` of each candidate that was probed and did not qualify, strongest first. */
  failures: string[];
}

/**
 * THE default choice, for the engine (a workspace or run that names no backend) and for
 * doctor: the strongest backend that is not opt-in and whose probe says it works here
 * without being opt-in itself (qemu under TCG is). Candidates are asked strongest first
 * and the first that qualifies wins, so a caller that probes lazily stops there. The
 * host backend is never chosen unless `allowHostCompat`, and then only when no
 * isolating backend qualifies.
 */
export async function chooseDefault(
  verdict: (name: BackendName) => Promise<Verdict> | Verdict,
  options: { allowHostCompat?: boolean; candidates?: readonly Candidate[] } = {},
): Promise<DefaultChoice> {
  const candidates = [...(options.candidates ?? BACKENDS)].sort((a, b) => b.strength - a.strength);
  const failures: string[] = [];
  for (const c of candidates) {
    if (c.optIn || !c.isolating) continue;
    const r = await verdict(c.name);
    if (r.available && !r.opt_in)
      return { name: c.name, reason: "strongest isolating backend that works here", failures };
    failures.push(`${c.name}: ${r.reason}`);
  }
  const host = candidates.find((c) => !c.isolating);
  if (options.allowHostCompat && host)
    return {
      name: host.name,
      reason: "no isolating backend works here; host-compat allowed (no isolation)",
      failures,
    };
  return {
    name: null,
    reason:
      "no isolating backend works here; install bubblewrap or runsc (npm run setup), or pass --allow-host-compat",
    failures,
  };
}

export interface ProbeReport {
  kvm: KvmStatus;
  /** `implemented`: every registry entry has a constructor (kept for the doctor's JSON shape). */
  backends: (ProbeResult & { implemented: boolean; default: boolean })[];
  default_backend: BackendName | null;
  default_reason: string;
}

/** Probes every backend in parallel (KVM once) and picks the default with chooseDefault. */
export async function probeAll(
  options: {
    env?: NodeJS.ProcessEnv;
    settings?: BackendSettings;
    timeoutMs?: number;
    /** Replace the registry (tests). */
    entries?: readonly (BackendProbe & Candidate)[];
    /** Replace the KVM check (default: a fresh one, so doctor reports what is true now). */
    kvm?: KvmCheck;
  } = {},
): Promise<ProbeReport> {
  const env = options.env ?? process.env;
  const settings = options.settings ?? {};
  const timeoutMs = options.timeoutMs ?? 10_000;
  const entries = options.entries ?? BACKENDS;
  const kvm = options.kvm ?? kvmCheck(env, timeoutMs);
  const scratchDir = await mkdtemp(join(tmpdir(), "pyro-probe-"));
  try {
    const results = await Promise.all(
      entries.map(async (p) => {
        const started = performance.now();
        let r: Omit<ProbeResult, "name" | "isolation" | "probe_ms">;
        try {
          r = await p.probe({ env, settings, scratchDir: join(scratchDir, p.name), timeoutMs, kvm });
        } catch (err) {
          r = {
            available: false,
            version: null,
            reason: `probe failed: ${(err as Error).message}`,
            opt_in: false,
            details: {},
          };
        }
        return {
          name: p.name,
          isolation: p.isolation,
          ...r,
          probe_ms: Math.round(performance.now() - started),
        };
      }),
    );
    const byName = new Map(results.map((r) => [r.name, r]));
    const { name, reason } = await chooseDefault((n) => byName.get(n)!, { candidates: entries });
    return {
      kvm: await kvm(),
      backends: results.map((r) => ({ ...r, implemented: true, default: r.name === name })),
      default_backend: name,
      default_reason: reason,
    };
  } finally {
    await rm(scratchDir, { recursive: true, force: true });
  }
}
