import type { Command } from "commander";
import { exportDisk, listDisk, readDisk } from "../../../core/disk.js";
import type { CliContext } from "../../main.js";
import { act } from "../../output.js";
import { renderEntries, renderExport, renderRead } from "./files.js";

/**
 * `pyro workspace disk list|read|export`: a stopped workspace's files, read without
 * starting it (core/disk.ts); the output is the file commands'.
 */
export function registerDisk(ws: Command, ctx: CliContext): void {
  const disk = ws
    .command("disk")
    .description("read a STOPPED workspace's files without starting it (conflict while it runs)");
  disk
    .command("list")
    .argument("<id>", "workspace id or name")
    .argument("[path]", "directory (default /workspace)", "/workspace")
    .option("--recursive", "descend into directories")
    .option("--json", "print the structured result")
    .action(async (id: string, path: string, o: { recursive?: boolean; json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () => listDisk(ctx.engine().workspaces, id, path, o.recursive === true, ctx.signal),
        renderEntries,
      );
    });
  disk
    .command("read")
    .argument("<id>", "workspace id or name")
    .argument("<path>", "file path")
    .option("--content-only", "print only the content")
    .option("--json", "print the structured result")
    .action(async (id: string, path: string, o: { contentOnly?: boolean; json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () => readDisk(ctx.engine().workspaces, id, path, { signal: ctx.signal }),
        (r) => renderRead(ctx, r, o.contentOnly === true),
      );
    });
  disk
    .command("export")
    .description("copy a file or directory of a stopped workspace to the host")
    .argument("<id>", "workspace id or name")
    .argument("<path>", "file or directory in the workspace")
    .requiredOption("--output <out>", "host path to write")
    .option("--json", "print the structured result")
    .action(async (id: string, path: string, o: { output: string; json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () => exportDisk(ctx.engine().workspaces, id, path, o.output, ctx.signal),
        renderExport,
      );
    });
}
