import { stat } from "node:fs/promises";
import { join, resolve } from "node:path";
import type { Command } from "commander";
import { debugEnabled, resolvePaths } from "../../core/config.js";
import { SERVE_POOL_SIZE } from "../../core/pool.js";
import { EXIT_OK, PyroError, toPyroError } from "../../errors.js";
import { parseHttpAddress, serveHttp } from "../../mcp/http.js";
import { MODE_NAMES, PROFILE_NAMES, toolSet } from "../../mcp/profiles.js";
import { defaultSeed, prefetch } from "../../mcp/seed.js";
import { CallTracker, createServer } from "../../mcp/server.js";
import { LineTransport } from "../../mcp/stdio.js";
import { Pyro } from "../../sdk/pyro.js";
import type { CliContext } from "../main.js";
import { reportError } from "../output.js";

interface ServeFlags {
  profile?: string;
  mode?: string;
  projectPath?: string;
  repoUrl?: string;
  repoRef?: string;
  http?: string;
  allowHostCompat?: boolean;
  allowHostPath: string[];
}

/** How long a shutdown waits for calls in flight (they are cancelled first). */
const DRAIN_MS = 10_000;

/**
 * How long a stdio server may go on after its host closed stdin: the drain, closing the
 * engine, then the process's natural end. Past it, whatever still holds the event loop
 * is named on stderr and the process exits (a host waits for its server to go).
 */
const EXIT_GRACE_MS = DRAIN_MS + 10_000;

/** Ends this process if it is still alive EXIT_GRACE_MS from now, naming what kept it. */
function exitWatchdog(stderr: NodeJS.WritableStream): void {
  setTimeout(() => {
    const open = process.getActiveResourcesInfo().filter((r) => r !== "Timeout");
    stderr.write(
      `pyro mcp: still running ${EXIT_GRACE_MS / 1000} s after the host closed stdin; ending it (still open: ${open.join(", ") || "nothing"})\n`,
    );
    process.exit(typeof process.exitCode === "number" ? process.exitCode : 0);
  }, EXIT_GRACE_MS).unref();
}

/** `pyro mcp serve`: the product entrypoint that MCP hosts launch. */
export function registerMcp(program: Command, ctx: CliContext): void {
  const mcp = program
    .command("mcp")
    .description("the MCP server for chat hosts (Claude Code, Codex, OpenCode, any MCP client)");
  mcp
    .command("serve")
    .description(
      "serve pyro's tools over MCP: stdio by default (what hosts launch), or Streamable HTTP on loopback",
    )
    .option("--profile <name>", `tool profile: ${PROFILE_NAMES.join(", ")} (default workspace-core)`)
    .option("--mode <name>", `curated tool set for one workflow: ${MODE_NAMES.join(", ")}`)
    .option(
      "--project-path <path>",
      "default seed for workspace_create (for hosts that do not start the server in the project)",
    )
    .option("--repo-url <url>", "default seed: a clean clone of this repository, made once per server")
    .option("--repo-ref <ref>", "branch, tag or commit for --repo-url")
    .option(
      "--http <host:port>",
      "serve Streamable HTTP on loopback at http://HOST:PORT/mcp instead of stdio (port 0: a free one)",
    )
    .option("--allow-host-compat", "allow the host backend (no isolation) for creates and runs")
    .option(
      "--allow-host-path <dir>",
      "let tool arguments (seed_path, source_path, output_path) name this host directory too, besides the project (repeatable)",
      (dir: string, all: string[]) => [...all, dir],
      [] as string[],
    )
    .action(async (o: ServeFlags) => {
      ctx.exitCode = await serve(ctx, o);
    });
}

async function serve(ctx: CliContext, o: ServeFlags): Promise<number> {
  const log = debugEnabled(ctx.io.env)
    ? (line: string) => ctx.io.stderr.write(`pyro mcp: ${line}\n`)
    : () => {};
  let cleanup = async () => {};
  try {
    const set = toolSet({
      ...(o.profile ? { profile: o.profile } : {}),
      ...(o.mode ? { mode: o.mode } : {}),
    });
    const address = o.http !== undefined ? parseHttpAddress(o.http) : undefined;
    const cwd = process.cwd();
    const seed = await defaultSeed({
      projectPath: o.projectPath,
      repoUrl: o.repoUrl,
      repoRef: o.repoRef,
      cwd,
      reposDir: join(resolvePaths({ env: ctx.io.env }).home, "repos"),
    });
    const allowHostPaths = await allowedDirs(cwd, o.allowHostPath);
    prefetch(seed);
    // A started sandbox ready for the first create (PYRO_POOL=0 turns it off).
    const pyro = new Pyro({ env: ctx.io.env, poolDefault: SERVE_POOL_SIZE });
    const shutdown = new AbortController();
    const calls = new CallTracker();
    cleanup = async () => {
      shutdown.abort();
      await calls.drain(DRAIN_MS);
      await pyro.close();
      await seed.close();
    };
    const newServer = () =>
      createServer(pyro, {
        profile: o.profile,
        mode: o.mode,
        seed,
        allowHostCompat: o.allowHostCompat === true,
        baseDir: o.projectPath !== undefined ? resolve(cwd, o.projectPath) : cwd,
        allowHostPaths,
        shutdown: shutdown.signal,
        calls,
        log,
      });
    const what = `${set.kind} ${set.name} (${set.tools.length} tools), default seed: ${seed.describe()}`;
    if (o.allowHostCompat)
      ctx.io.stderr.write(
        "pyro mcp: warning: --allow-host-compat: creates may run on the host without isolation\n",
      );

    if (address) {
      const endpoint = await serveHttp(newServer, address);
      // The address is the one thing a user of --http needs (port 0 picks it): always shown.
      ctx.io.stderr.write(`pyro mcp: serving ${what} at ${endpoint.url}\n`);
      await aborted(ctx.signal);
      await endpoint.close();
    } else {
      const server = newServer();
      const transport = new LineTransport(process.stdin, ctx.io.stdout);
      const ended = new Promise<void>((done) => {
        // The stdio transport does not watch for EOF: a host closing our stdin is the end.
        process.stdin.once("end", done);
        process.stdin.once("close", done);
        server.server.onclose = () => done();
        ctx.signal.addEventListener("abort", () => done(), { once: true });
      });
      await server.connect(transport);
      log(`serving ${what} on stdio`);
      await ended;
      exitWatchdog(ctx.io.stderr);
      await server.close();
    }
    return EXIT_OK;
  } catch (err) {
    return reportError(ctx.io, {}, toPyroError(err));
  } finally {
    await cleanup();
  }
}

/** The --allow-host-path directories, absolute; each must exist and be a directory. */
async function allowedDirs(cwd: string, dirs: readonly string[]): Promise<string[]> {
  const out: string[] = [];
  for (const d of dirs) {
    if (d.includes("\0"))
      throw new PyroError("invalid_argument", "--allow-host-path cannot contain a NUL byte");
    const abs = resolve(cwd, d);
    if (!(await stat(abs).catch(() => null))?.isDirectory())
      throw new PyroError("invalid_argument", `--allow-host-path ${abs} is not a directory`);
    out.push(abs);
  }
  return out;
}

function aborted(signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((done) => signal.addEventListener("abort", () => done(), { once: true }));
}
