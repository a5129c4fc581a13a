import { mkdtemp, rm } from "node:fs/promises";
import { createServer, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { QmpClient } from "../../../src/backends/qemu/qmp.js";
import { PyroError } from "../../../src/errors.js";

type Reply = Record<string, unknown> | "close" | "silent";

const GREETING = { QMP: { version: { qemu: { major: 7, minor: 2, micro: 0 } }, capabilities: ["oob"] } };
const EVENT = { event: "RESUME", timestamp: { seconds: 1, microseconds: 2 } };

/**
 * QEMU's QMP socket, faked: sends the greeting, then answers each command line with what
 * `answer` returns (an event is sent first when asked). Records the commands it got.
 */
async function fakeQmp(path: string, answer: (cmd: { execute: string; arguments?: unknown }) => Reply[]) {
  const commands: { execute: string; arguments?: unknown }[] = [];
  const sockets: Socket[] = [];
  const server: Server = createServer((sock) => {
    sockets.push(sock);
    sock.on("error", () => {});
    sock.write(`${JSON.stringify(GREETING)}\n`);
    let buf = "";
    sock.on("data", (chunk) => {
      buf += chunk.toString("utf8");
      for (let nl = buf.indexOf("\n"); nl >= 0; nl = buf.indexOf("\n")) {
        const cmd = JSON.parse(buf.slice(0, nl)) as { execute: string; arguments?: unknown };
        buf = buf.slice(nl + 1);
        commands.push(cmd);
        for (const r of answer(cmd)) {
          if (r === "close") sock.destroy();
          else if (r !== "silent") sock.write(`${JSON.stringify(r)}\n`);
        }
      }
    });
  });
  await new Promise<void>((r) => server.listen(path, r));
  return {
    commands,
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}

/** The usual answers; `extra` decides for the commands it knows. */
function answers(extra: Record<string, () => Reply[]> = {}) {
  return (cmd: { execute: string }): Reply[] => {
    const f = extra[cmd.execute];
    if (f) return f();
    if (cmd.execute === "qmp_capabilities") return [{ return: {} }];
    return [{ return: {} }];
  };
}

let dir = "";
let sock = "";
const cleanups: (() => unknown)[] = [];
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "pyro-qmp-"));
  sock = join(dir, "qmp");
});
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
  await rm(dir, { recursive: true, force: true });
});

async function connected(answer: ReturnType<typeof answers>) {
  const server = await fakeQmp(sock, answer);
  cleanups.push(server.close);
  const client = await QmpClient.connect(sock, 2000);
  cleanups.push(() => client.close());
  return { server, client };
}

