import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtemp, readdir, readFile, rm, stat } from "node:fs/promises";
import { createConnection, createServer, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import {
  bridgeFileName,
  buildVsockBridge,
  prepareVsockBridge,
  VSOCK_BRIDGE_SOURCE,
} from "../../../src/backends/firecracker/bridge.js";
import { run, which } from "../../../src/util/run.js";

const cc = await which("cc");
const protocols = await readFile("/proc/net/protocols", "utf8").catch(() => "");
const hasVsock = /^AF_VSOCK\b/m.test(protocols);

describe("vsock bridge source", () => {
  it("names the cached binary by a hash of the source", () => {
    expect(bridgeFileName()).toMatch(/^pyro-vsock-bridge-[0-9a-f]{16}$/);
    expect(bridgeFileName(`${VSOCK_BRIDGE_SOURCE}\n`)).not.toBe(bridgeFileName());
  });

  it("reports why it cannot build without a compiler", async () => {
    const dir = await mkdtemp(join(tmpdir(), "pyro-fc-bridge-"));
    try {
      const reasons: string[] = [];
      const path = await buildVsockBridge(dir, {
        cc: join(dir, "no-such-cc"),
        onUnavailable: (r) => reasons.push(r),
      });
      expect(path).toBeNull();
      expect(reasons[0]).toMatch(/^cannot run .*no-such-cc/);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe.skipIf(!cc)(`vsock bridge binary${cc ? "" : " (skipped: no C compiler `cc` on this host)"}`, () => {
  let cache: string;
  let bin: string;
  const children: ChildProcess[] = [];

  beforeAll(async () => {
    cache = await mkdtemp(join(tmpdir(), "pyro-fc-bridge-"));
    const r = await prepareVsockBridge(cache);
    if (r.path === null) throw new Error(`the bridge does not build here: ${r.reason}`);
    bin = r.path;
  }, 120_000);

  afterEach(() => {
    for (const c of children.splice(0)) c.kill("SIGKILL");
  });

  afterAll(async () => {
    await rm(cache, { recursive: true, force: true });
  });

  it("compiles statically once and is reused from the cache", async () => {
    expect(bin).toBe(join(cache, bridgeFileName()));
    const before = await stat(bin);
    expect(before.mode & 0o111).not.toBe(0);
    const file = await run(["file", bin], { timeoutMs: 5000 });
    if (file.exitCode === 0) expect(file.stdout).toMatch(/statically linked|static-pie/);
    const again = await prepareVsockBridge(cache);
    expect(again.path).toBe(bin);
    expect((await stat(bin)).mtimeMs).toBe(before.mtimeMs);
    // No temp directories left behind.
    expect((await readdir(cache)).filter((f) => f.startsWith("."))).toEqual([]);
  });

  it("prints its usage and exits 2 on bad arguments", async () => {
    for (const args of [[], ["1024"], ["notaport", "/x"], ["0", "/x"], ["99999999999", "/x"], ["1024", ""]]) {
      const r = await run([bin, ...args], { timeoutMs: 5000 });
      expect(r.exitCode, args.join(" ")).toBe(2);
      expect(r.stderr).toContain("usage: pyro-vsock-bridge PORT UNIX_SOCKET_PATH");
    }
  });

  it.skipIf(!hasVsock)(
    `listens on a vsock port${hasVsock ? "" : " (skipped: this host's kernel has no AF_VSOCK)"}`,
    async () => {
      const child = spawn(bin, ["47123", "/nonexistent/agent.sock"], { stdio: ["ignore", "ignore", "pipe"] });
      children.push(child);
      let stderr = "";
      child.stderr?.on("data", (c) => {
        stderr += c.toString();
      });
      const exited = await new Promise<number | null>((resolve) => {
        child.once("exit", (code) => resolve(code));
        setTimeout(() => resolve(null), 500);
      });
      // Still running: socket(AF_VSOCK), bind and listen succeeded.
      expect(exited, stderr).toBeNull();
    },
  );

  describe("relay (unix listening mode: no vsock loopback needed)", () => {
    let dir: string;
    let agent: Server;
    let agentConns: Socket[];
    let bridge: ChildProcess;
    let listen: string;

    async function startBridge(target: string): Promise<void> {
      bridge = spawn(bin, ["--unix", listen, target], { stdio: "ignore" });
      children.push(bridge);
      for (let i = 0; i < 100; i++) {
        if (
          await stat(listen).then(
            () => true,
            () => false,
          )
        )
          return;
        await new Promise((r) => setTimeout(r, 10));
      }
      throw new Error("the bridge did not listen");
    }

    async function withDir<T>(fn: () => Promise<T>): Promise<T> {
      dir = await mkdtemp(join(tmpdir(), "pyro-fc-relay-"));
      listen = join(dir, "l.sock");
      agentConns = [];
      try {
        return await fn();
      } finally {
        await new Promise<void>((r) => (agent ? agent.close(() => r()) : r()));
        for (const s of agentConns) s.destroy();
        await rm(dir, { recursive: true, force: true });
      }
    }

    function startAgent(onConn: (s: Socket) => void): Promise<string> {
      const path = join(dir, "agent.sock");
      agent = createServer((s) => {
        agentConns.push(s);
        onConn(s);
      });
      return new Promise((r) => agent.listen(path, () => r(path)));
    }

    function dial(): Promise<Socket> {
      return new Promise((resolve, reject) => {
        const s = createConnection({ path: listen });
        s.once("connect", () => resolve(s));
        s.once("error", reject);
      });
    }

    function collect(s: Socket): Promise<Buffer> {
      return new Promise((resolve, reject) => {
        const chunks: Buffer[] = [];
        s.on("data", (c: Buffer) => chunks.push(c));
        s.once("end", () => resolve(Buffer.concat(chunks)));
        s.once("error", reject);
      });
    }

    it("copies bytes both ways and passes each side's end of stream on (half-close)", () =>
      withDir(async () => {
        let agentGot: Promise<Buffer> = Promise.resolve(Buffer.alloc(0));
        let agentSide: Socket | undefined;
        const target = await startAgent((s) => {
          agentSide = s;
          s.allowHalfOpen = true;
          agentGot = collect(s);
        });
        await startBridge(target);
        const host = await dial();
        host.allowHalfOpen = true;
        const hostGot = collect(host);
        host.end("request");
        for (let i = 0; i < 100 && !agentSide; i++) await new Promise((r) => setTimeout(r, 10));
        expect((await agentGot).toString()).toBe("request");
        // The host's half-close reached the agent; the agent can still answer.
        agentSide!.end("reply after the host's end");
        expect((await hostGot).toString()).toBe("reply after the host's end");
      }));

    it(
      "moves large streams in both directions at once without deadlocking",
      () =>
        withDir(async () => {
          const up = randomBytes(4 * 1024 * 1024);
          const down = randomBytes(4 * 1024 * 1024);
          let agentGot: Promise<Buffer> = Promise.resolve(Buffer.alloc(0));
          const target = await startAgent((s) => {
            s.allowHalfOpen = true;
            agentGot = collect(s);
            s.end(down);
          });
          await startBridge(target);
          const host = await dial();
          host.allowHalfOpen = true;
          const hostGot = collect(host);
          host.end(up);
          const [atHost, atAgent] = await Promise.all([
            hostGot,
            (async () => {
              for (let i = 0; i < 100 && agentConns.length === 0; i++)
                await new Promise((r) => setTimeout(r, 10));
              return agentGot;
            })(),
          ]);
          expect(atHost.equals(down)).toBe(true);
          expect(atAgent.equals(up)).toBe(true);
        }),
      30_000,
    );

    it("closes a connection at once while the agent is not listening (the host retries)", () =>
      withDir(async () => {
        await startBridge(join(dir, "agent.sock"));
        const host = await dial();
        // Closed either way: an orderly end, or a reset when the bridge closed before reading.
        const got = await collect(host).catch((err: NodeJS.ErrnoException) =>
          err.code === "ECONNRESET" ? Buffer.alloc(0) : Promise.reject(err),
        );
        expect(got.length).toBe(0);
      }));

    it(
      "leaves no child process and no descriptor behind after many connections",
      () =>
        withDir(async () => {
          const target = await startAgent((s) => s.pipe(s));
          await startBridge(target);
          const fdsBefore = (await readdir(`/proc/${bridge.pid}/fd`)).length;
          for (let i = 0; i < 30; i++) {
            const host = await dial();
            const got = collect(host);
            host.end(`n${i}`);
            expect((await got).toString()).toBe(`n${i}`);
          }
          let children = "";
          for (let i = 0; i < 100; i++) {
            children = await readFile(`/proc/${bridge.pid}/task/${bridge.pid}/children`, "utf8").catch(
              () => "",
            );
            if (children.trim() === "") break;
            await new Promise((r) => setTimeout(r, 20));
          }
          expect(children.trim()).toBe("");
          expect((await readdir(`/proc/${bridge.pid}/fd`)).length).toBe(fdsBefore);
        }),
      30_000,
    );
  });
});
