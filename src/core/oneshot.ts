import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Readable } from "node:stream";
import type { BackendName } from "../backends/backend.js";
import { PyroError } from "../errors.js";
import { atomicWriteFile } from "../util/fs.js";
import type { Engine } from "./engine.js";
import { execInWorkspace } from "./exec.js";
import { applyPatch, diffWorkspace } from "./files.js";
import { checkNetworkSupport, parseNetworkPolicy } from "./network.js";
import { checkMaxOutputBytes, type OutputListener } from "./output.js";
import { resetWorkspace } from "./snapshots.js";
import { type CreateOptions, checkDiskMib, checkLimits, DEFAULTS } from "./workspace-spec.js";

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
export async function runOnce(engine: Engine, command: string, options: RunOptions = {}) {
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
    const env = await engine.environments.pull(environment, {
      ...(options.signal ? { signal: options.signal } : {}),
      ...(options.on_progress ? { onProgress: options.on_progress } : {}),
    });
    const r = await backend.runOnce({
      rootfs: env.rootfs,
      scratchDir: join(engine.paths.home, "oneshot"),
      runtimeCacheDir: join(engine.paths.home, "runtime"),
      command,
      // The image's own variables (its config's Env) first, as a workspace gets them.
      env: { ...env.image_env, ...(options.env ?? {}) },
      limits: {
        vcpus: options.vcpus ?? DEFAULTS.vcpus,
        memory_mib: options.memory_mib ?? DEFAULTS.memory_mib,
        pids_max: DEFAULTS.pids_max,
        disk_mib: checkDiskMib(options.disk_mib, backend.name),
      },
      timeoutMs: timeoutSeconds * 1000,
      maxOutputBytes,
      ...(options.signal ? { signal: options.signal } : {}),
      ...(options.on_output ? { onOutput: options.on_output } : {}),
      ...(options.stdin ? { stdin: options.stdin } : {}),
    });
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

/**
 * A tiny project with a failing test: the demo reproduces, fixes, diffs and resets it.
 * Tests run with `python3 -B`: the fix has the same size as the bug, and within the same
 * second Python would trust its stale bytecode (it checks mtime seconds and size).
 */
const DEMO_PROJECT: Record<string, string> = {
  "calc.py": "def add(a, b):\n    return a - b\n",
  "test_calc.py":
    "from calc import add\n\nassert add(2, 3) == 5, 'add(2, 3) should be 5'\nprint('tests passed')\n",
};
const DEMO_FIX = [
  "--- a/calc.py",
  "+++ b/calc.py",
  "@@ -1,2 +1,2 @@",
  " def add(a, b):",
  "-    return a - b",
  "+    return a + b",
  "",
].join("\n");

/**
 * Proves the product end to end on the default environment: a one-shot run, then the
 * daily workspace loop on a tiny project (reproduce a failure, patch, rerun, diff,
 * reset, delete).
 */
export async function demo(
  engine: Engine,
  options: { backend?: BackendName; allow_host_compat?: boolean } = {},
) {
  const steps: { step: string; ok: boolean; duration_ms: number; detail: string }[] = [];
  const step = async <T>(
    name: string,
    fn: () => Promise<T>,
    check: (r: T) => [boolean, string],
  ): Promise<T> => {
    const t = performance.now();
    const r = await fn();
    const [ok, detail] = check(r);
    steps.push({ step: name, ok, duration_ms: Math.round(performance.now() - t), detail });
    return r;
  };
  const choice = {
    ...(options.backend ? { backend: options.backend } : {}),
    allow_host_compat: options.allow_host_compat === true,
  };
  await step(
    "environment",
    () => engine.environments.pull("debian:12"),
    (e) => [true, `debian:12 ${e.built ? "built" : "cached"}`],
  );
  const run = await step(
    "run",
    () => runOnce(engine, "git --version && python3 --version && cat /etc/debian_version", choice),
    (r) => [r.exit_code === 0, `${r.backend}: ${r.stdout.trim().split("\n").join("; ")}`],
  );
  const seed = await mkdtemp(join(tmpdir(), "pyro-demo-"));
  try {
    for (const [f, text] of Object.entries(DEMO_PROJECT)) await writeFile(join(seed, f), text);
    const ws = await step(
      "create",
      () => engine.workspaces.create({ ...choice, seed_path: seed, ttl_seconds: 600 }),
      (w) => [w.state === "running", w.workspace_id],
    );
    try {
      await demoLoop(step, engine.workspaces, ws.workspace_id);
    } finally {
      await step(
        "delete",
        () => engine.workspaces.delete(ws.workspace_id),
        (r) => [r.deleted, r.workspace_id],
      );
    }
  } finally {
    await rm(seed, { recursive: true, force: true });
  }
  return { ok: steps.every((s) => s.ok), backend: run.backend, execution_mode: run.execution_mode, steps };
}

type Step = <T>(name: string, fn: () => Promise<T>, check: (r: T) => [boolean, string]) => Promise<T>;

/** The demo's loop on its workspace: reproduce, patch, rerun, diff, reset, verify. */
async function demoLoop(step: Step, W: Engine["workspaces"], id: string): Promise<void> {
  await step(
    "reproduce",
    () => execInWorkspace(W, id, "python3 -B test_calc.py"),
    (r) => [r.exit_code !== 0, `fails as expected (exit ${r.exit_code})`],
  );
  await step(
    "patch",
    () => applyPatch(W, id, DEMO_FIX),
    (r) => [r.changed, r.files.map((f) => `${f.status} ${f.path}`).join(", ")],
  );
  await step(
    "rerun",
    () => execInWorkspace(W, id, "python3 -B test_calc.py"),
    (r) => [r.exit_code === 0, r.stdout.trim()],
  );
  await step(
    "diff",
    () => diffWorkspace(W, id),
    (d) => [d.summary.modified === 1, `${d.summary.total} changed file(s)`],
  );
  await step(
    "reset",
    () => resetWorkspace(W, id),
    (r) => [r.reset_count === 1, `back to ${r.workspace_reset.snapshot_name}`],
  );
  await step(
    "verify",
    () => execInWorkspace(W, id, "python3 -B test_calc.py"),
    (r) => [r.exit_code !== 0, "the fix is gone after reset"],
  );
}

/**
 * Makes an environment warm: cached, then the daily loop proved once (create, exec,
 * reset, delete). Records a manifest; a second prepare with nothing changed returns at once.
 */
export async function prepare(
  engine: Engine,
  environment: string,
  options: { backend?: BackendName; allow_host_compat?: boolean; force?: boolean } = {},
) {
  const started = performance.now();
  const info = await engine.environments.info(environment);
  const backend = await engine.chooseBackend(options.backend, options.allow_host_compat === true);
  const dir = join(engine.paths.home, "prepared");
  const manifestPath = join(dir, `${environment.replace(/[^A-Za-z0-9._-]/g, "_")}.json`);
  const expect = { environment, recipe_key: info.recipe_key, backend: backend.name, pyro_version: "0.1.0" };
  if (!options.force && info.status === "cached") {
    try {
      const m = JSON.parse(await readFile(manifestPath, "utf8"));
      if (
        m.environment === expect.environment &&
        m.recipe_key === expect.recipe_key &&
        m.backend === expect.backend &&
        m.pyro_version === expect.pyro_version
      ) {
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
  const ws = await time("create_ms", () =>
    engine.workspaces.create({
      environment,
      backend: backend.name,
      allow_host_compat: options.allow_host_compat === true,
      ttl_seconds: 600,
    }),
  );
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
