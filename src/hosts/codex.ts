import { rm } from "node:fs/promises";
import { join } from "node:path";
import { isDeepStrictEqual } from "node:util";
import { parse as parseToml } from "smol-toml";
import { LIMITS } from "../core/limits.js";
import { PyroError } from "../errors.js";
import { stringRecord } from "./claude-code.js";
import {
  isObject,
  type JsonObject,
  loadToml,
  removeTomlTable,
  replaceTomlTable,
  tomlTable,
  writeConfig,
} from "./files.js";
import type { EntryRead, HostContext, HostDriver, ServerEntry } from "./host.js";
import type { LaunchCommand } from "./launch.js";
import { defineHost, runHostCli } from "./ops.js";

/**
 * Codex keeps MCP servers in `$CODEX_HOME/config.toml` (default `~/.codex/config.toml`)
 * as `[mcp_servers.<name>]` tables: `command`, `args`, an optional `[...env]` table,
 * `enabled = false` to switch one off, and the timeouts. pyro always edits only its own
 * table: `codex mcp add` rewrites every `[mcp_servers.*]` table and drops the comments
 * in and around them, and it cannot set the timeouts. With the CLI installed, Codex then
 * reads the entry back, so a config Codex would refuse is rolled back.
 */
export function codexConfigPath(ctx: HostContext): string {
  const dir = ctx.env.CODEX_HOME;
  return join(dir && dir.length > 0 ? dir : join(ctx.home, ".codex"), "config.toml");
}

const TABLE = ["mcp_servers", "pyro"] as const;

/**
 * The ceiling of `workspace_exec`'s `timeout_seconds` (src/mcp/schemas.ts `timeoutArg`;
 * a unit test pins the two together). A Codex tool call must be allowed to outlast it.
 */
export const EXEC_TIMEOUT_MAX_SECONDS = LIMITS.timeout_seconds.max;

/**
 * Codex's `tool_timeout_sec` for pyro: the longest exec, plus ten minutes for booting
 * the sandbox and carrying the output back. Codex's default is 60 s.
 */
export const CODEX_TOOL_TIMEOUT_SEC = EXEC_TIMEOUT_MAX_SECONDS + 600;

/**
 * Codex's `startup_timeout_sec` for pyro: Codex's default is 10 s, and a cold Node start
 * on a loaded machine can come close.
 */
export const CODEX_STARTUP_TIMEOUT_SEC = 30;

const TIMEOUTS = { tool_timeout_sec: CODEX_TOOL_TIMEOUT_SEC, startup_timeout_sec: CODEX_STARTUP_TIMEOUT_SEC };

export function codexEntry(raw: unknown): ServerEntry {
  if (!isObject(raw)) return { type: typeof raw, command: "", args: [], env: {}, enabled: true, raw };
  return {
    // A `url` makes it a streamable-HTTP server; anything with a command is stdio.
    type: typeof raw.url === "string" ? "http" : "stdio",
    command: typeof raw.command === "string" ? raw.command : "",
    args: Array.isArray(raw.args) ? raw.args.map(String) : [],
    env: stringRecord(raw.env),
    enabled: raw.enabled !== false,
    settings: Object.fromEntries(Object.keys(TIMEOUTS).flatMap((k) => (k in raw ? [[k, raw[k]]] : []))),
    raw,
  };
}

/** The stored value when it is a number at least `min` (a user may allow more), else `min`. */
function atLeast(stored: unknown, min: number): number {
  return typeof stored === "number" && stored >= min ? stored : min;
}

