import { arch, platform, release } from "node:os";
import { join } from "node:path";
import type { BackendName, KvmStatus } from "../backends/backend.js";
import { type ProbeReport, probeAll } from "../backends/registry.js";
import type { EnvironmentInfo } from "../env/cache.js";
import { loadConfig } from "./config.js";
import type { Engine } from "./engine.js";
import { type NetworkDoctor, networkDoctor } from "./network-doctor.js";
import { poolDirOf, poolReport, SERVE_POOL_SIZE, type SpareReport } from "./pool.js";
import { keepVerdict, verdictsFile } from "./probe-cache.js";

export type Readiness = "warm" | "cold" | "stale";

export interface DoctorReport {
  platform: { os: string; arch: string; kernel: string; node: string; root: boolean };
  kvm: KvmStatus;
  backends: ProbeReport["backends"];
  default_backend: BackendName | null;
  default_reason: string;
  cache: {
    path: string;
    home: string;
    size_bytes: number;
    environments: {
      name: string;
      status: EnvironmentInfo["status"];
      recipe_key: string;
      size_bytes: number | null;
    }[];
  };
  /** Network policies and published ports per backend, and whether the proxy serves here. */
  network: NetworkDoctor;
  /**
   * The pool of started sandboxes (core/pool.ts): the size this process would keep
   * (`pyro mcp serve` keeps 1 unless PYRO_POOL says otherwise) and the spares on disk,
   * each with whether its owner still runs (a dead owner's are reaped by the next pool).
   */
  pool: { size: number; serve_size: number; spares: SpareReport[] };
  /** Per available backend: how a workspace's disk use is limited there, or why it is not. */
  disk_limit: Partial<Record<BackendName, string>>;
  environment?: {
    name: string;
    readiness: Readiness;
    recipe_key: string;
    reason: string;
  };
}

/**
 * Host readiness: every backend probed by trying it, KVM, the environment cache, and for
 * `environment` a warm/cold/stale verdict. The default is the registry's chooseDefault,
 * the same choice the engine makes for a workspace that names no backend.
 */
export async function doctor(
  engine: Engine,
  options: { environment?: string; timeout_ms?: number } = {},
): Promise<DoctorReport> {
  // Validate the environment name before spending seconds on probes.
  const envInfo = options.environment ? await engine.environments.info(options.environment) : undefined;
  const [probes, list, network, spares] = await Promise.all([
    probeAll({
      env: engine.env,
      settings: engine.backendSettings,
      ...(options.timeout_ms ? { timeoutMs: options.timeout_ms } : {}),
    }),
    engine.environments.list(),
    networkDoctor(
      engine.implemented().map((n) => engine.backend(n)),
      join(engine.paths.home, "tmp"),
    ),
    poolReport(poolDirOf(engine.paths.home)),
  ]);
  // Fresh verdicts replace what CLI calls keep between them (probe-cache.ts).
  for (const b of probes.backends)
    await keepVerdict(b.name, verdictsFile(engine.paths.home), engine.env, b).catch(() => {});
  const report: DoctorReport = {
    platform: {
      os: platform(),
      arch: arch(),
      kernel: release(),
      node: process.version,
      root: process.getuid?.() === 0,
    },
    kvm: probes.kvm,
    backends: probes.backends,
    default_backend: probes.default_backend,
    default_reason: probes.default_reason,
    cache: {
      path: engine.environments.root,
      home: engine.paths.home,
      size_bytes: list.reduce((a, e) => a + (e.size_bytes ?? 0), 0),
      environments: list.map((e) => ({
        name: e.name,
        status: e.status,
        recipe_key: e.recipe_key,
        size_bytes: e.size_bytes,
      })),
    },
    network,
    pool: {
      size: engine.config.pool,
      serve_size: loadConfig({ env: engine.env, poolDefault: SERVE_POOL_SIZE }).pool,
      spares,
    },
    disk_limit: diskLimits(probes.backends),
  };
  if (envInfo) report.environment = readiness(envInfo);
  return report;
}

/** How each available backend limits a workspace's disk use (docs/workspaces.md "Disk limit"). */
function diskLimits(backends: ProbeReport["backends"]): DoctorReport["disk_limit"] {
  const fixed: Partial<Record<BackendName, string>> = {
    bwrap: "yes (an ext4 image per workspace)",
    gvisor: "yes (an ext4 image per workspace)",
    qemu: "yes (the VM's state filesystem)",
    firecracker: "yes (the VM's state filesystem)",
    host: "none (no isolation)",
  };
  const out: DoctorReport["disk_limit"] = {};
  for (const b of backends) {
    if (!b.available) continue;
    const said = b.details?.disk_limit;
    const line = typeof said === "string" ? said : fixed[b.name];
    if (line) out[b.name] = line;
  }
  return out;
}

export function readiness(info: EnvironmentInfo): NonNullable<DoctorReport["environment"]> {
  const base = { name: info.name, recipe_key: info.recipe_key };
  switch (info.status) {
    case "cached":
      return { ...base, readiness: "warm", reason: `cached at ${info.path}` };
    case "stale":
      return {
        ...base,
        readiness: "stale",
        reason: `cached only from an older recipe (${info.stale_keys.join(", ")}); run \`pyro env pull ${info.name}\``,
      };
    default:
      return { ...base, readiness: "cold", reason: `not cached; run \`pyro env pull ${info.name}\`` };
  }
}
