import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { atomicWriteFile } from "../util/fs.js";
import { mkdir } from "node:fs/promises";
import type { BackendName } from "../backends/backend.js";
import type { Engine } from "./engine.js";
import { execInWorkspace } from "./exec.js";
import { resetWorkspace } from "./snapshots.js";
import type { CreateOptions } from "./workspaces.js";

export interface RunOptions {
  environment?: string;
  vcpus?: number;
  memory_mib?: number;
  timeout_seconds?: number;
  network_policy?: string;
  backend?: BackendName;
  allow_host_compat?: boolean;
  env?: Record<string, string>;
  seed_path?: string;
  signal?: AbortSignal;
}

/** One-shot: create a throwaway workspace, run one command, capture, destroy (always). */
export async function runOnce(engine: Engine, command: string, options: RunOptions = {}) {
  const started = performance.now();
  const createOpts: CreateOptions = {
    ...(options.environment ? { environment: options.environment } : {}),
    ...(options.vcpus ? { vcpus: options.vcpus } : {}),
    ...(options.memory_mib ? { memory_mib: options.memory_mib } : {}),
    ...(options.network_policy ? { network_policy: options.network_policy } : {}),
    ...(options.backend ? { backend: options.backend } : {}),
    ...(options.env ? { env: options.env } : {}),
    ...(options.seed_path ? { seed_path: options.seed_path } : {}),
    ...(options.signal ? { signal: options.signal } : {}),
    allow_host_compat: options.allow_host_compat === true,
    ttl_seconds: 3600,
  };
  const ws = await engine.workspaces.create(createOpts);
  try {
    const r = await execInWorkspace(engine.workspaces, ws.workspace_id, command, {
      ...(options.timeout_seconds ? { timeout_seconds: options.timeout_seconds } : {}),
      ...(options.signal ? { signal: options.signal } : {}),
    });
    return {
      environment: ws.environment,
      backend: ws.backend,
      exit_code: r.exit_code,
      stdout: r.stdout,
      stderr: r.stderr,
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

/** Proves the one-shot lifecycle end to end on the default environment. */
export async function demo(engine: Engine, options: { backend?: BackendName; allow_host_compat?: boolean } = {}) {
  const steps: { step: string; ok: boolean; duration_ms: number; detail: string }[] = [];
  const t0 = performance.now();
  const env = await engine.environments.pull("debian:12");
  steps.push({ step: "environment", ok: true, duration_ms: Math.round(performance.now() - t0), detail: `debian:12 ${env.built ? "built" : "cached"}` });
  const r = await runOnce(engine, "uname -sr && git --version && python3 --version && id -u && cat /etc/debian_version", {
    ...(options.backend ? { backend: options.backend } : {}),
    allow_host_compat: options.allow_host_compat === true,
  });
  steps.push({ step: "run", ok: r.exit_code === 0, duration_ms: r.total_ms, detail: r.stdout.trim().split("\n").join("; ") });
  return { ok: steps.every((s) => s.ok), backend: r.backend, execution_mode: r.execution_mode, steps, output: r.stdout, exit_code: r.exit_code };
}

/**
 * Makes an environment warm: cached, then the daily loop proved once (create, exec,
 * reset, delete). Records a manifest; a second prepare with nothing changed returns at once.
 */
export async function prepare(engine: Engine, environment: string, options: { backend?: BackendName; allow_host_compat?: boolean; force?: boolean } = {}) {
  const started = performance.now();
  const info = await engine.environments.info(environment);
  const backend = await engine.chooseBackend(options.backend, options.allow_host_compat === true);
  const dir = join(engine.paths.home, "prepared");
  const manifestPath = join(dir, `${environment.replace(/[^A-Za-z0-9._-]/g, "_")}.json`);
  const expect = { environment, recipe_key: info.recipe_key, backend: backend.name, pyro_version: "0.1.0" };
  if (!options.force && info.status === "cached") {
    try {
      const m = JSON.parse(await readFile(manifestPath, "utf8"));
      if (m.environment === expect.environment && m.recipe_key === expect.recipe_key && m.backend === expect.backend && m.pyro_version === expect.pyro_version) {
        return { ...m, reused: true, duration_ms: Math.round(performance.now() - started) };
      }
    } catch {
      // no manifest yet
    }
  }
  const timings: Record<string, number> = {};
  const time = async <T>(k: string, fn: () => Promise<T>): Promise<T> => {
    const t = performance.now();
    const r = await fn();
    timings[k] = Math.round(performance.now() - t);
    return r;
  };
  await time("pull_ms", () => engine.environments.pull(environment));
  const ws = await time("create_ms", () => engine.workspaces.create({ environment, backend: backend.name, allow_host_compat: options.allow_host_compat === true, ttl_seconds: 600 }));
  try {
    const r = await time("exec_ms", () => execInWorkspace(engine.workspaces, ws.workspace_id, "true"));
    if (r.exit_code !== 0) throw new Error(`the check command failed: ${r.stderr}`);
    await time("reset_ms", () => resetWorkspace(engine.workspaces, ws.workspace_id));
  } finally {
    await time("delete_ms", () => engine.workspaces.delete(ws.workspace_id));
  }
  const manifest = { ...expect, prepared_at: new Date().toISOString(), timings };
  await mkdir(dir, { recursive: true });
  await atomicWriteFile(manifestPath, `${JSON.stringify(manifest, null, 2)}\n`);
  return { ...manifest, reused: false, duration_ms: Math.round(performance.now() - started) };
}