function tomlValue(
  launch: { command: string; args: string[] },
  env: Record<string, string>,
  settings: Record<string, unknown>,
): JsonObject {
  return {
    command: launch.command,
    args: launch.args,
    ...settings,
    ...(Object.keys(env).length > 0 ? { env } : {}),
  };
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

/** Removes pyro's table (and sub-tables) from a Codex config; proven like setCodexEntry. */
export function removeCodexEntry(text: string): string {
  const before = parseToml(text) as JsonObject;
  const next = removeTomlTable(text, TABLE);
  let after: JsonObject;
  try {
    after = parseToml(next) as JsonObject;
  } catch (err) {
    throw unsafe(`the edited file would not parse (${(err as Error).message.split("\n")[0]})`);
  }
  if (isObject(after.mcp_servers) && Object.hasOwn(after.mcp_servers, "pyro"))
    throw unsafe("the pyro entry is not a table of its own");
  if (!isDeepStrictEqual(toPlain(after), toPlain(withoutPyro(before))))
    throw unsafe("other settings would have changed");
  return next;
}

/**
 * Asks Codex itself to read pyro's entry back (`codex mcp get pyro --json`). Codex is
 * stricter than a TOML parser (types, known keys) and refuses to start on a config it
 * rejects, so when it does not read the entry as written, the file goes back to what it
 * was and connect fails.
 */
async function codexAccepts(
  ctx: HostContext,
  binary: string,
  path: string,
  original: { exists: boolean; text: string },
): Promise<void> {
  const r = await runHostCli(ctx, [binary, "mcp", "get", "pyro", "--json"], { check: false });
  let got: unknown;
  try {
    got = JSON.parse(r.stdout);
  } catch {
    got = null;
  }
  const transport = isObject(got) && isObject(got.transport) ? got.transport : null;
  if (r.exitCode === 0 && transport && typeof transport.command === "string") return;
  if (original.exists) await writeConfig(path, original.text, 0o600);
  else await rm(path, { force: true });
  // Codex's error and its causes, without its warnings and Rust backtrace.
  const said = r.stderr
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l && !/^(WARNING:|Caused by:$|Stack backtrace:$|\d+: |at )/.test(l))
    .map((l) => l.replace(/^Error: /, ""))
    .slice(0, 3)
    .join(" / ");
  throw new PyroError(
    "conflict",
    `Codex does not accept ${path} with pyro's entry${said ? ` (${said})` : ""}; the file is back as it was`,
    "run `codex mcp list` to see what Codex objects to, or add the entry by hand from `pyro host print-config codex`",
  );
}

function unsafe(why: string): PyroError {
  return new PyroError(
    "conflict",
    `cannot safely edit the Codex config: ${why}`,
    "add the entry by hand from `pyro host print-config codex`",
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

  desired(launch, existing) {
    const stored = existing?.settings ?? {};
    return {
      type: "stdio",
      command: launch.command,
      args: launch.args,
      env: existing?.env ?? {},
      enabled: true,
      settings: {
        tool_timeout_sec: atLeast(stored.tool_timeout_sec, CODEX_TOOL_TIMEOUT_SEC),
        startup_timeout_sec: atLeast(stored.startup_timeout_sec, CODEX_STARTUP_TIMEOUT_SEC),
      },
      raw: null,
    };
  },

  problems(entry) {
    const t = entry.settings?.tool_timeout_sec;
    if (typeof t === "number" && t >= CODEX_TOOL_TIMEOUT_SEC) return [];
    const now = t === undefined ? "not set (Codex's default is 60 s)" : `${JSON.stringify(t)}`;
    return [
      `tool_timeout_sec is ${now}: Codex would give up on a workspace_exec that may run ${EXEC_TIMEOUT_MAX_SECONDS} s; pyro sets ${CODEX_TOOL_TIMEOUT_SEC}`,
    ];
  },

  async writeEntry(ctx, desired, { binary }) {
    const path = codexConfigPath(ctx);
    const file = await loadToml(path);
    if (file.error) throw new PyroError("conflict", `cannot parse ${path}: ${file.error}`);
    const value = tomlValue(desired, desired.env, desired.settings ?? {});
    await writeConfig(path, setCodexEntry(file.text, value), 0o600);
    if (binary) await codexAccepts(ctx, binary, path, file);
    return "file";
  },

  async removeEntry(ctx) {
    const path = codexConfigPath(ctx);
    const file = await loadToml(path);
    if (file.error) throw new PyroError("conflict", `cannot parse ${path}: ${file.error}`);
    await writeConfig(path, removeCodexEntry(file.text), 0o600);
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
      snippet: tomlTable(["mcp_servers", launch.server_name], tomlValue(launch, {}, TIMEOUTS)).trimEnd(),
      // `codex mcp add` cannot set the timeouts, so there is no one-line alternative.
      cli_command: null,
    };
  },
};

export const codex = defineHost(driver);
