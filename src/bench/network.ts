import { mkdtemp, rm } from "node:fs/promises";
import http from "node:http";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createEgressProxy, type EgressProxy } from "../net/proxy.js";
import { Pyro } from "../sdk/pyro.js";
import { type BenchRow, median, medianMs, round, row, sampleMs } from "./stats.js";

/**
 * Egress proxy rows, on loopback only: every server listens on 127.0.0.1 and the proxy
 * reaches them through `testHosts` (bench.test → 127.0.0.1), so nothing here dials any
 * other address. Each row against a floor measured now: the same request made directly.
 */

const BODY_BYTES = 10 * 1024 * 1024;
const NAME = "bench.test";
const TEST_HOSTS: Record<string, string> = { [NAME]: "127.0.0.1" };

export interface NetworkRowsOptions {
  quick: boolean;
  log: (s: string) => void;
  extra: Record<string, unknown>;
}

export async function networkRows(o: NetworkRowsOptions): Promise<BenchRow[]> {
  const rows: BenchRow[] = [];
  const dir = await mkdtemp(join(tmpdir(), "pyro-bench-net-"));
  const body = Buffer.alloc(BODY_BYTES, 0x61);
  const web = http.createServer((_req, res) => {
    res.writeHead(200, { "content-type": "application/octet-stream", "content-length": BODY_BYTES });
    res.end(body);
  });
  const greeter = net.createServer((s) => {
    s.on("error", () => {});
    s.end("hi\n");
  });
  const proxy: EgressProxy = createEgressProxy({
    decide: () => ({ allowed: true }),
    onBlock: () => {},
    testHosts: new Map(Object.entries(TEST_HOSTS)),
    resolve: async (host) => {
      throw new Error(`bench: the real resolver must not be used (asked for ${host})`);
    },
  });
  const sock = join(dir, "proxy.sock");
  try {
    const webPort = await listenLoopback(web);
    const greetPort = await listenLoopback(greeter);
    await new Promise<void>((r, j) => proxy.server.once("error", j).listen(sock, r));

    const getRuns = o.quick ? 5 : 15;
    await getRows(rows, o, sock, webPort, getRuns);
    await setupRows(rows, o, sock, greetPort);
    o.extra.proxy_stats = proxy.stats();

    // Row 3: the same GET from inside a bwrap workspace, through its egress proxy.
    const ws = await workspaceGet(dir, webPort, o.quick, o.log);
    if ("skipped" in ws) {
      o.log(`bench: proxy workspace row skipped: ${ws.skipped}`);
      o.extra.proxy_workspace_skipped = ws.skipped;
    } else {
      const ms = median(ws.value);
      o.extra.proxy_workspace_first_gets_ms = ws.cold.map((t) => round(t));
      rows.push(
        row(
          "proxy: HTTP GET 10 MB in a bwrap workspace (allowlist)",
          ws.value,
          FLOOR_GET,
          ws.floor,
          { min: 0.5, inverse: true },
          `${mbs(ms)}; timed inside the sandbox, node via HTTP_PROXY, after ${WARM_GETS} GETs warmed the path (they took ${ws.cold.map((t) => Math.round(t)).join(", ")} ms); floor alternated with it`,
        ),
      );
    }
  } finally {
    await proxy.close();
    web.closeAllConnections();
    web.close();
    greeter.close();
    await rm(dir, { recursive: true, force: true });
  }
  return rows;
}

const FLOOR_GET = "direct GET 127.0.0.1";
const mbs = (ms: number) => `${round(BODY_BYTES / 1024 / 1024 / (ms / 1000), 0)} MB/s`;

/** Row 1: a 10 MB GET, direct (floor) vs forwarded and tunnelled through the proxy. */
async function getRows(
  rows: BenchRow[],
  o: NetworkRowsOptions,
  sock: string,
  webPort: number,
  getRuns: number,
): Promise<void> {
  const direct = await medianMs(getRuns, () => directGet(webPort));
  const forward = await medianMs(getRuns, () =>
    readBody(
      http.get({
        socketPath: sock,
        path: `http://${NAME}:${webPort}/`,
        headers: { host: `${NAME}:${webPort}` },
        agent: false,
      }),
    ),
  );
  const tunnel = await medianMs(getRuns, async () => {
    const s = await connectTunnel(sock, `${NAME}:${webPort}`);
    await readBody(
      // No agent: with one, node would ignore createConnection and look the name up.
      http.get({ createConnection: () => s, host: NAME, port: webPort, path: "/" }),
    );
  });
  o.log(`bench: proxy GET 10 MB direct ${round(direct)} ms (${mbs(direct)})`);
  rows.push(
    row(
      "proxy: HTTP GET 10 MB (forward, unix socket)",
      forward,
      FLOOR_GET,
      direct,
      { min: 0.5, inverse: true },
      `${mbs(forward)} vs ${mbs(direct)}`,
    ),
    row(
      "proxy: HTTP GET 10 MB (CONNECT tunnel)",
      tunnel,
      FLOOR_GET,
      direct,
      { min: 0.5, inverse: true },
      `${mbs(tunnel)} vs ${mbs(direct)}`,
    ),
  );
}

