/** Test fixtures for the agent: an in-memory duplex pair, temp roots, a connected client. */
import { mkdtemp, realpath, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { Duplex } from "node:stream";
import { AgentClient } from "../../../src/agent/client.js";
import type { CloseReason } from "../../../src/agent/connection.js";
import { BUILTIN_OPS, type OpHandlers } from "../../../src/agent/guest/ops/index.js";
import { Workspace } from "../../../src/agent/guest/paths.js";
import { serveConnection } from "../../../src/agent/server.js";

/** Two connected in-memory byte streams: what one writes, the other reads. Destroying one ends the other. */
export function duplexPair(): [Duplex, Duplex] {
  let a: Duplex | undefined;
  let b: Duplex | undefined;
  const make = (peer: () => Duplex | undefined) =>
    new Duplex({
      read() {},
      write(chunk: Buffer, _encoding, callback) {
        const p = peer();
        if (p && !p.destroyed && !p.readableEnded) p.push(chunk);
        callback();
      },
      final(callback) {
        const p = peer();
        if (p && !p.destroyed) p.push(null);
        callback();
      },
      destroy(err, callback) {
        const p = peer();
        if (p && !p.destroyed && !p.readableEnded) p.push(null);
        callback(err);
      },
    });
  a = make(() => b);
  b = make(() => a);
  return [a, b];
}

/** A fresh temp directory (real path), removed by the returned cleanup. */
export async function tempDir(
  prefix = "pyro-agent-test-",
): Promise<{ dir: string; cleanup: () => Promise<void> }> {
  const dir = await realpath(await mkdtemp(path.join(os.tmpdir(), prefix)));
  return { dir, cleanup: () => rm(dir, { recursive: true, force: true }) };
}

export interface AgentFixture {
  client: AgentClient;
  root: string;
  /** Scratch dir outside root (e.g. for baselines). */
  outside: string;
  workspace: Workspace;
  served: Promise<CloseReason>;
  cleanup(): Promise<void>;
}

/** A real agent session in-process over an in-memory pair, rooted in a temp dir. */
export async function startAgent(handlers: Partial<OpHandlers> = {}): Promise<AgentFixture> {
  const base = await tempDir();
  const root = path.join(base.dir, "root");
  const outside = path.join(base.dir, "outside");
  const { mkdir } = await import("node:fs/promises");
  await mkdir(root);
  await mkdir(outside);
  const workspace = await Workspace.open(root);
  const [hostEnd, agentEnd] = duplexPair();
  const served = serveConnection(agentEnd, {
    workspace,
    handlers: { ...BUILTIN_OPS, ...handlers },
    tmpDir: outside,
  });
  const client = await AgentClient.connect(hostEnd, { timeoutMs: 5000 });
  return {
    client,
    root,
    outside,
    workspace,
    served,
    async cleanup() {
      client.close();
      await served;
      await base.cleanup();
    },
  };
}

/** Polls `check` until it returns true or `ms` elapse. */
export async function eventually(check: () => boolean | Promise<boolean>, ms = 3000): Promise<boolean> {
  const until = Date.now() + ms;
  while (Date.now() < until) {
    if (await check()) return true;
    await new Promise((r) => setTimeout(r, 25));
  }
  return check();
}

/** Whether a pid is a live (non-zombie) process. */
export async function alive(pid: number): Promise<boolean> {
  const { readFile } = await import("node:fs/promises");
  const stat = await readFile(`/proc/${pid}/stat`, "utf8").catch(() => null);
  if (!stat) return false;
  const state = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0];
  return state !== "Z" && state !== "X";
}
