import { basename, join } from "node:path";
import { PyroError } from "../errors.js";
import { stringRecord } from "./claude-code.js";
import { isObject, type JsonObject, type LoadedFile, writeConfig } from "./files.js";
import type { EntryRead, HostContext, HostDriver, ServerEntry } from "./host.js";
import { loadJsonc, setJsonMember } from "./jsonc.js";
import type { LaunchCommand } from "./launch.js";
import { defineHost } from "./ops.js";

/**
 * OpenCode reads its global config from `$XDG_CONFIG_HOME/opencode/` (default
 * `~/.config/opencode/`): `opencode.json`, then `opencode.jsonc` merged over it, both
 * JSONC (comments and trailing commas allowed). MCP servers live under `mcp`, a local
 * one as `{type: "local", command: [argv...], environment?, enabled?}`. Its
 * `opencode mcp add` is an interactive wizard, so pyro always edits the file, as text,
 * keeping comments.
 */
export function opencodeConfigDir(ctx: HostContext): string {
  const xdg = ctx.env.XDG_CONFIG_HOME;
  return join(xdg && xdg.length > 0 ? xdg : join(ctx.home, ".config"), "opencode");
}

/** The files pyro reads, in the order OpenCode merges them (the later one wins). */
export const OPENCODE_FILES = ["opencode.json", "opencode.jsonc"] as const;

/** `opencode.json`: where a new entry goes unless only `opencode.jsonc` exists. */
export function opencodeConfigPath(ctx: HostContext): string {
  return join(opencodeConfigDir(ctx), "opencode.json");
}

type Loaded = LoadedFile<JsonObject>;

function pyroIn(file: Loaded): unknown {
  const servers = file.data.mcp;
  return isObject(servers) && Object.hasOwn(servers, "pyro") ? servers.pyro : undefined;
}

async function loadConfigs(ctx: HostContext): Promise<[Loaded, Loaded]> {
  const dir = opencodeConfigDir(ctx);
  const [json, jsonc] = await Promise.all(OPENCODE_FILES.map((f) => loadJsonc(join(dir, f))));
  return [json as Loaded, jsonc as Loaded];
}

/**
 * The file that holds the pyro entry OpenCode uses (opencode.jsonc's when both have
 * one), else the file a new one goes in: opencode.jsonc when it is the only file.
 */
function entryFile(json: Loaded, jsonc: Loaded): Loaded {
  if (pyroIn(jsonc) !== undefined) return jsonc;
  if (pyroIn(json) !== undefined) return json;
  return jsonc.exists && !json.exists ? jsonc : json;
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
const HINT = "add the entry by hand from `pyro host print-config opencode`";

const driver: HostDriver = {
  name: "opencode",
  title: "OpenCode",
  binEnvVar: "PYRO_OPENCODE_BIN",
  binaryName: "opencode",
  entryType: "local",
  versionArgs: ["--version"],

  async readEntry(ctx): Promise<EntryRead> {
    const [json, jsonc] = await loadConfigs(ctx);
    const broken = [json, jsonc].find((f) => f.error);
    if (broken)
      return {
        config_path: broken.path,
        config_exists: true,
        parse_error: broken.error,
        entry: null,
        notes: [],
      };
    const file = entryFile(json, jsonc);
    const notes: string[] = [];
    if (json.exists && jsonc.exists)
      notes.push(
        `OpenCode merges opencode.json and opencode.jsonc (opencode.jsonc wins); pyro's entry is in ${basename(file.path)}`,
      );
    if (pyroIn(json) !== undefined && pyroIn(jsonc) !== undefined)
      notes.push(
        "opencode.json holds a pyro entry too, merged under opencode.jsonc's; `pyro host disconnect opencode` removes both",
      );
    const raw = pyroIn(file);
    return {
      config_path: file.path,
      config_exists: file.exists,
      entry: raw === undefined ? null : opencodeEntry(raw),
      notes,
    };
  },

  desired(launch, existing) {
    return {
      type: "local",
      command: launch.command,
      args: launch.args,
      env: existing?.env ?? {},
      enabled: true,
      raw: null,
    };
  },

  async writeEntry(ctx, desired) {
    const file = entryFile(...(await loadConfigs(ctx)));
    if (file.error) throw new PyroError("conflict", `cannot parse ${file.path}: ${file.error}`);
    const next = setJsonMember(file.text, ["mcp", "pyro"], jsonEntry(desired, desired.env), {
      newDocument: { $schema: SCHEMA },
      hint: HINT,
    });
    await writeConfig(file.path, next, 0o644);
    return "file";
  },

  async removeEntry(ctx) {
    for (const file of await loadConfigs(ctx)) {
      if (pyroIn(file) === undefined) continue;
      await writeConfig(
        file.path,
        setJsonMember(file.text, ["mcp", "pyro"], undefined, { hint: HINT }),
        0o644,
      );
    }
    return "file";
  },

  printConfig(launch: LaunchCommand) {
    return {
      host: "opencode",
      server_name: launch.server_name,
      command: launch.command,
      args: launch.args,
      format: "json",
      config_location: "~/.config/opencode/opencode.json or opencode.jsonc (or either at a project's root)",
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
