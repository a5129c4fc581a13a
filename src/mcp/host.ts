/**
 * What chat hosts use besides tools (CONTRACT §10): logging (`logging/setLevel`,
 * `notifications/message` from the engine's events), prompts (prompts.ts, only those the
 * tool set can run), resources (`pyro://workspaces`, a workspace's summary, diff and
 * files; `list_changed` when workspaces come and go; subscriptions), completions
 * (`completion/complete` for workspace ids and names, environment, snapshot and service
 * names, and file paths) and pagination (`cursor`/`nextCursor` on tools/list,
 * resources/list and prompts/list).
 *
 * Handlers are set on the SDK's low-level Server (the McpServer keeps tools): errors are
 * JSON-RPC errors with pyro's `{code, hint}` as `data`, never stack traces.
 */
import type { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import type { RequestHandlerExtra } from "@modelcontextprotocol/sdk/shared/protocol.js";
import { UriTemplate } from "@modelcontextprotocol/sdk/shared/uriTemplate.js";
import {
  CompleteRequestSchema,
  ErrorCode,
  GetPromptRequestSchema,
  ListPromptsRequestSchema,
  ListResourcesRequestSchema,
  ListResourceTemplatesRequestSchema,
  ListToolsRequestSchema,
  type LoggingLevel,
  LoggingLevelSchema,
  McpError,
  ReadResourceRequestSchema,
  type Resource,
  type ServerNotification,
  type ServerRequest,
  SubscribeRequestSchema,
  type Tool,
  UnsubscribeRequestSchema,
} from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";
import { type EngineEvent, EVENT_LEVELS } from "../core/events.js";
import { type PyroError, toPyroError } from "../errors.js";
import type { Pyro } from "../sdk/pyro.js";
import type { ToolName } from "./profiles.js";
import { type CompletionKind, type PromptDefinition, promptsFor, renderPrompt } from "./prompts.js";

type Extra = RequestHandlerExtra<ServerRequest, ServerNotification>;

/** Default page size of paginated lists; a host may see fewer per page, never more. */
export const PAGE_SIZE = 100;
/** The default logging level before a client sets one. */
export const DEFAULT_LOG_LEVEL: LoggingLevel = "info";
/** At most this many completion values are returned (the protocol's limit). */
const MAX_COMPLETIONS = 100;
/** A file read through a resource is cut past this (the file tool's default). */
const RESOURCE_FILE_BYTES = 1024 * 1024;

export const WORKSPACES_URI = "pyro://workspaces";
export const TEMPLATES = {
  summary: "pyro://workspaces/{workspace_id}/summary",
  diff: "pyro://workspaces/{workspace_id}/diff",
  files: "pyro://workspaces/{workspace_id}/files/{+path}",
} as const;

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

  // ---- logging ----
  let level: LoggingLevel = DEFAULT_LOG_LEVEL;
  let initialized = false;
  const inflight: Extra[] = [];
  const prevInit = low.oninitialized;
  low.oninitialized = () => {
    initialized = true;
    prevInit?.();
  };
  // Lenient on purpose: an unknown level is answered -32602 (invalid params) with the
  // levels, where the SDK's own schema check would answer -32603 (internal error).
  low.setRequestHandler(LENIENT_SET_LEVEL, (req) => {
    const raw = (req.params as { level?: unknown } | undefined)?.level;
    const parsed = LoggingLevelSchema.safeParse(raw);
    if (!parsed.success)
      throw new McpError(
        ErrorCode.InvalidParams,
        `unknown logging level '${String(raw).slice(0, 64)}'; levels: ${EVENT_LEVELS.join(", ")}`,
      );
    level = parsed.data;
    return {};
  });
  const notify = (n: ServerNotification): void => {
    if (!initialized) return;
    // During a call, on that call's stream (Streamable HTTP answers it there); else standalone.
    const current = inflight[inflight.length - 1];
    const sent = current ? current.sendNotification(n) : low.notification(n);
    sent.catch(() => {});
  };
  const logMessage = (lvl: LoggingLevel, data: Record<string, unknown>): void => {
    if (EVENT_LEVELS.indexOf(lvl) < EVENT_LEVELS.indexOf(level)) return;
    notify({ method: "notifications/message", params: { level: lvl, logger: "pyro", data } });
  };

  // ---- resources: subscriptions and list changes ----
  const subscribed = new Set<string>();
  const updated = (uri: string) => {
    if (subscribed.has(uri)) notify({ method: "notifications/resources/updated", params: { uri } });
  };
  const workspaceUpdated = (id: string) => {
    for (const uri of subscribed) if (uri.startsWith(`${WORKSPACES_URI}/${id}/`)) updated(uri);
  };
  const onEvent = (e: EngineEvent) => {
    logMessage(e.level, {
      message: e.message,
      kind: e.kind,
      ...(e.workspace_id ? { workspace_id: e.workspace_id } : {}),
      ...(e.data ? { details: e.data } : {}),
    });
    if (e.workspaces_changed) {
      notify({ method: "notifications/resources/list_changed" });
      updated(WORKSPACES_URI);
    }
    if (e.workspace_id) workspaceUpdated(e.workspace_id);
  };
  const unsubscribe = o.pyro.engine.events.on(onEvent);

  low.setRequestHandler(SubscribeRequestSchema, (req) => {
    parseUri(req.params.uri);
    subscribed.add(req.params.uri);
    return {};
  });
  low.setRequestHandler(UnsubscribeRequestSchema, (req) => {
    subscribed.delete(req.params.uri);
    return {};
  });

  // ---- tools/list, paginated ----
  low.setRequestHandler(ListToolsRequestSchema, (req) => {
    const { items, nextCursor } = page(o.tools(), req.params?.cursor, pageSize);
    return { tools: items, ...(nextCursor ? { nextCursor } : {}) };
  });

  // ---- prompts ----
  low.setRequestHandler(ListPromptsRequestSchema, (req) => {
    const { items, nextCursor } = page(prompts, req.params?.cursor, pageSize);
    return {
      prompts: items.map((p) => ({
        name: p.name,
        title: p.title,
        description: p.description,
        arguments: p.arguments.map((a) => ({
          name: a.name,
          description: a.description,
          required: a.required,
        })),
      })),
      ...(nextCursor ? { nextCursor } : {}),
    };
  });
  low.setRequestHandler(GetPromptRequestSchema, (req) => {
    const p = prompts.find((x) => x.name === req.params.name);
    if (!p)
      throw new McpError(
        ErrorCode.InvalidParams,
        `no prompt '${req.params.name}' here; prompts: ${prompts.map((x) => x.name).join(", ") || "none"}`,
      );
    const args = checkPromptArgs(p, req.params.arguments ?? {});
    return {
      description: p.description,
      messages: [
        {
          role: "user" as const,
          content: { type: "text" as const, text: renderPrompt(p, args, o.available) },
        },
      ],
    };
  });

  // ---- resources ----
  low.setRequestHandler(ListResourcesRequestSchema, async (req) => {
    const list = await o.pyro.listWorkspaces();
    const all: Resource[] = [
      {
        uri: WORKSPACES_URI,
        name: "workspaces",
        title: "pyro workspaces",
        description: "Every workspace on this machine, most recent activity first (JSON).",
        mimeType: "application/json",
      },
    ];
    for (const w of list.workspaces) {
      const label = w.name ?? w.workspace_id;
      all.push(
        {
          uri: `${WORKSPACES_URI}/${w.workspace_id}/summary`,
          name: `${label} summary`,
          title: `Workspace ${label}: summary`,
          description: `Commands, edits, changes and exports of workspace ${label} (${w.state}).`,
          mimeType: "application/json",
        },
        {
          uri: `${WORKSPACES_URI}/${w.workspace_id}/diff`,
          name: `${label} diff`,
          title: `Workspace ${label}: diff`,
          description: `The changes of workspace ${label} against its baseline, as a unified diff.`,
          mimeType: "text/x-diff",
        },
      );
    }
    const { items, nextCursor } = page(all, req.params?.cursor, pageSize);
    return { resources: items, ...(nextCursor ? { nextCursor } : {}) };
  });
  low.setRequestHandler(ListResourceTemplatesRequestSchema, () => ({
    resourceTemplates: [
      {
        uriTemplate: TEMPLATES.summary,
        name: "workspace summary",
        title: "Workspace summary",
        description: "A workspace's review: commands, edits, current changes, exports, snapshots (JSON).",
        mimeType: "application/json",
      },
      {
        uriTemplate: TEMPLATES.diff,
        name: "workspace diff",
        title: "Workspace diff",
        description:
          "A workspace's changes against its baseline as a unified diff (starts a stopped workspace).",
        mimeType: "text/x-diff",
      },
      {
        uriTemplate: TEMPLATES.files,
        name: "workspace file",
        title: "Workspace file",
        description:
          "A file under /workspace (path relative to it): text as is, binary as a blob; a directory is its listing (JSON).",
      },
    ],
  }));
  low.setRequestHandler(ReadResourceRequestSchema, async (req) => {
    const uri = req.params.uri;
    const r = parseUri(uri);
    try {
      return { contents: [await readResource(o.pyro, uri, r)] };
    } catch (err) {
      throw asMcpError(err, uri);
    }
  });

  // ---- completions ----
  low.setRequestHandler(CompleteRequestSchema, async (req) => {
    const { ref, argument } = req.params;
    const context = req.params.context?.arguments ?? {};
    let kind: CompletionKind | "path" | undefined;
    if (ref.type === "ref/prompt") {
      const p = prompts.find((x) => x.name === ref.name);
      if (!p) throw new McpError(ErrorCode.InvalidParams, `no prompt '${ref.name}' here`);
      kind = p.arguments.find((a) => a.name === argument.name)?.complete;
    } else if (ref.type === "ref/resource") {
      const known = ref.uri === WORKSPACES_URI || Object.values(TEMPLATES).includes(ref.uri as never);
      if (!known) throw new McpError(ErrorCode.InvalidParams, `no resource template '${ref.uri}' here`);
      if (argument.name === "workspace_id") kind = "workspace";
      else if (argument.name === "path" && ref.uri === TEMPLATES.files) kind = "path";
    }
    if (kind === undefined) return { completion: { values: [], hasMore: false } };
    let values: string[];
    try {
      values = await complete(o.pyro, kind, argument.value, context);
    } catch (err) {
      // A completion is a hint: a workspace that is gone or stopped offers nothing.
      o.log(`completion ${kind}: ${toPyroError(err).message}`);
      values = [];
    }
    return {
      completion: {
        values: values.slice(0, MAX_COMPLETIONS),
        total: values.length,
        hasMore: values.length > MAX_COMPLETIONS,
      },
    };
  });

  return {
    begin(extra) {
      inflight.push(extra);
      return () => {
        const i = inflight.lastIndexOf(extra);
        if (i >= 0) inflight.splice(i, 1);
      };
    },
    touched(id) {
      if (id) workspaceUpdated(id);
    },
    failed(tool, e) {
      const refused = REFUSALS.has(e.code);
      logMessage(refused ? "warning" : "error", {
        message: `${tool} ${refused ? "refused" : "failed"}: [${e.code}] ${e.message}`,
        kind: "tool",
        details: { tool, code: e.code },
      });
    },
    close: unsubscribe,
  };
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

const LENIENT_SET_LEVEL = z.object({ method: z.literal("logging/setLevel"), params: z.unknown() });

// ---- pagination ----

/** One page of `all` from an opaque cursor (the offset, base64url JSON). */
export function page<T>(all: readonly T[], cursor: string | undefined, size: number) {
  let offset = 0;
  if (cursor !== undefined) {
    try {
      const v = JSON.parse(Buffer.from(cursor, "base64url").toString("utf8")) as { o?: unknown };
      if (typeof v.o !== "number" || !Number.isInteger(v.o) || v.o < 0) throw new Error("bad offset");
      offset = v.o;
    } catch {
      throw new McpError(ErrorCode.InvalidParams, "invalid cursor: pass back a nextCursor this server gave");
    }
  }
  const items = all.slice(offset, offset + size);
  const next = offset + size < all.length ? encodeCursor(offset + size) : undefined;
  return { items, nextCursor: next };
}

export function encodeCursor(offset: number): string {
  return Buffer.from(JSON.stringify({ o: offset })).toString("base64url");
}

// ---- prompts ----

function checkPromptArgs(
  p: PromptDefinition,
  raw: Record<string, string>,
): Record<string, string | undefined> {
  const known = new Set(p.arguments.map((a) => a.name));
  const unknown = Object.keys(raw).filter((k) => !known.has(k));
  if (unknown.length > 0)
    throw new McpError(
      ErrorCode.InvalidParams,
      `prompt ${p.name} has no argument ${unknown.join(", ")}; arguments: ${[...known].join(", ")}`,
    );
  const missing = p.arguments.filter((a) => a.required && !(raw[a.name] ?? "").trim());
  if (missing.length > 0)
    throw new McpError(
      ErrorCode.InvalidParams,
      `prompt ${p.name} needs ${missing.map((a) => a.name).join(", ")} (${missing.map((a) => a.description).join(" ")})`,
    );
  const args: Record<string, string | undefined> = {};
  for (const a of p.arguments) {
    const v = raw[a.name]?.trim();
    if (v && v.length > 64 * 1024)
      throw new McpError(ErrorCode.InvalidParams, `prompt argument ${a.name} is over 64 KiB`);
    args[a.name] = v ? v : undefined;
  }
  return args;
}

// ---- resources ----

type ParsedUri =
  | { kind: "workspaces" }
  | { kind: "summary" | "diff"; workspace_id: string }
  | { kind: "files"; workspace_id: string; path: string };

const templates = {
  summary: new UriTemplate(TEMPLATES.summary),
  diff: new UriTemplate(TEMPLATES.diff),
  files: new UriTemplate(TEMPLATES.files),
};

/** Error code for an unknown resource (MCP spec: resources, error handling). */
export const RESOURCE_NOT_FOUND = -32002;

function parseUri(uri: string): ParsedUri {
  if (uri === WORKSPACES_URI) return { kind: "workspaces" };
  const files = templates.files.match(uri);
  if (files && typeof files.workspace_id === "string" && typeof files.path === "string")
    return {
      kind: "files",
      workspace_id: decodeURIComponent(files.workspace_id),
      path: decodeURIComponent(files.path),
    };
  for (const kind of ["summary", "diff"] as const) {
    const m = templates[kind].match(uri);
    if (m && typeof m.workspace_id === "string" && !m.workspace_id.includes("/"))
      return { kind, workspace_id: decodeURIComponent(m.workspace_id) };
  }
  throw new McpError(RESOURCE_NOT_FOUND, `no resource '${uri.slice(0, 200)}'`, {
    uri,
    hint: `resources: ${WORKSPACES_URI}, ${Object.values(TEMPLATES).join(", ")}`,
  });
}

async function readResource(pyro: Pyro, uri: string, r: ParsedUri) {
  switch (r.kind) {
    case "workspaces":
      return { uri, mimeType: "application/json", text: json(await pyro.listWorkspaces()) };
    case "summary":
      return { uri, mimeType: "application/json", text: json(await pyro.summarizeWorkspace(r.workspace_id)) };
    case "diff": {
      const d = await pyro.diffWorkspace(r.workspace_id);
      return { uri, mimeType: "text/x-diff", text: d.patch };
    }
    case "files": {
      const path = r.path === "" ? "/workspace" : `/workspace/${r.path.replace(/^\/+/, "")}`;
      const f = await pyro
        .readWorkspaceFile(r.workspace_id, path, { maxBytes: RESOURCE_FILE_BYTES })
        .catch((err: unknown) => {
          // A directory is read as its listing.
          if (toPyroError(err).code === "invalid_argument" && /directory/.test(toPyroError(err).message))
            return undefined;
          throw err;
        });
      if (!f)
        return {
          uri,
          mimeType: "application/json",
          text: json(await pyro.listWorkspaceFiles(r.workspace_id, path)),
        };
      if (f.encoding === "utf8") return { uri, mimeType: mimeOf(path, true), text: f.content };
      return { uri, mimeType: mimeOf(path, false), blob: f.content };
    }
  }
}

function asMcpError(err: unknown, uri: string): McpError {
  if (err instanceof McpError) return err;
  const e = toPyroError(err);
  const j = e.toJSON("tool");
  const code = ["workspace_not_found", "not_found"].includes(e.code)
    ? RESOURCE_NOT_FOUND
    : ["invalid_argument", "path_outside_workspace"].includes(e.code)
      ? ErrorCode.InvalidParams
      : ErrorCode.InternalError;
  return new McpError(code, `${uri}: ${j.message}`, {
    uri,
    code: j.code,
    ...(j.hint ? { hint: j.hint } : {}),
  });
}

const json = (v: unknown) => `${JSON.stringify(v, null, 2)}\n`;

const MIME: Record<string, string> = {
  md: "text/markdown",
  json: "application/json",
  js: "text/javascript",
  mjs: "text/javascript",
  ts: "text/x-typescript",
  py: "text/x-python",
  sh: "text/x-shellscript",
  html: "text/html",
  css: "text/css",
  csv: "text/csv",
  xml: "application/xml",
  yaml: "application/yaml",
  yml: "application/yaml",
  toml: "application/toml",
  diff: "text/x-diff",
  patch: "text/x-diff",
  png: "image/png",
  jpg: "image/jpeg",
  jpeg: "image/jpeg",
  gif: "image/gif",
  svg: "image/svg+xml",
  pdf: "application/pdf",
  gz: "application/gzip",
  zip: "application/zip",
  tar: "application/x-tar",
};

export function mimeOf(path: string, text: boolean): string {
  const ext = /\.([A-Za-z0-9]+)$/.exec(path)?.[1]?.toLowerCase();
  const m = ext ? MIME[ext] : undefined;
  if (m && (text ? !m.startsWith("image/") || m === "image/svg+xml" : true)) return m;
  return text ? "text/plain" : "application/octet-stream";
}

// ---- completions ----

async function complete(
  pyro: Pyro,
  kind: CompletionKind | "path",
  value: string,
  context: Record<string, string>,
): Promise<string[]> {
  const prefix = value.toLowerCase();
  const matching = (names: Iterable<string>) =>
    [...new Set(names)].filter((n) => n.toLowerCase().startsWith(prefix)).sort();
  switch (kind) {
    case "workspace": {
      const { workspaces } = await pyro.listWorkspaces();
      // Names first (what a person types), then ids.
      const names = matching(workspaces.flatMap((w) => (w.name ? [w.name] : [])));
      return [...names, ...matching(workspaces.map((w) => w.workspace_id))];
    }
    case "environment":
      return matching((await pyro.listEnvironments()).environments.map((e) => e.name));
    case "snapshot": {
      const id = context.workspace_id;
      if (!id) return [];
      return matching((await pyro.listSnapshots(id)).snapshots.map((s) => s.snapshot_name));
    }
    case "service": {
      const id = context.workspace_id;
      if (!id) return [];
      const w = await pyro.engine.workspaces.get(id);
      return matching((w.spec.services ?? []).map((s) => s.name));
    }
    case "path": {
      const id = context.workspace_id;
      if (!id) return [];
      const w = await pyro.engine.workspaces.get(id);
      // Listing needs the agent: never start a stopped workspace for a completion.
      if (w.state !== "running") return [];
      const slash = value.lastIndexOf("/");
      const dir = value.slice(0, slash + 1);
      const list = await pyro.listWorkspaceFiles(w.workspace_id, `/workspace/${dir}`);
      return list.entries
        .map((e) => {
          const rel = e.path.replace(/^\/workspace\//, "");
          return e.artifact_type === "directory" ? `${rel}/` : rel;
        })
        .filter((p) => p.startsWith(value))
        .sort();
    }
  }
}
