/**
 * What a new workspace is made from, checked before anything is made: the defaults, the
 * limits (CPU, memory, disk, TTL), the name, and the spec a create records. Shared by
 * Workspaces.create and the one-shot path (core/oneshot.ts).
 */
import type { BackendName, WorkspaceBackend } from "../backends/backend.js";
import { DISK_LIMITED } from "../backends/disk-image.js";
import type { BuildProgress } from "../env/builder.js";
import { PyroError } from "../errors.js";
import type { PublishedPort, WorkspaceRow, WorkspaceSpec } from "../state/types.js";
import { LIMITS } from "./limits.js";
import type { SecretPrompt } from "./secrets.js";
import type { SeedSource } from "./seed.js";

export const DEFAULTS = {
  vcpus: 1,
  memory_mib: 1024,
  pids_max: 1024,
  /** Writable layers of a workspace or one-shot (bwrap, gVisor; see backends/disk-image.ts). */
  disk_mib: 10 * 1024,
  timeout_seconds: 300,
  max_output_bytes: 1024 * 1024,
  ttl_seconds: 24 * 60 * 60,
} as const;

/**
 * A disk limit, validated before anything is made: whole MiB, 64 MiB to 16 TiB, and only
 * on a backend that can enforce it (asked of another, it is refused, not ignored).
 */
export function checkDiskMib(mib: number | undefined, backend?: BackendName): number {
  if (mib === undefined) return DEFAULTS.disk_mib;
  if (backend !== undefined && !DISK_LIMITED.includes(backend))
    throw new PyroError(
      "backend_unavailable",
      `the ${backend} backend cannot limit disk use here`,
      `drop {action}, or use ${DISK_LIMITED.join(" or ")}`,
      { action: { cli: "--disk", tool: "disk_mib" } },
    );
  const { min, max } = LIMITS.disk_mib;
  if (!Number.isInteger(mib) || mib < min || mib > max)
    throw new PyroError(
      "invalid_argument",
      `invalid disk limit ${String(mib).slice(0, 20)} MiB`,
      `give a whole number of MiB from ${min} to ${max}`,
    );
  return mib;
}

/**
 * The disk limit a new workspace or one-shot gets on `backend`: `disk_mib` (validated; the
 * default when none is asked) where the backend enforces one. A backend whose limit
 * depends on the host (docker: its engine's storage driver) is asked: where it cannot,
 * the workspace gets none, and an explicit limit is refused, never ignored. `enforced`
 * marks such a host-dependent limit as applied (views and later starts read it).
 */
export async function resolveDisk(
  mib: number | undefined,
  backend: Pick<WorkspaceBackend, "name" | "diskLimitSupport">,
): Promise<{ disk_mib?: number; enforced?: true }> {
  if (!backend.diskLimitSupport) return { disk_mib: checkDiskMib(mib, backend.name) };
  const disk_mib = checkDiskMib(mib);
  const why = await backend.diskLimitSupport();
  if (why === null) return { disk_mib, enforced: true };
  if (mib !== undefined)
    throw new PyroError(
      "backend_unavailable",
      `the ${backend.name} backend cannot limit disk use here: ${why.message}`,
      `drop {action}, or ${why.hint}`,
      { action: { cli: "--disk", tool: "disk_mib" } },
    );
  return {};
}

/** The disk limit a workspace's sandbox is started with (none: undefined). */
export function sandboxDiskMib(w: Pick<WorkspaceRow, "backend" | "spec">): number | undefined {
  if (DISK_LIMITED.includes(w.backend)) return w.spec.disk_mib ?? DEFAULTS.disk_mib;
  return w.spec.disk_enforced ? w.spec.disk_mib : undefined;
}

/**
 * CPU, memory and TTL limits, validated before anything is made (a sandbox given 1 MiB
 * died during start with an empty log): whole numbers, vcpus 1-64, memory 64 MiB-1 TiB,
 * a TTL of 1 s to 10 years.
 */
export function checkLimits(o: { vcpus?: number; memory_mib?: number; ttl_seconds?: number | null }): void {
  const check = (
    value: number | undefined | null,
    what: string,
    { min, max }: { min: number; max: number },
    unit: string,
  ) => {
    if (value === undefined || value === null) return;
    if (!Number.isInteger(value) || value < min || value > max)
      throw new PyroError(
        "invalid_argument",
        `invalid ${what} ${String(value).slice(0, 20)}`,
        `give a whole number of ${unit} from ${min} to ${max}`,
      );
  };
  check(o.vcpus, "vcpus", LIMITS.vcpus, "CPUs");
  check(o.memory_mib, "memory limit", LIMITS.memory_mib, "MiB");
  check(o.ttl_seconds, "ttl", LIMITS.ttl_seconds, "seconds");
}

export interface CreateOptions extends SeedSource {
  /** Secret specs by name: a literal, `${HOST_VAR}`, or `?` (prompted through `prompt_secret`). */
  secrets?: Record<string, string>;
  prompt_secret?: SecretPrompt;
  /** Progress of long steps (an environment build). */
  on_progress?: (p: BuildProgress) => void;
  environment?: string;
  name?: string;
  labels?: Record<string, string>;
  network_policy?: string;
  /** Host ports (127.0.0.1) forwarded to guest ports; host port 0 picks a free one. */
  published_ports?: PublishedPort[];
  env?: Record<string, string>;
  backend?: BackendName;
  allow_host_compat?: boolean;
  vcpus?: number;
  memory_mib?: number;
  /** Disk limit of the writable layers, MiB (default DEFAULTS.disk_mib). */
  disk_mib?: number;
  ttl_seconds?: number | null;
  signal?: AbortSignal;
}

export function validateName(name: string): void {
  if (!/^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/.test(name) || /^ws_[0-9a-f]{12}$/.test(name)) {
    throw new PyroError(
      "invalid_argument",
      `invalid workspace name '${name}'`,
      "use 1-63 letters, digits, '.', '_' or '-', not shaped like an id",
    );
  }
}

/** The spec of a new workspace: the caller's options over the defaults. */
export function createSpec(
  options: CreateOptions,
  disk: { disk_mib?: number; enforced?: true },
  ports: PublishedPort[],
  imageEnv: Record<string, string>,
): WorkspaceSpec {
  return {
    vcpus: options.vcpus ?? DEFAULTS.vcpus,
    memory_mib: options.memory_mib ?? DEFAULTS.memory_mib,
    pids_max: DEFAULTS.pids_max,
    ...(disk.disk_mib !== undefined ? { disk_mib: disk.disk_mib } : {}),
    ...(disk.enforced ? { disk_enforced: true as const } : {}),
    // An image's config `Env` (PATH, LANG, its tool versions) is the base; the caller's wins.
    env: { ...imageEnv, ...(options.env ?? {}) },
    timeout_seconds: DEFAULTS.timeout_seconds,
    ...(ports.length > 0 ? { published_ports: ports } : {}),
  };
}