/** Row 2: connection setup to the first byte of a greeting server. */
async function setupRows(
  rows: BenchRow[],
  o: NetworkRowsOptions,
  sock: string,
  greetPort: number,
): Promise<void> {
  const setupRuns = o.quick ? 20 : 100;
  const directSetup = await medianMs(setupRuns, () => firstByte(net.connect(greetPort, "127.0.0.1")), 3);
  const connectSetup = await medianMs(
    setupRuns,
    async () => (await connectTunnel(sock, `${NAME}:${greetPort}`, true)).destroy(),
    3,
  );
  const socksSetup = await medianMs(setupRuns, () => socksFirstByte(sock, NAME, greetPort), 3);
  const setupFloor = "direct TCP connect 127.0.0.1";
  rows.push(
    row("proxy: connection setup to first byte (CONNECT)", connectSetup, setupFloor, directSetup, {}),
    row("proxy: connection setup to first byte (SOCKS5, name)", socksSetup, setupFloor, directSetup, {}),
  );
}

/**
 * GETs through a fresh workspace's path run slow until V8 has compiled the helper's
 * proxy and the agent's relay (measured: the first 3-5 GETs at 100-230 ms, then 40-60
 * ms, at a 28-58 ms floor): the row times the path warmed by this many GETs, which it
 * reports beside.
 */
const WARM_GETS = 5;

/**
 * A 10 MB GET made by node inside an `allowlist:bench.test` bwrap workspace, in batches
 * alternating with batches of the direct GET (the floor), so that both see the same load;
 * the samples of both and the times of the warming GETs. Or why bwrap cannot run here
 * (the row is skipped, as main.ts skips unavailable backends).
 */
async function workspaceGet(
  dir: string,
  port: number,
  quick: boolean,
  log: (s: string) => void,
): Promise<{ value: number[]; floor: number[]; cold: number[] } | { skipped: string }> {
  // The environment cache comes from the configuration (PYRO_ENV_CACHE), like any client's.
  const pyro = new Pyro({ home: join(dir, "home"), networkTestHosts: TEST_HOSTS });
  try {
    try {
      await pyro.engine.chooseBackend("bwrap", false);
    } catch (err) {
      return { skipped: (err as Error).message };
    }
    log("bench: proxy: creating an allowlist:bench.test bwrap workspace");
    const w = await pyro.createWorkspace({ backend: "bwrap", networkPolicy: `allowlist:${NAME}` });
    try {
      const inside = async (warm: number, timed: number): Promise<number[]> => {
        const r = await pyro.execWorkspace(w.workspace_id, getScript(port, warm, timed));
        if (r.exit_code !== 0) throw new Error(`workspace GET failed: ${r.stderr}${r.stdout}`);
        return JSON.parse(r.stdout.trim().split("\n").pop()!) as number[];
      };
      const cold = await inside(0, WARM_GETS);
      const [rounds, batch] = quick ? [3, 3] : [5, 4];
      const value: number[] = [];
      const floor: number[] = [];
      for (let i = 0; i < rounds; i++) {
        floor.push(...(await sampleMs(batch, () => directGet(port), 0)));
        // One untimed GET per batch: each batch is a new node process, its client code cold.
        value.push(...(await inside(1, batch)));
      }
      return { value, floor, cold };
    } finally {
      await pyro.deleteWorkspace(w.workspace_id);
    }
  } finally {
    await pyro.close();
  }
}

const directGet = (port: number) => readBody(http.get({ host: "127.0.0.1", port, path: "/", agent: false }));

