import { randomBytes } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import http from "node:http";
import net from "node:net";
import { networkInterfaces, tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { classifyAddress, isOwnAddress } from "../../../src/net/addresses.js";
import { createEgressProxy, type EgressProxy, type EgressProxyOptions } from "../../../src/net/proxy.js";

/**
 * The proxy end to end, on this machine only: an HTTP server and a TCP echo server on
 * loopback, reached through `testHosts`; every refused name uses a fake resolver and the
 * tests check that nothing was dialled. No test aims at an address off this host.
 */

type Counted = { server: net.Server; port: number; connections: () => number };

async function listen(server: net.Server, host = "127.0.0.1"): Promise<Counted> {
  let n = 0;
  server.on("connection", () => n++);
  await new Promise<void>((r) => server.listen(0, host, r));
  return { server, port: (server.address() as net.AddressInfo).port, connections: () => n };
}

const echoServer = () =>
  net.createServer((s) => {
    s.on("error", () => {});
    s.pipe(s);
  });

let dir: string;
let echo: Counted;
let web: Counted;
const proxies: EgressProxy[] = [];

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "pyro-net-"));
  echo = await listen(echoServer());
  web = await listen(
    http.createServer((req, res) => {
      let body = "";
      req.on("data", (c) => (body += c));
      req.on("end", () => {
        const seen = `${req.method} ${req.url} host=${req.headers.host} pc=${req.headers["proxy-connection"] ?? "-"}`;
        res.end(`${seen} body=${body}`);
      });
    }),
  );
});

afterEach(async () => {
  await Promise.all(proxies.splice(0).map((p) => p.close()));
});

afterAll(async () => {
  echo.server.close();
  web.server.close();
  await rm(dir, { recursive: true, force: true });
});

type Blocks = { dest: { host: string; port: number }; reason: string }[];

async function startProxy(
  overrides: Partial<EgressProxyOptions> = {},
): Promise<{ path: string; blocks: Blocks; proxy: EgressProxy }> {
  const blocks: Blocks = [];
  const proxy = createEgressProxy({
    decide: (d) =>
      d.host.startsWith("denied") ? { allowed: false, reason: "not in the allowlist" } : { allowed: true },
    onBlock: (dest, reason) => blocks.push({ dest, reason }),
    testHosts: new Map([["allowed.test", "127.0.0.1"]]),
    resolve: async () => {
      throw new Error("the real resolver must not be used in tests");
    },
    connectTimeoutMs: 2000,
    ...overrides,
  });
  proxies.push(proxy);
  const path = join(dir, `p${proxies.length}-${randomBytes(3).toString("hex")}.sock`);
  await new Promise<void>((r) => proxy.server.listen(path, r));
  return { path, blocks, proxy };
}

/** A client connection that collects what it receives. */
class Client {
  readonly socket: net.Socket;
  private data = Buffer.alloc(0);
  private waiters: (() => void)[] = [];
  private ended = false;

  constructor(path: string) {
    this.socket = net.connect(path);
    this.socket.on("data", (c) => {
      this.data = Buffer.concat([this.data, c]);
      this.wake();
    });
    this.socket.on("error", () => {});
    this.socket.on("close", () => {
      this.ended = true;
      this.wake();
    });
  }

  send(bytes: Buffer | string): this {
    this.socket.write(bytes);
    return this;
  }

  /** Resolves with everything received once `done` holds (or the socket closed). */
  async until(done: (b: Buffer) => boolean, ms = 3000): Promise<Buffer> {
    const deadline = Date.now() + ms;
    while (!done(this.data) && !this.ended) {
      if (Date.now() > deadline)
        throw new Error(`timed out; got ${JSON.stringify(this.data.toString("latin1"))}`);
      await new Promise<void>((r) => {
        this.waiters.push(r);
        setTimeout(r, 50);
      });
    }
    return this.data;
  }

