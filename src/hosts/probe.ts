import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import type { HostContext, ServerEntry, StartProbe } from "./host.js";

/**
 * Proves an entry works the way a host would: launch its command over stdio, complete
 * the MCP handshake and list the tools, then shut it down. Never throws: a failure is
 * a result with the reason (the server's last stderr line when it printed one).
 */
export async function probeStart(entry: ServerEntry, ctx: HostContext): Promise<StartProbe> {
  const started = performance.now();
  const timeout = ctx.timeoutMs ?? 30_000;
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(ctx.env)) if (v !== undefined) env[k] = v;
  Object.assign(env, entry.env);
  const transport = new StdioClientTransport({
    command: entry.command,
    args: entry.args,
    env,
    cwd: ctx.cwd,
    stderr: "pipe",
  });
  let stderr = "";
  transport.stderr?.on("data", (chunk: Buffer) => {
    stderr = (stderr + chunk.toString("utf8")).slice(-4096);
  });
  const client = new Client({ name: "pyro-host-doctor", version: "0.1.0" });
  const elapsed = () => Math.round(performance.now() - started);
  try {
    const opts = { timeout, ...(ctx.signal ? { signal: ctx.signal } : {}) };
    await client.connect(transport, opts);
    const tools = await client.listTools({}, opts);
    const info = client.getServerVersion();
    return {
      starts: true,
      ...(info ? { server_name: info.name, server_version: info.version } : {}),
      tool_count: tools.tools.length,
      duration_ms: elapsed(),
    };
  } catch (err) {
    const lastLine = stderr
      .split("\n")
      .map((l) => l.trim())
      .filter(Boolean)
      .pop();
    const reason = (err as Error).message || String(err);
    return { starts: false, duration_ms: elapsed(), error: lastLine ? `${reason}: ${lastLine}` : reason };
  } finally {
    await client.close().catch(() => {});
  }
}
