import type { BackendName } from "../backends/backend.js";
import type { Pyro } from "../sdk/pyro.js";
import { execCpuRows } from "./exec-cpu.js";
import { idleMemoryRows } from "./idle-memory.js";
import { type BenchRow, pairedSampleMs, row, sampleMs, type Target } from "./stats.js";

/** A bare bwrap spawn of /bin/true over `rootfs`: the floor of the bwrap rows. */
export function bareBwrap(rootfs: string): string[] {
  return [
    "bwrap",
    "--unshare-all",
    "--die-with-parent",
    "--ro-bind",
    rootfs,
    "/",
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "/bin/true",
  ];
}

/**
 * The goals issue 18 names (docs/architecture.md "Benchmarks"): per backend for create, reset, warm exec
 * and the in-process one-shot run, and for the rows of main.ts. Rows of the other modules
 * carry their own (the pull row's ≤ 1.5× is issue 15's).
 */
export const GOALS = {
  backend: {
    bwrap: { create: { maxAbs: 100 }, reset: { maxAbs: 50 }, exec: { max: 0.5 }, run: { max: 2 } },
    gvisor: { create: { max: 2 }, reset: { max: 1 } },
    docker: { create: { max: 1 }, reset: { max: 0.3 } },
  } as Partial<Record<BackendName, Partial<Record<"create" | "reset" | "exec" | "run", Target>>>>,
  reset10k: { max: 0.1 } as Target,
  sync: { min: 0.8, inverse: true } as Target,
};

/** Create, warm exec, one-shot run and reset on one backend, against its floor. */
export async function backendRows(
  pyro: Pyro,
  backend: BackendName,
  floorName: string,
  floor: number[],
  n: number,
  quick: boolean,
  extra: Record<string, unknown>,
  /** One sample of the floor: given, the warm exec row takes its own, alternating with it. */
  floorRun?: () => Promise<unknown>,
): Promise<BenchRow[]> {
  const goal = GOALS.backend[backend] ?? {};
  const rows: BenchRow[] = [];
  const createMs = await sampleMs(
    quick ? 2 : 5,
    async () => {
      const w = await pyro.createWorkspace({ backend });
      await pyro.deleteWorkspace(w.workspace_id);
    },
    0,
  );
  if (backend === "bwrap" || backend === "gvisor" || backend === "docker") {
    // Without a pool (a CLI call) the create starts a sandbox: shown, judged on the pool's row.
    rows.push(row(`${backend}: workspace create, no pool (CLI)`, createMs, floorName, floor, {}));
    rows.push(await pooledCreateRow(pyro, backend, floorName, floor, quick ? 3 : 8, goal.create ?? {}));
  } else
    rows.push(row(`${backend}: workspace create (warm env)`, createMs, floorName, floor, goal.create ?? {}));
  const ws = await pyro.createWorkspace({ backend });
  try {
    const execTrue = async () => {
      const r = await pyro.execWorkspace(ws.workspace_id, "true");
      if (r.exit_code !== 0) throw new Error("exec failed");
    };
    const exec = floorRun
      ? await pairedSampleMs(n * 2, execTrue, floorRun, 3)
      : { value: await sampleMs(n * 2, execTrue, 3), floor };
    rows.push(
      row(`${backend}: workspace exec true (warm)`, exec.value, floorName, exec.floor, goal.exec ?? {}),
    );
    // Where the warm exec's time goes, in CPU, which other sessions' load moves far less.
    if (backend === "bwrap" && floorRun)
      rows.push(...(await execCpuRows(ws.workspace_id, execTrue, floorRun, quick ? 3 : 6)));
    // The hangup of a command's leftovers (a background job, ended when the call returns).
    const leftoverMs = await sampleMs(
      n,
      async () => {
        const r = await pyro.execWorkspace(ws.workspace_id, "sleep 100 & true");
        if (r.exit_code !== 0) throw new Error("exec failed");
      },
      1,
    );
    rows.push(row(`${backend}: exec leaving a background job (hung up)`, leftoverMs, floorName, floor, {}));
    if (backend === "docker" || backend === "gvisor")
      rows.push(...(await standbyResetRows(pyro, backend, ws.workspace_id, floorName, floor, quick, goal)));
    else {
      const resetMs = await sampleMs(quick ? 2 : 5, () => pyro.resetWorkspace(ws.workspace_id), 0);
      rows.push(row(`${backend}: reset (small workspace)`, resetMs, floorName, floor, goal.reset ?? {}));
    }
  } finally {
    await pyro.deleteWorkspace(ws.workspace_id);
  }
  if (backend === "bwrap") rows.push(...(await idleMemoryRows(pyro, quick ? 20 : 50, extra)));
  const runMs = await sampleMs(quick ? 3 : 10, async () => {
    const r = await pyro.run("debian:12", "true", { backend });
    if (r.exit_code !== 0) throw new Error("run failed");
  });
  if (backend === "bwrap") {
    // Without a pool every step of the sandbox's start is on the run's path: shown, and
    // judged on the row of a run in a launch prepared by the pool.
    rows.push(row("bwrap: run debian:12 -- true, no pool (in-process SDK)", runMs, floorName, floor, {}));
    rows.push(await preparedRunRow(pyro, floorName, floor, quick ? 5 : 15, goal.run ?? {}, floorRun));
  } else
    rows.push(
      row(`${backend}: run debian:12 -- true (in-process SDK)`, runMs, floorName, floor, goal.run ?? {}),
    );
  return rows;
}

