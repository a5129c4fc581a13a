/** MCP prompts: prompts/list (paginated) and prompts/get of the recipes in ../prompts.ts. */
import type { Server } from "@modelcontextprotocol/sdk/server/index.js";
import {
  ErrorCode,
  GetPromptRequestSchema,
  ListPromptsRequestSchema,
  McpError,
} from "@modelcontextprotocol/sdk/types.js";
import type { ToolName } from "../profiles.js";
import { type PromptDefinition, renderPrompt } from "../prompts.js";
import { page } from "./pagination.js";

/** Answers prompts/list and prompts/get with `prompts` (those the tool set can run). */
export function registerPrompts(
  low: Server,
  prompts: readonly PromptDefinition[],
  available: ReadonlySet<ToolName>,
  pageSize: number,
): void {
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
          content: { type: "text" as const, text: renderPrompt(p, args, available) },
        },
      ],
    };
  });
}

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
