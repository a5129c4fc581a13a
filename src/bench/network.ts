import { mkdtemp, rm } from "node:fs/promises";
import http from "node:http";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createEgressProxy, type EgressProxy } from "../net/proxy.js";
import { WARM_GETS, workspaceGets } from "./network-workspace.js";
import { type BenchRow, median, medianMs, round, row } from "./stats.js";

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
    const ws = await workspaceGets({
      dir,
      name: NAME,
      port: webPort,
      bodyBytes: BODY_BYTES,
      testHosts: TEST_HOSTS,
      quick: o.quick,
      floorGet: () => directGet(webPort),
      log: o.log,
    });
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
          `${mbs(ms)}; timed inside the sandbox, node via HTTP_PROXY, after ${WARM_GETS} GETs warmed the path and the client (they took ${ws.cold.map((t) => Math.round(t)).join(", ")} ms); floor alternated with it`,
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

const directGet = (port: number) => readBody(http.get({ host: "127.0.0.1", port, path: "/", agent: false }));

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
