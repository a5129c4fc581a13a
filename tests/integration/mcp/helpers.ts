import { spawn } from "node:child_process";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { PYRO_BIN } from "../../helpers/cli.js";
import { git as gitIn, makeGitRepo } from "../../helpers/git.js";

/** A tiny Python project whose test fails until calc.add adds (the demo's project). */
export const PYTHON_PROJECT: Record<string, string> = {
  "calc.py": "def add(a, b):\n    return a - b\n",
  "test_calc.py":
    "from calc import add\n\nassert add(2, 3) == 5, 'add(2, 3) should be 5'\nprint('tests passed')\n",
  "README.md": "# calc\n",
};
export const PYTHON_FIX = [
  "--- a/calc.py",
  "+++ b/calc.py",
  "@@ -1,2 +1,2 @@",
  " def add(a, b):",
  "-    return a - b",
  "+    return a + b",
  "",
].join("\n");
/** `-B`: the fix has the bug's size, and Python would trust a same-second stale .pyc. */
export const RUN_TESTS = "python3 -B test_calc.py";

/** Runs git in `cwd` (tests/helpers/git.ts), its output trimmed. */
export function git(cwd: string, ...args: string[]): string {
  return gitIn(cwd, ...args).trim();
}

/** Makes `dir` a Git checkout of the Python project (one commit) plus an untracked file. */
export async function pythonCheckout(dir: string): Promise<{ commit: string }> {
  const { commit } = await makeGitRepo(dir, PYTHON_PROJECT, "calc with a bug");
  // Untracked and not ignored: a Git seed copies it too, as `git add -A` would see it.
  await writeFile(join(dir, "scratch.txt"), "not tracked\n");
  return { commit };
}

export interface StdioServer {
  client: Client;
  transport: StdioClientTransport;
  /** What the server wrote on stderr so far. */
  stderr(): string;
  /** Calls a tool; a failed call throws with its error object. */
  ok(name: string, args?: Record<string, unknown>): Promise<any>;
  call(name: string, args?: Record<string, unknown>): Promise<CallToolResult>;
  close(): Promise<void>;
}

/** Launches `node bin/pyro.js mcp serve ARGS` as a host would and connects an MCP client over stdio. */
export async function launchStdio(options: {
  cwd: string;
  env: NodeJS.ProcessEnv;
  args?: string[];
  /** The launcher to run (default: this checkout's bin/pyro.js). */
  bin?: string;
}): Promise<StdioServer> {
  const env = Object.fromEntries(
    Object.entries({ ...process.env, PYRO_DEBUG: "", ...options.env }).filter(
      (e): e is [string, string] => e[1] !== undefined,
    ),
  );
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [options.bin ?? PYRO_BIN, "mcp", "serve", ...(options.args ?? [])],
    cwd: options.cwd,
    env,
    stderr: "pipe",
  });
  let err = "";
  transport.stderr?.on("data", (c: Buffer) => {
    err += c.toString("utf8");
  });
  const client = new Client({ name: "pyro-integration", version: "0.0.0" });
  await client.connect(transport);
  await client.listTools();
  const call = (name: string, args: Record<string, unknown> = {}) =>
    client.callTool({ name, arguments: args }, undefined, { timeout: 300_000 }) as Promise<CallToolResult>;
  return {
    client,
    transport,
    stderr: () => err,
    call,
    ok: async (name, args) => {
      const r = await call(name, args);
      if (r.isError)
        throw new Error(`${name} failed: ${JSON.stringify(r.structuredContent)}; server stderr: ${err}`);
      return r.structuredContent;
    },
    close: () => client.close(),
  };
}

/** Runs a command to completion, capturing its output (for the third-party client). */
export function runProcess(
  argv: string[],
  options: { cwd: string; env: NodeJS.ProcessEnv; timeoutMs?: number },
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(argv[0]!, argv.slice(1), {
      cwd: options.cwd,
      env: options.env,
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (c: Buffer) => {
      stdout += c.toString("utf8");
    });
    child.stderr.on("data", (c: Buffer) => {
      stderr += c.toString("utf8");
    });
    const timer = setTimeout(() => child.kill("SIGKILL"), options.timeoutMs ?? 120_000);
    child.on("error", reject);
    child.on("close", (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

export function median(values: number[]): number {
  const s = [...values].sort((a, b) => a - b);
  const mid = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2;
}
