/**
 * MCP resources: `pyro://workspaces`, a workspace's summary, diff and files; subscriptions
 * (`notifications/resources/updated`) and list changes. An unknown resource is -32002, a
 * bad path -32602, anything else -32603, each with pyro's `{code, hint}` as `data`.
 */
import type { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { UriTemplate } from "@modelcontextprotocol/sdk/shared/uriTemplate.js";
import {
  ErrorCode,
  ListResourcesRequestSchema,
  ListResourceTemplatesRequestSchema,
  McpError,
  ReadResourceRequestSchema,
  type Resource,
  SubscribeRequestSchema,
  UnsubscribeRequestSchema,
} from "@modelcontextprotocol/sdk/types.js";
import { toPyroError } from "../../errors.js";
import type { Pyro } from "../../sdk/pyro.js";
import type { Notifier } from "./logging.js";
import { mimeOf } from "./mime.js";
import { page } from "./pagination.js";

/** A file read through a resource is cut past this (the file tool's default). */
const RESOURCE_FILE_BYTES = 1024 * 1024;

export const WORKSPACES_URI = "pyro://workspaces";
export const TEMPLATES = {
  summary: "pyro://workspaces/{workspace_id}/summary",
  diff: "pyro://workspaces/{workspace_id}/diff",
  files: "pyro://workspaces/{workspace_id}/files/{+path}",
} as const;

/** Error code for an unknown resource (MCP spec: resources, error handling). */
export const RESOURCE_NOT_FOUND = -32002;

/** Tells subscribers that resources changed. */
export interface ResourceWatch {
  /** This resource changed (a notification if the client subscribed to it). */
  updated(uri: string): void;
  /** Every subscribed resource of this workspace changed. */
  workspaceUpdated(id: string): void;
}

/** Answers resources/list, resources/templates/list, resources/read and (un)subscribe. */
export function registerResources(
  low: Server,
  o: { pyro: Pyro; pageSize: number; notifier: Notifier },
): ResourceWatch {
  const subscribed = new Set<string>();
  const updated = (uri: string) => {
    if (subscribed.has(uri))
      o.notifier.notify({ method: "notifications/resources/updated", params: { uri } });
  };
  low.setRequestHandler(SubscribeRequestSchema, (req) => {
    parseUri(req.params.uri);
    subscribed.add(req.params.uri);
    return {};
  });
  low.setRequestHandler(UnsubscribeRequestSchema, (req) => {
    subscribed.delete(req.params.uri);
    return {};
  });
  low.setRequestHandler(ListResourcesRequestSchema, async (req) => {
    const all = workspaceResources(await o.pyro.listWorkspaces());
    const { items, nextCursor } = page(all, req.params?.cursor, o.pageSize);
    return { resources: items, ...(nextCursor ? { nextCursor } : {}) };
  });
  low.setRequestHandler(ListResourceTemplatesRequestSchema, () => ({
    resourceTemplates: RESOURCE_TEMPLATES,
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
  return {
    updated,
    workspaceUpdated(id) {
      for (const uri of subscribed) if (uri.startsWith(`${WORKSPACES_URI}/${id}/`)) updated(uri);
    },
  };
}

/** The list of every workspace, then each workspace's summary and diff. */
function workspaceResources(list: Awaited<ReturnType<Pyro["listWorkspaces"]>>): Resource[] {
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
  return all;
}

const RESOURCE_TEMPLATES = [
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
    description: "A workspace's changes against its baseline as a unified diff (starts a stopped workspace).",
    mimeType: "text/x-diff",
  },
  {
    uriTemplate: TEMPLATES.files,
    name: "workspace file",
    title: "Workspace file",
    description:
      "A file under /workspace (path relative to it): text as is, binary as a blob; a directory is its listing (JSON).",
  },
];

type ParsedUri =
  | { kind: "workspaces" }
  | { kind: "summary" | "diff"; workspace_id: string }
  | { kind: "files"; workspace_id: string; path: string };

const templates = {
  summary: new UriTemplate(TEMPLATES.summary),
  diff: new UriTemplate(TEMPLATES.diff),
  files: new UriTemplate(TEMPLATES.files),
};

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
    case "files":
      return readFileResource(pyro, uri, r.workspace_id, r.path);
  }
}

/** A file under /workspace: text as is, binary as a blob, a directory as its listing. */
async function readFileResource(pyro: Pyro, uri: string, workspaceId: string, rel: string) {
  const path = rel === "" ? "/workspace" : `/workspace/${rel.replace(/^\/+/, "")}`;
  const f = await pyro
    .readWorkspaceFile(workspaceId, path, { maxBytes: RESOURCE_FILE_BYTES })
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
      text: json(await pyro.listWorkspaceFiles(workspaceId, path)),
    };
  if (f.encoding === "utf8") return { uri, mimeType: mimeOf(path, true), text: f.content };
  return { uri, mimeType: mimeOf(path, false), blob: f.content };
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
