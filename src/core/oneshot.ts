import { join } from "node:path";
import type { Readable } from "node:stream";
import type { BackendName } from "../backends/backend.js";
import { hostCgroups } from "../backends/linux/cgroups.js";
import { sweepOneShots } from "../backends/linux/oneshot-sweep.js";
import { PyroError } from "../errors.js";
import type { Engine } from "./engine.js";
import { checkNetworkSupport, parseNetworkPolicy } from "./network.js";
import { checkMaxOutputBytes, type OutputListener } from "./output.js";
import { type CreateOptions, checkLimits, DEFAULTS, resolveDisk } from "./workspace-spec.js";

export interface RunOptions {
  environment?: string;
  vcpus?: number;
  memory_mib?: number;
  /** Disk limit of the writable layer, MiB (default DEFAULTS.disk_mib). */
  disk_mib?: number;
  timeout_seconds?: number;
  /** Per stream (default 1 MiB); past it a stream keeps its head and tail (see output.ts). */
  max_output_bytes?: number;
  network_policy?: string;
  backend?: BackendName;
  allow_host_compat?: boolean;
  env?: Record<string, string>;
  seed_path?: string;
  signal?: AbortSignal;
  /** Receives the command's output as it is produced (the result still holds it, capped). */
  on_output?: OutputListener;
  /** The command's stdin (default: none). Docker one-shots do not take one: EOF at once. */
  stdin?: AsyncIterable<Uint8Array> | Readable;
  /** Progress of long steps (an environment build). */
  on_progress?: (p: import("../env/builder.js").BuildProgress) => void;
}

/**
 * One-shot: create, run one command, capture, destroy (always). A backend with a
 * one-shot fast path runs the command as the sandbox's only process; otherwise (or with
 * a seed) it is a throwaway workspace.
 */
export async function runOnce(
  engine: Engine,
  command: string,
  options: RunOptions = {},
  /** `detachCleanup`: the caller exits after the answer (the CLI; see OneShotSpec). */
  how: { detachCleanup?: boolean } = {},
) {
  const started = performance.now();
  if (command.trim() === "") throw new PyroError("invalid_argument", "the command is empty");
  const maxOutputBytes = checkMaxOutputBytes(options.max_output_bytes ?? DEFAULTS.max_output_bytes);
  checkLimits(options);
  const backend = await engine.chooseBackend(options.backend, options.allow_host_compat === true);
  // A policy other than off needs the network helper: the throwaway-workspace path.
  const policy = parseNetworkPolicy(options.network_policy);
  checkNetworkSupport(backend, policy, []);
  const environment = options.environment ?? "debian:12";
  const timeoutSeconds = options.timeout_seconds ?? DEFAULTS.timeout_seconds;
  if (backend.runOnce && !options.seed_path && policy === "off") {
    const disk = await resolveDisk(options.disk_mib, backend);
    const env = await engine.environments.pull(environment, {
      ...(options.signal ? { signal: options.signal } : {}),
      ...(options.on_progress ? { onProgress: options.on_progress } : {}),
    });
    // A signal aborted before the run is not one the backend's listener will hear.
    if (options.signal?.aborted) throw new PyroError("cancelled", "the run was cancelled before it started");
    const scratchDir = join(engine.paths.home, "oneshot");
    // What runs of a killed owner left behind (their commands died with it), swept beside this run.
    const sweep = sweepLeftovers(scratchDir);
    const r = await backend
      .runOnce({
        rootfs: env.rootfs,
        scratchDir,
        runtimeCacheDir: join(engine.paths.home, "runtime"),
        command,
        // The image's own variables (its config's Env) first, as a workspace gets them.
        env: { ...env.image_env, ...(options.env ?? {}) },
        limits: {
          vcpus: options.vcpus ?? DEFAULTS.vcpus,
          memory_mib: options.memory_mib ?? DEFAULTS.memory_mib,
          pids_max: DEFAULTS.pids_max,
          ...(disk.disk_mib !== undefined ? { disk_mib: disk.disk_mib } : {}),
        },
        timeoutMs: timeoutSeconds * 1000,
        maxOutputBytes,
        ...(options.signal ? { signal: options.signal } : {}),
        ...(options.on_output ? { onOutput: options.on_output } : {}),
        ...(options.stdin ? { stdin: options.stdin } : {}),
        // With the pool on, the backend may run it in a launch prepared after the last run.
        ...(engine.pool.enabled ? { keep: engine.launches } : {}),
        ...(how.detachCleanup ? { detachCleanup: true } : {}),
      })
      .finally(() => sweep);
    return {
      environment,
      backend: backend.name,
      ...r,
      execution_mode: backend.executionMode,
      total_ms: Math.round(performance.now() - started),
    };
  }
  return runInThrowawayWorkspace(engine, command, options, {
    environment,
    backend: backend.name,
    timeoutSeconds,
    maxOutputBytes,
    started,
  });
}

