import { spawnSync } from "node:child_process";
import { accessSync, constants } from "node:fs";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { delimiter, dirname, join } from "node:path";
import { launchCommand } from "../../src/hosts/launch.js";
import { probeStart } from "../../src/hosts/probe.js";
import { PYRO_BIN } from "./cli.js";

/**
 * The real chat-host CLIs (Claude Code, Codex, OpenCode), installed by
 * `scripts/install-hosts` into a cache outside the clone.
 */
export const HOSTS_DIR = process.env.PYRO_HOSTS_DIR || "/var/cache/pyro-ci/hosts";
export const HOSTS_BIN = join(HOSTS_DIR, "node_modules", ".bin");

function executable(p: string): boolean {
  try {
    accessSync(p, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

let serverReason: Promise<string> | undefined;

/**
 * Why the real-host suite for `cli` cannot run here, or "" when it can: the host CLI
 * must be installed, and `pyro mcp serve` must complete an MCP handshake (the hosts'
 * `mcp list` launch it).
 */
export async function realHostSkipReason(cli: "claude" | "codex" | "opencode"): Promise<string> {
  if (!executable(join(HOSTS_BIN, cli)))
    return `${cli} is not installed in ${HOSTS_DIR} (run scripts/install-hosts, or set PYRO_HOSTS_DIR)`;
  serverReason ??= (async () => {
    const dir = await mkdtemp(join(tmpdir(), "pyro-serve-probe-"));
    try {
      const env = { ...process.env, HOME: dir, PYRO_HOME: join(dir, "pyro"), PYRO_DEBUG: "" };
      const p = await probeStart(
        { ...launchCommand(), type: "stdio", env: {}, enabled: true, raw: null },
        { env, home: dir, cwd: dir, timeoutMs: 30_000 },
      );
      return p.starts ? "" : `\`pyro mcp serve\` does not start yet (${p.error ?? "unknown"})`;
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  })();
  return serverReason;
}

export interface Ran {
  code: number;
  stdout: string;
  stderr: string;
  /** stdout without ANSI colour codes (OpenCode colours even when piped). */
  plain: string;
  json: () => any;
}

/** A throwaway HOME for one suite, and runners for pyro and the host CLIs inside it. */
export interface HostHome {
  home: string;
  env: NodeJS.ProcessEnv;
  pyro(args: string[]): Ran;
  host(cli: "claude" | "codex" | "opencode", args: string[]): Ran;
  read(rel: string): Promise<string>;
  write(rel: string, text: string): Promise<void>;
  cleanup(): Promise<void>;
}

/** Variables that would point a host (or pyro) at the real user's config. */
const LEAKY = [
  "CLAUDE_CONFIG_DIR",
  "CODEX_HOME",
  "OPENCODE_CONFIG",
  "OPENCODE_CONFIG_DIR",
  "OPENCODE_CONFIG_CONTENT",
  "XDG_CONFIG_HOME",
  "XDG_DATA_HOME",
  "XDG_STATE_HOME",
  "XDG_CACHE_HOME",
  "PYRO_HOME",
  "PYRO_CLAUDE_BIN",
  "PYRO_CODEX_BIN",
  "PYRO_OPENCODE_BIN",
];

export async function hostHome(): Promise<HostHome> {
  const home = await mkdtemp(join(tmpdir(), "pyro-realhost-"));
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if (!LEAKY.includes(k)) env[k] = v;
  Object.assign(env, {
    HOME: home,
    XDG_CONFIG_HOME: join(home, ".config"),
    XDG_DATA_HOME: join(home, ".local", "share"),
    XDG_STATE_HOME: join(home, ".local", "state"),
    XDG_CACHE_HOME: join(home, ".cache"),
    PYRO_HOME: join(home, ".pyro"),
    PYRO_DEBUG: "",
    PATH: [HOSTS_BIN, dirname(process.execPath), process.env.PATH ?? ""].join(delimiter),
    // Configuration only: keep the hosts from updating themselves or fetching anything.
    DISABLE_AUTOUPDATER: "1",
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1",
    OPENCODE_DISABLE_AUTOUPDATE: "1",
    OPENCODE_DISABLE_MODELS_FETCH: "1",
    npm_config_offline: "true",
  });
  const spawn = (argv: string[]): Ran => {
    const r = spawnSync(argv[0]!, argv.slice(1), { env, cwd: home, encoding: "utf8", timeout: 120_000 });
    const stdout = r.stdout ?? "";
    return {
      code: r.status ?? -1,
      stdout,
      stderr: r.stderr ?? "",
      // biome-ignore lint/suspicious/noControlCharactersInRegex: ANSI escapes
      plain: stdout.replace(/\x1b\[[0-9;]*m/g, ""),
      json: () => JSON.parse(stdout),
    };
  };
  return {
    home,
    env,
    pyro: (args) => spawn([process.execPath, PYRO_BIN, ...args]),
    host: (cli, args) => spawn([join(HOSTS_BIN, cli), ...args]),
    read: (rel) => readFile(join(home, rel), "utf8"),
    write: (rel, text) => writeFile(join(home, rel), text),
    cleanup: () => rm(home, { recursive: true, force: true }),
  };
}

/** The line of a host's `mcp list` output that names `server`. */
export function listLine(output: string, server: string): string {
  return (
    output
      .split("\n")
      .find((l) => new RegExp(`(^|\\s)${server}(:|\\s)`).test(l) && !/^\s*Name\s/.test(l))
      ?.trim() ?? ""
  );
}
