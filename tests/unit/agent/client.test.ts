import net from "node:net";
import path from "node:path";
import type { Duplex } from "node:stream";
import { afterEach, describe, expect, it } from "vitest";
import { AgentClient, AgentError } from "../../../src/agent/client.js";
import { encodeFrame, FrameDecoder, FrameKind } from "../../../src/agent/frames.js";
import type { OpHandler } from "../../../src/agent/guest/ops/index.js";
import { BUILTIN_OPS } from "../../../src/agent/guest/ops/index.js";
import { Workspace } from "../../../src/agent/guest/paths.js";
import { PROTOCOL_VERSION } from "../../../src/agent/messages.js";
import { serveConnection } from "../../../src/agent/server.js";
import { duplexPair, startAgent, tempDir } from "./helpers.js";

/** A scripted peer: records the JSON messages it receives and lets the test reply. */
function scriptedPeer(stream: Duplex) {
  const decoder = new FrameDecoder();
  const messages: Record<string, unknown>[] = [];
  const waiters: (() => void)[] = [];
  let ended = false;
  stream.on("data", (chunk: Buffer) => {
    for (const f of decoder.push(chunk)) {
      if (f.kind === FrameKind.Message) messages.push(JSON.parse(f.payload.toString()));
    }
    for (const w of waiters.splice(0)) w();
  });
  stream.on("end", () => {
    ended = true;
    for (const w of waiters.splice(0)) w();
  });
  return {
    messages,
    get ended() {
      return ended;
    },
    send(value: unknown) {
      stream.write(encodeFrame(FrameKind.Message, 0, Buffer.from(JSON.stringify(value))));
    },
    raw(bytes: Buffer) {
      stream.write(bytes);
    },
    end() {
      stream.end();
    },
    async next(predicate: (m: Record<string, unknown>) => boolean): Promise<Record<string, unknown>> {
      for (;;) {
        const found = messages.find(predicate);
        if (found) return found;
        if (ended) throw new Error("peer stream ended");
        await new Promise<void>((r) => waiters.push(r));
      }
    },
    async untilEnded(): Promise<void> {
      while (!ended) await new Promise<void>((r) => waiters.push(r));
    },
  };
}

const agentHello = { type: "hello", version: PROTOCOL_VERSION, agent_version: "test", pid: 1, ops: ["ping"] };

async function connectToScripted() {
  const [hostEnd, agentEnd] = duplexPair();
  const peer = scriptedPeer(agentEnd);
  const connecting = AgentClient.connect(hostEnd, { timeoutMs: 2000 });
  const hello = await peer.next((m) => m.type === "hello");
  peer.send(agentHello);
  const client = await connecting;
  return { client, peer, hello };
}

async function codeOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (err) {
    expect(err).toBeInstanceOf(AgentError);
    return (err as AgentError).code;
  }
  throw new Error("expected a rejection");
}

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0)) await c();
});

