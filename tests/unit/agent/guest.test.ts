import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { lstat, writeFile } from "node:fs/promises";
import net from "node:net";
import path from "node:path";
import { PassThrough } from "node:stream";
import { afterEach, describe, expect, it } from "vitest";
import { AgentClient } from "../../../src/agent/client.js";
import type { AgentError } from "../../../src/agent/errors.js";
import { parseGuestArgs, startGuest } from "../../../src/agent/guest/agent.js";
import { AGENT_ENTRY } from "../../../src/backends/guest.js";
import { duplexPair, eventually, tempDir } from "./helpers.js";

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function connectSocket(socketPath: string): Promise<AgentClient> {
  const socket = net.connect(socketPath);
  await new Promise((resolve, reject) => {
    socket.once("connect", resolve);
    socket.once("error", reject);
  });
  return AgentClient.connect(socket, { timeoutMs: 5000 });
}

describe("guest agent entry", () => {
  it("parses --root with exactly one of --listen and --stdio", () => {
    expect(parseGuestArgs(["--root", "/workspace", "--listen", "/run/pyro/agent.sock"])).toEqual({
      root: "/workspace",
      listen: "/run/pyro/agent.sock",
    });
    expect(parseGuestArgs(["--stdio", "--root", "/w"])).toEqual({ root: "/w", stdio: true });
    for (const bad of [
      [],
      ["--root", "/w"],
      ["--root", "/w", "--stdio", "--listen", "s"],
      ["--root"],
      ["--root", "/w", "--stdio", "--verbose"],
    ]) {
      expect(() => parseGuestArgs(bad)).toThrow(
        expect.objectContaining({ code: "invalid_argument" }) as unknown as Error,
      );
    }
  });

  it("serves several connections on a unix socket, replacing a stale socket file", async () => {
    const { dir, cleanup } = await tempDir();
    cleanups.push(cleanup);
    const socketPath = path.join(dir, "agent.sock");
    // A stale socket file: its listener was SIGKILLed, so nothing removed it.
    const script = `require("net").createServer().listen(${JSON.stringify(socketPath)}, () => process.kill(process.pid, "SIGKILL"))`;
    await new Promise((r) => spawn(process.execPath, ["-e", script]).once("exit", r));
    expect((await lstat(socketPath)).isSocket()).toBe(true);
    const guest = await startGuest({ root: dir, listen: socketPath });
    cleanups.push(() => guest.close());
    expect((await lstat(socketPath)).mode & 0o777).toBe(0o600);
    const [a, b] = await Promise.all([connectSocket(socketPath), connectSocket(socketPath)]);
    const [ra, rb] = await Promise.all([a.request("info", {}), b.request("ping", {})]);
    expect(ra.root).toBe(dir);
    expect(rb.time_ms).toBeGreaterThan(0);
    a.close();
    b.close();
  });

  it("refuses to replace a path that is not a socket", async () => {
    const { dir, cleanup } = await tempDir();
    cleanups.push(cleanup);
    const notSocket = path.join(dir, "important.txt");
    await writeFile(notSocket, "keep me");
    const err = (await startGuest({ root: dir, listen: notSocket }).catch(
      (e: AgentError) => e,
    )) as AgentError;
    expect(err.code).toBe("conflict");
    expect((await lstat(notSocket)).isFile()).toBe(true);
  });

  it("serves one session over stdio and finishes when the host closes it", async () => {
    const { dir, cleanup } = await tempDir();
    cleanups.push(cleanup);
    const [hostEnd, agentEnd] = duplexPair();
    const input = new PassThrough();
    const output = new PassThrough();
    agentEnd.pipe(input);
    output.pipe(agentEnd);
    const guest = await startGuest({ root: dir, stdio: true }, { input, output });
    const client = await AgentClient.connect(hostEnd, { timeoutMs: 5000 });
    expect(
      (await client.request("exec", { command: "echo via-stdio", timeout_ms: 5000, max_output_bytes: 100 }))
        .stdout,
    ).toBe("via-stdio\n");
    client.close();
    let finished = false;
    void guest.done.then(() => {
      finished = true;
    });
    expect(await eventually(() => finished)).toBe(true);
  });

  const built = path.resolve("dist/agent/guest/main.js");
  it.skipIf(!existsSync(built))(
    "runs as a process from dist with --listen, writing nothing to stdout (needs `npm run build`)",
    () => runsFromDist(built),
  );
  // What the backends start (AGENT_ENTRY): the same program bundled by scripts/bundle-agent.mjs.
  const bundle = path.resolve(AGENT_ENTRY);
  it.skipIf(!existsSync(bundle))(
    "runs as a process from the bundle the backends start, with --listen (needs `npm run build`)",
    () => runsFromDist(bundle),
  );

  async function runsFromDist(built: string): Promise<void> {
    const { dir, cleanup } = await tempDir();
    cleanups.push(cleanup);
    const socketPath = path.join(dir, "agent.sock");
    const child = spawn(process.execPath, [built, "--root", dir, "--listen", socketPath], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    child.stdout.on("data", (c: Buffer) => {
      stdout += c.toString();
    });
    cleanups.push(async () => {
      child.kill("SIGTERM");
      await new Promise((r) => child.once("exit", r));
    });
    expect(await eventually(() => existsSync(socketPath), 10_000)).toBe(true);
    const client = await connectSocket(socketPath);
    const info = await client.request("info", {});
    expect(info.pid).toBe(child.pid);
    client.close();
    expect(stdout).toBe("");
  }
});