  closed(ms = 3000): Promise<Buffer> {
    return this.until(() => false, ms).then(() => {
      if (!this.ended) throw new Error("still open");
      return this.data;
    });
  }

  private wake(): void {
    for (const w of this.waiters.splice(0)) w();
  }
}

const has = (s: string) => (b: Buffer) => b.toString("latin1").includes(s);

function socksConnect(name: string, port: number): Buffer {
  const host = Buffer.from(name);
  const p = Buffer.alloc(2);
  p.writeUInt16BE(port);
  return Buffer.concat([Buffer.from([5, 1, 0, 3, host.length]), host, p]);
}

function httpGet(
  path: string,
  url: string,
  headers: Record<string, string> = {},
): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ socketPath: path, path: url, headers, agent: false }, (res) => {
      let body = "";
      res.on("data", (c) => (body += c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on("error", reject);
    req.end();
  });
}

describe("createEgressProxy over HTTP", () => {
  it("tunnels a CONNECT to an allowed host", async () => {
    const { path, proxy } = await startProxy();
    const c = new Client(path).send(
      `CONNECT allowed.test:${echo.port} HTTP/1.1\r\nHost: allowed.test\r\n\r\n`,
    );
    expect((await c.until(has("\r\n\r\n"))).toString()).toBe("HTTP/1.1 200 Connection Established\r\n\r\n");
    c.send("ping over the tunnel");
    expect((await c.until(has("tunnel"))).toString()).toContain("ping over the tunnel");
    c.socket.end();
    expect(proxy.stats()).toEqual({ connections: 1, blocked: 0 });
  });

  it("forwards a plain absolute-URI GET and strips proxy headers", async () => {
    const { path } = await startProxy();
    const res = await httpGet(path, `http://allowed.test:${web.port}/x?y=1`, {
      "proxy-connection": "keep-alive",
    });
    expect(res.status).toBe(200);
    expect(res.body).toBe(`GET /x?y=1 host=allowed.test:${web.port} pc=- body=`);
  });

  it("streams a request body upstream", async () => {
    const { path } = await startProxy();
    const body = await new Promise<string>((resolve, reject) => {
      const req = http.request(
        { socketPath: path, method: "POST", path: `http://allowed.test:${web.port}/up`, agent: false },
        (res) => {
          let b = "";
          res.on("data", (c) => (b += c));
          res.on("end", () => resolve(b));
        },
      );
      req.on("error", reject);
      req.write("part1-");
      setTimeout(() => req.end("part2"), 50);
    });
    expect(body).toContain("body=part1-part2");
  });

  it("answers 403 naming the target and how to approve it, and reports the block", async () => {
    const { path, blocks, proxy } = await startProxy({ workspaceId: "w1" });
    const got = (
      await new Client(path).send("CONNECT Denied.TEST.:443 HTTP/1.1\r\n\r\n").closed()
    ).toString();
    expect(got).toMatch(/^HTTP\/1\.1 403 Forbidden/);
    expect(got).toContain("denied.test:443");
    expect(got).toContain("not in the allowlist");
    expect(got).toContain("pyro workspace network approve w1 denied.test:443");
    const res = await httpGet(path, "http://denied.example/");
    expect(res.status).toBe(403);
    expect(blocks.map((b) => b.dest)).toEqual([
      { host: "denied.test", port: 443 },
      { host: "denied.example", port: 80 },
    ]);
    expect(proxy.stats().blocked).toBe(2);
  });

  it("answers 400 to a plain request without an absolute URI or Host", async () => {
    const { path } = await startProxy();
    const got = await new Client(path).send("GET /nohost HTTP/1.0\r\n\r\n").closed();
    expect(got.toString()).toMatch(/^HTTP\/1\.1 400/);
  });

  it("answers 502 for a name that does not resolve, without calling it a block", async () => {
    const { path, blocks } = await startProxy({
      resolve: async () => {
        throw Object.assign(new Error("nope"), { code: "ENOTFOUND" });
      },
    });
    const got = await new Client(path).send("CONNECT nowhere.test:443 HTTP/1.1\r\n\r\n").closed();
    expect(got.toString()).toMatch(/^HTTP\/1\.1 502/);
    expect(blocks).toEqual([]);
  });
});