/** Sweeps `scratchDir` of one-shot leftovers (linux/oneshot-sweep.ts); never throws. */
async function sweepLeftovers(scratchDir: string): Promise<void> {
  // The namespace backends' one-shots need root (overlays, cgroups): nothing to sweep otherwise.
  if (process.getuid?.() !== 0) return;
  try {
    await sweepOneShots(scratchDir, await hostCgroups());
  } catch {
    // Nothing swept now; the next run tries again.
  }
}

/**
 * The one-shot path for backends without a one-shot fast path, or with a seed: a
 * workspace made for the command and deleted after it (whatever happened).
 */
async function runInThrowawayWorkspace(
  engine: Engine,
  command: string,
  options: RunOptions,
  run: {
    environment: string;
    backend: BackendName;
    timeoutSeconds: number;
    maxOutputBytes: number;
    started: number;
  },
) {
  const { environment, timeoutSeconds, maxOutputBytes, started } = run;
  const createOpts: CreateOptions = {
    environment,
    backend: run.backend,
    ...(options.vcpus ? { vcpus: options.vcpus } : {}),
    ...(options.memory_mib ? { memory_mib: options.memory_mib } : {}),
    ...(options.disk_mib !== undefined ? { disk_mib: options.disk_mib } : {}),
    ...(options.env ? { env: options.env } : {}),
    ...(options.seed_path ? { seed_path: options.seed_path } : {}),
    ...(options.network_policy ? { network_policy: options.network_policy } : {}),
    ...(options.signal ? { signal: options.signal } : {}),
    ...(options.on_progress ? { on_progress: options.on_progress } : {}),
    allow_host_compat: options.allow_host_compat === true,
    ttl_seconds: 3600,
  };
  // Imported here: the fast path above (a `pyro run`) never loads the workspace exec.
  const { execInWorkspace } = await import("./exec.js");
  const ws = await engine.workspaces.create(createOpts);
  try {
    const r = await execInWorkspace(engine.workspaces, ws.workspace_id, command, {
      timeout_seconds: timeoutSeconds,
      max_output_bytes: maxOutputBytes,
      ...(options.signal ? { signal: options.signal } : {}),
      ...(options.on_output ? { on_output: options.on_output } : {}),
      ...(options.stdin ? { stdin: options.stdin } : {}),
    });
    return {
      environment: ws.environment,
      backend: ws.backend,
      exit_code: r.exit_code,
      stdout: r.stdout,
      stderr: r.stderr,
      stdout_bytes: r.stdout_bytes,
      stderr_bytes: r.stderr_bytes,
      duration_ms: r.duration_ms,
      timed_out: r.timed_out,
      truncated: r.truncated,
      execution_mode: r.execution_mode,
      total_ms: Math.round(performance.now() - started),
    };
  } finally {
    await engine.workspaces.delete(ws.workspace_id);
  }
}
