import { homedir } from "node:os";
import { join, resolve } from "node:path";
import { PyroError } from "../errors.js";

/**
 * pyro's configuration: every `PYRO_*` environment variable it reads, declared once
 * with a reader and a description (docs/configuration.md is checked against this table).
 * Precedence: an explicit option (CLI flag, SDK/engine option), then the variable, then
 * the default. This module is the only place in src/ that reads a `PYRO_*` variable
 * (tests/unit/core/config.test.ts scans for others); everything below core gets the
 * values passed in (backends through the registry's BackendSettings, environment builds
 * through their options). The guest agent (src/agent) reads its own PYRO_AGENT_DEBUG:
 * it runs inside the sandbox, where this module does not exist.
 *
 * The readers keep the meaning each variable had before it was declared here: an empty
 * value counts as unset except for the paths and PYRO_BACKEND (as `??` always treated
 * them), and a PYRO_HOST_TIMEOUT_SECONDS that is not a positive number is ignored.
 * They are plain functions, not zod schemas: every CLI command reads this module, and
 * zod's classic build was ~135 ms of a `workspace list`'s CPU to import (issue 18).
 */

/** Most spares a pool keeps per environment (core/pool.ts). */
export const MAX_POOL = 4;

/** A string where an empty value means "not set". */
const optionalString = (v: string): string | undefined => (v === "" ? undefined : v);
const string = (v: string): string => v;

/** One declared variable: how its text is read, what it means, what applies when unset. */
interface ConfigVar<T> {
  read: (raw: string) => T;
  description: string;
  /** The default in words (documentation); `-` when unset means "not used". */
  default: string;
}

function declare<T>(v: ConfigVar<T>): ConfigVar<T> {
  return v;
}

export const CONFIG_VARS = {
  PYRO_HOME: declare({
    read: string,
    description: "Where pyro keeps its state (state.db, workspaces, probe scratch). SDK option `home`.",
    default: "`$XDG_CACHE_HOME/pyro`, else `~/.cache/pyro`",
  }),
  PYRO_ENV_CACHE: declare({
    read: string,
    description:
      "The environment cache (root filesystems, .debs). Separate so that several homes (tests, CI) share one expensive cache. SDK option `environmentsDir`.",
    default: "`$PYRO_HOME/environments`",
  }),
  PYRO_BACKEND: declare({
    // Checked where it is used (an unknown name, even an empty one, is invalid_argument).
    read: string,
    description:
      "Backend for new workspaces and one-shot runs when none is asked for (`--backend`, `backend` argument win). `host` still needs --allow-host-compat.",
    default: "the strongest isolating backend that works here (`pyro doctor`)",
  }),
  PYRO_DEBUG: declare({
    read: (v) => v !== "" && v !== "0" && v !== "false",
    description: "Stack traces and debug logs on stderr (any value but empty, `0` or `false`).",
    default: "off",
  }),
  PYRO_DEBIAN_MIRROR: declare({
    read: optionalString,
    description: "Debian mirror for environment builds (debootstrap). SDK option `mirror`.",
    default: "the mirror of the host's apt sources, else http://deb.debian.org/debian",
  }),
  PYRO_REGISTRY_AUTH: declare({
    read: optionalString,
    description:
      "Credentials for OCI registries (`pyro env pull`): `HOST=USER:PASSWORD` entries separated by commas, or one `USER:PASSWORD` for every registry. Never stored or logged.",
    default: "the `auths` of `$DOCKER_CONFIG/config.json` (default `~/.docker/config.json`), else anonymous",
  }),
  PYRO_SECRET_KEY_FILE: declare({
    read: optionalString,
    description:
      "The file holding the key that encrypts workspace secrets (made 0600 on first use); nothing else is consulted when set.",
    default:
      "the Secret Service keyring when it answers, else `$XDG_CONFIG_HOME/pyro/secrets.key` (`~/.config/pyro/secrets.key`)",
  }),
  PYRO_FIRECRACKER_BIN: declare({
    read: optionalString,
    description: "The firecracker binary (a path, or a name looked up on PATH).",
    default: "`firecracker` on PATH",
  }),
  PYRO_POOL: declare({
    read: (v) => {
      const n = Number(v);
      return v.trim() !== "" && Number.isInteger(n) && n >= 0 ? Math.min(n, MAX_POOL) : undefined;
    },
    description:
      "Started sandboxes (bwrap, gVisor, docker) kept ready per environment for new workspaces, and a bwrap one-shot launch prepared after each run for the next (docs/backends.md, pool and prepared launch); 0 turns both off, at most 4, anything else is ignored. SDK option `pool`.",
    default: "1 for `pyro mcp serve`, else 0",
  }),
  PYRO_CLAUDE_BIN: declare({
    read: optionalString,
    description: "The Claude Code CLI used by `pyro host` (must exist when set).",
    default: "`claude` on PATH",
  }),
  PYRO_CODEX_BIN: declare({
    read: optionalString,
    description: "The Codex CLI used by `pyro host` (must exist when set).",
    default: "`codex` on PATH",
  }),
  PYRO_OPENCODE_BIN: declare({
    read: optionalString,
    description: "The OpenCode CLI used by `pyro host` (must exist when set).",
    default: "`opencode` on PATH",
  }),
  PYRO_HOST_TIMEOUT_SECONDS: declare({
    read: (v) => {
      const t = Number(v);
      return Number.isFinite(t) && t > 0 ? t : undefined;
    },
    description:
      "Time limit in seconds for each host CLI `pyro host` runs (a value that is not a positive number is ignored).",
    default: "each call's own limit",
  }),
} as const;

