import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { BackendName, BackendProbe, KvmStatus, ProbeResult } from "./backend.js";
import { bwrapProbe } from "./bwrap/probe.js";
import { dockerProbe } from "./docker/probe.js";
import { firecrackerProbe } from "./firecracker/probe.js";
import { gvisorProbe } from "./gvisor/probe.js";
import { hostProbe } from "./host/probe.js";
import { probeKvm } from "./kvm.js";
import { qemuProbe } from "./qemu/probe.js";

/** Every backend of contract §2, strongest first. */
export const BACKEND_PROBES: readonly BackendProbe[] = [
  firecrackerProbe,
  qemuProbe,
  gvisorProbe,
  dockerProbe,
  bwrapProbe,
  hostProbe,
];

/**
 * Backends this build can create workspaces on. A backend that probes available but is
 * not implemented yet is reported, never chosen.
 */
export const IMPLEMENTED_BACKENDS: ReadonlySet<BackendName> = new Set<BackendName>([
  "firecracker",
  "qemu",
  "gvisor",
  "docker",
  "bwrap",
  "host",
]);

export interface ProbeReport {
  kvm: KvmStatus;
  backends: (ProbeResult & { implemented: boolean; default: boolean })[];
  default_backend: BackendName | null;
  default_reason: string;
}

/** Probes every backend (in parallel, KVM once) and picks the default. */
export async function probeAll(
  options: {
    env?: NodeJS.ProcessEnv;
    timeoutMs?: number;
    probes?: readonly BackendProbe[];
    implemented?: ReadonlySet<BackendName>;
  } = {},
): Promise<ProbeReport> {
  const env = options.env ?? process.env;
  const timeoutMs = options.timeoutMs ?? 10_000;
  const probes = options.probes ?? BACKEND_PROBES;
  const implemented = options.implemented ?? IMPLEMENTED_BACKENDS;
  const scratchDir = await mkdtemp(join(tmpdir(), "pyro-probe-"));
  let kvmPromise: Promise<KvmStatus> | undefined;
  const kvm = () => {
    kvmPromise ??= probeKvm(env, join(scratchDir, "kvm"), timeoutMs);
    return kvmPromise;
  };
  try {
    const results = await Promise.all(
      probes.map(async (p) => {
        const started = performance.now();
        let r: Omit<ProbeResult, "name" | "isolation" | "probe_ms">;
        try {
          r = await p.probe({ env, scratchDir: join(scratchDir, p.name), timeoutMs, kvm });
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
    const { name, reason } = chooseDefault(results, probes, implemented);
    return {
      kvm: await kvm(),
      backends: results.map((r) => ({
        ...r,
        implemented: implemented.has(r.name),
        default: r.name === name,
      })),
      default_backend: name,
      default_reason: reason,
    };
  } finally {
    await rm(scratchDir, { recursive: true, force: true });
  }
}

/** The strongest backend that works here, is not opt-in, and this build implements. */
export function chooseDefault(
  results: readonly ProbeResult[],
  probes: readonly BackendProbe[],
  implemented: ReadonlySet<BackendName>,
): { name: BackendName | null; reason: string } {
  const ranked = [...results]
    .filter((r) => r.available && !r.opt_in && implemented.has(r.name))
    .sort((a, b) => strength(probes, b.name) - strength(probes, a.name));
  const best = ranked[0];
  if (best) return { name: best.name, reason: `strongest isolating backend that works here` };
  const workingButPending = results
    .filter((r) => r.available && !r.opt_in && !implemented.has(r.name))
    .map((r) => r.name);
  return {
    name: null,
    reason:
      workingButPending.length > 0
        ? `no implemented isolating backend works here (working but not implemented in this build: ${workingButPending.join(", ")})`
        : "no isolating backend works here; install bubblewrap or runsc (npm run setup), or pass --allow-host-compat",
  };
}

function strength(probes: readonly BackendProbe[], name: BackendName): number {
  return probes.find((p) => p.name === name)?.strength ?? 0;
}
