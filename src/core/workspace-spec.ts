/**
 * What a new workspace is made from, checked before anything is made: the defaults, the
 * limits (CPU, memory, disk, TTL), the name, and the spec a create records. Shared by
 * Workspaces.create and the one-shot path (core/oneshot.ts).
 */
import type { BackendName } from "../backends/backend.js";
import { DISK_LIMITED } from "../backends/disk-image.js";
import type { BuildProgress } from "../env/builder.js";
import { PyroError } from "../errors.js";
import type { PublishedPort, WorkspaceSpec } from "../state/types.js";
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
  diskMib: number,
  ports: PublishedPort[],
  imageEnv: Record<string, string>,
): WorkspaceSpec {
  return {
    vcpus: options.vcpus ?? DEFAULTS.vcpus,
    memory_mib: options.memory_mib ?? DEFAULTS.memory_mib,
    pids_max: DEFAULTS.pids_max,
    disk_mib: diskMib,
    // An image's config `Env` (PATH, LANG, its tool versions) is the base; the caller's wins.
    env: { ...imageEnv, ...(options.env ?? {}) },
    timeout_seconds: DEFAULTS.timeout_seconds,
    ...(ports.length > 0 ? { published_ports: ports } : {}),
  };
}
