import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startService, stopService } from "../core/services.js";
import { Pyro } from "../sdk/pyro.js";
import { type BenchRow, median, row } from "./stats.js";

/** A server that logs the milliseconds from its start to listening, then serves. */
const SERVER = `const t = performance.now(); require("http").createServer((q, r) => r.end("ok")).listen(Number(process.argv[2]), "127.0.0.1", () => { console.log(String(performance.now() - t)); if (process.argv[3] === "once") process.exit(0); });`;

/**
 * "service start to ready (tcp probe)": `startService` with a tcp probe, from the call to
 * its answer, against the floor of the same server's own start in the same sandbox (one
 * `exec` of it that exits once listening: the command's wall time as the agent measures
 * it). Goal: the probe and the round trip add little (≤ 2×). On bwrap.
 */
export async function serviceRows(o: { quick: boolean; log: (s: string) => void }): Promise<BenchRow[]> {
  const home = await mkdtemp(join(tmpdir(), "pyro-bench-svc-"));
  const pyro = new Pyro({ home });
  try {
    try {
      await pyro.engine.chooseBackend("bwrap", false);
    } catch (err) {
      o.log(`bench: service row skipped: ${(err as Error).message}`);
      return [];
    }
    const w = await pyro.createWorkspace({ backend: "bwrap" });
    const id = w.workspace_id;
    await pyro.writeWorkspaceFile(id, "srv.js", SERVER);
    const runs = o.quick ? 5 : 15;
    const floor: number[] = [];
    const ready: number[] = [];
    for (let i = 0; i < runs; i++) {
      const port = 19000 + i;
      const r = await pyro.execWorkspace(id, `/run/pyro/runtime/bin/node srv.js ${port + 500} once`);
      floor.push(r.duration_ms);
      const t = performance.now();
      await startService(pyro.engine.workspaces, id, `s${i}`, `/run/pyro/runtime/bin/node srv.js ${port}`, {
        readiness: { type: "tcp", port },
      });
      ready.push(performance.now() - t);
      await stopService(pyro.engine.workspaces, id, `s${i}`, 1);
    }
    await pyro.deleteWorkspace(id);
    const f = median(floor);
    const v = median(ready);
    o.log(`bench: service start to ready ${v.toFixed(1)} ms, server's own start ${f.toFixed(1)} ms`);
    return [
      row("service start to ready (tcp probe), bwrap", v, "the server's own start (exec)", f, { max: 2 }),
    ];
  } finally {
    await pyro.close();
    await rm(home, { recursive: true, force: true });
  }
}
