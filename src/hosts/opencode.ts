import { join } from "node:path";
import { stringRecord } from "./claude-code.js";
import { editJson, fileExists, isObject, loadJson } from "./files.js";
import type { EntryRead, HostContext, HostDriver, ServerEntry } from "./host.js";
import type { LaunchCommand } from "./launch.js";
import { defineHost } from "./ops.js";

/**
 * OpenCode reads its global config from `$XDG_CONFIG_HOME/opencode/opencode.json`
 * (default `~/.config/opencode/`). MCP servers live under `mcp`, a local one as
 * `{type: "local", command: [argv...], environment?, enabled?}`. Its `opencode mcp add`
 * is an interactive wizard, so pyro always edits the file.
 */
export function opencodeConfigDir(ctx: HostContext): string {
  const xdg = ctx.env.XDG_CONFIG_HOME;
  return join(xdg && xdg.length > 0 ? xdg : join(ctx.home, ".config"), "opencode");
}

export function opencodeConfigPath(ctx: HostContext): string {
  return join(opencodeConfigDir(ctx), "opencode.json");
}

export function opencodeEntry(raw: unknown): ServerEntry {
  if (!isObject(raw)) return { type: typeof raw, command: "", args: [], env: {}, enabled: true, raw };
  const argv = Array.isArray(raw.command) ? raw.command.map(String) : [];
  return {
    type: typeof raw.type === "string" ? raw.type : "(none)",
    command: argv[0] ?? "",
    args: argv.slice(1),
    env: stringRecord(raw.environment),
    enabled: raw.enabled !== false,
    raw,
  };
}

function jsonEntry(launch: { command: string; args: string[] }, env: Record<string, string>) {
  return {
    type: "local",
    command: [launch.command, ...launch.args],
    enabled: true,
    ...(Object.keys(env).length > 0 ? { environment: env } : {}),
  };
}

const SCHEMA = "https://opencode.ai/config.json";

const driver: HostDriver = {
  name: "opencode",
  title: "OpenCode",
  binEnvVar: "PYRO_OPENCODE_BIN",
  binaryName: "opencode",
  entryType: "local",
  versionArgs: ["--version"],

  async readEntry(ctx): Promise<EntryRead> {
    const path = opencodeConfigPath(ctx);
    const file = await loadJson(path);
    const base = { config_path: path, config_exists: file.exists, notes: [] as string[] };
    if (await fileExists(join(opencodeConfigDir(ctx), "opencode.jsonc")))
      base.notes.push(
        "opencode.jsonc in the same directory is merged with opencode.json; pyro reads and writes only opencode.json",
      );
    if (file.error)
      return {
        ...base,
        parse_error: `${file.error} (comments are not supported in the file pyro edits)`,
        entry: null,
      };
    const servers = file.data.mcp;
    const raw = isObject(servers) && Object.hasOwn(servers, "pyro") ? servers.pyro : undefined;
    return { ...base, entry: raw === undefined ? null : opencodeEntry(raw) };
  },

  desired(launch, keepEnv) {
    return {
      type: "local",
      command: launch.command,
      args: launch.args,
      env: keepEnv,
      enabled: true,
      raw: null,
    };
  },

  async writeEntry(ctx, desired) {
    await editJson(opencodeConfigPath(ctx), 0o644, (data) => {
      const servers = isObject(data.mcp) ? data.mcp : {};
      const head = Object.keys(data).length === 0 ? { $schema: SCHEMA } : {};
      return { ...head, ...data, mcp: { ...servers, pyro: jsonEntry(desired, desired.env) } };
    });
    return "file";
  },

  printConfig(launch: LaunchCommand) {
    return {
      host: "opencode",
      server_name: launch.server_name,
      command: launch.command,
      args: launch.args,
      format: "json",
      config_location: "~/.config/opencode/opencode.json (or opencode.json at a project's root)",
      snippet: JSON.stringify(
        { $schema: SCHEMA, mcp: { [launch.server_name]: jsonEntry(launch, {}) } },
        null,
        2,
      ),
      cli_command: null,
    };
  },
};

export const opencode = defineHost(driver);