describe("createEgressProxy over SOCKS5", () => {
  it("connects to an allowed domain name", async () => {
    const { path } = await startProxy();
    const c = new Client(path).send(Buffer.from([5, 1, 0]));
    expect([...(await c.until((b) => b.length >= 2))]).toEqual([5, 0]);
    c.send(socksConnect("allowed.test", echo.port));
    const replyBytes = await c.until((b) => b.length >= 12);
    expect([...replyBytes.subarray(2, 4)]).toEqual([5, 0]);
    c.send("socks ping");
    expect((await c.until(has("socks ping"))).subarray(12).toString()).toBe("socks ping");
    c.socket.end();
  });

  it("replies 0x02 to a name the policy refuses and reports the block", async () => {
    const { path, blocks } = await startProxy();
    const got = await new Client(path)
      .send(Buffer.from([5, 1, 0]))
      .send(socksConnect("denied.test", 22))
      .closed();
    expect([...got.subarray(0, 4)]).toEqual([5, 0, 5, 0x02]);
    expect(blocks[0]?.dest).toEqual({ host: "denied.test", port: 22 });
  });

  it("replies 0x07 to BIND and 0xff to a client without no-auth", async () => {
    const { path } = await startProxy();
    const bind = Buffer.from([5, 2, 0, 1, 127, 0, 0, 1, 0, 80]);
    const got = await new Client(path)
      .send(Buffer.from([5, 1, 0]))
      .send(bind)
      .closed();
    expect([...got.subarray(0, 4)]).toEqual([5, 0, 5, 0x07]);
    const noAuth = await new Client(path).send(Buffer.from([5, 1, 2])).closed();
    expect([...noAuth]).toEqual([5, 0xff]);
  });
});

describe("address checks", () => {
  it.each([
    ["127.0.0.1", "loopback"],
    ["10.0.0.1", "private"],
    ["169.254.169.254", "metadata"],
  ])("refuses a name resolving to %s before dialling anything", async (address, kind) => {
    const before = echo.connections();
    const { path, blocks } = await startProxy({ resolve: async () => [address] });
    const got = await new Client(path).send(`CONNECT sneaky.test:${echo.port} HTTP/1.1\r\n\r\n`).closed();
    expect(got.toString()).toMatch(/^HTTP\/1\.1 403/);
    expect(blocks[0]?.reason).toContain(kind);
    const socks = await new Client(path)
      .send(Buffer.from([5, 1, 0]))
      .send(socksConnect("sneaky.test", echo.port))
      .closed();
    expect(socks[3]).toBe(0x02);
    expect(echo.connections()).toBe(before);
  });

  it("refuses an IP literal on loopback and a name with any one bad address", async () => {
    const before = echo.connections();
    const { path } = await startProxy({ resolve: async () => ["8.8.8.8", "127.0.0.1"] });
    for (const target of [`127.0.0.1:${echo.port}`, `[::1]:${echo.port}`, `mixed.test:${echo.port}`]) {
      const got = await new Client(path).send(`CONNECT ${target} HTTP/1.1\r\n\r\n`).closed();
      expect(got.toString()).toMatch(/^HTTP\/1\.1 403/);
    }
    expect(echo.connections()).toBe(before);
  });

  it("with trustPrivate still refuses loopback", async () => {
    const before = echo.connections();
    const { path } = await startProxy({
      decide: () => ({ allowed: true, trustPrivate: true }),
      resolve: async () => ["127.0.0.1"],
    });
    const got = await new Client(path).send(`CONNECT lan.test:${echo.port} HTTP/1.1\r\n\r\n`).closed();
    expect(got.toString()).toMatch(/^HTTP\/1\.1 403/);
    expect(echo.connections()).toBe(before);
  });

  const privateLocal = Object.values(networkInterfaces())
    .flat()
    .find((i) => i !== undefined && classifyAddress(i.address) === "private")?.address;

  it.skipIf(!privateLocal)(
    "with trustPrivate reaches a private address (this host's own interface)",
    async () => {
      const lan = await listen(echoServer(), privateLocal);
      try {
        const decide = (d: { host: string }) =>
          d.host === "lan.test" ? { allowed: true as const, trustPrivate: true } : { allowed: true as const };
        // This machine's own address stands in for a LAN host (the only private address a
        // test may dial): the own-address refusal is switched off for it here, and proved
        // by the next test.
        const { path } = await startProxy({
          decide,
          resolve: async () => [privateLocal!],
          ownAddress: () => false,
        });
        const c = new Client(path).send(`CONNECT lan.test:${lan.port} HTTP/1.1\r\n\r\n`);
        expect((await c.until(has("\r\n\r\n"))).toString()).toMatch(/^HTTP\/1\.1 200/);
        c.socket.end();
        const untrusted = await new Client(path)
          .send(`CONNECT other.test:${lan.port} HTTP/1.1\r\n\r\n`)
          .closed();
        expect(untrusted.toString()).toMatch(/^HTTP\/1\.1 403/);
      } finally {
        lan.server.close();
      }
    },
  );
});

