import type { Command } from "commander";
import type { CliContext } from "../../main.js";

type Register = (ws: Command, ctx: CliContext) => void;

/**
 * The workspace subcommands by module, in help order. A call imports only the module of
 * the subcommand it runs (each module's actions import the core they use, and `workspace
 * list` should not compile the shells' or the exports'); help, a bare `workspace` and an
 * unknown word load them all. tests/unit/cli/workspace-modules.test.ts checks the words
 * against what each module registers.
 */
export const WORKSPACE_MODULES: readonly { words: readonly string[]; load: () => Promise<Register> }[] = [
  {
    words: ["create", "list", "status", "update", "delete", "stop", "start"],
    load: async () => (await import("./lifecycle.js")).registerLifecycle,
  },
  { words: ["exec", "logs", "summary"], load: async () => (await import("./exec.js")).registerExec },
  {
    words: ["sync", "file", "patch", "diff", "export"],
    load: async () => (await import("./files.js")).registerFiles,
  },
  { words: ["reset", "snapshot"], load: async () => (await import("./snapshots.js")).registerSnapshots },
  { words: ["network"], load: async () => (await import("./network.js")).registerNetwork },
  { words: ["service"], load: async () => (await import("./services.js")).registerServices },
  { words: ["shell"], load: async () => (await import("./shells.js")).registerShells },
  { words: ["disk"], load: async () => (await import("./disk.js")).registerDisk },
  { words: ["commit"], load: async () => (await import("./commit.js")).registerCommit },
];

/** The subcommand word of `pyro ... workspace WORD ...`, or undefined. */
function subcommand(argv: string[]): string | undefined {
  const words = argv.slice(2).filter((a) => !a.startsWith("-"));
  return words[0] === "workspace" ? words[1] : undefined;
}

/** The workspace group's registration, with the modules `argv` needs loaded. */
export async function loadWorkspace(argv: string[]): Promise<(program: Command, ctx: CliContext) => void> {
  const word = subcommand(argv);
  const one = WORKSPACE_MODULES.find((m) => word !== undefined && m.words.includes(word));
  const registers = await Promise.all((one ? [one] : WORKSPACE_MODULES).map((m) => m.load()));
  return (program, ctx) => {
    const ws = program
      .command("workspace")
      .description("persistent workspaces: create, exec, edit, diff, export, reset, delete");
    for (const register of registers) register(ws, ctx);
  };
}
