import type { EnvironmentSource, EnvironmentSpec } from "./catalog.js";

/** One step of a long build, for progress displays (TTY) and MCP progress later. */
export interface BuildProgress {
  phase:
    | "lock"
    | "resolve"
    | "retrieve"
    | "extract"
    | "install"
    | "unpack"
    | "configure"
    | "finish"
    | "done"
    | "download"
    | "step";
  message: string;
  /** Packages handled so far in this phase, when known. */
  count?: number;
  /** Bytes written to the target so far, when measured. */
  bytes?: number;
  /** Bytes expected in all (image downloads). */
  total_bytes?: number;
  /** Layers finished / in the image (image pulls), or steps done / in the recipe. */
  done_count?: number;
  total_count?: number;
}

export interface BuildContext {
  /** Empty directory that must hold the root filesystem when build() resolves. */
  rootfs: string;
  onProgress?: (p: BuildProgress) => void;
  signal?: AbortSignal;
  /** Plain HTTP to a loopback registry (image pulls only). */
  insecureRegistry?: boolean;
  /** The version to build, from `currentVersion` (an image tag pinned to this digest). */
  version?: string;
}

/** What a moving source (an image tag) names now, or why its origin could not be asked. */
export type VersionCheck = { digest: string } | { unreachable: string };

/** What a builder reports about the rootfs it made; lands in the entry's manifest. */
export interface BuildOutput {
  source_detail: Record<string, unknown>;
  package_count?: number;
  /** The root's size when the builder measured it (else the cache walks the tree). */
  size?: { bytes: number; files: number };
}

/**
 * Turns an environment source into a root filesystem. The cache owns atomicity and
 * locking; a builder only fills `ctx.rootfs` and may throw, leaving the cache to
 * discard the partial tree.
 */
export interface Builder {
  readonly kind: EnvironmentSource["kind"];
  build(spec: EnvironmentSpec, ctx: BuildContext): Promise<BuildOutput>;
  /**
   * For sources that can change under the same name (an image tag): the digest the name
   * stands for now (one cheap request), or `unreachable` when the origin cannot be asked.
   */
  currentVersion?(
    spec: EnvironmentSpec,
    ctx: Pick<BuildContext, "signal" | "insecureRegistry">,
  ): Promise<VersionCheck>;
}
