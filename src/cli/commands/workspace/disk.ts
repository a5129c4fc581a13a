import type { Command } from "commander";
import { exportDisk, listDisk, readDisk } from "../../../core/disk.js";
import { formatBytes } from "../../../util/fs.js";
import type { CliContext } from "../../main.js";
import { act } from "../../output.js";

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
        (r) =>
          r.entries
            .map(
              (e) =>
                `${e.artifact_type.padEnd(9)} ${String(e.size_bytes).padStart(10)}  ${e.path}${e.link_target ? ` -> ${e.link_target}` : ""}`,
            )
            .join("\n"),
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
        (r) => {
          const body = r.encoding === "base64" ? Buffer.from(r.content, "base64") : r.content;
          if (o.contentOnly) {
            ctx.io.stdout.write(body);
            return "";
          }
          return `${r.path} (${r.size_bytes} bytes${r.truncated ? ", truncated" : ""}${r.encoding === "base64" ? ", binary" : ""})\n${typeof body === "string" ? body : "(binary content; use --content-only or --json)"}`;
        },
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
        (r) => `exported ${r.artifact_type} ${r.path} to ${r.output_path} (${formatBytes(r.bytes)})`,
      );
    });
}