export type ConfigVarName = keyof typeof CONFIG_VARS;
type ValueOf<N extends ConfigVarName> = ReturnType<(typeof CONFIG_VARS)[N]["read"]>;

/**
 * The value of one declared variable in `env` (undefined when unset), read through its
 * reader. The one reader of `PYRO_*` variables in src/.
 */
export function configValue<N extends ConfigVarName>(
  env: NodeJS.ProcessEnv,
  name: N,
): ValueOf<N> | undefined {
  const raw = env[name];
  if (raw === undefined) return undefined;
  return CONFIG_VARS[name].read(raw) as ValueOf<N>;
}

/** The host CLI override of a `pyro host` driver (PYRO_CLAUDE_BIN, PYRO_CODEX_BIN, PYRO_OPENCODE_BIN). */
export function hostBinOverride(env: NodeJS.ProcessEnv, name: string): string | undefined {
  if (name !== "PYRO_CLAUDE_BIN" && name !== "PYRO_CODEX_BIN" && name !== "PYRO_OPENCODE_BIN")
    throw new Error(`${name} is not a declared host CLI variable (src/core/config.ts)`);
  return configValue(env, name);
}

/**
 * Where pyro keeps its files. Precedence: explicit option, then environment variable,
 * then default.
 *
 * - `home`: PYRO_HOME, default `$XDG_CACHE_HOME/pyro` or `~/.cache/pyro`.
 * - `environmentsDir`: PYRO_ENV_CACHE, default `<home>/environments`. Separate so that
 *   several homes (tests, CI) can share one expensive environment cache.
 */
export interface PyroPaths {
  home: string;
  environmentsDir: string;
  debCacheDir: string;
}

export interface PathOptions {
  home?: string;
  environmentsDir?: string;
  env?: NodeJS.ProcessEnv;
}

export function resolvePaths(options: PathOptions = {}): PyroPaths {
  const env = options.env ?? process.env;
  const home = resolve(options.home ?? configValue(env, "PYRO_HOME") ?? defaultHome(env));
  const environmentsDir = resolve(
    options.environmentsDir ?? configValue(env, "PYRO_ENV_CACHE") ?? join(home, "environments"),
  );
  return { home, environmentsDir, debCacheDir: join(environmentsDir, ".debs") };
}

function defaultHome(env: NodeJS.ProcessEnv): string {
  const base =
    env.XDG_CACHE_HOME && env.XDG_CACHE_HOME.length > 0 ? env.XDG_CACHE_HOME : join(homedir(), ".cache");
  return join(base, "pyro");
}

/** True when PYRO_DEBUG asks for stack traces and debug logs on stderr. */
export function debugEnabled(env: NodeJS.ProcessEnv = process.env): boolean {
  return configValue(env, "PYRO_DEBUG") ?? false;
}

/** What an engine is configured with: its paths and the values it hands to the floors below. */
export interface PyroConfig {
  paths: PyroPaths;
  /** PYRO_BACKEND: the backend asked for when a call names none (checked when used). */
  backend: string | undefined;
  /** Engine option `mirror`, then PYRO_DEBIAN_MIRROR. */
  debianMirror: string | undefined;
  /** PYRO_FIRECRACKER_BIN. */
  firecrackerBin: string | undefined;
  /** PYRO_REGISTRY_AUTH (a secret: never logged). */
  registryAuth: string | undefined;
  /** Option `pool`, then PYRO_POOL, then option `poolDefault`, then 0: spares per environment. */
  pool: number;
}

export interface ConfigOptions extends PathOptions {
  /** Debian mirror for environment builds (default: PYRO_DEBIAN_MIRROR, else the host's apt mirror). */
  mirror?: string;
  /** Started sandboxes kept ready per environment (core/pool.ts); default PYRO_POOL, else `poolDefault`. */
  pool?: number;
  /** The pool's size when neither `pool` nor PYRO_POOL says (`pyro mcp serve`: 1; default 0). */
  poolDefault?: number;
}

/** The engine's configuration: option → environment variable → default. */
export function loadConfig(options: ConfigOptions = {}): PyroConfig {
  const env = options.env ?? process.env;
  for (const [key, v] of [
    ["pool", options.pool],
    ["poolDefault", options.poolDefault],
  ] as const) {
    if (v !== undefined && !(Number.isInteger(v) && v >= 0 && v <= MAX_POOL))
      throw new PyroError(
        "invalid_argument",
        `${key} must be a whole number from 0 to ${MAX_POOL}`,
        "0 turns the pool off",
      );
  }
  return {
    paths: resolvePaths({ ...options, env }),
    backend: configValue(env, "PYRO_BACKEND"),
    debianMirror: options.mirror ?? configValue(env, "PYRO_DEBIAN_MIRROR"),
    firecrackerBin: configValue(env, "PYRO_FIRECRACKER_BIN"),
    registryAuth: configValue(env, "PYRO_REGISTRY_AUTH"),
    pool: Math.min(options.pool ?? configValue(env, "PYRO_POOL") ?? options.poolDefault ?? 0, MAX_POOL),
  };
}

/**
 * The Markdown table of every variable (docs/configuration.md holds it verbatim; a unit
 * test fails when the two differ). Print it with
 * `node --input-type=module -e 'console.log((await import("./dist/core/config.js")).configTable())'`.
 */
export function configTable(): string {
  const cell = (s: string) => s.replace(/\|/g, "\\|");
  return [
    "| variable | meaning | default |",
    "| --- | --- | --- |",
    ...Object.entries(CONFIG_VARS).map(
      ([name, v]) => `| \`${name}\` | ${cell(v.description)} | ${cell(v.default)} |`,
    ),
  ].join("\n");
}
