import { Command, CommanderError } from "commander";
import { Engine } from "../core/engine.js";
import { EXIT_OK, EXIT_USAGE, PyroError } from "../core/errors.js";
import { registerDoctor } from "./commands/doctor.js";
import { registerEnv } from "./commands/env.js";
import { registerRun } from "./commands/run.js";
import { registerWorkspace } from "./commands/workspace/index.js";
import { type Io, reportError } from "./output.js";

/** What every command gets: its I/O, a lazily made engine, a cancellation signal. */
export interface CliContext {
  io: Io;
  engine: () => Engine;
  signal: AbortSignal;
  exitCode: number;
}

export function buildProgram(ctx: CliContext): Command {
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
  registerDoctor(program, ctx);
  registerEnv(program, ctx);
  registerRun(program, ctx);
  registerWorkspace(program, ctx);
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
    await buildProgram(ctx).parseAsync(argv);
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