describe("handshake", () => {
  it("exchanges hellos with the protocol version and learns the agent's ops", async () => {
    const fx = await startAgent();
    cleanups.push(fx.cleanup);
    expect(fx.client.agent.version).toBe(PROTOCOL_VERSION);
    expect(fx.client.agent.pid).toBe(process.pid);
    expect(fx.client.agent.ops).toEqual(expect.arrayContaining(["exec", "file_read", "tar_in", "diff"]));
    const pong = await fx.client.request("ping", {});
    expect(pong.time_ms).toBeGreaterThan(0);
  });

  it("sends the host's hello first, with version and client name", async () => {
    const { hello, client } = await connectToScripted();
    expect(hello).toEqual({ type: "hello", version: PROTOCOL_VERSION, client: "pyro-mcp" });
    client.close();
  });

  it("has the agent answer an unknown protocol version with version_mismatch and close", async () => {
    const { dir, cleanup } = await tempDir();
    cleanups.push(cleanup);
    const [hostEnd, agentEnd] = duplexPair();
    const served = serveConnection(agentEnd, { workspace: await Workspace.open(dir), handlers: BUILTIN_OPS });
    const peer = scriptedPeer(hostEnd);
    peer.send({ type: "hello", version: PROTOCOL_VERSION + 41, client: "future-host" });
    const reply = await peer.next((m) => m.type === "error");
    expect(reply.code).toBe("version_mismatch");
    expect(String(reply.message)).toContain(String(PROTOCOL_VERSION + 41));
    await peer.untilEnded();
    expect((await served).kind).toBe("local");
  });

  it("rejects an agent that speaks another version, and closes", async () => {
    const [hostEnd, agentEnd] = duplexPair();
    const peer = scriptedPeer(agentEnd);
    const connecting = AgentClient.connect(hostEnd, { timeoutMs: 2000 });
    await peer.next((m) => m.type === "hello");
    peer.send({ ...agentHello, version: PROTOCOL_VERSION + 1 });
    expect(await codeOf(connecting)).toBe("version_mismatch");
    await peer.untilEnded();
  });

  it("surfaces the agent's own version_mismatch error from the handshake", async () => {
    const [hostEnd, agentEnd] = duplexPair();
    const peer = scriptedPeer(agentEnd);
    const connecting = AgentClient.connect(hostEnd, { timeoutMs: 2000 });
    await peer.next((m) => m.type === "hello");
    peer.send({ type: "error", code: "version_mismatch", message: "nope", hint: "upgrade" });
    const err = await connecting.catch((e: AgentError) => e);
    expect(err).toMatchObject({ code: "version_mismatch", message: "nope", hint: "upgrade" });
  });

  it("times out a handshake the agent never answers", async () => {
    const [hostEnd] = duplexPair();
    const started = Date.now();
    expect(await codeOf(AgentClient.connect(hostEnd, { timeoutMs: 150 }))).toBe("timeout");
    expect(Date.now() - started).toBeLessThan(2000);
    expect(hostEnd.destroyed).toBe(true);
  });

  it("cancels a handshake through its AbortSignal", async () => {
    const [hostEnd] = duplexPair();
    const controller = new AbortController();
    const connecting = AgentClient.connect(hostEnd, { timeoutMs: 5000, signal: controller.signal });
    controller.abort();
    expect(await codeOf(connecting)).toBe("cancelled");
  });

  it("refuses a host whose first message is not a hello, and closes", async () => {
    const { dir, cleanup } = await tempDir();
    cleanups.push(cleanup);
    const [hostEnd, agentEnd] = duplexPair();
    const served = serveConnection(agentEnd, { workspace: await Workspace.open(dir), handlers: BUILTIN_OPS });
    const peer = scriptedPeer(hostEnd);
    peer.send({ type: "request", id: 1, op: "ping", args: {} });
    const reply = await peer.next((m) => m.type === "error");
    expect(reply.code).toBe("protocol_violation");
    expect((await served).kind).toBe("violation");
  });
});

