/**
 * MCP completions (`completion/complete`): workspace ids and names, environment, snapshot
 * and service names for prompt arguments, and workspace ids and file paths for resource
 * templates. A completion is a hint: one that fails offers nothing.
 */
import type { Server } from "@modelcontextprotocol/sdk/server/index.js";
import {
  type CompleteRequest,
  CompleteRequestSchema,
  ErrorCode,
  McpError,
} from "@modelcontextprotocol/sdk/types.js";
import { toPyroError } from "../../errors.js";
import type { Pyro } from "../../sdk/pyro.js";
import type { CompletionKind, PromptDefinition } from "../prompts.js";
import { TEMPLATES, WORKSPACES_URI } from "./resources.js";

/** At most this many completion values are returned (the protocol's limit). */
const MAX_COMPLETIONS = 100;

type Kind = CompletionKind | "path";

/** Answers completion/complete for the arguments of `prompts` and the resource templates. */
export function registerCompletions(
  low: Server,
  o: { pyro: Pyro; prompts: readonly PromptDefinition[]; log: (line: string) => void },
): void {
  low.setRequestHandler(CompleteRequestSchema, async (req) => {
    const context = req.params.context?.arguments ?? {};
    const kind = kindOf(req.params, o.prompts);
    if (kind === undefined) return { completion: { values: [], hasMore: false } };
    let values: string[];
    try {
      values = await complete(o.pyro, kind, req.params.argument.value, context);
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
}

/** What the argument completes to; an unknown prompt or template is invalid params. */
function kindOf(
  { ref, argument }: CompleteRequest["params"],
  prompts: readonly PromptDefinition[],
): Kind | undefined {
  if (ref.type === "ref/prompt") {
    const p = prompts.find((x) => x.name === ref.name);
    if (!p) throw new McpError(ErrorCode.InvalidParams, `no prompt '${ref.name}' here`);
    return p.arguments.find((a) => a.name === argument.name)?.complete;
  }
  if (ref.type === "ref/resource") {
    const known = ref.uri === WORKSPACES_URI || Object.values(TEMPLATES).includes(ref.uri as never);
    if (!known) throw new McpError(ErrorCode.InvalidParams, `no resource template '${ref.uri}' here`);
    if (argument.name === "workspace_id") return "workspace";
    if (argument.name === "path" && ref.uri === TEMPLATES.files) return "path";
  }
  return undefined;
}

async function complete(
  pyro: Pyro,
  kind: Kind,
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
    case "path":
      return completePath(pyro, value, context.workspace_id);
  }
}

/** Entries of the directory `value` names, in a running workspace (directories end in /). */
async function completePath(pyro: Pyro, value: string, id: string | undefined): Promise<string[]> {
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
