import { mkdir } from "node:fs/promises";
import net from "node:net";
import path from "node:path";
import type { Duplex } from "node:stream";
import { afterEach, describe, expect, it } from "vitest";
import { BUILTIN_OPS } from "../../../src/agent/guest/ops/index.js";
import { Workspace } from "../../../src/agent/guest/paths.js";
import { serveConnection } from "../../../src/agent/server.js";
import { setupSocket } from "../../../src/backends/qemu/machine.js";
import { askSetupPort, guestReady, setupRequest } from "../../../src/backends/qemu/setup-port.js";
import type { PyroError } from "../../../src/errors.js";
import { duplexPair, tempDir } from "../agent/helpers.js";

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/**
 * A stand-in for QEMU's socket of the setup port: records each request line, answers with `answer(line)` (null: never answers; "" hangs up).
 */
async function fakePort(answer: (line: string) => string | null) {
  const t = await tempDir("pyro-setup-port-");
  cleanups.push(t.cleanup);
  const lines: { line: string }[] = [];
  const server = net.createServer((c) => {
    let buf = "";
    c.setEncoding("utf8");
    c.on("data", (d: string) => {
      buf += d;
      const nl = buf.indexOf("\n");
      if (nl < 0) return;
      const line = buf.slice(0, nl);
      lines.push({ line });
      const reply = answer(line);
      if (reply === "") c.destroy();
      else if (reply !== null) {
        // In two pieces: the reader must join them.
        c.write(reply.slice(0, 3));
        setTimeout(() => c.write(reply.slice(3)), 20);
      }
    });
    c.on("error", () => {});
  });
  await new Promise<void>((r) => server.listen(setupSocket(t.dir), r));
  cleanups.push(() => new Promise<void>((r) => server.close(() => r())));
  return { sockets: t.dir, lines };
}

const errorOf = (p: Promise<unknown>) =>
  p.then(
    () => null as unknown as PyroError,
    (e: PyroError) => e,
  );

describe("setupRequest", () => {
  it("is the helper's line: hostname, whole milliseconds, entropy in hex, nomount when asked", () => {
    const entropy = Buffer.alloc(64, 0xab);
    expect(setupRequest({ hostname: "pyro-abc", timeMs: 1_795_000_000_123.7, entropy, mount: true })).toBe(
      `pyro-abc 1795000000123 ${"ab".repeat(64)}\n`,
    );
    expect(setupRequest({ hostname: "pyro", timeMs: 5, entropy, mount: false })).toMatch(/ nomount\n$/);
  });

  it("refuses a hostname that could split the line, and too little entropy", () => {
    const entropy = Buffer.alloc(64);
    for (const hostname of ["a b", "a\nb", "", "x".repeat(64), "a;b"])
      expect(() => setupRequest({ hostname, timeMs: 1, entropy, mount: true })).toThrow(/hostname/);
    expect(() => setupRequest({ hostname: "h", timeMs: 1, entropy: Buffer.alloc(16), mount: true })).toThrow(
      /entropy/,
    );
  });
});

