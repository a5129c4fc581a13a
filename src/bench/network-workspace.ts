import { join } from "node:path";
import { PassThrough } from "node:stream";
import { execInWorkspace } from "../core/exec.js";
import { Pyro } from "../sdk/pyro.js";
import { sampleMs } from "./stats.js";

/**
 * The in-workspace proxy row's samples (bench/network.ts): a 10 MB GET made by node inside
 * an `allowlist:NAME` bwrap workspace through its egress proxy (node, the agent's relay,
 * the helper's proxy, the server), against the same GET made directly on the host.
 *
 * - GETs through a new workspace's path run slow until V8 has compiled the helper's
 *   proxy and the agent's relay, and a new node process its HTTP client (the first GETs
 *   took 100-420 ms, then 40-60 ms on a quiet machine, at a 28 ms floor): the row times
 *   the path after WARM_GETS GETs, whose times it reports beside, from one node process
 *   that lives through the whole row, as warm as the bench's own client is for the floor.
 * - Batches of GETs inside alternate with batches of direct GETs (the floor), so that
 *   both see the same load: the floor was a median taken before the workspace was made.
 */
export const WARM_GETS = 5;

export interface WorkspaceGets {
  value: number[];
  floor: number[];
  /** The warming GETs, first to last. */
  cold: number[];
}

export async function workspaceGets(o: {
  dir: string;
  name: string;
  port: number;
  bodyBytes: number;
  testHosts: Record<string, string>;
  quick: boolean;
  floorGet: () => Promise<void>;
  log: (s: string) => void;
}): Promise<WorkspaceGets | { skipped: string }> {
  // The environment cache comes from the configuration (PYRO_ENV_CACHE), like any client's.
  const pyro = new Pyro({ home: join(o.dir, "home"), networkTestHosts: o.testHosts });
  try {
    try {
      await pyro.engine.chooseBackend("bwrap", false);
    } catch (err) {
      return { skipped: (err as Error).message };
    }
    o.log(`bench: proxy: creating an allowlist:${o.name} bwrap workspace`);
    const w = await pyro.createWorkspace({ backend: "bwrap", networkPolicy: `allowlist:${o.name}` });
    const input = new PassThrough();
    const lines = new Lines();
    const run = execInWorkspace(pyro.engine.workspaces, w.workspace_id, getScript(o), {
      stdin: input,
      timeout_seconds: 300,
      on_output: (stream, chunk) => (stream === "stdout" ? lines.push(chunk) : undefined),
    });
    const failed = run.then((r) => {
      throw new Error(`the workspace's GETs ended early: exit ${r.exit_code}: ${r.stderr}${r.stdout}`);
    });
    failed.catch(() => {});
    // `n` GETs in the workspace's node process; their times.
    const inside = async (n: number): Promise<number[]> => {
      input.write(`${n}\n`);
      return JSON.parse(await Promise.race([lines.next(), failed])) as number[];
    };
    try {
      const cold = await inside(WARM_GETS);
      const [rounds, batch] = o.quick ? [3, 3] : [5, 4];
      const value: number[] = [];
      const floor: number[] = [];
      for (let i = 0; i < rounds; i++) {
        floor.push(...(await sampleMs(batch, o.floorGet, 0)));
        value.push(...(await inside(batch)));
      }
      return { value, floor, cold };
    } finally {
      input.end();
      await run.catch(() => {});
      await pyro.deleteWorkspace(w.workspace_id);
    }
  } finally {
    await pyro.close();
  }
}

/** Lines of a byte stream, one promise per line, in order. */
class Lines {
  private text = "";
  private readonly ready: string[] = [];
  private readonly waiting: ((line: string) => void)[] = [];

  push(chunk: Buffer): void {
    this.text += chunk.toString("utf8");
    for (let nl = this.text.indexOf("\n"); nl >= 0; nl = this.text.indexOf("\n")) {
      const line = this.text.slice(0, nl);
      this.text = this.text.slice(nl + 1);
      const w = this.waiting.shift();
      if (w) w(line);
      else this.ready.push(line);
    }
  }

  next(): Promise<string> {
    const line = this.ready.shift();
    return line !== undefined ? Promise.resolve(line) : new Promise((r) => this.waiting.push(r));
  }
}

/**
 * One node process in the workspace: for each line `N` on its stdin, N GETs through
 * HTTP_PROXY, then their times as one JSON line; it ends with its stdin.
 */
function getScript(o: { name: string; port: number; bodyBytes: number }): string {
  const script = `
const http = require("node:http");
const readline = require("node:readline");
const p = new URL(process.env.HTTP_PROXY);
const get = () => new Promise((ok, fail) => {
  const t = performance.now();
  http.get({ host: p.hostname, port: p.port, path: "http://${o.name}:${o.port}/", headers: { host: "${o.name}:${o.port}" }, agent: false }, (res) => {
    let n = 0;
    res.on("data", (c) => (n += c.length));
    res.on("end", () => (n === ${o.bodyBytes} ? ok(performance.now() - t) : fail(new Error("short body " + n + " " + res.statusCode))));
    res.on("error", fail);
  }).on("error", fail);
});
(async () => {
  for await (const line of readline.createInterface({ input: process.stdin })) {
    const times = [];
    for (let i = 0; i < Number(line); i++) times.push(await get());
    console.log(JSON.stringify(times));
  }
})().catch((e) => { console.error(String(e)); process.exit(1); });
`;
  return `/run/pyro/runtime/bin/node -e '${script}'`;
}
