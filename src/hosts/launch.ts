import { isAbsolute, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { PyroError } from "../errors.js";
import { MODE_NAMES, PROFILE_NAMES } from "../mcp/profiles.js";

/** The name every host's config knows pyro by. */
export const SERVER_NAME = "pyro";

/**
 * Profile and mode names `pyro mcp serve` accepts: the MCP server's own lists. Checked
 * here so that `host connect --profile typo` fails at once instead of leaving a host
 * entry that never starts.
 */
export const SERVE_PROFILES: readonly string[] = PROFILE_NAMES;
export const SERVE_MODES: readonly string[] = MODE_NAMES;

/** The `pyro mcp serve` options a host entry carries (snake_case like every result). */
export interface ServeOptions {
  mode?: string;
  profile?: string;
  project_path?: string;
  repo_url?: string;
  repo_ref?: string;
  allow_host_compat?: boolean;
}

/** What a host runs to start pyro: an argv, never a shell string. */
export interface LaunchCommand {
  server_name: string;
  command: string;
  args: string[];
}

/**
 * This package's `bin/pyro.js`, by absolute path. Both `src/hosts/launch.ts` (tests)
 * and `dist/hosts/launch.js` (the built CLI) sit two levels below the package root.
 */
export function pyroBinPath(): string {
  return fileURLToPath(new URL("../../bin/pyro.js", import.meta.url));
}

/**
 * The launch command hosts get: this Node (`process.execPath`) running this package's
 * `bin/pyro.js`, both by absolute path, so the entry works without a global install,
 * without PATH, and keeps working whatever Node version manager the host's shell uses.
 */
export function launchCommand(
  options: ServeOptions = {},
  where: { execPath?: string; binPath?: string } = {},
): LaunchCommand {
  return {
    server_name: SERVER_NAME,
    command: where.execPath ?? process.execPath,
    args: [where.binPath ?? pyroBinPath(), "mcp", "serve", ...serveArgs(options)],
  };
}

/** Validates serve options and renders them as `pyro mcp serve` flags. */
export function serveArgs(options: ServeOptions): string[] {
  const o = normaliseServeOptions(options);
  const args: string[] = [];
  if (o.mode !== undefined) args.push("--mode", o.mode);
  if (o.profile !== undefined) args.push("--profile", o.profile);
  if (o.project_path !== undefined) args.push("--project-path", o.project_path);
  if (o.repo_url !== undefined) args.push("--repo-url", o.repo_url);
  if (o.repo_ref !== undefined) args.push("--repo-ref", o.repo_ref);
  if (o.allow_host_compat) args.push("--allow-host-compat");
  return args;
}

/**
 * Checks the combinations `pyro mcp serve` allows and makes `project_path` absolute
 * (a host starts servers from a cwd of its own choosing).
 */
export function normaliseServeOptions(options: ServeOptions, cwd = process.cwd()): ServeOptions {
  const o: ServeOptions = {};
  if (options.mode !== undefined) {
    if (!SERVE_MODES.includes(options.mode))
      throw new PyroError(
        "invalid_argument",
        `unknown mode '${options.mode}'`,
        `modes: ${SERVE_MODES.join(", ")}`,
      );
    o.mode = options.mode;
  }
  if (options.profile !== undefined) {
    if (!SERVE_PROFILES.includes(options.profile))
      throw new PyroError(
        "invalid_argument",
        `unknown profile '${options.profile}'`,
        `profiles: ${SERVE_PROFILES.join(", ")}`,
      );
    o.profile = options.profile;
  }
  if (o.mode !== undefined && o.profile !== undefined)
    throw new PyroError("invalid_argument", "--mode and --profile are mutually exclusive");
  if (options.project_path !== undefined && options.repo_url !== undefined)
    throw new PyroError("invalid_argument", "--project-path and --repo-url are mutually exclusive");
  if (options.repo_ref !== undefined && options.repo_url === undefined)
    throw new PyroError("invalid_argument", "--repo-ref needs --repo-url");
  if (options.project_path !== undefined)
    o.project_path = isAbsolute(options.project_path)
      ? options.project_path
      : resolve(cwd, options.project_path);
  if (options.repo_url !== undefined) o.repo_url = options.repo_url;
  if (options.repo_ref !== undefined) o.repo_ref = options.repo_ref;
  if (options.allow_host_compat) o.allow_host_compat = true;
  return o;
}

/** What an existing entry's argv says about the pyro it launches. */
export interface ParsedLaunch {
  /** The `.js` launcher before `mcp serve` (absolute path), or null (e.g. a `pyro` on PATH). */
  launcher: string | null;
  /** True when the argv runs `mcp serve`. */
  serves: boolean;
  /** The serve options recovered from the argv; unknown flags are dropped. */
  options: ServeOptions;
}

/**
 * Reads back a host entry's command + args, so that `host repair` keeps a user's
 * `--profile` or `--project-path` when it rewrites a broken entry.
 */
export function parseLaunch(command: string, args: readonly string[]): ParsedLaunch {
  const argv = [command, ...args];
  const at = argv.findIndex((a, i) => a === "mcp" && argv[i + 1] === "serve");
  if (at < 0) return { launcher: null, serves: false, options: {} };
  const before = argv.slice(0, at);
  const launcher = [...before].reverse().find((a) => /\.[cm]?js$/.test(a)) ?? null;
  const options: ServeOptions = {};
  const rest = argv.slice(at + 2);
  for (let i = 0; i < rest.length; i++) {
    const flag = rest[i];
    const value = rest[i + 1];
    const take = (): string | undefined => {
      if (value === undefined || value.startsWith("--")) return undefined;
      i++;
      return value;
    };
    switch (flag) {
      case "--mode":
        options.mode = take();
        break;
      case "--profile":
        options.profile = take();
        break;
      case "--project-path":
        options.project_path = take();
        break;
      case "--repo-url":
        options.repo_url = take();
        break;
      case "--repo-ref":
        options.repo_ref = take();
        break;
      case "--allow-host-compat":
        options.allow_host_compat = true;
        break;
      default:
        break;
    }
  }
  for (const k of Object.keys(options) as (keyof ServeOptions)[])
    if (options[k] === undefined) delete options[k];
  return { launcher, serves: true, options };
}

/** Quotes an argv for a POSIX shell, for the copy-paste lines in print-config and docs. */
export function shellJoin(argv: readonly string[]): string {
  return argv
    .map((w) => (/^[A-Za-z0-9_@%+=:,./-]+$/.test(w) ? w : `'${w.replace(/'/g, `'\\''`)}'`))
    .join(" ");
}