describe("QmpClient", () => {
  it("reads the greeting and negotiates capabilities before anything else", async () => {
    const { server, client } = await connected(answers());
    expect(server.commands).toEqual([{ execute: "qmp_capabilities" }]);
    expect(await client.execute("stop")).toEqual({});
    expect(await client.execute("migrate", { uri: "exec:cat > /x" })).toEqual({});
    expect(server.commands.slice(1)).toEqual([
      { execute: "stop" },
      { execute: "migrate", arguments: { uri: "exec:cat > /x" } },
    ]);
  });

  it("skips events that arrive before a reply", async () => {
    const { client } = await connected(
      answers({
        "query-status": () => [EVENT, { event: "STOP" }, { return: { status: "paused", running: false } }],
        cont: () => [EVENT, { return: {} }, { event: "RESUME" }],
      }),
    );
    expect(await client.status()).toBe("paused");
    expect(await client.execute("cont")).toEqual({});
    // The trailing event after cont's reply is not taken for the next reply.
    expect(await client.execute("query-name")).toEqual({});
  });

  it("rejects with QEMU's error description", async () => {
    const { client } = await connected(
      answers({ "human-monitor-command": () => [{ error: { class: "GenericError", desc: "boom" } }] }),
    );
    const err = (await client.execute("human-monitor-command").catch((e: unknown) => e)) as PyroError;
    expect(err).toBeInstanceOf(PyroError);
    expect(err.message).toContain("boom");
    expect(err.message).toContain("human-monitor-command");
    // The session goes on.
    expect(await client.execute("stop")).toEqual({});
  });

  it("falls back to the error class when there is no description", async () => {
    const { client } = await connected(answers({ quit: () => [{ error: { class: "CommandNotFound" } }] }));
    await expect(client.execute("quit")).rejects.toThrow(/CommandNotFound/);
  });

  it("reports the run state, 'unknown' when QEMU gives none", async () => {
    let status: string | undefined = "running";
    const { client } = await connected(answers({ "query-status": () => [{ return: { status } }] }));
    expect(await client.status()).toBe("running");
    status = "inmigrate";
    expect(await client.status()).toBe("inmigrate");
    status = undefined;
    expect(await client.status()).toBe("unknown");
  });

  it("waits for a migration through active to completed", async () => {
    const states = ["active", "active", "completed"];
    const { server, client } = await connected(
      answers({ "query-migrate": () => [{ return: { status: states.shift() ?? "completed" } }] }),
    );
    await client.waitMigration(5000);
    expect(server.commands.filter((c) => c.execute === "query-migrate")).toHaveLength(3);
  });

  it("fails a migration that failed, with QEMU's reason", async () => {
    const states: Record<string, unknown>[] = [
      { status: "setup" },
      { status: "failed", "error-desc": "disk full" },
    ];
    const { client } = await connected(answers({ "query-migrate": () => [{ return: states.shift() }] }));
    const err = (await client.waitMigration(5000).catch((e: unknown) => e)) as PyroError;
    expect(err).toBeInstanceOf(PyroError);
    expect(err.message).toContain("disk full");
  });

  it("fails a cancelled migration", async () => {
    const { client } = await connected(
      answers({ "query-migrate": () => [{ return: { status: "cancelled" } }] }),
    );
    await expect(client.waitMigration(5000)).rejects.toThrow(/cancelled/);
  });

  it("times out a migration that never ends", async () => {
    const { client } = await connected(
      answers({ "query-migrate": () => [{ return: { status: "active" } }] }),
    );
    const err = (await client.waitMigration(150).catch((e: unknown) => e)) as PyroError;
    expect(err).toBeInstanceOf(PyroError);
    expect(err.code).toBe("timeout");
  });

  it("rejects, not hangs, when QEMU closes the socket during a command", async () => {
    const { client } = await connected(answers({ quit: () => ["close"] }));
    const started = Date.now();
    const err = (await client.execute("quit", undefined, 10_000).catch((e: unknown) => e)) as PyroError;
    expect(err).toBeInstanceOf(PyroError);
    expect(err.message).toMatch(/closed/);
    expect(Date.now() - started).toBeLessThan(2000);
    // And every later command fails at once.
    await expect(client.execute("stop", undefined, 10_000)).rejects.toThrow(/closed/);
  });

  it("times out a command QEMU never answers", async () => {
    const { client } = await connected(answers({ stop: () => ["silent"] }));
    const err = (await client.execute("stop", undefined, 100).catch((e: unknown) => e)) as PyroError;
    expect(err.code).toBe("timeout");
  });

  it("retries until the socket appears", async () => {
    const answer = answers();
    let server: Awaited<ReturnType<typeof fakeQmp>> | undefined;
    const late = new Promise<void>((resolve) =>
      setTimeout(async () => {
        server = await fakeQmp(sock, answer);
        resolve();
      }, 100),
    );
    cleanups.push(async () => {
      await late;
      await server?.close();
    });
    const started = Date.now();
    const client = await QmpClient.connect(sock, 3000);
    cleanups.push(() => client.close());
    expect(Date.now() - started).toBeGreaterThanOrEqual(90);
    expect(server?.commands).toEqual([{ execute: "qmp_capabilities" }]);
    expect(await client.execute("stop")).toEqual({});
  });

  it("gives up when the socket never appears", async () => {
    const started = Date.now();
    const err = (await QmpClient.connect(join(dir, "absent"), 200).catch((e: unknown) => e)) as PyroError;
    expect(err).toBeInstanceOf(PyroError);
    expect(err.code).toBe("backend_unavailable");
    expect(err.message).toMatch(/ENOENT/);
    expect(Date.now() - started).toBeGreaterThanOrEqual(190);
    expect(Date.now() - started).toBeLessThan(2000);
  });
});
