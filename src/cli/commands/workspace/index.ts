import type { Command } from "commander";
import type { CliContext } from "../../main.js";
import { registerCommit } from "./commit.js";
import { registerDisk } from "./disk.js";
import { registerExec } from "./exec.js";
import { registerFiles } from "./files.js";
import { registerLifecycle } from "./lifecycle.js";
import { registerNetwork } from "./network.js";
import { registerServices } from "./services.js";
import { registerShells } from "./shells.js";
import { registerSnapshots } from "./snapshots.js";

export function registerWorkspace(program: Command, ctx: CliContext): void {
  const ws = program
    .command("workspace")
    .description("persistent workspaces: create, exec, edit, diff, export, reset, delete");
  registerLifecycle(ws, ctx);
  registerExec(ws, ctx);
  registerFiles(ws, ctx);
  registerSnapshots(ws, ctx);
  registerNetwork(ws, ctx);
  registerServices(ws, ctx);
  registerShells(ws, ctx);
  registerDisk(ws, ctx);
  registerCommit(ws, ctx);
}
