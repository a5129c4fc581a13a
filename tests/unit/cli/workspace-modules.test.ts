import { Command } from "commander";
import { describe, expect, it } from "vitest";
import { loadWorkspace, WORKSPACE_MODULES } from "../../../src/cli/commands/workspace/index.js";
import type { CliContext } from "../../../src/cli/main.js";

/**
 * `pyro workspace WORD` imports only the module WORKSPACE_MODULES names for WORD (issue
 * 18): a word missing from the table would load every module, and a word listed under
 * the wrong module would leave its command unregistered (an unknown-command error).
 */
const ctx = { light: (c: Command) => c } as unknown as CliContext;

function registered(register: (ws: Command, ctx: CliContext) => void): string[] {
  const ws = new Command("workspace");
  register(ws, ctx);
  return ws.commands.map((c) => c.name());
}

describe("the workspace subcommand table", () => {
  it("lists, for each module, exactly the subcommands it registers, in order", async () => {
    for (const m of WORKSPACE_MODULES) expect(registered(await m.load())).toEqual(m.words);
  });

  it("names each subcommand once", () => {
    const words = WORKSPACE_MODULES.flatMap((m) => m.words);
    expect(new Set(words).size).toBe(words.length);
  });

  it("registers only the named subcommand's module, and every module for help", async () => {
    const program = (argv: string[]) => {
      const p = new Command("pyro");
      return loadWorkspace(argv).then((register) => {
        register(p, ctx);
        return p.commands[0]!.commands.map((c) => c.name());
      });
    };
    expect(await program(["node", "pyro", "workspace", "list", "--json"])).toEqual(
      WORKSPACE_MODULES[0]!.words,
    );
    expect(await program(["node", "pyro", "workspace", "shell", "open", "x"])).toEqual(["shell"]);
    const all = WORKSPACE_MODULES.flatMap((m) => m.words);
    expect(await program(["node", "pyro", "workspace", "--help"])).toEqual(all);
    expect(await program(["node", "pyro", "workspace", "nope"])).toEqual(all);
  });
});
