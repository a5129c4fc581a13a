import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";

export const REPO_ROOT = fileURLToPath(new URL("../..", import.meta.url));
export const PYRO_BIN = `${REPO_ROOT}bin/pyro.js`;

export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
  json: () => any;
}

/** Runs the built CLI (`npm test` builds first) as a user would, in a child process. */
export function pyro(args: string[], env: NodeJS.ProcessEnv = {}, timeoutMs = 120_000): CliResult {
  const r = spawnSync(process.execPath, [PYRO_BIN, ...args], {
    env: { ...process.env, PYRO_DEBUG: "", ...env },
    encoding: "utf8",
    timeout: timeoutMs,
  });
  return {
    code: r.status ?? -1,
    stdout: r.stdout,
    stderr: r.stderr,
    json: () => JSON.parse(r.stdout),
  };
}

export const isRoot = process.getuid?.() === 0;
