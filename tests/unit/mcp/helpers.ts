import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { expect } from "vitest";
import { FakeBackend } from "../../../src/backends/fake/backend.js";
import { LocalSeed } from "../../../src/mcp/seed.js";
import { createServer, type ServerOptions } from "../../../src/mcp/server.js";
import { Pyro } from "../../../src/sdk/pyro.js";
import { FakeBuilder } from "../../helpers/fake-builder.js";

/**
 * A tiny project with a failing check: `sh check.sh` fails until calc.sh adds instead of
 * subtracting. Shell only, so it runs on the fake backend (the host's own tools).
 */
export const PROJECT: Record<string, string> = {
  "calc.sh": "add() { echo $(($1 - $2)); }\n",
  "check.sh":
    '. ./calc.sh\n[ "$(add 2 3)" = 5 ] || { echo "add 2 3 should be 5, got $(add 2 3)" >&2; exit 1; }\necho ok\n',
  "docs/readme.txt": "hello\n",
};

export const FIX = [
  "--- a/calc.sh",
  "+++ b/calc.sh",
  "@@ -1 +1 @@",
  "-add() { echo $(($1 - $2)); }",
  "+add() { echo $(($1 + $2)); }",
  "",
].join("\n");

export interface McpFixture {
  client: Client;
  pyro: Pyro;
  backend: FakeBackend;
  /** The server's base directory (relative host paths resolve here); holds `project/`. */
  base: string;
  /** The default seed directory (a copy of PROJECT). */
  project: string;
  call(
    name: string,
    args?: Record<string, unknown>,
    options?: Parameters<Client["callTool"]>[2],
  ): Promise<CallToolResult>;
  /** Calls a tool and expects success; returns its structuredContent. */
  ok(name: string, args?: Record<string, unknown>): Promise<any>;
  /** Calls a tool and expects an error result; returns the error object. */
  fails(
    name: string,
    args?: Record<string, unknown>,
  ): Promise<{ code: string; message: string; hint?: string }>;
  cleanup(): Promise<void>;
}

/**
 * An MCP server on an SDK client with the fake backend, connected to an SDK Client
 * through the in-memory transport. The default seed is `base/project`.
 */
export async function mcpFixture(
  options: Partial<ServerOptions> & { builderDelayMs?: number } = {},
): Promise<McpFixture> {
  const { builderDelayMs, ...serverOptions } = options;
  const home = await mkdtemp(join(tmpdir(), "pyro-mcp-home-"));
  const base = await mkdtemp(join(tmpdir(), "pyro-mcp-base-"));
  const project = join(base, "project");
  for (const [rel, text] of Object.entries(PROJECT)) {
    await mkdir(join(project, rel, ".."), { recursive: true });
    await writeFile(join(project, rel), text);
  }
  const backend = new FakeBackend("bwrap");
  const builder = new FakeBuilder(builderDelayMs ? { delayMs: builderDelayMs } : {});
  const pyro = new Pyro({
    home,
    environmentsDir: join(home, "envs"),
    builders: [builder],
    backends: { bwrap: backend },
    // The fake stands in for bwrap: pin it, or a real stronger backend (gvisor) would win.
    // The secrets key goes to a config directory of the fixture, not the user's.
    env: { PYRO_BACKEND: "bwrap", XDG_CONFIG_HOME: join(base, "config") },
  });
  const server = createServer(pyro, {
    baseDir: base,
    seed: new LocalSeed({ origin: "project_path", path: project }),
    ...serverOptions,
  });
  const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
  const client = new Client({ name: "pyro-test", version: "0.0.0" });
  await Promise.all([server.connect(serverSide), client.connect(clientSide)]);
  // The client validates structuredContent against the advertised outputSchema once it has listed the tools.
  await client.listTools();
  const call = (name: string, args: Record<string, unknown> = {}, opts?: Parameters<Client["callTool"]>[2]) =>
    client.callTool({ name, arguments: args }, undefined, opts) as Promise<CallToolResult>;
  return {
    client,
    pyro,
    backend,
    base,
    project,
    call,
    ok: async (name, args) => {
      const r = await call(name, args);
      if (r.isError) throw new Error(`${name} failed: ${JSON.stringify(r.structuredContent)}`);
      expect(r.structuredContent).toBeTypeOf("object");
      expect(r.content[0]).toMatchObject({ type: "text" });
      return r.structuredContent;
    },
    fails: async (name, args) => {
      const r = await call(name, args);
      expect(r.isError, `${name} should fail: ${JSON.stringify(r.structuredContent)}`).toBe(true);
      const error = (r.structuredContent as { error: { code: string; message: string; hint?: string } })
        .error;
      expect(error).toMatchObject({ code: expect.any(String), message: expect.any(String) });
      expect((r.content[0] as { text: string }).text).toContain(`[${error.code}]`);
      return error;
    },
    cleanup: async () => {
      await client.close();
      await server.close();
      await pyro.close();
      await backend.closeAll();
      await rm(home, { recursive: true, force: true });
      await rm(base, { recursive: true, force: true });
    },
  };
}
