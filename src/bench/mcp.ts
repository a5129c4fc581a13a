import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import { CallToolResultSchema, ListToolsResultSchema } from "@modelcontextprotocol/sdk/types.js";
import { createServer } from "../mcp/server.js";
import { Pyro } from "../sdk/pyro.js";
import { waitQuiet } from "./settle.js";
import { type BenchRow, row } from "./stats.js";

const CLI_ENTRY = fileURLToPath(new URL("../../bin/pyro.js", import.meta.url));

/**
 * MCP as a host drives it: `pyro mcp serve` over stdio (a child process, as chat hosts
 * launch it), against the same work done in-process.
 * - tools/list of workspace-full over stdio vs the same server on an in-memory transport;
 * - a workspace_exec of `true` over stdio vs the SDK's execWorkspace in-process (one agent
 *   round trip either way: the row is what the MCP layer and the pipe add);
 * - a 10 MB output (`seq 1 1400000`) over stdio, fitted under the result bound, vs the
 *   SDK's exec of the same command with the same cap.
 * On bwrap.
 */
export async function mcpRows(o: { quick: boolean; log: (s: string) => void }): Promise<BenchRow[]> {
  const home = await mkdtemp(join(tmpdir(), "pyro-bench-mcp-"));
  const pyro = new Pyro({ home });
  let clients: Clients | undefined;
  try {
    try {
      await pyro.engine.chooseBackend("bwrap", false);
    } catch (err) {
      o.log(`bench: mcp rows skipped: ${(err as Error).message}`);
      return [];
    }
    const runs = o.quick ? 10 : 40;
    const w = await pyro.createWorkspace({ backend: "bwrap" });
    const id = w.workspace_id;
    clients = await connectClients(pyro, home);
    const { stdio, local } = clients;
    const quiet = clients.pid === undefined ? null : await waitQuiet(clients.pid);
    if (quiet)
      o.log(`bench: mcp serve ${quiet.settled ? "settled" : "still busy"} after ${Math.round(quiet.ms)} ms`);
    // Raw requests: the server and the transport, not the SDK client's schema compilation
    // (Client.listTools compiles every output schema with Ajv: ~70 ms here, on any transport).
    const exec = (command: string) =>
      stdio.request(
        {
          method: "tools/call",
          params: { name: "workspace_exec", arguments: { workspace_id: id, command } },
        },
        CallToolResultSchema,
      );
    // Warm every path once (module loads, the agent connection, schema compilation).
    await stdio.listTools();
    await local.listTools();
    await exec("true");
    await pyro.execWorkspace(id, "true");

    const rows = [
      await listRow(stdio, local, runs),
      await execRow(exec, () => pyro.execWorkspace(id, "true"), runs),
      await bigOutputRow(
        exec,
        () => pyro.execWorkspace(id, "seq 1 1400000", { maxOutputBytes: 16 * 1024 }),
        runs,
      ),
    ];
    await pyro.deleteWorkspace(id);
    for (const r of rows)
      o.log(`bench: ${r.name} ${r.value_ms.toFixed(1)} ms vs ${r.floor_ms.toFixed(1)} ms`);
    return rows;
  } finally {
    await clients?.stdio.close().catch(() => {});
    await clients?.local.close().catch(() => {});
    await pyro.close();
    await rm(home, { recursive: true, force: true });
  }
}

interface Clients {
  /** `pyro mcp serve` as a child process over stdio. */
  stdio: Client;
  /** The same server in-process, on an in-memory transport. */
  local: Client;
  /** The stdio server's process id. */
  pid: number | undefined;
}

/** Both clients connected; on a failure, whichever was made is closed. */
async function connectClients(pyro: Pyro, home: string): Promise<Clients> {
  const env = Object.fromEntries(
    Object.entries({ ...process.env, PYRO_HOME: home, PYRO_DEBUG: "" }).filter(
      (e): e is [string, string] => e[1] !== undefined,
    ),
  );
  const stdio = new Client({ name: "pyro-bench", version: "0" });
  let local: Client | undefined;
  try {
    const transport = new StdioClientTransport({
      command: process.execPath,
      args: [CLI_ENTRY, "mcp", "serve", "--profile", "workspace-full"],
      env,
      cwd: home,
      stderr: "ignore",
    });
    await stdio.connect(transport);
    const server = createServer(pyro, { profile: "workspace-full", baseDir: home });
    const [a, b] = InMemoryTransport.createLinkedPair();
    local = new Client({ name: "pyro-bench-local", version: "0" });
    await Promise.all([server.connect(b), local.connect(a)]);
    return { stdio, local, pid: transport.pid ?? undefined };
  } catch (err) {
    await stdio.close().catch(() => {});
    await local?.close().catch(() => {});
    throw err;
  }
}

async function time(f: () => Promise<unknown>): Promise<number> {
  const t = performance.now();
  await f();
  return performance.now() - t;
}

/** tools/list over stdio against the same server in-memory, alternating. */
async function listRow(stdio: Client, local: Client, runs: number): Promise<BenchRow> {
  const listOver = (c: Client) => c.request({ method: "tools/list" }, ListToolsResultSchema);
  const list: number[] = [];
  const listFloor: number[] = [];
  for (let i = 0; i < runs; i++) {
    list.push(await time(() => listOver(stdio)));
    listFloor.push(await time(() => listOver(local)));
  }
  const count = (await listOver(local)).tools.length;
  return row(
    `MCP stdio: tools/list (workspace-full, ${count} tools)`,
    list,
    "same server, in-memory transport",
    listFloor,
    { max: 10 },
  );
}

/** workspace_exec of `true` over stdio against the SDK's exec in-process, alternating. */
async function execRow(
  exec: (command: string) => Promise<unknown>,
  floor: () => Promise<unknown>,
  runs: number,
): Promise<BenchRow> {
  const trip: number[] = [];
  const tripFloor: number[] = [];
  for (let i = 0; i < runs; i++) {
    trip.push(await time(() => exec("true")));
    tripFloor.push(await time(floor));
  }
  return row(
    "MCP stdio: workspace_exec true, bwrap",
    trip,
    "SDK execWorkspace true (in-process)",
    tripFloor,
    {
      max: 2,
    },
  );
}

/** A 10 MB output over stdio (fitted under the result bound) against the SDK with the same cap. */
async function bigOutputRow(
  exec: (command: string) => Promise<unknown>,
  floor: () => Promise<unknown>,
  runs: number,
): Promise<BenchRow> {
  const big: number[] = [];
  const bigFloor: number[] = [];
  // At least 5 pairs: with 3, one slow run (a load spike) moved the median and the quartiles.
  for (let i = 0; i < Math.max(5, runs / 4); i++) {
    big.push(await time(() => exec("seq 1 1400000")));
    bigFloor.push(await time(floor));
  }
  return row(
    "MCP stdio: workspace_exec of 10 MB output (fitted)",
    big,
    "SDK execWorkspace, same command and cap",
    bigFloor,
    { max: 1.5 },
  );
}