describe("requests", () => {
  it("runs concurrent requests on one connection and matches responses by id", async () => {
    // Handlers that finish in the reverse order of their start.
    const slowPing: OpHandler<"ping"> = async () => {
      await new Promise((r) => setTimeout(r, 300));
      return { time_ms: 1 };
    };
    const fx = await startAgent({ ping: slowPing });
    cleanups.push(fx.cleanup);
    const order: string[] = [];
    const slow = fx.client.request("ping", {}).then((r) => {
      order.push("ping");
      return r;
    });
    const fast = fx.client.request("info", {}).then((r) => {
      order.push("info");
      return r;
    });
    const execs = Promise.all(
      [1, 2, 3].map((n) =>
        fx.client.request("exec", { command: `echo ${n}`, timeout_ms: 5000, max_output_bytes: 100 }),
      ),
    );
    const [p, i, e] = await Promise.all([slow, fast, execs]);
    expect(p.time_ms).toBe(1);
    expect(i.root).toBe(fx.root);
    expect(e.map((r) => r.stdout)).toEqual(["1\n", "2\n", "3\n"]);
    expect(order).toEqual(["info", "ping"]);
  });

  it("times out a request to a peer that hangs, and tells it to cancel", async () => {
    const { client, peer } = await connectToScripted();
    expect(await codeOf(client.request("ping", {}, { timeoutMs: 150 }))).toBe("timeout");
    const cancel = await peer.next((m) => m.type === "cancel");
    const request = await peer.next((m) => m.type === "request");
    expect(cancel.id).toBe(request.id);
    // A single slow request does not doom the connection.
    expect(client.closed).toBe(false);
    client.close();
  });

  it("stops holding the connection when a request with a slow onData ends (timed out), its promise still pending", async () => {
    const { client, peer } = await connectToScripted();
    // A consumer that never catches up: its promise never settles.
    const stuck = client.request(
      "file_read",
      { path: "f", stream: true },
      { timeoutMs: 200, onData: () => new Promise<void>(() => {}) },
    );
    const req = await peer.next((m) => m.type === "request" && m.op === "file_read");
    peer.raw(encodeFrame(FrameKind.Data, req.id as number, Buffer.from("chunk")));
    expect(await codeOf(stuck)).toBe("timeout");
    // The connection reads again: a later request on it is answered.
    const later = client.request("ping", {}, { timeoutMs: 2000 });
    const ping = await peer.next((m) => m.type === "request" && m.op === "ping");
    peer.send({ type: "response", id: ping.id, ok: true, result: { time_ms: 7 } });
    expect((await later).time_ms).toBe(7);
    client.close();
  });

  it("ignores a late response to a request it already gave up on", async () => {
    const { client, peer } = await connectToScripted();
    expect(await codeOf(client.request("ping", {}, { timeoutMs: 100 }))).toBe("timeout");
    peer.send({ type: "response", id: 1, ok: true, result: { time_ms: 5 } });
    const second = client.request("ping", {});
    const req = await peer.next((m) => m.type === "request" && m.id === 2);
    peer.send({ type: "response", id: req.id, ok: true, result: { time_ms: 6 } });
    expect((await second).time_ms).toBe(6);
    client.close();
  });

  it("fails every pending request with protocol_violation when the peer sends garbage, and closes", async () => {
    const { client, peer } = await connectToScripted();
    const a = client.request("ping", {});
    const b = client.request("info", {});
    await peer.next((m) => m.type === "request" && m.op === "info");
    peer.raw(Buffer.from("this is not a frame at all\n"));
    expect(await codeOf(a)).toBe("protocol_violation");
    expect(await codeOf(b)).toBe("protocol_violation");
    expect(client.closed).toBe(true);
    expect(await codeOf(client.request("ping", {}))).toBe("protocol_violation");
    await peer.untilEnded();
  });

  it("treats a result that fails its schema as a protocol violation", async () => {
    const { client, peer } = await connectToScripted();
    const pending = client.request("ping", {});
    const req = await peer.next((m) => m.type === "request");
    peer.send({ type: "response", id: req.id, ok: true, result: { time_ms: "soon", extra: 1 } });
    expect(await codeOf(pending)).toBe("protocol_violation");
    expect(client.closed).toBe(true);
  });

  it("treats a response to a request never sent as a protocol violation", async () => {
    const { client, peer } = await connectToScripted();
    const pending = client.request("ping", {});
    await peer.next((m) => m.type === "request");
    peer.send({ type: "response", id: 99, ok: true, result: { time_ms: 1 } });
    expect(await codeOf(pending)).toBe("protocol_violation");
  });

  it("fails pending requests with agent_disconnected when the peer closes mid-message", async () => {
    const { client, peer } = await connectToScripted();
    const pending = client.request("ping", {});
    const req = await peer.next((m) => m.type === "request");
    const frame = encodeFrame(
      FrameKind.Message,
      0,
      Buffer.from(JSON.stringify({ type: "response", id: req.id, ok: true, result: { time_ms: 1 } })),
    );
    peer.raw(frame.subarray(0, frame.length - 5));
    // End the agent's side of the stream in the middle of that frame.
    peer.end();
    const err = await pending.catch((e: AgentError) => e);
    expect(err).toBeInstanceOf(AgentError);
    expect((err as AgentError).code).toBe("agent_disconnected");
    expect((err as AgentError).message).toMatch(/middle/);
    expect(client.closed).toBe(true);
  });

  it("keeps the agent's error codes, such as path_outside_workspace", async () => {
    const fx = await startAgent();
    cleanups.push(fx.cleanup);
    const err = await fx.client.request("file_read", { path: "../etc/passwd" }).catch((e: AgentError) => e);
    expect(err).toBeInstanceOf(AgentError);
    expect((err as AgentError).code).toBe("path_outside_workspace");
    expect((err as AgentError).hint).toBeTruthy();
  });

  it("refuses bad arguments locally with invalid_argument, before sending anything", async () => {
    const { client, peer } = await connectToScripted();
    // @ts-expect-error: wrong type on purpose
    expect(await codeOf(client.request("exec", { command: 5, timeout_ms: 1, max_output_bytes: 1 }))).toBe(
      "invalid_argument",
    );
    expect(await codeOf(client.request("tar_in", { dest: "x" }))).toBe("invalid_argument");
    expect(await codeOf(client.request("tar_out", { path: "x" }))).toBe("invalid_argument");
    expect(peer.messages.filter((m) => m.type === "request")).toEqual([]);
    client.close();
  });

  it("answers a schema failure on a request with an error response for that id and stays open", async () => {
    const { dir, cleanup } = await tempDir();
    cleanups.push(cleanup);
    const [hostEnd, agentEnd] = duplexPair();
    void serveConnection(agentEnd, { workspace: await Workspace.open(dir), handlers: BUILTIN_OPS });
    const peer = scriptedPeer(hostEnd);
    peer.send({ type: "hello", version: PROTOCOL_VERSION, client: "test" });
    await peer.next((m) => m.type === "hello");
    peer.send({ type: "request", id: 1, op: "exec", args: { command: "true" } });
    peer.send({ type: "request", id: 2, op: "no_such_op", args: {} });
    peer.send({ type: "request", id: 3, op: "ping", args: {}, surprise: true });
    peer.send({ type: "request", id: 4, op: "ping", args: {} });
    const r1 = await peer.next((m) => m.id === 1);
    const r2 = await peer.next((m) => m.id === 2);
    const r3 = await peer.next((m) => m.id === 3);
    const r4 = await peer.next((m) => m.id === 4);
    expect(r1).toMatchObject({ ok: false, error: { code: "invalid_argument" } });
    expect(String((r1.error as { message: string }).message)).toMatch(/timeout_ms/);
    expect(r2).toMatchObject({ ok: false, error: { code: "invalid_argument" } });
    expect(r3).toMatchObject({ ok: false, error: { code: "invalid_argument" } });
    expect(r4).toMatchObject({ ok: true });
    // A message without a readable id is garbage: error message, then close.
    peer.send({ type: "bogus" });
    expect((await peer.next((m) => m.type === "error")).code).toBe("protocol_violation");
    await peer.untilEnded();
  });

  it("cancels a running command through the request's AbortSignal", async () => {
    const fx = await startAgent();
    cleanups.push(fx.cleanup);
    const controller = new AbortController();
    const running = fx.client.request(
      "exec",
      { command: "echo $$ > pid; sleep 100", timeout_ms: 60_000, max_output_bytes: 100 },
      { signal: controller.signal },
    );
    setTimeout(() => controller.abort(), 300);
    expect(await codeOf(running)).toBe("cancelled");
    // The agent killed the process: the workspace is free for the next command promptly.
    const { readFile } = await import("node:fs/promises");
    const pid = Number((await readFile(path.join(fx.root, "pid"), "utf8")).trim());
    const { alive, eventually } = await import("./helpers.js");
    expect(await eventually(async () => !(await alive(pid)))).toBe(true);
  });

  it("carries messages larger than one frame by fragmenting them", async () => {
    const fx = await startAgent();
    cleanups.push(fx.cleanup);
    const content = "0123456789abcdef".repeat(200_000); // 3.2 MB, > 1 MiB frame payload
    await fx.client.request("file_write", { path: "big.txt", content, encoding: "utf8" });
    const back = await fx.client.request("file_read", { path: "big.txt", max_bytes: 4_000_000 });
    expect(back.content.length).toBe(content.length);
    expect(back.content === content).toBe(true);
  });

  it("refuses locally a request larger than the message limit, leaving the connection usable", async () => {
    const fx = await startAgent();
    cleanups.push(fx.cleanup);
    const huge = "x".repeat(65 * 1024 * 1024);
    const err = await fx.client
      .request("file_write", { path: "huge", content: huge, encoding: "utf8" })
      .catch((e: AgentError) => e);
    expect((err as AgentError).code).toBe("invalid_argument");
    expect((await fx.client.request("ping", {})).time_ms).toBeGreaterThan(0);
  });

  it("fails pending requests with agent_disconnected when the client is closed", async () => {
    const { client } = await connectToScripted();
    const pending = client.request("ping", {});
    client.close();
    expect(await codeOf(pending)).toBe("agent_disconnected");
    expect(await codeOf(client.request("ping", {}))).toBe("agent_disconnected");
  });

  it("works over a real unix socket", async () => {
    const { dir, cleanup } = await tempDir();
    cleanups.push(cleanup);
    const workspace = await Workspace.open(dir);
    const socketPath = path.join(dir, "..", `${path.basename(dir)}.sock`);
    const server = net.createServer((s) => void serveConnection(s, { workspace, handlers: BUILTIN_OPS }));
    await new Promise<void>((r) => server.listen(socketPath, r));
    cleanups.push(() => new Promise<void>((r) => server.close(() => r())));
    const socket = net.connect(socketPath);
    await new Promise((r) => socket.once("connect", r));
    const client = await AgentClient.connect(socket, { timeoutMs: 2000 });
    const r = await client.request("exec", { command: "printf hi", timeout_ms: 5000, max_output_bytes: 10 });
    expect(r.stdout).toBe("hi");
    client.close();
  });
});