/**
 * A bwrap one-shot run with the pool on, as in `pyro mcp serve` or an SDK object given
 * `pool`: each run takes the launch prepared after the previous one (backends/bwrap/
 * prepared-run.ts); each sample after that preparation and the previous run's clean-up
 * are done (untimed), as between an agent's runs. With `floorRun` each sample has a floor
 * sample of its own just before it (a load swing hits both alike).
 */
async function preparedRunRow(
  pyro: Pyro,
  floorName: string,
  floor: number[],
  n: number,
  goal: Target,
  floorRun?: () => Promise<unknown>,
): Promise<BenchRow> {
  const { Pyro: PyroClass } = await import("../sdk/pyro.js");
  const { home, environmentsDir } = pyro.engine.paths;
  const pooled = new PyroClass({ home, environmentsDir, env: pyro.engine.env, pool: 1 });
  try {
    const runTrue = async () => {
      const r = await pooled.run("debian:12", "true", { backend: "bwrap" });
      if (r.exit_code !== 0) throw new Error("run failed");
    };
    await runTrue(); // the first run of an engine has nothing prepared: it prepares the next
    const ms: number[] = [];
    const paired: number[] = [];
    for (let i = 0; i < n; i++) {
      await pooled.engine.launches.ready();
      if (floorRun) paired.push(...(await sampleMs(1, floorRun, 0)));
      ms.push(...(await sampleMs(1, runTrue, 0)));
    }
    const name = "bwrap: run debian:12 -- true, prepared (SDK, pool on: mcp serve)";
    return row(name, ms, floorName, floorRun ? paired : floor, goal);
  } finally {
    await pooled.close();
  }
}

/**
 * Docker's and gVisor's resets (backends/docker/standby.ts, backends/gvisor/standby.ts): a
 * reset hands the workspace over to a standby its process started after the previous
 * reset, so the goal's row resets a workspace that was idle for a moment since the last
 * one (as an agent's workspace is between tasks; untimed, 1.5 s); the first reset of the
 * process restarts (no standby yet) and is left out. Back-to-back resets, which wait for
 * the standby being started, are shown beside it.
 */
async function standbyResetRows(
  pyro: Pyro,
  backend: BackendName,
  id: string,
  floorName: string,
  floor: number[],
  quick: boolean,
  goal: Partial<Record<"reset", Target>>,
): Promise<BenchRow[]> {
  await pyro.resetWorkspace(id);
  const idle: number[] = [];
  for (let i = 0; i < (quick ? 3 : 8); i++) {
    const r = await pyro.execWorkspace(id, "echo changed > f.txt; sleep 100 & true");
    if (r.exit_code !== 0) throw new Error("exec failed");
    await new Promise((ok) => setTimeout(ok, 1500));
    const t = performance.now();
    await pyro.resetWorkspace(id);
    idle.push(performance.now() - t);
  }
  const backToBack = await sampleMs(quick ? 2 : 5, () => pyro.resetWorkspace(id), 0);
  return [
    row(`${backend}: reset (small workspace, idle since the last)`, idle, floorName, floor, goal.reset ?? {}),
    row(`${backend}: reset back-to-back (waits for the standby)`, backToBack, floorName, floor, {}),
  ];
}

/**
 * A bwrap or gVisor create (unseeded, default limits: what a gVisor spare can take) that
 * takes a started sandbox from the pool, as `pyro mcp serve` does (core/pool.ts): each
 * sample after the pool has refilled, as between an agent's creates.
 */
async function pooledCreateRow(
  pyro: Pyro,
  backend: BackendName,
  floorName: string,
  floor: number[],
  n: number,
  goal: Target,
): Promise<BenchRow> {
  const { Pyro: PyroClass } = await import("../sdk/pyro.js");
  const { home, environmentsDir } = pyro.engine.paths;
  const pooled = new PyroClass({ home, environmentsDir, env: pyro.engine.env, pool: 1 });
  try {
    const env = await pooled.engine.environments.pull("debian:12");
    pooled.engine.pool.want(pooled.engine.backend(backend), env.rootfs);
    const ms: number[] = [];
    for (let i = 0; i < n; i++) {
      await pooled.engine.pool.ready();
      const t = performance.now();
      const w = await pooled.createWorkspace({ backend });
      ms.push(performance.now() - t);
      await pooled.deleteWorkspace(w.workspace_id);
    }
    return row(`${backend}: workspace create from the pool (mcp serve)`, ms, floorName, floor, goal);
  } finally {
    await pooled.close();
  }
}
