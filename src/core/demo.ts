import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { BackendName } from "../backends/backend.js";
import { atomicWriteFile } from "../util/fs.js";
import type { Engine } from "./engine.js";
import { execInWorkspace } from "./exec.js";
import { applyPatch, diffWorkspace } from "./files.js";
import { runOnce } from "./oneshot.js";
import { resetWorkspace } from "./snapshots.js";

// `pyro demo` and `pyro prepare`: the evaluator commands beside `pyro run` (oneshot.ts),
// in a module of their own so that a one-shot run does not load the workspace loop.

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
