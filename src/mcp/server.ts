import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { toJsonSchemaCompat } from "@modelcontextprotocol/sdk/server/zod-json-schema-compat.js";
import type { RequestHandlerExtra } from "@modelcontextprotocol/sdk/shared/protocol.js";
import type {
  CallToolRequest,
  CallToolResult,
  ServerNotification,
  ServerRequest,
  Tool,
} from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";
import { PyroError, toPyroError } from "../errors.js";
import type { Pyro } from "../sdk/pyro.js";
import { type HostHooks, registerHostFeatures } from "./host.js";
import { HostPaths } from "./host-paths.js";
import { type ToolName, type ToolSet, toolSet } from "./profiles.js";
import { RequestProgress } from "./progress.js";
import { advertisedOutput } from "./schemas.js";
import { type DefaultSeed, NO_SEED } from "./seed.js";
import type { DescribeEnv, ToolContext, ToolDefinition } from "./tool.js";
import { toolDefinitions } from "./tools/index.js";

export const SERVER_NAME = "pyro-mcp";
export const SERVER_VERSION = "0.1.0";

export interface ServerOptions {
  /** A profile name (default workspace-core) or a mode name; not both. */
  profile?: string | undefined;
  mode?: string | undefined;
  /** Seed for workspace_create without seed_path (default: none, an empty workspace). */
  seed?: DefaultSeed;
  /** Lets creates and runs use the host backend (no isolation); never chosen otherwise. */
  allowHostCompat?: boolean;
  /**
   * The project directory: relative host paths (seed_path, output_path, source_path)
   * resolve against it, and host paths must be inside it, the default seed's directory
   * or `allowHostPaths` (see host-paths.ts).
   */
  baseDir?: string;
  /** More host directories tool arguments may name (`--allow-host-path`). */
  allowHostPaths?: readonly string[];
  /** Server-wide shutdown: aborts every call in flight. */
  shutdown?: AbortSignal;
  /** Tracks calls in flight so a shutdown can wait for them before closing the SDK. */
  calls?: CallTracker;
  /** Debug log (stderr behind PYRO_DEBUG); never stdout, which is the stdio transport. */
  log?: (line: string) => void;
  /** Items per page of tools/list, prompts/list and resources/list (default 100; tests use less). */
  pageSize?: number;
}

type Extra = RequestHandlerExtra<ServerRequest, ServerNotification>;

/**
 * Builds the MCP server for one profile or mode on an SDK client. Tools are registered
 * on the SDK's McpServer (which lists them with their JSON Schemas), and `tools/call` is
 * answered by one wrapper that:
 * - validates arguments itself, so malformed ones become an `invalid_argument` result
 *   with structuredContent `{error}` (the McpServer's own validation answers with bare
 *   text and no code);
 * - turns anything thrown into `isError: true` + `{error: {code, message, hint}}` via
 *   `toPyroError`, so the server keeps serving after any failure;
 * - checks each success against the tool's output schema (a mismatch is an `internal`
 *   error, never a malformed result);
 * - sends progress (heartbeats for long tools, environment build steps) when the client
 *   asked for it, and passes the request's AbortSignal on, so a client's cancel stops
 *   the work.
 */
export function createServer(pyro: Pyro, options: ServerOptions = {}): McpServer {
  const set = toolSet({ ...optional("profile", options.profile), ...optional("mode", options.mode) });
  const tools = toolDefinitions(set);
  const byName = new Map<string, ToolDefinition>(tools.map((t) => [t.name, t]));
  const seed = options.seed ?? NO_SEED;
  const env: DescribeEnv = { available: new Set(set.tools), defaultSeed: seed.describe() };
  const hostPath = hostPathResolver(options, seed);
  const log = options.log ?? (() => {});

  const server = new McpServer(
    { name: SERVER_NAME, version: SERVER_VERSION, title: "pyro: disposable isolated workspaces" },
    { capabilities: { tools: {} }, instructions: instructions(set, env) },
  );

  // Registered first: host.ts then replaces the McpServer's tools/list with a paginated one.
  registerTools(server, tools, env, (tool, args, extra) => tracked(tool, args, extra));
  const host = registerHostFeatures(server, {
    pyro,
    available: env.available,
    tools: toolLister(tools, env),
    ...(options.pageSize !== undefined ? { pageSize: options.pageSize } : {}),
    log,
  });
  closeHostWithServer(server, host);

  const c: CallContext = {
    pyro,
    seed,
    allowHostCompat: options.allowHostCompat === true,
    hostPath,
    shutdown: options.shutdown,
    log,
    host,
  };
  const tracked = (tool: ToolDefinition, raw: unknown, extra: Extra) =>
    options.calls ? options.calls.track(callTool(tool, raw, extra, c)) : callTool(tool, raw, extra, c);

  // Replaces the McpServer's tools/call handler (the SDK documents that setRequestHandler
  // replaces); listing, capabilities and everything else stay the McpServer's. The schema
  // given here is lenient on purpose: the SDK's Server checks the request against
  // CallToolRequestSchema itself and answers -32602 (invalid params) when, say, `arguments`
  // is not an object, whereas a failure of this schema would be answered -32603 (internal).
  server.server.setRequestHandler(LENIENT_CALL, async (raw, extra) => {
    // Already checked against CallToolRequestSchema by the SDK's Server (see above).
    const request = raw as CallToolRequest;
    const tool = byName.get(request.params.name);
    if (!tool) {
      return errorResult(
        new PyroError(
          "not_found",
          `no tool '${request.params.name}' in ${set.kind} ${set.name}`,
          `tools here: ${set.tools.join(", ")}`,
        ),
      );
    }
    return tracked(tool, request.params.arguments, extra);
  });
  return server;
}