describe("askSetupPort", () => {
  const line = "pyro-x 1 00\n";

  it("sends the line and resolves with the reply's mounted flag", async () => {
    const port = await fakePort(() => "ok mounted=1\n");
    expect(await askSetupPort(port.sockets, line, { timeoutMs: 5000 })).toBe(true);
    expect(port.lines.map((l) => l.line)).toEqual(["pyro-x 1 00"]);
    const again = await fakePort(() => "ok mounted=0\n");
    expect(await askSetupPort(again.sockets, line, { timeoutMs: 5000 })).toBe(false);
  });

  it("the helper's error fails the start, its words shown printable and bounded", async () => {
    const port = await fakePort(() => `error mount overlay on /workspace: boom\x1b[2J${"z".repeat(900)}\n`);
    const err = await errorOf(askSetupPort(port.sockets, line, { timeoutMs: 5000 }));
    expect(err.code).toBe("backend_unavailable");
    expect(err.message).toContain("the VM's setup failed: mount overlay on /workspace: boom?[2J");
    expect(err.message.length).toBeLessThan(400);
  });

  it("no reply: a timeout; a hang-up or an endless line: backend_unavailable", async () => {
    const silent = await fakePort(() => null);
    const started = Date.now();
    const err = await errorOf(askSetupPort(silent.sockets, line, { timeoutMs: 300 }));
    expect(err.code).toBe("timeout");
    expect(Date.now() - started).toBeLessThan(3000);
    const gone = await fakePort(() => "");
    expect((await errorOf(askSetupPort(gone.sockets, line, { timeoutMs: 5000 }))).message).toMatch(
      /closed without a reply/,
    );
    const endless = await fakePort(() => "x".repeat(5000));
    expect((await errorOf(askSetupPort(endless.sockets, line, { timeoutMs: 5000 }))).code).toBe(
      "backend_unavailable",
    );
  });

  it("a cancelled start stops waiting", async () => {
    const silent = await fakePort(() => null);
    const controller = new AbortController();
    setTimeout(() => controller.abort(), 50);
    const err = await errorOf(
      askSetupPort(silent.sockets, line, { timeoutMs: 10_000, signal: controller.signal }),
    );
    expect(err.code).toBe("cancelled");
  });
});

describe("guestReady over the port", () => {
  /** An in-process agent, reached once `gate` settles (a guest still to answer its handshake). */
  async function gatedAgent(gate: Promise<unknown>) {
    const t = await tempDir("pyro-setup-agent-");
    cleanups.push(t.cleanup);
    await mkdir(path.join(t.dir, "root"));
    const [hostEnd, agentEnd] = duplexPair();
    const served = serveConnection(agentEnd, {
      workspace: await Workspace.open(path.join(t.dir, "root")),
      handlers: BUILTIN_OPS,
      tmpDir: t.dir,
    });
    cleanups.push(async () => {
      hostEnd.destroy();
      await served;
    });
    let connected = false;
    const connect = async (): Promise<Duplex> => {
      await gate;
      connected = true;
      return hostEnd;
    };
    return { connect, connected: () => connected };
  }

  it("sends the setup before the agent has answered, and waits for both", async () => {
    let arrived: () => void = () => {};
    const requested = new Promise<void>((r) => {
      arrived = r;
    });
    const port = await fakePort(() => {
      arrived();
      return "ok mounted=1\n";
    });
    // The agent can only be reached once the port has the request: a setup sent after the
    // handshake would never come (the test then times out).
    const agent = await gatedAgent(requested);
    const r = await guestReady(agent.connect, {
      sockets: port.sockets,
      viaPort: true,
      timeoutMs: 5000,
      hostname: "pyro-one",
    });
    expect(r.via).toBe("port");
    expect(agent.connected()).toBe(true);
    expect(port.lines).toHaveLength(1);
    const [hostname, ms, hex] = port.lines[0]!.line.split(" ");
    expect(hostname).toBe("pyro-one");
    expect(Math.abs(Number(ms) - Date.now())).toBeLessThan(5000);
    expect(hex).toMatch(/^[0-9a-f]{128}$/);
  });

  it("sequential (the bench's restore floor): the setup only after the handshake", async () => {
    const agent = await gatedAgent(new Promise((r) => setTimeout(r, 50)));
    const connectedAtRequest: boolean[] = [];
    const port = await fakePort(() => {
      connectedAtRequest.push(agent.connected());
      return "ok mounted=1\n";
    });
    await guestReady(agent.connect, {
      sockets: port.sockets,
      viaPort: true,
      sequential: true,
      timeoutMs: 5000,
      hostname: "pyro-one",
    });
    expect(connectedAtRequest).toEqual([true]);
  });

  it("the port's error fails it even though the agent answered", async () => {
    const port = await fakePort(() => "error no seed disk\n");
    const agent = await gatedAgent(Promise.resolve());
    const err = await errorOf(
      guestReady(agent.connect, { sockets: port.sockets, viaPort: true, timeoutMs: 5000, hostname: "h" }),
    );
    expect(err.message).toMatch(/no seed disk/);
  });
});
