/**
 * What chat hosts use besides tools (CONTRACT §10), one module each under host/:
 * logging (`logging/setLevel`, `notifications/message` from the engine's events), prompts
 * (prompts.ts, only those the tool set can run), resources (`pyro://workspaces`, a
 * workspace's summary, diff and files; `list_changed` when workspaces come and go;
 * subscriptions), completions (`completion/complete` for workspace ids and names,
 * environment, snapshot and service names, and file paths) and pagination
 * (`cursor`/`nextCursor` on tools/list, resources/list and prompts/list).
 *
 * Handlers are set on the SDK's low-level Server (the McpServer keeps tools): errors are
 * JSON-RPC errors with pyro's `{code, hint}` as `data`, never stack traces.
 */
import type { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { ListToolsRequestSchema, type Tool } from "@modelcontextprotocol/sdk/types.js";
import type { EngineEvent } from "../core/events.js";
import type { PyroError } from "../errors.js";
import type { Pyro } from "../sdk/pyro.js";
import { registerCompletions } from "./host/completions.js";
import { type Extra, type Notifier, registerLogging } from "./host/logging.js";
import { PAGE_SIZE, page } from "./host/pagination.js";
import { registerPrompts } from "./host/prompts.js";
import { type ResourceWatch, registerResources, WORKSPACES_URI } from "./host/resources.js";
import type { ToolName } from "./profiles.js";
import { promptsFor } from "./prompts.js";

export interface HostOptions {
  pyro: Pyro;
  available: ReadonlySet<ToolName>;
  /** Every tool as tools/list shows it, in order (paginated here). */
  tools: () => Tool[];
  pageSize?: number;
  log: (line: string) => void;
}

/** What the tool-call wrapper tells the host features. */
export interface HostHooks {
  /** A call starts: notifications go out on its stream while it runs (HTTP). */
  begin(extra: Extra): () => void;
  /** A call finished with this result (workspace resources it touched are now updated). */
  touched(workspaceId: string | undefined): void;
  /** A call failed: a warning for whoever watches the host. */
  failed(tool: string, e: PyroError): void;
  /** Unsubscribes from the engine (the server closed). */
  close(): void;
}

export function registerHostFeatures(server: McpServer, o: HostOptions): HostHooks {
  const low = server.server;
  const pageSize = o.pageSize ?? PAGE_SIZE;
  const prompts = promptsFor(o.available);
  low.registerCapabilities({
    logging: {},
    prompts: { listChanged: false },
    resources: { subscribe: true, listChanged: true },
    completions: {},
  });
  const notifier = registerLogging(low);
  const resources = registerResources(low, { pyro: o.pyro, pageSize, notifier });
  const unsubscribe = o.pyro.engine.events.on((e) => onEngineEvent(e, notifier, resources));
  low.setRequestHandler(ListToolsRequestSchema, (req) => {
    const { items, nextCursor } = page(o.tools(), req.params?.cursor, pageSize);
    return { tools: items, ...(nextCursor ? { nextCursor } : {}) };
  });
  registerPrompts(low, prompts, o.available, pageSize);
  registerCompletions(low, { pyro: o.pyro, prompts, log: o.log });

  return {
    begin: (extra) => notifier.begin(extra),
    touched(id) {
      if (id) resources.workspaceUpdated(id);
    },
    failed(tool, e) {
      const refused = REFUSALS.has(e.code);
      notifier.log(refused ? "warning" : "error", {
        message: `${tool} ${refused ? "refused" : "failed"}: [${e.code}] ${e.message}`,
        kind: "tool",
        details: { tool, code: e.code },
      });
    },
    close: unsubscribe,
  };
}

/** An engine event: a log message, and resource notifications for what it changed. */
function onEngineEvent(e: EngineEvent, notifier: Notifier, resources: ResourceWatch): void {
  notifier.log(e.level, {
    message: e.message,
    kind: e.kind,
    ...(e.workspace_id ? { workspace_id: e.workspace_id } : {}),
    ...(e.data ? { details: e.data } : {}),
  });
  if (e.workspaces_changed) {
    notifier.notify({ method: "notifications/resources/list_changed" });
    resources.updated(WORKSPACES_URI);
  }
  if (e.workspace_id) resources.workspaceUpdated(e.workspace_id);
}

/** Codes of calls refused by policy or validation (warnings), not failures of pyro (errors). */
const REFUSALS = new Set([
  "invalid_argument",
  "path_outside_workspace",
  "backend_unavailable",
  "patch_rejected",
  "conflict",
  "not_found",
  "workspace_not_found",
  "environment_not_found",
  "workspace_stopped",
  "cancelled",
]);
