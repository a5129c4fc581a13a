import { spawnSync } from "node:child_process";
import { PassThrough } from "node:stream";
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

/**
 * Runs the CLI in this process through `main(argv, io)`, with captured output: the same
 * program as the binary, without a Node start per call. Use `pyro()` where the process
 * itself matters (signals, exit, PATH, stdin of a terminal).
 */
export async function cli(args: string[], env: NodeJS.ProcessEnv = {}): Promise<CliResult> {
  const { main } = await import("../../src/cli/main.js");
  const stdout = new PassThrough();
  const stderr = new PassThrough();
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  stdout.on("data", (c: Buffer) => out.push(c));
  stderr.on("data", (c: Buffer) => err.push(c));
  const code = await main(["node", "pyro", ...args], {
    stdout,
    stderr,
    stderrIsTTY: false,
    env: { PATH: process.env.PATH ?? "", ...env, PYRO_DEBUG: "" },
  });
  const text = Buffer.concat(out).toString("utf8");
  return { code, stdout: text, stderr: Buffer.concat(err).toString("utf8"), json: () => JSON.parse(text) };
}
