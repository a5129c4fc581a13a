import { readdir, readFile } from "node:fs/promises";
import { statFields } from "../backends/common.js";
import { cpuTicks } from "./exec-cpu.js";

/**
 * Waiting for a process and everything it started to go quiet, so that a row times the
 * steady state of a server rather than its start-up. `pyro mcp serve` fills its pool of
 * started sandboxes (core/pool.ts) and probes the backends in the background for a few
 * seconds after it starts; timed in that window, a 10 MB workspace_exec shared the two
 * cores with a spare's agent booting and read 1.5-2.6x its floor, against 0.8-1.1x with
 * PYRO_POOL=0 (issue 18).
 */

/**
 * CPU time (user + system) of `pid` and all its live descendants with their reaped
 * children, in clock ticks; Linux only.
 */
export async function treeCpuTicks(pid: number): Promise<number> {
  const children = new Map<number, number[]>();
  const ticks = new Map<number, number>();
  for (const name of await readdir("/proc").catch(() => [] as string[])) {
    if (!/^[0-9]+$/.test(name)) continue;
    const stat = await readFile(`/proc/${name}/stat`, "utf8").catch(() => null);
    if (!stat) continue;
    const ppid = Number(statFields(stat)[1]);
    const p = Number(name);
    // With the reaped children's time: a child that lived within one window counts, and a
    // live child's time moves to its parent's when it is reaped (the sum does not drop).
    ticks.set(p, cpuTicks(stat, true));
    children.set(ppid, [...(children.get(ppid) ?? []), p]);
  }
  let total = 0;
  const todo = [pid];
  for (let p = todo.pop(); p !== undefined; p = todo.pop()) {
    total += ticks.get(p) ?? 0;
    todo.push(...(children.get(p) ?? []));
  }
  return total;
}

/**
 * Resolves once `pid`'s process tree used at most `maxTicks` clock ticks (10 ms each on
 * Linux) in each of two consecutive `windowMs` windows, or after `timeoutMs`; returns how
 * long it waited and whether it settled.
 */
export async function waitQuiet(
  pid: number,
  o: { windowMs?: number; maxTicks?: number; timeoutMs?: number } = {},
): Promise<{ ms: number; settled: boolean }> {
  const windowMs = o.windowMs ?? 300;
  const maxTicks = o.maxTicks ?? 2;
  const timeoutMs = o.timeoutMs ?? 30_000;
  const started = performance.now();
  let quiet = 0;
  let before = await treeCpuTicks(pid);
  while (performance.now() - started < timeoutMs) {
    await new Promise((r) => setTimeout(r, windowMs));
    const now = await treeCpuTicks(pid);
    quiet = now - before <= maxTicks ? quiet + 1 : 0;
    before = now;
    if (quiet >= 2) return { ms: performance.now() - started, settled: true };
  }
  return { ms: performance.now() - started, settled: false };
}
