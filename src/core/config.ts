import { homedir } from "node:os";
import { join, resolve } from "node:path";

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
  const home = resolve(options.home ?? env.PYRO_HOME ?? defaultHome(env));
  const environmentsDir = resolve(
    options.environmentsDir ?? env.PYRO_ENV_CACHE ?? join(home, "environments"),
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
  const v = env.PYRO_DEBUG;
  return v !== undefined && v !== "" && v !== "0" && v !== "false";
}
