import { createRequire } from "node:module";
import type { Command } from "commander";
import type { Engine } from "../core/engine.js";
import { EXIT_OK, EXIT_USAGE, PyroError, toPyroError } from "../errors.js";
import type { Io } from "./output.js";

type Register = (program: Command, ctx: CliContext) => void;
/** Loads a group's registration; `argv` lets a group load only the subcommand it runs. */
type Loader = (argv: string[]) => Promise<Register>;

/**
 * Command groups, loaded on demand: a CLI call imports only the group it runs (the MCP
 * server and host onramps pull in the MCP SDK, ~300 ms of module loading that
 * `workspace exec` should not pay). Help and unknown commands load every group.
 */
const GROUPS: Record<string, Loader> = {
  doctor: async () => (await import("./commands/doctor.js")).registerDoctor,
  env: async () => (await import("./commands/env.js")).registerEnv,
  host: async () => (await import("./commands/host.js")).registerHost,
  run: async () => (await import("./commands/run.js")).registerRun,
  workspace: async (argv) => (await import("./commands/workspace/index.js")).loadWorkspace(argv),
  mcp: async () => (await import("./commands/mcp.js")).registerMcp,
};
const ALIASES: Record<string, string> = { demo: "run", prepare: "run" };

/** The groups an argv needs: the first word that is not an option, or all of them. */
async function loadGroups(argv: string[]): Promise<Register[]> {
  const first = argv.slice(2).find((a) => !a.startsWith("-"));
  if (!first && (argv.includes("--version") || argv.includes("-V"))) return [];
  const name = first ? (ALIASES[first] ?? first) : undefined;
  const wanted = name && GROUPS[name] ? [GROUPS[name]] : Object.values(GROUPS);
  return Promise.all(wanted.map((load) => load(argv)));
}

/** What every command gets: its I/O, a lazily made engine, a cancellation signal. */
export interface CliContext {
  io: Io;
  /** The engine; its module is imported before any action runs, unless the command is `light`. */
  engine: () => Engine;
  /** The engine for a `light` command, which must import the core first. */
  loadEngine: () => Promise<Engine>;
  /**
   * Marks a command whose action does not need the engine up front (it calls loadEngine
   * when it does): the core's module graph is most of a start (issue 18).
   */
  light: (command: Command) => Command;
  signal: AbortSignal;
  exitCode: number;
}

type Commander = typeof import("commander");

export function buildProgram(
  ctx: CliContext,
  groups: Register[],
  { Command }: Pick<Commander, "Command">,
  /** Runs before a command's action (imports the core unless the command is light). */
  beforeAction: (action: Command) => Promise<void> = async () => {},
): Command {
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
  program.hook("preAction", (_program, action) => beforeAction(action));
  for (const register of groups) register(program, ctx);
  return program;
}

const PACKAGE_VERSION = "0.1.0";
/**
 * The context commands get, and `loadCore`, run before an action (buildProgram's hook).
 * The core (the workspace service, environment builders, the agent client: most of a
 * start's module loading) is imported there, not for --version, --help or a `light`
 * command, which imports what it needs itself.
 */
function cliContext(io: Io, signal: AbortSignal) {
  let engine: Engine | undefined;
  let EngineClass: typeof Engine | undefined;
  const lightCommands = new WeakSet<Command>();
  const importEngine = async () => {
    EngineClass ??= (await import("../core/engine.js")).Engine;
  };
  const ctx: CliContext = {
    io,
    engine: () => {
      if (!EngineClass) throw new PyroError("internal", "the engine was used before it was loaded");
      engine ??= new EngineClass({ env: io.env });
      return engine;
    },
    loadEngine: async () => {
      await importEngine();
      return ctx.engine();
    },
    light: (command) => {
      lightCommands.add(command);
      return command;
    },
    signal,
    exitCode: EXIT_OK,
  };
  return {
    ctx,
    loadCore: async (command: Command) => (lightCommands.has(command) ? undefined : importEngine()),
    closeEngine: async () => engine?.close(),
  };
}

/** How long a cancelled CLI process may take to stop before it is ended. */
const FORCED_EXIT_MS = 10_000;

/** The CLI entry point; returns the exit code instead of calling process.exit. */
export async function main(argv: string[], io?: Partial<Io>): Promise<number> {
  // `pyro --version` answers before anything is imported (commander, the output module
  // and its config schemas are most of a start): it is what a user times first.
  if (argv.length === 3 && (argv[2] === "--version" || argv[2] === "-V")) {
    (io?.stdout ?? process.stdout).write(`${PACKAGE_VERSION}\n`);
    return EXIT_OK;
  }
  // Required, not imported: an `import` of a CommonJS package first parses its source for
  // the names it exports (~20 ms of every command's start, issue 18).
  const commander = createRequire(import.meta.url)("commander") as Commander;
  const { reportError } = await import("./output.js");
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
  let forced: NodeJS.Timeout | undefined;
  const onSignal = (signal: NodeJS.Signals) => {
    abort.abort();
    // A real process that does not end after its work was cancelled is ended: a signal
    // must never be ignored (in-process callers, such as tests, manage their own life).
    if (!io && !forced) {
      forced = setTimeout(() => {
        fullIo.stderr.write(`pyro: cancelled (${signal}); the operation did not stop in time\n`);
        process.exit(128 + (signal === "SIGINT" ? 2 : 15));
      }, FORCED_EXIT_MS);
      forced.unref();
    }
  };
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  const groups = await loadGroups(argv);
  const { ctx, loadCore, closeEngine } = cliContext(fullIo, abort.signal);
  const wantsJson = argv.includes("--json");
  if (argv.length <= 2) {
    // Bare `pyro`: the help, which is what was asked for, not a usage error.
    buildProgram(ctx, groups, commander, loadCore).outputHelp();
    return EXIT_OK;
  }
  try {
    await buildProgram(ctx, groups, commander, loadCore).parseAsync(argv);
    return ctx.exitCode;
  } catch (err) {
    if (err instanceof commander.CommanderError) {
      if (err.exitCode === 0) return EXIT_OK; // --help, --version
      const message = err.message.replace(/^error:\s*/, "");
      return reportError(
        fullIo,
        { json: wantsJson },
        new PyroError("invalid_argument", message, "run `pyro --help` for usage"),
        EXIT_USAGE,
      );
    }
    // An option parser's refusal (`--vcpus abc`) is a usage error; anything else that
    // escaped a command is rendered like every other error, never as a stack trace.
    if (err instanceof PyroError && err.code === "invalid_argument")
      return reportError(fullIo, { json: wantsJson }, err, EXIT_USAGE);
    return reportError(fullIo, { json: wantsJson }, toPyroError(err));
  } finally {
    await closeEngine();
    process.removeListener("SIGINT", onSignal);
    process.removeListener("SIGTERM", onSignal);
  }
}
