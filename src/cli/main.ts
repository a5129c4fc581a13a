import { Command, CommanderError } from "commander";
import { Engine } from "../core/engine.js";
import { EXIT_OK, EXIT_USAGE, PyroError } from "../core/errors.js";
import { type Io, reportError } from "./output.js";

type Register = (program: Command, ctx: CliContext) => void;

/**
 * Command groups, loaded on demand: a CLI call imports only the group it runs (the MCP
 * server and host onramps pull in the MCP SDK, ~300 ms of module loading that
 * `workspace exec` should not pay). Help and unknown commands load every group.
 */
const GROUPS: Record<string, () => Promise<Register>> = {
  doctor: async () => (await import("./commands/doctor.js")).registerDoctor,
  env: async () => (await import("./commands/env.js")).registerEnv,
  host: async () => (await import("./commands/host.js")).registerHost,
  run: async () => (await import("./commands/run.js")).registerRun,
  workspace: async () => (await import("./commands/workspace/index.js")).registerWorkspace,
  mcp: async () => (await import("./commands/mcp.js")).registerMcp,
};
const ALIASES: Record<string, string> = { demo: "run", prepare: "run" };

/** The groups an argv needs: the first word that is not an option, or all of them. */
async function loadGroups(argv: string[]): Promise<Register[]> {
  const first = argv.slice(2).find((a) => !a.startsWith("-"));
  if (!first && (argv.includes("--version") || argv.includes("-V"))) return [];
  const name = first ? (ALIASES[first] ?? first) : undefined;
  const wanted = name && GROUPS[name] ? [GROUPS[name]] : Object.values(GROUPS);
  return Promise.all(wanted.map((load) => load()));
}

/** What every command gets: its I/O, a lazily made engine, a cancellation signal. */
export interface CliContext {
  io: Io;
  engine: () => Engine;
  signal: AbortSignal;
  exitCode: number;
}

export function buildProgram(ctx: CliContext, groups: Register[]): Command {
  const program = new Command("pyro")
    .description("Disposable, isolated Linux workspaces for coding agents")
    .version(PACKAGE_VERSION, "-V, --version")
    .showSuggestionAfterError()
    .exitOverride()
    .configureOutput({
      writeOut: (s) => ctx.io.stdout.write(s),
      writeErr: (s) => ctx.io.stderr.write(s),
      // Usage errors are rendered by main() as one line (or JSON): silence commander's own.
      outputError: () => {},
    });
  for (const register of groups) register(program, ctx);
  return program;
}

const PACKAGE_VERSION = "0.1.0";

/** The CLI entry point; returns the exit code instead of calling process.exit. */
export async function main(argv: string[], io?: Partial<Io>): Promise<number> {
  const fullIo: Io = {
    stdout: io?.stdout ?? process.stdout,
    stderr: io?.stderr ?? process.stderr,
    stderrIsTTY: io?.stderrIsTTY ?? process.stderr.isTTY === true,
    env: io?.env ?? process.env,
  };
  // Piped stdin goes to the commands that run (exec, run); a terminal's does not.
  const stdin = io ? io.stdin : process.stdin.isTTY ? undefined : process.stdin;
  if (stdin) fullIo.stdin = stdin;
  const abort = new AbortController();
  const onSignal = () => abort.abort();
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  let engine: Engine | undefined;
  const ctx: CliContext = {
    io: fullIo,
    engine: () => {
      engine ??= new Engine({ env: fullIo.env });
      return engine;
    },
    signal: abort.signal,
    exitCode: EXIT_OK,
  };
  const wantsJson = argv.includes("--json");
  try {
    await buildProgram(ctx, await loadGroups(argv)).parseAsync(argv);
    return ctx.exitCode;
  } catch (err) {
    if (err instanceof CommanderError) {
      if (err.exitCode === 0) return EXIT_OK; // --help, --version
      const message = err.message.replace(/^error:\s*/, "");
      return reportError(
        fullIo,
        { json: wantsJson },
        new PyroError("invalid_argument", message, "run `pyro --help` for usage"),
        EXIT_USAGE,
      );
    }
    throw err;
  } finally {
    await engine?.close();
    process.removeListener("SIGINT", onSignal);
    process.removeListener("SIGTERM", onSignal);
  }
}