/** One node process in the workspace: `warm` GETs, then `timed` GETs whose times it prints as JSON. */
function getScript(port: number, warm: number, timed: number): string {
  const script = `
const http = require("node:http");
const p = new URL(process.env.HTTP_PROXY);
const get = () => new Promise((ok, fail) => {
  const t = performance.now();
  http.get({ host: p.hostname, port: p.port, path: "http://${NAME}:${port}/", headers: { host: "${NAME}:${port}" }, agent: false }, (res) => {
    let n = 0;
    res.on("data", (c) => (n += c.length));
    res.on("end", () => (n === ${BODY_BYTES} ? ok(performance.now() - t) : fail(new Error("short body " + n + " " + res.statusCode))));
    res.on("error", fail);
  }).on("error", fail);
});
(async () => {
  for (let i = 0; i < ${warm}; i++) await get();
  const times = [];
  for (let i = 0; i < ${timed}; i++) times.push(await get());
  console.log(JSON.stringify(times));
})().catch((e) => { console.error(String(e)); process.exit(1); });
`;
  return `/run/pyro/runtime/bin/node -e '${script}'`;
}

async function listenLoopback(server: net.Server): Promise<number> {
  await new Promise<void>((r, j) => server.once("error", j).listen(0, "127.0.0.1", r));
  return (server.address() as net.AddressInfo).port;
}

/** Reads a response to its end and checks it is the whole 10 MB body. */
function readBody(req: http.ClientRequest): Promise<void> {
  return new Promise((ok, fail) => {
    req.on("error", fail);
    req.on("response", (res) => {
      let n = 0;
      res.on("data", (c: Buffer) => (n += c.length));
      res.on("error", fail);
      res.on("end", () =>
        res.statusCode === 200 && n === BODY_BYTES
          ? ok()
          : fail(new Error(`bench: GET got ${res.statusCode}, ${n} bytes`)),
      );
    });
  });
}

/**
 * A CONNECT tunnel through the proxy's unix socket. With `waitFirstByte`, also waits
 * for the upstream's first byte (the greeting) before resolving.
 */
function connectTunnel(sock: string, target: string, waitFirstByte = false): Promise<net.Socket> {
  return new Promise((ok, fail) => {
    const req = http.request({ socketPath: sock, method: "CONNECT", path: target, agent: false });
    req.on("error", fail);
    req.on("connect", (res, s, head) => {
      if (res.statusCode !== 200) {
        s.destroy();
        return fail(new Error(`bench: CONNECT ${target} got ${res.statusCode}`));
      }
      if (!waitFirstByte || head.length > 0) return ok(s);
      s.once("data", () => ok(s));
      s.once("error", fail);
      s.once("end", () => fail(new Error("bench: tunnel closed before the first byte")));
    });
    req.end();
  });
}

/** Resolves at a socket's first byte, then destroys it. */
function firstByte(s: net.Socket): Promise<void> {
  return new Promise((ok, fail) => {
    s.once("data", () => {
      s.destroy();
      ok();
    });
    s.once("error", fail);
    s.once("end", () => fail(new Error("bench: closed before the first byte")));
  });
}

/** SOCKS5 (no auth, CONNECT by domain name) over the unix socket, to the upstream's first byte. */
function socksFirstByte(sock: string, host: string, port: number): Promise<void> {
  return new Promise((ok, fail) => {
    const s = net.connect(sock);
    let buf = Buffer.alloc(0);
    let stage = 0;
    s.on("error", fail);
    s.once("end", () => stage < 3 && fail(new Error(`bench: SOCKS closed at stage ${stage}`)));
    s.on("connect", () => s.write(Buffer.from([5, 1, 0])));
    s.on("data", (c: Buffer) => {
      buf = Buffer.concat([buf, c]);
      if (stage === 0 && buf.length >= 2) {
        if (buf[1] !== 0) return fail(new Error("bench: SOCKS method refused"));
        buf = buf.subarray(2);
        stage = 1;
        const name = Buffer.from(host);
        s.write(
          Buffer.concat([Buffer.from([5, 1, 0, 3, name.length]), name, Buffer.from([port >> 8, port & 255])]),
        );
      }
      if (stage === 1 && buf.length >= 10) {
        if (buf[1] !== 0) return fail(new Error(`bench: SOCKS reply ${buf[1]}`));
        buf = buf.subarray(10);
        stage = 2;
      }
      if (stage === 2 && buf.length > 0) {
        stage = 3;
        s.destroy();
        ok();
      }
    });
  });
}
