import { join } from "node:path";
import { PyroError } from "../errors.js";
import { isObject, loadJson, writeConfig } from "./files.js";
import type { EntryRead, HostContext, HostDriver, ServerEntry } from "./host.js";
import { setJsonMember } from "./jsonc.js";
import type { LaunchCommand } from "./launch.js";
import { defineHost, runHostCli } from "./ops.js";

/**
 * Claude Code keeps user-scope MCP servers in `~/.claude.json` (or
 * `$CLAUDE_CONFIG_DIR/.claude.json`) under `mcpServers`; local-scope ones under
 * `projects[<dir>].mcpServers` in the same file. pyro connects at user scope so the
 * server is there in every project. With the `claude` CLI present, `claude mcp add`
 * writes the entry (Claude rewrites that file itself, and another writer could race
 * it); without it pyro edits the file.
 */
export function claudeConfigPath(ctx: HostContext): string {
  const dir = ctx.env.CLAUDE_CONFIG_DIR;
  return join(dir && dir.length > 0 ? dir : ctx.home, ".claude.json");
}

/** Claude's entry shape: `{type?: "stdio", command, args, env}`; no type means stdio. */
export function claudeEntry(raw: unknown): ServerEntry {
  if (!isObject(raw))
    return { type: raw === null ? "null" : typeof raw, command: "", args: [], env: {}, enabled: true, raw };
  return {
    type: typeof raw.type === "string" ? raw.type : "stdio",
    command: typeof raw.command === "string" ? raw.command : "",
    args: Array.isArray(raw.args) ? raw.args.map(String) : [],
    env: stringRecord(raw.env),
    enabled: true,
    raw,
  };
}

export function stringRecord(v: unknown): Record<string, string> {
  if (!isObject(v)) return {};
  return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, String(x)]));
}

function jsonEntry(launch: { command: string; args: string[] }, env: Record<string, string>) {
  return { type: "stdio", command: launch.command, args: launch.args, env };
}

/** Sets (or, with undefined, removes) the user-scope pyro entry in the file itself. */
async function editClaudeConfig(ctx: HostContext, entry: unknown): Promise<void> {
  const path = claudeConfigPath(ctx);
  const file = await loadJson(path);
  if (file.error) throw new PyroError("conflict", `cannot parse ${path}: ${file.error}`);
  const next = setJsonMember(file.text, ["mcpServers", "pyro"], entry, {
    hint: "add the entry by hand from `pyro host print-config claude-code`",
  });
  if (next !== file.text) await writeConfig(path, next, 0o600);
}

const driver: HostDriver = {
  name: "claude-code",
  title: "Claude Code",
  binEnvVar: "PYRO_CLAUDE_BIN",
  binaryName: "claude",
  entryType: "stdio",
  versionArgs: ["--version"],

  async readEntry(ctx): Promise<EntryRead> {
    const path = claudeConfigPath(ctx);
    const file = await loadJson(path);
    const base = { config_path: path, config_exists: file.exists, notes: [] as string[] };
    if (file.error) return { ...base, parse_error: file.error, entry: null };
    const servers = file.data.mcpServers;
    const raw = isObject(servers) && Object.hasOwn(servers, "pyro") ? servers.pyro : undefined;
    const projects = file.data.projects;
    const project = isObject(projects) ? projects[ctx.cwd] : undefined;
    if (isObject(project) && isObject(project.mcpServers) && Object.hasOwn(project.mcpServers, "pyro"))
      base.notes.push(
        `a local-scope 'pyro' entry for ${ctx.cwd} takes precedence there over the user-scope one`,
      );
    return { ...base, entry: raw === undefined ? null : claudeEntry(raw) };
  },

  desired(launch, existing) {
    return {
      type: "stdio",
      command: launch.command,
      args: launch.args,
      env: existing?.env ?? {},
      enabled: true,
      raw: null,
    };
  },

  async writeEntry(ctx, desired, { binary, existing }) {
    if (binary) {
      // `claude mcp add` refuses an existing name: remove ours first (user scope only).
      if (existing) await runHostCli(ctx, [binary, "mcp", "remove", "--scope", "user", "pyro"]);
      const envFlags = Object.entries(desired.env).flatMap(([k, v]) => ["-e", `${k}=${v}`]);
      // The name goes before -e: -e is variadic and would swallow it.
      await runHostCli(ctx, [
        binary,
        "mcp",
        "add",
        "pyro",
        "--scope",
        "user",
        ...envFlags,
        "--",
        desired.command,
        ...desired.args,
      ]);
      return "cli";
    }
    await editClaudeConfig(ctx, jsonEntry(desired, desired.env));
    return "file";
  },

  async removeEntry(ctx, { binary }) {
    if (binary) {
      await runHostCli(ctx, [binary, "mcp", "remove", "--scope", "user", "pyro"]);
      return "cli";
    }
    await editClaudeConfig(ctx, undefined);
    return "file";
  },

  printConfig(launch: LaunchCommand) {
    return {
      host: "claude-code",
      server_name: launch.server_name,
      command: launch.command,
      args: launch.args,
      format: "json",
      config_location:
        "~/.claude.json `mcpServers` (user scope), or .mcp.json at a project's root (project scope)",
      snippet: JSON.stringify({ mcpServers: { [launch.server_name]: jsonEntry(launch, {}) } }, null, 2),
      cli_command: [
        "claude",
        "mcp",
        "add",
        launch.server_name,
        "--scope",
        "user",
        "--",
        launch.command,
        ...launch.args,
      ],
    };
  },
};

export const claudeCode = defineHost(driver);
