import { createHash, randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { listen, spliceTo } from "../../../src/agent/pipe.js";

const sha = (b: Buffer) => createHash("sha256").update(b).digest("hex");
const cleanup: (() => void)[] = [];
afterEach(() => {
  for (const f of cleanup.splice(0)) f();
});

/** A unix socket server running `serve` per connection, and a TCP relay to it through spliceTo. */
async function relayTo(serve: (s: net.Socket) => void): Promise<number> {
  const dir = mkdtempSync(join(tmpdir(), "pyro-pipe-"));
  const path = join(dir, "up.sock");
  const upstream = net.createServer(serve);
  await listen(upstream, { path });
  const relay = net.createServer((client) => void spliceTo(client, { path }));
  await listen(relay, { host: "127.0.0.1", port: 0 });
  cleanup.push(() => {
    relay.close();
    upstream.close();
    rmSync(dir, { recursive: true, force: true });
  });
  return (relay.address() as net.AddressInfo).port;
}

/** Reads a socket to its end, pausing now and then so that the relay's writes back up. */
function readSlowly(s: net.Socket): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let n = 0;
    s.on("data", (c: Buffer) => {
      chunks.push(c);
      if (++n % 8 === 0) {
        s.pause();
        setTimeout(() => s.resume(), 2);
      }
    });
    s.on("end", () => resolve(Buffer.concat(chunks)));
    s.on("error", reject);
  });
}

describe("spliceTo", () => {
  it("relays a download byte for byte to a client that reads slowly (the reused buffer is not overwritten)", async () => {
    const body = randomBytes(8 * 1024 * 1024);
    const port = await relayTo((s) => s.end(body));
    const got = await readSlowly(net.connect(port, "127.0.0.1"));
    expect(got.length).toBe(body.length);
    expect(sha(got)).toBe(sha(body));
  });

  it("relays an upload, then the answer and the upstream's end", async () => {
    const upload = randomBytes(1024 * 1024);
    const port = await relayTo((s) => {
      const chunks: Buffer[] = [];
      let n = 0;
      s.on("data", (c: Buffer) => {
        chunks.push(c);
        n += c.length;
        if (n === upload.length) s.end(sha(Buffer.concat(chunks)));
      });
    });
    const c = net.connect(port, "127.0.0.1");
    c.write(upload);
    expect((await readSlowly(c)).toString()).toBe(sha(upload));
  });

  it("closes the client when the upstream cannot be reached", async () => {
    const relay = net.createServer((client) => void spliceTo(client, { path: "/nonexistent/pyro.sock" }));
    await listen(relay, { host: "127.0.0.1", port: 0 });
    cleanup.push(() => relay.close());
    const c = net.connect((relay.address() as net.AddressInfo).port, "127.0.0.1");
    c.on("error", () => {});
    await new Promise((r) => c.once("close", r));
    expect(c.destroyed).toBe(true);
  });
});
