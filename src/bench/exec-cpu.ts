/**
 * The warm exec's CPU beside its wall time (issue 18). On the shared 2-core bench machine
 * the wall-time row follows other sessions' load (0.54-0.79× its floor within one hour),
 * which adds the time a process waits for a CPU; CPU time leaves that out, and says where
 * the time goes: the host process (SDK, core, agent client) and the sandbox (the agent and
 * the commands it reaped), against the CPU of the floor (the bench process spawning a bare
 * bwrap, and bwrap with its /bin/true). Shown, not judged: the goal is on the wall time.
 */
import { readFile } from "node:fs/promises";
import { statFields } from "../backends/common.js";
import { sandboxPids } from "./idle-memory.js";
import { type BenchRow, row } from "./stats.js";

/** Calls per sample: /proc counts CPU in 10 ms clock ticks, an exec spends a few ms. */
const CHUNK = 20;
/** Milliseconds per clock tick (USER_HZ, 100 on every Linux architecture pyro runs on). */
const TICK_MS = 10;

/** CPU of a /proc/PID/stat text in clock ticks: its own, plus its reaped children's with `children`. */
export function cpuTicks(stat: string, children: boolean): number {
  const f = statFields(stat);
  const own = Number(f[11]) + Number(f[12]);
  return children ? own + Number(f[13]) + Number(f[14]) : own;
}

/** Ticks of `pids` with their reaped children (a process gone since reads as 0). */
async function sandboxTicks(pids: readonly number[]): Promise<number> {
  const texts = await Promise.all(pids.map((p) => readFile(`/proc/${p}/stat`, "utf8").catch(() => null)));
  return texts.reduce((sum, t) => sum + (t === null ? 0 : cpuTicks(t, true)), 0);
}

/** CPU ms of this process alone. */
function selfMs(): number {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
}

/** CPU ms of this process's reaped children. */
async function childrenMs(): Promise<number> {
  const f = statFields(await readFile("/proc/self/stat", "utf8"));
  return (Number(f[13]) + Number(f[14])) * TICK_MS;
}

/**
 * Rows of CPU per warm exec of workspace `id` (`exec` one call), alternating chunks of
 * calls with chunks of the floor (`floorRun`), `chunks` samples each.
 */
export async function execCpuRows(
  id: string,
  exec: () => Promise<unknown>,
  floorRun: () => Promise<unknown>,
  chunks: number,
): Promise<BenchRow[]> {
  const pids = await sandboxPids(id);
  const floor: number[] = [];
  const host: number[] = [];
  const sandbox: number[] = [];
  for (let c = 0; c < chunks; c++) {
    const s0 = selfMs();
    const c0 = await childrenMs();
    for (let i = 0; i < CHUNK; i++) await floorRun();
    floor.push((selfMs() - s0 + (await childrenMs()) - c0) / CHUNK);
    const h0 = selfMs();
    const b0 = await sandboxTicks(pids);
    for (let i = 0; i < CHUNK; i++) await exec();
    host.push((selfMs() - h0) / CHUNK);
    sandbox.push((((await sandboxTicks(pids)) - b0) * TICK_MS) / CHUNK);
  }
  const total = host.map((h, i) => h + sandbox[i]!);
  const floorName = "CPU of bwrap /bin/true";
  const note = `chunks of ${CHUNK} calls; sandbox: ${pids.length} processes of its cgroup with their reaped children`;
  return [
    row("bwrap: warm exec true, CPU (host + sandbox)", total, floorName, floor, {}, note),
    row("bwrap: warm exec true, CPU of the host process", host, floorName, floor, {}),
    row("bwrap: warm exec true, CPU of the sandbox (agent, command)", sandbox, floorName, floor, {}),
  ];
}
