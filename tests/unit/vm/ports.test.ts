import { existsSync } from "node:fs";
import { mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import { createServer, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { procStartTime } from "../../../src/backends/common.js";
import { portSocket } from "../../../src/backends/qemu/machine.js";
import { connectPort } from "../../../src/backends/qemu/ports.js";
import { SERIAL_PORTS } from "../../../src/backends/vm/types.js";
import { PyroError } from "../../../src/errors.js";
import { eventually } from "../agent/helpers.js";

/** QEMU's per-port chardev sockets, faked: each greets a client with its port number. */
async function fakePorts(socketDir: string) {
  const servers: Server[] = [];
  const sockets: Socket[] = [];
  for (let i = 0; i < SERIAL_PORTS; i++) {
    const server = createServer((s) => {
      sockets.push(s);
      s.on("error", () => {});
      s.write(`p${i}\n`);
    });
    await new Promise<void>((r) => server.listen(portSocket(socketDir, i), r));
    servers.push(server);
  }
  return {
    /** Server-side ends of the connections, in arrival order. */
    sockets,
    close: async () => {
      for (const s of sockets) s.destroy();
      await Promise.all(servers.map((srv) => new Promise<void>((r) => srv.close(() => r()))));
    },
  };
}

/** Which port a connection reached (the fake's greeting). */
function portOf(sock: Socket): Promise<number> {
  return new Promise((resolve, reject) => {
    let got = "";
    const timer = setTimeout(() => reject(new Error(`no greeting, got ${JSON.stringify(got)}`)), 2000);
    const onData = (c: Buffer) => {
      got += c.toString();
      const m = /^p(\d+)\n/.exec(got);
      if (m) {
        clearTimeout(timer);
        sock.off("data", onData);
        resolve(Number(m[1]));
      }
    };
    sock.on("data", onData);
  });
}

const lockOf = (dir: string, i: number) => `${portSocket(dir, i)}.lock`;

let dir = "";
let liveHolder = "";
const cleanups: (() => unknown)[] = [];
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "pyro-ports-"));
  // A lock held by a live process: this one, with its real start time.
  liveHolder = `${process.pid} ${await procStartTime(process.pid)} someoneelse`;
});
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
  // Closed connections release their locks asynchronously (writing .cool files): retry.
  await rm(dir, { recursive: true, force: true, maxRetries: 10, retryDelay: 50 });
});

async function withPorts() {
  const fake = await fakePorts(dir);
  cleanups.push(fake.close);
  return fake;
}

async function connect(timeoutMs = 3000): Promise<{ sock: Socket; port: number }> {
  const sock = await connectPort(dir, timeoutMs);
  cleanups.push(() => sock.destroy());
  return { sock, port: await portOf(sock) };
}

async function lockAllBut(...free: number[]): Promise<void> {
  for (let i = 0; i < SERIAL_PORTS; i++) if (!free.includes(i)) await writeFile(lockOf(dir, i), liveHolder);
}

