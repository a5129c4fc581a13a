import { homedir } from "node:os";
import { configValue } from "../core/config.js";
import { PyroError } from "../errors.js";
import { claudeCode } from "./claude-code.js";
import { codex } from "./codex.js";
import { genericConfig } from "./generic.js";
import {
  HOST_NAMES,
  type Host,
  type HostContext,
  type HostName,
  PRINT_TARGETS,
  type PrintedConfig,
  type PrintTarget,
} from "./host.js";
import type { LaunchCommand } from "./launch.js";
import { opencode } from "./opencode.js";

export * from "./host.js";
export * from "./launch.js";

const HOSTS: Record<HostName, Host> = { "claude-code": claudeCode, codex, opencode };

/** The host called `name`, or an invalid_argument error listing the known ones. */
export function getHost(name: string): Host {
  if (!(HOST_NAMES as readonly string[]).includes(name))
    throw new PyroError("invalid_argument", `unknown host '${name}'`, `hosts: ${HOST_NAMES.join(", ")}`);
  return HOSTS[name as HostName];
}

export function allHosts(): Host[] {
  return HOST_NAMES.map((n) => HOSTS[n]);
}

export function printConfig(target: string, launch: LaunchCommand, ctx?: HostContext): PrintedConfig {
  if (!(PRINT_TARGETS as readonly string[]).includes(target))
    throw new PyroError(
      "invalid_argument",
      `unknown target '${target}'`,
      `targets: ${PRINT_TARGETS.join(", ")}`,
    );
  if ((target as PrintTarget) === "generic") return genericConfig(launch);
  return getHost(target).printConfig(launch, ctx);
}

/** A HostContext from an environment: HOME from it (so tests can swap it), else the OS's. */
export function hostContext(
  env: NodeJS.ProcessEnv,
  options: { cwd?: string; signal?: AbortSignal } = {},
): HostContext {
  const ctx: HostContext = {
    env,
    home: env.HOME && env.HOME.length > 0 ? env.HOME : homedir(),
    cwd: options.cwd ?? process.cwd(),
  };
  if (options.signal) ctx.signal = options.signal;
  const t = configValue(env, "PYRO_HOST_TIMEOUT_SECONDS");
  if (t !== undefined) ctx.timeoutMs = t * 1000;
  return ctx;
}