describe("this machine's own addresses", () => {
  it("refuses every address of this machine's interfaces, even trusted as private, and dials nothing", async () => {
    const own = Object.values(networkInterfaces())
      .flat()
      .filter((i) => i && !i.internal)
      .map((i) => i!.address.split("%")[0]!);
    const echo = await listen(echoServer(), "127.0.0.1");
    try {
      const decide = () => ({ allowed: true as const, trustPrivate: true });
      for (const ip of own) {
        const { path } = await startProxy({ decide, resolve: async () => [ip] });
        const r = await new Client(path).send(`CONNECT self.test:${echo.port} HTTP/1.1\r\n\r\n`).closed();
        expect(r.toString(), ip).toMatch(/^HTTP\/1\.1 403/);
        // Either way never reachable: as this machine's, or by its range (link-local).
        expect(r.toString()).toMatch(/an address of this machine|never reachable/);
      }
      expect(isOwnAddress("127.0.0.1")).toBe(true);
      expect(isOwnAddress("::ffff:127.0.0.1")).toBe(true);
      expect(isOwnAddress("1.1.1.1", () => ({ lo: [] }))).toBe(false);
    } finally {
      echo.server.close();
    }
  });
});

describe("garbage", () => {
  it("closes on random bytes, huge headers and a truncated SOCKS greeting, and keeps serving", async () => {
    const { path } = await startProxy();
    const junk = Buffer.concat([Buffer.from([0x16, 0x03, 0x01]), randomBytes(2000)]);
    await new Client(path).send(junk).closed();
    const huge = `GET http://allowed.test/ HTTP/1.1\r\nX-Big: ${"a".repeat(64 * 1024)}\r\n\r\n`;
    expect((await new Client(path).send(huge).closed()).toString()).toMatch(/^HTTP\/1\.1 431/);
    const truncated = new Client(path).send(Buffer.from([5, 3, 0]));
    truncated.socket.end();
    await truncated.closed();
    const badAtyp = await new Client(path).send(Buffer.from([5, 1, 0, 5, 1, 0, 9, 1, 2])).closed();
    expect([...badAtyp.subarray(2, 4)]).toEqual([5, 0x08]);
    const emptyName = await new Client(path).send(Buffer.from([5, 1, 0, 5, 1, 0, 3, 0, 0, 80])).closed();
    expect(emptyName[3]).toBe(0x01);
    const res = await httpGet(path, `http://allowed.test:${web.port}/still`);
    expect(res.body).toContain("/still");
  });
});