describe("connectPort", () => {
  it("gives concurrent connections different ports, each locked by this process", async () => {
    await withPorts();
    const [a, b] = await Promise.all([connect(), connect()]);
    expect(a.port).not.toBe(b.port);
    expect(new Set([a.port, b.port])).toEqual(new Set([0, 1]));
    const start = await procStartTime(process.pid);
    const la = await readFile(lockOf(dir, a.port), "utf8");
    const lb = await readFile(lockOf(dir, b.port), "utf8");
    expect(la).toMatch(new RegExp(`^${process.pid} ${start} [0-9a-f]{12}$`));
    expect(lb).toMatch(new RegExp(`^${process.pid} ${start} [0-9a-f]{12}$`));
    expect(la).not.toBe(lb);
  });

  it("removes the lock when the connection closes, from either side", async () => {
    const fake = await withPorts();
    const a = await connect();
    expect(existsSync(lockOf(dir, a.port))).toBe(true);
    a.sock.destroy();
    expect(await eventually(() => !existsSync(lockOf(dir, a.port)))).toBe(true);
    expect(existsSync(`${lockOf(dir, a.port)}.cool`)).toBe(true);

    const b = await connect();
    expect(existsSync(lockOf(dir, b.port))).toBe(true);
    fake.sockets.at(-1)!.destroy(); // QEMU's side hangs up
    expect(await eventually(() => !existsSync(lockOf(dir, b.port)))).toBe(true);
  });

  it("does not reuse a released port during its cool-down while another is free", async () => {
    await withPorts();
    const a = await connect();
    expect(a.port).toBe(0);
    a.sock.destroy();
    expect(await eventually(() => !existsSync(lockOf(dir, 0)))).toBe(true);
    const b = await connect();
    expect(b.port).toBe(1);
    b.sock.destroy();
    expect(await eventually(() => !existsSync(lockOf(dir, 1)))).toBe(true);
    // Once cooled, port 0 is the first choice again.
    await new Promise((r) => setTimeout(r, 1100));
    const c = await connect();
    expect(c.port).toBe(0);
  });

  it("waits for a released port to cool down when no other is free", async () => {
    await withPorts();
    await lockAllBut(3);
    const a = await connect();
    expect(a.port).toBe(3);
    a.sock.destroy();
    expect(await eventually(() => !existsSync(lockOf(dir, 3)))).toBe(true);
    const started = Date.now();
    const b = await connect();
    expect(b.port).toBe(3);
    expect(Date.now() - started).toBeGreaterThanOrEqual(800);
  });

  it("takes over a lock whose holder died, only after the cool-down", async () => {
    await withPorts();
    await lockAllBut(0);
    const dead = "999999 123 x"; // pid_max is far below 999999 here, or the start time differs
    await writeFile(lockOf(dir, 0), dead);
    const started = Date.now();
    const a = await connect();
    const waited = Date.now() - started;
    expect(a.port).toBe(0);
    expect(waited).toBeGreaterThanOrEqual(950);
    const lock = await readFile(lockOf(dir, 0), "utf8");
    expect(lock).not.toBe(dead);
    expect(lock.startsWith(`${process.pid} `)).toBe(true);
    // The live holders' locks were left alone.
    for (let i = 1; i < SERIAL_PORTS; i++) expect(await readFile(lockOf(dir, i), "utf8")).toBe(liveHolder);
  });

  it("times out when every port is held by a live process", async () => {
    await withPorts();
    await lockAllBut();
    const started = Date.now();
    const err = (await connectPort(dir, 300).catch((e: unknown) => e)) as PyroError;
    expect(err).toBeInstanceOf(PyroError);
    expect(err.code).toBe("timeout");
    expect(err.message).toContain(`all ${SERIAL_PORTS}`);
    expect(Date.now() - started).toBeGreaterThanOrEqual(300);
    for (let i = 0; i < SERIAL_PORTS; i++) expect(await readFile(lockOf(dir, i), "utf8")).toBe(liveHolder);
  });

  it("treats a lock still being written (empty) as held", async () => {
    await withPorts();
    await lockAllBut(5);
    await writeFile(lockOf(dir, 5), "");
    await expect(connectPort(dir, 200)).rejects.toMatchObject({ code: "timeout" });
    expect(await readFile(lockOf(dir, 5), "utf8")).toBe("");
    expect(existsSync(`${lockOf(dir, 5)}.cool`)).toBe(false);
  });

  it("leaves a lock alone on close once someone else holds it", async () => {
    await withPorts();
    const a = await connect();
    await writeFile(lockOf(dir, a.port), liveHolder);
    a.sock.destroy();
    await new Promise((r) => setTimeout(r, 100));
    expect(await readFile(lockOf(dir, a.port), "utf8")).toBe(liveHolder);
  });

  it("fails and frees the port when nothing listens on it", async () => {
    const err = (await connectPort(dir, 2000).catch((e: unknown) => e)) as PyroError;
    expect(err).toBeInstanceOf(PyroError);
    expect(err.code).toBe("backend_unavailable");
    expect(existsSync(lockOf(dir, 0))).toBe(false);
    // Released like any port: it cools down.
    expect((await stat(`${lockOf(dir, 0)}.cool`)).isFile()).toBe(true);
  });
});
