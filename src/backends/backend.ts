/**
 * The backend interface: the narrow waist between the core and an isolation technology.
 * Every backend can be probed (does it work on this host, and why not); later issues add
 * `create(spec)` returning a handle with a byte channel to the guest agent.
 */
export const BACKEND_NAMES = ["firecracker", "qemu", "gvisor", "docker", "bwrap", "host"] as const;
export type BackendName = (typeof BACKEND_NAMES)[number];

export interface ProbeResult {
  name: BackendName;
  /** What kind of boundary it gives. */
  isolation: string;
  /** The host can run this backend right now (proved by trying, not by a file existing). */
  available: boolean;
  /** Version of the underlying tool, when it could be read. */
  version: string | null;
  /** Why it is not available (or a caveat when it is). */
  reason: string | null;
  /** Only used when asked for explicitly (host always; qemu under TCG; docker). */
  opt_in: boolean;
  /** Extra facts (KVM state, platform, socket path). */
  details: Record<string, unknown>;
  probe_ms: number;
}

export interface ProbeContext {
  env: NodeJS.ProcessEnv;
  /** Scratch directory for probes that need files (a probe kernel, an OCI bundle). */
  scratchDir: string;
  timeoutMs: number;
  /** Shared KVM verdict: several backends need it, it is probed once. */
  kvm: () => Promise<KvmStatus>;
}

export interface KvmStatus {
  present: boolean;
  usable: boolean;
  reason: string | null;
}

export interface BackendProbe {
  readonly name: BackendName;
  readonly isolation: string;
  /** Rank for the default choice; higher is stronger. 0: never a default. */
  readonly strength: number;
  probe(ctx: ProbeContext): Promise<Omit<ProbeResult, "name" | "isolation" | "probe_ms">>;
}
