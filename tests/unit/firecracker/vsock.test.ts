import { mkdir, mkdtemp, open, rm } from "node:fs/promises";
import { createServer, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { connectVsock } from "../../../src/backends/firecracker/vsock.js";

type Behaviour = "ok" | "close" | "garbage" | "silent" | "long";

/**
 * Firecracker's vsock unix socket, faked: reads the CONNECT line, then behaves as told for
 * each connection in turn (the last behaviour repeats). After "ok" it sends "early" right
 * behind the OK line in the same write and answers every chunk with "pong:<chunk>".
 */
async function fakeVsock(path: string, behaviours: Behaviour[]) {
  const lines: string[] = [];
  const sockets: Socket[] = [];
  let n = 0;
  const server: Server = createServer((sock) => {
    sockets.push(sock);
    const behaviour = behaviours[Math.min(n++, behaviours.length - 1)];
    let buf = "";
    let connected = false;
    sock.on("error", () => {});
    sock.on("data", (chunk) => {
      if (connected) {
        sock.write(`pong:${chunk.toString()}`);
        return;
      }
      buf += chunk.toString("latin1");
      const nl = buf.indexOf("\n");
      if (nl < 0) return;
      lines.push(buf.slice(0, nl + 1));
      if (behaviour === "ok") {
        connected = true;
        sock.write("OK 1073741824\nearly");
      } else if (behaviour === "close") sock.destroy();
      else if (behaviour === "garbage") sock.write("garbage\n");
      else if (behaviour === "long") sock.write("x".repeat(200));
      // "silent": never answers
    });
  });
  await new Promise<void>((r) => server.listen(path, r));
  return {
    lines,
    connections: () => n,
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}

function readUntil(sock: Socket, text: string, ms = 2000): Promise<string> {
  return new Promise((resolve, reject) => {
    let got = "";
    const timer = setTimeout(() => reject(new Error(`timed out with ${JSON.stringify(got)}`)), ms);
    const onData = (c: Buffer) => {
      got += c.toString();
      if (got.includes(text)) {
        clearTimeout(timer);
        sock.off("data", onData);
        resolve(got);
      }
    };
    sock.on("data", onData);
  });
}

let dir: string;
let uds: string;
let fake: Awaited<ReturnType<typeof fakeVsock>> | null = null;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "pyro-fc-vsock-"));
  uds = join(dir, "vsock.sock");
});

afterEach(async () => {
  await fake?.close();
  fake = null;
  await rm(dir, { recursive: true, force: true });
});

describe("Firecracker vsock handshake (host side)", () => {
  it("sends CONNECT <port>, accepts OK <n>, keeps the bytes sent right behind the OK line, and carries bytes both ways", async () => {
    fake = await fakeVsock(uds, ["ok"]);
    const sock = await connectVsock(uds, 1024, { timeoutMs: 2000 });
    try {
      expect(fake.lines).toEqual(["CONNECT 1024\n"]);
      // "early" arrived in the same segment as the OK line: it must not be lost.
      expect(await readUntil(sock, "early")).toBe("early");
      sock.write("ping");
      expect(await readUntil(sock, "pong:ping")).toBe("pong:ping");
    } finally {
      sock.destroy();
    }
  });

  it("keeps early bytes for a consumer that reads with async iteration", async () => {
    fake = await fakeVsock(uds, ["ok"]);
    const sock = await connectVsock(uds, 1024, { timeoutMs: 2000 });
    try {
      for await (const chunk of sock) {
        expect((chunk as Buffer).toString()).toBe("early");
        break;
      }
    } finally {
      sock.destroy();
    }
  });

  it("retries while Firecracker closes the connection (nothing listens on the guest port yet)", async () => {
    fake = await fakeVsock(uds, ["close", "close", "close", "ok"]);
    const sock = await connectVsock(uds, 1024, { timeoutMs: 5000, retryDelayMs: 5 });
    sock.destroy();
    expect(fake.connections()).toBe(4);
    expect(fake.lines).toEqual(Array(4).fill("CONNECT 1024\n"));
  });

  it("retries until the vsock socket appears", async () => {
    setTimeout(() => {
      void fakeVsock(uds, ["ok"]).then((f) => {
        fake = f;
      });
    }, 100);
    const sock = await connectVsock(uds, 1024, { timeoutMs: 5000, retryDelayMs: 10 });
    sock.destroy();
    expect(fake?.connections()).toBe(1);
  });

  it("gives up at the deadline with a clear timeout when the guest never listens", async () => {
    fake = await fakeVsock(uds, ["close"]);
    const started = Date.now();
    await expect(connectVsock(uds, 1024, { timeoutMs: 300, retryDelayMs: 5 })).rejects.toMatchObject({
      code: "timeout",
      message: expect.stringMatching(
        /vsock port 1024 via .* did not accept a connection within 300 ms \(Firecracker closed the connection: nothing listens on guest vsock port 1024 yet\)/,
      ),
    });
    expect(Date.now() - started).toBeLessThan(2000);
    expect(fake.connections()).toBeGreaterThan(1);
  });

  it("refuses a reply that is not OK <port>, without retrying", async () => {
    fake = await fakeVsock(uds, ["garbage", "ok"]);
    await expect(connectVsock(uds, 1024, { timeoutMs: 2000 })).rejects.toMatchObject({
      code: "backend_unavailable",
      message: expect.stringContaining('unexpected handshake reply "garbage" (expected "OK <port>")'),
    });
    expect(fake.connections()).toBe(1);
  });

  it("refuses an overlong reply line", async () => {
    fake = await fakeVsock(uds, ["long"]);
    await expect(connectVsock(uds, 1024, { timeoutMs: 2000 })).rejects.toMatchObject({
      code: "backend_unavailable",
      message: expect.stringContaining("unexpected handshake reply"),
    });
  });

  it("times out a handshake that is never answered", async () => {
    fake = await fakeVsock(uds, ["silent"]);
    await expect(connectVsock(uds, 1024, { timeoutMs: 200 })).rejects.toMatchObject({
      code: "timeout",
      message: expect.stringContaining("no handshake reply within"),
    });
  });

  it("reaches a socket whose path is longer than a unix socket address holds", async () => {
    const deep = join(dir, "a".repeat(60), "b".repeat(60));
    await mkdir(deep, { recursive: true });
    const long = join(deep, "vsock.sock");
    expect(Buffer.byteLength(long)).toBeGreaterThan(107);
    // Bind it the same way (through the directory's descriptor), as Firecracker's relative path does.
    const fh = await open(deep, "r");
    try {
      fake = await fakeVsock(`/proc/self/fd/${fh.fd}/vsock.sock`, ["ok"]);
    } finally {
      await fh.close();
    }
    const sock = await connectVsock(long, 1024, { timeoutMs: 2000 });
    expect(await readUntil(sock, "early")).toBe("early");
    sock.destroy();
  });

  it("is cancelled by its AbortSignal", async () => {
    fake = await fakeVsock(uds, ["close"]);
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 50);
    await expect(
      connectVsock(uds, 1024, { timeoutMs: 5000, retryDelayMs: 5, signal: ac.signal }),
    ).rejects.toMatchObject({ code: "cancelled" });
  });
});