type CallFn = (tool: ToolDefinition, args: unknown, extra: Extra) => Promise<CallToolResult>;

/** Registers every tool on the McpServer (which then lists them and declares `tools`). */
function registerTools(server: McpServer, tools: readonly ToolDefinition[], env: DescribeEnv, call: CallFn) {
  for (const tool of tools) {
    server.registerTool(
      tool.name,
      {
        title: tool.title,
        description: describe(tool, env),
        inputSchema: tool.input,
        outputSchema: advertisedOutput(tool.output),
        annotations: { title: tool.title, ...tool.annotations },
      },
      // Used only if createServer's tools/call override were missing; the same wrapper either way.
      ((args: unknown, extra: Extra) => call(tool, args, extra)) as never,
    );
  }
}

/** tools/list as the McpServer would list them, built once on first use, paginated by host.ts. */
function toolLister(tools: readonly ToolDefinition[], env: DescribeEnv): () => Tool[] {
  let listed: Tool[] | undefined;
  return (): Tool[] => {
    listed ??= tools.map((tool) => ({
      name: tool.name,
      title: tool.title,
      description: describe(tool, env),
      inputSchema: toJsonSchemaCompat(tool.input, {
        strictUnions: true,
        pipeStrategy: "input",
      }) as Tool["inputSchema"],
      outputSchema: toJsonSchemaCompat(advertisedOutput(tool.output), {
        strictUnions: true,
        pipeStrategy: "output",
      }) as Tool["outputSchema"],
      annotations: { title: tool.title, ...tool.annotations },
    }));
    return listed;
  };
}

/**
 * Stops listening to the engine when the connection closes (an HTTP session ending) or
 * the server is closed (a caller may replace onclose, as the stdio command does).
 */
function closeHostWithServer(server: McpServer, host: HostHooks): void {
  const prevClose = server.server.onclose;
  server.server.onclose = () => {
    host.close();
    prevClose?.();
  };
  const closeServer = server.close.bind(server);
  server.close = async () => {
    host.close();
    await closeServer();
  };
}

/** Resolves host paths of tool arguments against the project (see host-paths.ts). */
function hostPathResolver(options: ServerOptions, seed: DefaultSeed): ToolContext["hostPath"] {
  const baseDir = options.baseDir ?? process.cwd();
  const hostPaths = new HostPaths({
    base: baseDir,
    project: [baseDir, seed.root()],
    allowed: options.allowHostPaths ?? [],
  });
  return hostPaths.resolve.bind(hostPaths);
}

/** What every call of one server shares. */
interface CallContext {
  pyro: Pyro;
  seed: DefaultSeed;
  allowHostCompat: boolean;
  hostPath: ToolContext["hostPath"];
  shutdown: AbortSignal | undefined;
  log: (line: string) => void;
  host: HostHooks;
}

/**
 * One tools/call: validates the arguments itself (malformed ones become an
 * `invalid_argument` result), runs the tool with progress and cancellation, checks the
 * success against the output schema and turns anything thrown into an error result.
 */
