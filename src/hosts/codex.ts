import { join } from "node:path";
import { isDeepStrictEqual } from "node:util";
import { parse as parseToml } from "smol-toml";
import { PyroError } from "../core/errors.js";
import { stringRecord } from "./claude-code.js";
import { isObject, type JsonObject, loadToml, replaceTomlTable, tomlTable, writeConfig } from "./files.js";
import type { EntryRead, HostContext, HostDriver, ServerEntry } from "./host.js";
import type { LaunchCommand } from "./launch.js";
import { defineHost, runHostCli } from "./ops.js";

/**
 * Codex keeps MCP servers in `$CODEX_HOME/config.toml` (default `~/.codex/config.toml`)
 * as `[mcp_servers.<name>]` tables: `command`, `args`, an optional `[...env]` table and
 * `enabled = false` to switch one off. `codex mcp add` replaces the whole table and
 * keeps the rest of the file; without the CLI pyro edits only its own table.
 */
export function codexConfigPath(ctx: HostContext): string {
  const dir = ctx.env.CODEX_HOME;
  return join(dir && dir.length > 0 ? dir : join(ctx.home, ".codex"), "config.toml");
}

const TABLE = ["mcp_servers", "pyro"] as const;

export function codexEntry(raw: unknown): ServerEntry {
  if (!isObject(raw)) return { type: typeof raw, command: "", args: [], env: {}, enabled: true, raw };
  return {
    // A `url` makes it a streamable-HTTP server; anything with a command is stdio.
    type: typeof raw.url === "string" ? "http" : "stdio",
    command: typeof raw.command === "string" ? raw.command : "",
    args: Array.isArray(raw.args) ? raw.args.map(String) : [],
    env: stringRecord(raw.env),
    enabled: raw.enabled !== false,
    raw,
  };
}

function tomlValue(launch: { command: string; args: string[] }, env: Record<string, string>): JsonObject {
  return Object.keys(env).length > 0
    ? { command: launch.command, args: launch.args, env }
    : { command: launch.command, args: launch.args };
}

/**
 * Rewrites pyro's table in a Codex config and proves, by parsing the result, that
 * nothing else changed: every other key parses to the same value as before. A config
 * the line editor cannot handle safely (pyro's entry written as an inline table, say)
 * is refused rather than guessed at.
 */
export function setCodexEntry(text: string, value: JsonObject): string {
  const before = text.trim() === "" ? {} : (parseToml(text) as JsonObject);
  const next = replaceTomlTable(text, TABLE, tomlTable(TABLE, value));
  let after: JsonObject;
  try {
    after = parseToml(next) as JsonObject;
  } catch (err) {
    throw unsafe(`the edited file would not parse (${(err as Error).message.split("\n")[0]})`);
  }
  const servers = isObject(after.mcp_servers) ? after.mcp_servers : {};
  if (!isDeepStrictEqual(toPlain(servers.pyro), toPlain(value)))
    throw unsafe("the pyro table did not come out as written");
  if (!isDeepStrictEqual(toPlain(withoutPyro(after)), toPlain(withoutPyro(before))))
    throw unsafe("other settings would have changed");
  return next;
}

function unsafe(why: string): PyroError {
  return new PyroError(
    "conflict",
    `cannot safely edit the Codex config: ${why}`,
    "install the codex CLI so `codex mcp add` does it, or add the entry by hand from `pyro host print-config codex`",
  );
}

function withoutPyro(doc: JsonObject): JsonObject {
  if (!isObject(doc.mcp_servers)) return doc;
  const { pyro: _drop, ...servers } = doc.mcp_servers;
  const out: JsonObject = { ...doc, mcp_servers: servers };
  if (Object.keys(servers).length === 0) delete out.mcp_servers;
  return out;
}

/** TOML dates parse to objects with methods; compare documents as plain JSON. */
function toPlain(v: unknown): unknown {
  return v === undefined ? undefined : JSON.parse(JSON.stringify(v));
}

const driver: HostDriver = {
  name: "codex",
  title: "Codex",
  binEnvVar: "PYRO_CODEX_BIN",
  binaryName: "codex",
  entryType: "stdio",
  versionArgs: ["--version"],

  async readEntry(ctx): Promise<EntryRead> {
    const path = codexConfigPath(ctx);
    const file = await loadToml(path);
    const base = { config_path: path, config_exists: file.exists, notes: [] as string[] };
    if (file.error) return { ...base, parse_error: file.error, entry: null };
    const servers = file.data.mcp_servers;
    const raw = isObject(servers) && Object.hasOwn(servers, "pyro") ? servers.pyro : undefined;
    return { ...base, entry: raw === undefined ? null : codexEntry(raw) };
  },

  desired(launch, keepEnv) {
    return {
      type: "stdio",
      command: launch.command,
      args: launch.args,
      env: keepEnv,
      enabled: true,
      raw: null,
    };
  },

  async writeEntry(ctx, desired, { binary }) {
    if (binary) {
      // `codex mcp add` replaces an existing table of that name (and drops enabled=false).
      const envFlags = Object.entries(desired.env).flatMap(([k, v]) => ["--env", `${k}=${v}`]);
      await runHostCli(ctx, [
        binary,
        "mcp",
        "add",
        "pyro",
        ...envFlags,
        "--",
        desired.command,
        ...desired.args,
      ]);
      return "cli";
    }
    const path = codexConfigPath(ctx);
    const file = await loadToml(path);
    if (file.error) throw new PyroError("conflict", `cannot parse ${path}: ${file.error}`);
    await writeConfig(path, setCodexEntry(file.text, tomlValue(desired, desired.env)), 0o600);
    return "file";
  },

  printConfig(launch: LaunchCommand) {
    return {
      host: "codex",
      server_name: launch.server_name,
      command: launch.command,
      args: launch.args,
      format: "toml",
      config_location: "~/.codex/config.toml (or $CODEX_HOME/config.toml)",
      snippet: tomlTable(["mcp_servers", launch.server_name], tomlValue(launch, {})).trimEnd(),
      cli_command: ["codex", "mcp", "add", launch.server_name, "--", launch.command, ...launch.args],
    };
  },
};

export const codex = defineHost(driver);
