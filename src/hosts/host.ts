import type { LaunchCommand, ServeOptions } from "./launch.js";

/** Chat hosts `pyro host connect` knows how to configure. */
export const HOST_NAMES = ["claude-code", "codex", "opencode"] as const;
export type HostName = (typeof HOST_NAMES)[number];

/** Targets of `pyro host print-config`: the hosts plus any MCP client's `mcpServers` JSON. */
export const PRINT_TARGETS = [...HOST_NAMES, "generic"] as const;
export type PrintTarget = (typeof PRINT_TARGETS)[number];

/**
 * Where a host operation runs: the environment (HOME, XDG_CONFIG_HOME, PATH, the
 * PYRO_*_BIN overrides) comes from here, never from globals, so tests point it at a
 * temporary home.
 */
export interface HostContext {
  env: NodeJS.ProcessEnv;
  home: string;
  cwd: string;
  signal?: AbortSignal;
  /** Budget for one host-CLI call or one start probe (default 30 s). */
  timeoutMs?: number;
}

/** Whether the host's own CLI is here. */
export interface Detection {
  installed: boolean;
  /** Absolute path of the host CLI, when found. */
  binary: string | null;
  /** "env" when given by PYRO_<HOST>_BIN, "path" when found on PATH. */
  found_via: "env" | "path" | null;
  version: string | null;
  /** Why it counts as not installed (e.g. the env var names a missing file). */
  reason?: string;
}

/** A stdio MCP server entry as the host stores it, normalised across hosts. */
export interface ServerEntry {
  /** The host's transport word: "stdio" (Claude Code, Codex) or "local" (OpenCode). */
  type: string;
  command: string;
  args: string[];
  env: Record<string, string>;
  enabled: boolean;
  /**
   * Host-specific keys pyro writes beside the launch, as stored (Codex's
   * `tool_timeout_sec` and `startup_timeout_sec`); absent for hosts without any.
   */
  settings?: Record<string, unknown>;
  /** The entry exactly as stored, for --json. */
  raw: unknown;
}

/** The host's config as pyro sees it. */
export interface EntryRead {
  config_path: string;
  /** The file exists. */
  config_exists: boolean;
  /** Set when the file exists but cannot be parsed: pyro will not rewrite it. */
  parse_error?: string;
  entry: ServerEntry | null;
  /** Things worth knowing that are not faults (e.g. another scope shadows this one). */
  notes: string[];
}

/** Outcome of the start probe: the entry's command launched and spoke MCP. */
export interface StartProbe {
  starts: boolean;
  server_name?: string;
  server_version?: string;
  tool_count?: number;
  duration_ms: number;
  error?: string;
}

export type EntryStatus = "ok" | "missing" | "broken";

/** One row of `pyro host doctor`. */
export interface HostCheck {
  host: HostName;
  title: string;
  installed: boolean;
  binary: string | null;
  version: string | null;
  config_path: string;
  configured: boolean;
  status: EntryStatus;
  /** Faults that make the entry broken; empty when ok or missing. */
  problems: string[];
  notes: string[];
  command: string | null;
  args: string[] | null;
  /** null when there was nothing to start (missing entry, or a fault found first). */
  starts: boolean | null;
  start?: StartProbe;
  /** What to run (or do) about it; null when ok. */
  fix: string | null;
}

export type ConnectAction = "added" | "updated" | "unchanged";

export interface ConnectResult {
  host: HostName;
  action: ConnectAction;
  /** "cli" when the host's own CLI wrote the entry, "file" when pyro edited the config. */
  method: "cli" | "file" | "none";
  config_path: string;
  server_name: string;
  command: string;
  args: string[];
  /** The start probe after connecting; null with --no-verify. */
  starts: boolean | null;
  start?: StartProbe;
}

export interface DisconnectResult {
  host: HostName;
  /** True when an entry was removed; false when there was none (nothing was written). */
  changed: boolean;
  /** "cli" when the host's own CLI removed the entry, "file" when pyro edited the config. */
  method: "cli" | "file" | "none";
  config_path: string;
  server_name: string;
  /** E.g. a Claude Code local-scope entry that disconnect (user scope) leaves alone. */
  notes: string[];
}

export interface RepairResult {
  host: HostName;
  /** "repaired" when the entry was rewritten, "none" when it was already ok. */
  action: "repaired" | "none";
  before: HostCheck;
  after: HostCheck;
}

/** A copy-paste config for one target. */
export interface PrintedConfig {
  host: PrintTarget;
  server_name: string;
  command: string;
  args: string[];
  format: "json" | "toml";
  /** Where the snippet goes (a path with ~, or a description for generic clients). */
  config_location: string;
  snippet: string;
  /** The host-CLI command that adds the entry, when the host has one. */
  cli_command: string[] | null;
}

/**
 * The one interface every host implements. The per-host files supply detection, the
 * config reader/writer and the snippet; `defineHost` (ops.ts) builds connect, disconnect,
 * check and repair from them so that every host follows the same rules: idempotent, never
 * touches other servers, refuses to rewrite a file it cannot parse.
 */
export interface Host {
  name: HostName;
  title: string;
  detect(ctx: HostContext): Promise<Detection>;
  readEntry(ctx: HostContext): Promise<EntryRead>;
  connect(ctx: HostContext, launch: LaunchCommand, options?: { verify?: boolean }): Promise<ConnectResult>;
  /** Removes pyro's entry; idempotent (`changed: false` when there is none). */
  disconnect(ctx: HostContext): Promise<DisconnectResult>;
  check(ctx: HostContext, options?: { probe?: boolean }): Promise<HostCheck>;
  repair(
    ctx: HostContext,
    options?: { serve?: ServeOptions; force?: boolean; launch?: (o: ServeOptions) => LaunchCommand },
  ): Promise<RepairResult>;
  printConfig(launch: LaunchCommand, ctx?: HostContext): PrintedConfig;
}

/**
 * What a host file provides. `writeEntry` and `removeEntry` either drive the host's CLI
 * (when `binary` is set and the host's CLI keeps the rest of the file) or edit the
 * config file; `desired` is the entry connect wants to see.
 */
export interface HostDriver {
  name: HostName;
  title: string;
  /** Env var that names the host CLI, e.g. PYRO_CLAUDE_BIN. */
  binEnvVar: string;
  /** Executable name looked up on PATH. */
  binaryName: string;
  /** The transport word a healthy entry carries ("stdio", or OpenCode's "local"). */
  entryType: string;
  /** Arguments that print the CLI's version. */
  versionArgs: string[];
  readEntry(ctx: HostContext): Promise<EntryRead>;
  /**
   * The entry connect writes for a launch command. It keeps the old entry's env, and
   * any setting of the old entry that already satisfies pyro.
   */
  desired(launch: LaunchCommand, existing: ServerEntry | null): ServerEntry;
  /** Faults of a stored entry that only this host has (e.g. a tool timeout too short). */
  problems?(entry: ServerEntry): string[];
  writeEntry(
    ctx: HostContext,
    desired: ServerEntry,
    state: { binary: string | null; existing: ServerEntry | null },
  ): Promise<"cli" | "file">;
  /** Removes pyro's entry, which `readEntry` found; the same CLI-or-file rule as writeEntry. */
  removeEntry(
    ctx: HostContext,
    state: { binary: string | null; existing: ServerEntry },
  ): Promise<"cli" | "file">;
  printConfig(launch: LaunchCommand, ctx?: HostContext): PrintedConfig;
}
