import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Pyro } from "../sdk/pyro.js";
import { type BenchRow, median, row } from "./stats.js";

/**
 * "shell write → output visible": `writeShell` of an echo, then `readShell` until its
 * output shows, against the floor of `execWorkspace("true")` (a whole command round trip
 * through the same agent). Goal ≤ 2×. On bwrap.
 */
export async function shellRows(o: { quick: boolean; log: (s: string) => void }): Promise<BenchRow[]> {
  const home = await mkdtemp(join(tmpdir(), "pyro-bench-shell-"));
  const pyro = new Pyro({ home });
  try {
    try {
      await pyro.engine.chooseBackend("bwrap", false);
    } catch (err) {
      o.log(`bench: shell row skipped: ${(err as Error).message}`);
      return [];
    }
    const w = await pyro.createWorkspace({ backend: "bwrap" });
    const id = w.workspace_id;
    const sh = await pyro.openShell(id);
    const runs = o.quick ? 10 : 40;
    const floor: number[] = [];
    const trip: number[] = [];
    // Warm both paths once.
    await pyro.execWorkspace(id, "true");
    for (let i = 0; i < runs; i++) {
      let t = performance.now();
      await pyro.execWorkspace(id, "true");
      floor.push(performance.now() - t);
      const mark = `mark-${i}-${i * 7}`;
      t = performance.now();
      await pyro.writeShell(id, sh.shell_id, `echo ${mark.replace(/-(\d+)$/, "-$((" + i + "*7))")}`);
      for (let polls = 0; ; polls++) {
        const r = await pyro.readShell(id, sh.shell_id);
        if (r.output.includes(mark)) break;
        if (polls > 10_000) throw new Error("the shell never printed its mark");
      }
      trip.push(performance.now() - t);
    }
    await pyro.deleteWorkspace(id);
    const f = median(floor);
    const v = median(trip);
    o.log(`bench: shell write to output visible ${v.toFixed(1)} ms, exec true ${f.toFixed(1)} ms`);
    return [row("shell write → output visible, bwrap", v, "exec true (same agent)", f, { max: 2 })];
  } finally {
    await pyro.close();
    await rm(home, { recursive: true, force: true });
  }
}