async function callTool(
  tool: ToolDefinition,
  raw: unknown,
  extra: Extra,
  c: CallContext,
): Promise<CallToolResult> {
  const parsed = tool.input.safeParse(raw ?? {});
  if (!parsed.success) {
    return errorResult(
      new PyroError(
        "invalid_argument",
        `invalid arguments for ${tool.name}: ${issues(parsed.error)}`,
        `see the inputSchema of ${tool.name}`,
      ),
    );
  }
  const progress = new RequestProgress({
    progressToken: extra._meta?.progressToken,
    send: (params) => extra.sendNotification({ method: "notifications/progress", params }),
  });
  const signal = c.shutdown ? AbortSignal.any([extra.signal, c.shutdown]) : extra.signal;
  const ctx: ToolContext = {
    engine: c.pyro.engine,
    ws: c.pyro.engine.workspaces,
    seed: c.seed,
    allowHostCompat: c.allowHostCompat,
    hostPath: c.hostPath,
    signal,
    progress,
  };
  if (tool.long) progress.startHeartbeat(tool.long);
  const started = performance.now();
  const end = c.host.begin(extra);
  try {
    const result = await tool.run(parsed.data, ctx);
    const checked = tool.output.safeParse(result);
    if (!checked.success) {
      c.log(`${tool.name}: result does not match the output schema: ${issues(checked.error)}`);
      return errorResult(
        new PyroError(
          "internal",
          `${tool.name} produced a result that does not match its output schema: ${issues(checked.error)}`,
          "this is a pyro bug; rerun with PYRO_DEBUG=1 and report it",
        ),
      );
    }
    c.log(`${tool.name}: ok in ${Math.round(performance.now() - started)} ms`);
    // A JSON round trip: what an in-process client sees is exactly what goes on the wire.
    const structured = JSON.parse(JSON.stringify(result)) as Record<string, unknown>;
    if (!tool.annotations.readOnlyHint)
      c.host.touched(typeof structured.workspace_id === "string" ? structured.workspace_id : undefined);
    return {
      content: [{ type: "text", text: tool.render(checked.data, parsed.data) }],
      structuredContent: structured,
    };
  } catch (err) {
    const e =
      signal.aborted && !(err instanceof PyroError)
        ? new PyroError("cancelled", "the call was cancelled")
        : toPyroError(err);
    c.log(`${tool.name}: ${e.code}: ${e.message}${e.code === "internal" ? `\n${stackOf(e)}` : ""}`);
    c.host.failed(tool.name, e);
    return errorResult(e);
  } finally {
    end();
    progress.stop();
  }
}

const LENIENT_CALL = z.object({ method: z.literal("tools/call"), params: z.unknown() });

/** The result of a failed call: `isError` with the error object as structured content. */
export function errorResult(e: PyroError): CallToolResult {
  const error = e.toJSON("tool");
  return {
    isError: true,
    content: [
      {
        type: "text",
        text: `error [${error.code}]: ${error.message}${error.hint ? ` (hint: ${error.hint})` : ""}`,
      },
    ],
    structuredContent: { error },
  };
}

/** Calls in flight, so a shutdown can wait for them (bounded) before closing the SDK. */
export class CallTracker {
  private readonly pending = new Set<Promise<unknown>>();

  track<T>(p: Promise<T>): Promise<T> {
    this.pending.add(p);
    p.finally(() => this.pending.delete(p)).catch(() => {});
    return p;
  }

  get size(): number {
    return this.pending.size;
  }

  async drain(timeoutMs: number): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<void>((r) => {
      timer = setTimeout(r, timeoutMs);
    });
    await Promise.race([Promise.allSettled([...this.pending]), timeout]);
    clearTimeout(timer);
  }
}

function describe(tool: ToolDefinition, env: DescribeEnv): string {
  const base = typeof tool.description === "function" ? tool.description(env) : tool.description;
  const next = (tool.next ?? []).filter(([name]) => env.available.has(name));
  return next.length === 0
    ? base
    : `${base}\n\nNext: ${next.map(([name, when]) => `${when} with ${name}`).join("; ")}.`;
}

function instructions(set: ToolSet, env: DescribeEnv): string {
  const has = (t: ToolName) => env.available.has(t);
  const lines = [
    "pyro gives you disposable, isolated Linux workspaces (sandboxes with no network unless a policy grants it); nothing run in them touches the host.",
  ];
  if (has("workspace_create")) {
    const loop = ["workspace_create (seeded with the project)", "workspace_exec to reproduce"];
    if (has("workspace_patch_apply"))
      loop.push("workspace_patch_apply or workspace_file_write to fix", "rerun");
    if (has("workspace_diff")) loop.push("workspace_diff to review");
    loop.push("workspace_export to take results out", "workspace_delete when done");
    lines.push(`Typical loop: ${loop.join(", ")}.`, `Default seed for workspace_create: ${env.defaultSeed}.`);
  }
  if (has("vm_run")) lines.push("vm_run runs one command in a throwaway sandbox.");
  lines.push(
    `Failed calls return isError with structuredContent {error: {code, message, hint}}; branch on code. Tool set: ${set.kind} ${set.name}.`,
  );
  return lines.join("\n");
}

function issues(error: z.ZodError): string {
  return error.issues
    .map((i) => `${i.path.length > 0 ? i.path.join(".") : "arguments"}: ${i.message}`)
    .join("; ");
}

function optional<K extends string>(key: K, value: string | undefined): Partial<Record<K, string>> {
  return value === undefined ? {} : ({ [key]: value } as Record<K, string>);
}

function stackOf(e: PyroError): string {
  const cause = (e as Error & { cause?: unknown }).cause;
  return (cause instanceof Error ? cause : e).stack ?? "";
}
