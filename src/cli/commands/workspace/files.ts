import type { Command } from "commander";
import {
  applyPatch,
  diffWorkspace,
  exportFromWorkspace,
  listFiles,
  readFileFromWorkspace,
  readHostText,
  syncPush,
  writeFileToWorkspace,
} from "../../../core/files.js";
import { PyroError } from "../../../errors.js";
import { formatBytes } from "../../../util/fs.js";
import type { CliContext } from "../../main.js";
import { act } from "../../output.js";

/** A listing as `file list` and `disk list` print it: type, size, path (and link target). */
export function renderEntries(r: {
  entries: { artifact_type: string; size_bytes: number; path: string; link_target: string | null }[];
}): string {
  return r.entries
    .map(
      (e) =>
        `${e.artifact_type.padEnd(9)} ${String(e.size_bytes).padStart(10)}  ${e.path}${e.link_target ? ` -> ${e.link_target}` : ""}`,
    )
    .join("\n");
}

/** A file read as `file read` and `disk read` print it; with `contentOnly`, the bare bytes on stdout. */
export function renderRead(
  ctx: CliContext,
  r: { path: string; content: string; encoding: string; size_bytes: number; truncated: boolean },
  contentOnly: boolean,
): string {
  const body = r.encoding === "base64" ? Buffer.from(r.content, "base64") : r.content;
  if (contentOnly) {
    ctx.io.stdout.write(body);
    return "";
  }
  return `${r.path} (${r.size_bytes} bytes${r.truncated ? ", truncated" : ""}${r.encoding === "base64" ? ", binary" : ""})\n${typeof body === "string" ? body : "(binary content; use --content-only or --json)"}`;
}

/** An export as `export` and `disk export` print it. */
export function renderExport(r: {
  artifact_type: string;
  path: string;
  output_path: string;
  bytes: number;
}): string {
  return `exported ${r.artifact_type} ${r.path} to ${r.output_path} (${formatBytes(r.bytes)})`;
}

export function registerFiles(ws: Command, ctx: CliContext): void {
  const sync = ws.command("sync").description("copy host files into a workspace");
  sync
    .command("push")
    .description("copy a host file or directory into /workspace")
    .argument("<id>", "workspace id or name")
    .argument("<src>", "host file or directory")
    .option("--dest <path>", "destination directory in the workspace (default /workspace)")
    .option("--json", "print the structured result")
    .action(async (id: string, src: string, o: { dest?: string; json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () => syncPush(ctx.engine().workspaces, id, src, o.dest, ctx.signal),
        (r) => `pushed ${r.files} files (${formatBytes(r.bytes)}) to ${r.dest}`,
      );
    });

  const file = ws.command("file").description("structured file operations (no shell quoting)");
  file
    .command("list")
    .argument("<id>", "workspace id or name")
    .argument("[path]", "directory (default /workspace)", "/workspace")
    .option("--recursive", "descend into directories")
    .option("--json", "print the structured result")
    .action(async (id: string, path: string, o: { recursive?: boolean; json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () => listFiles(ctx.engine().workspaces, id, path, o.recursive === true),
        renderEntries,
      );
    });
  file
    .command("read")
    .argument("<id>", "workspace id or name")
    .argument("<path>", "file path")
    .option("--content-only", "print only the content")
    .option("--json", "print the structured result")
    .action(async (id: string, path: string, o: { contentOnly?: boolean; json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () => readFileFromWorkspace(ctx.engine().workspaces, id, path),
        (r) => renderRead(ctx, r, o.contentOnly === true),
      );
    });
  file
    .command("write")
    .argument("<id>", "workspace id or name")
    .argument("<path>", "file path (parent directories are created)")
    .option("--text <text>", "content")
    .option("--text-file <file>", "read the content from a host file")
    .option("--json", "print the structured result")
    .action(async (id: string, path: string, o: { text?: string; textFile?: string; json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        async () => {
          if ((o.text === undefined) === (o.textFile === undefined))
            throw new PyroError("invalid_argument", "pass exactly one of --text or --text-file");
          const content = o.text ?? (await readHostText(o.textFile!));
          return writeFileToWorkspace(ctx.engine().workspaces, id, path, content);
        },
        (r) => `${r.created ? "created" : "wrote"} ${r.path} (${r.size_bytes} bytes)`,
      );
    });

  const patch = ws
    .command("patch")
    .description("apply patches (unified diffs or the *** Begin Patch format)");
  patch
    .command("apply")
    .argument("<id>", "workspace id or name")
    .option("--patch <text>", "the patch: a unified diff (hunk line numbers optional) or *** Begin Patch")
    .option("--patch-file <file>", "read the patch from a host file")
    .option("--json", "print the structured result")
    .action(async (id: string, o: { patch?: string; patchFile?: string; json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        async () => {
          if ((o.patch === undefined) === (o.patchFile === undefined))
            throw new PyroError("invalid_argument", "pass exactly one of --patch or --patch-file");
          return applyPatch(ctx.engine().workspaces, id, o.patch ?? (await readHostText(o.patchFile!)));
        },
        (r) => (r.changed ? r.files.map((f) => `${f.status} ${f.path}`).join("\n") : "no changes"),
      );
    });

  ws.command("diff")
    .description("changes of /workspace against the baseline (or a snapshot)")
    .argument("<id>", "workspace id or name")
    .option("--snapshot <name>", "compare against this snapshot instead of the baseline")
    .option("--json", "print the structured result")
    .action(async (id: string, o: { snapshot?: string; json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () => diffWorkspace(ctx.engine().workspaces, id, o.snapshot ? { snapshot: o.snapshot } : {}),
        (r) => (r.changed ? r.patch : "no changes"),
      );
    });

  ws.command("export")
    .description("copy a file or directory out of /workspace to the host")
    .argument("<id>", "workspace id or name")
    .argument("<path>", "file or directory in the workspace")
    .requiredOption("--output <out>", "host path to write")
    .option("--json", "print the structured result")
    .action(async (id: string, path: string, o: { output: string; json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () => exportFromWorkspace(ctx.engine().workspaces, id, path, o.output, ctx.signal),
        renderExport,
      );
    });
}
