import { z } from "zod";
import {
  applyPatch,
  diffWorkspace,
  exportFromWorkspace,
  listFiles,
  readFileFromWorkspace,
  syncPush,
  writeFileToWorkspace,
} from "../../core/files.js";
import { refuseOverwrite } from "../host-paths.js";
import {
  byteBoundedString,
  changeEntry,
  diffSummary,
  fileEntry,
  hostPathArg,
  hostPathNote,
  INPUT_LIMITS,
  snapshotArg,
  workspaceIdArg,
  workspacePathArg,
} from "../schemas.js";
import { defineTool, mutating, READ_ONLY } from "../tool.js";
import { defined } from "./common.js";

const count = z.number().int().min(0);

/** Arguments and result of a directory listing: workspace_file_list and workspace_disk_list. */
export const FILE_LIST_SHAPE = {
  input: z.strictObject({
    workspace_id: workspaceIdArg,
    path: workspacePathArg.optional().describe("Directory inside the workspace (default /workspace)."),
    recursive: z.boolean().optional().describe("List the whole tree below path (default false)."),
  }),
  output: z.looseObject({
    workspace_id: z.string(),
    path: z.string(),
    entries: z.array(fileEntry),
    truncated: z.boolean(),
  }),
};

/** Arguments and result of a file read: workspace_file_read and workspace_disk_read. */
export const FILE_READ_SHAPE = {
  input: z.strictObject({
    workspace_id: workspaceIdArg,
    path: workspacePathArg,
    content_only: z
      .boolean()
      .optional()
      .describe("Return only the file content as text, without a header line (default false)."),
    max_bytes: z
      .number()
      .int()
      .min(0)
      .max(16 * 1024 * 1024)
      .optional()
      .describe("Read at most this many bytes (default 1 MiB)."),
  }),
  output: z.looseObject({
    workspace_id: z.string(),
    path: z.string(),
    content: z.string(),
    encoding: z.enum(["utf8", "base64", "stream"]),
    size_bytes: count,
    truncated: z.boolean(),
  }),
};

/** Arguments and result of an export to the host: workspace_export and workspace_disk_export. */
export const EXPORT_SHAPE = {
  input: z.strictObject({
    workspace_id: workspaceIdArg,
    path: workspacePathArg.describe("File or directory inside the workspace to export."),
    output_path: hostPathArg.describe(`Where to write it on the host. ${hostPathNote}`),
    overwrite: z
      .boolean()
      .optional()
      .describe("Replace an existing file at output_path (default false: an existing one is a conflict)."),
  }),
  output: z.looseObject({
    workspace_id: z.string(),
    path: z.string(),
    output_path: z.string(),
    artifact_type: z.enum(["file", "directory"]),
    bytes: count,
    entries: count,
  }),
};

type FileList = z.infer<(typeof FILE_LIST_SHAPE)["output"]>;
type FileRead = z.infer<(typeof FILE_READ_SHAPE)["output"]>;

export function renderFileList(r: FileList): string {
  return [
    `${r.path}: ${r.entries.length} entr${r.entries.length === 1 ? "y" : "ies"}${r.truncated ? " (listing truncated)" : ""}`,
    ...r.entries.map((e) => {
      if (e.artifact_type === "directory") return `${e.path}/`;
      if (e.artifact_type === "symlink") return `${e.path} -> ${e.link_target ?? "?"}`;
      return `${e.path} (${e.size_bytes} bytes)`;
    }),
  ].join("\n");
}

export function renderFileRead(r: FileRead, a: { content_only?: boolean | undefined }): string {
  return a.content_only
    ? r.content
    : `${r.path} (${r.size_bytes} bytes, ${r.encoding}${r.truncated ? ", truncated" : ""}):\n${r.content}`;
}

export const workspaceFileList = defineTool({
  name: "workspace_file_list",
  title: "List files",
  description:
    "List the entries of a directory in the workspace (default /workspace): path, artifact_type (file, directory, symlink), size_bytes and link_target. recursive: true walks the whole tree. Use it to find your way around before reading files.",
  next: [["workspace_file_read", "read a file"]],
  ...FILE_LIST_SHAPE,
  annotations: READ_ONLY,
  run: (a, ctx) => listFiles(ctx.ws, a.workspace_id, a.path ?? "/workspace", a.recursive === true),
  render: renderFileList,
});

export const workspaceFileRead = defineTool({
  name: "workspace_file_read",
  title: "Read a file",
  description:
    "Read a file from the workspace. Text comes back as is (encoding utf8), anything else base64 (encoding base64). content_only: true makes the text part of the result the bare content, with no header. Reads over max_bytes (default 1 MiB) are cut (truncated: true).",
  next: [
    ["workspace_patch_apply", "change it"],
    ["workspace_file_write", "replace it"],
  ],
  ...FILE_READ_SHAPE,
  annotations: READ_ONLY,
  run: (a, ctx) => readFileFromWorkspace(ctx.ws, a.workspace_id, a.path, defined({ max_bytes: a.max_bytes })),
  render: renderFileRead,
});

export const workspaceFileWrite = defineTool({
  name: "workspace_file_write",
  title: "Write a file",
  description:
    "Create or replace a file in the workspace with the given text (parent directories are created). Use it for new files or full rewrites; for a targeted change to an existing file, workspace_patch_apply is safer (it refuses to apply to content it did not expect).",
  next: [
    ["workspace_exec", "rerun the check"],
    ["workspace_diff", "review the change"],
  ],
  input: z.strictObject({
    workspace_id: workspaceIdArg,
    path: workspacePathArg,
    text: byteBoundedString(INPUT_LIMITS.textBytes, "text", 0, true).describe(
      "The complete new content of the file (UTF-8; at most 16 MiB: write bigger files with workspace_sync_push).",
    ),
  }),
  output: z.looseObject({
    workspace_id: z.string(),
    path: z.string(),
    size_bytes: count,
    created: z.boolean(),
  }),
  annotations: mutating({ destructive: true, idempotent: true }),
  run: (a, ctx) => writeFileToWorkspace(ctx.ws, a.workspace_id, a.path, a.text),
  render: (r) => `${r.created ? "created" : "replaced"} ${r.path} (${r.size_bytes} bytes)`,
});

export const workspacePatchApply = defineTool({
  name: "workspace_patch_apply",
  title: "Apply a patch",
  description:
    "Apply a patch to the workspace: a unified diff (git style or plain; several files at once; paths relative to /workspace, a/ and b/ prefixes accepted; hunk line numbers optional: a bare @@ hunk is located by its context, which must then appear exactly once) or the *** Begin Patch / *** Update File: / *** Add File: / *** Delete File: / *** Move to: / *** End Patch format. All or nothing: if any hunk does not apply, no file changes and the error (patch_rejected) names the file, the hunk and the line not found; read the file again and retry with correct context. Files can be added, modified, deleted and renamed. changed is false when the patch leaves every file as it was.",
  next: [
    ["workspace_exec", "rerun the failing command"],
    ["workspace_diff", "review all changes"],
  ],
  input: z.strictObject({
    workspace_id: workspaceIdArg,
    patch: byteBoundedString(INPUT_LIMITS.patchBytes, "patch", 1, true).describe(
      "The patch text: a unified diff, e.g. '--- a/calc.py\\n+++ b/calc.py\\n@@\\n def add(a, b):\\n-    return a - b\\n+    return a + b\\n', or '*** Begin Patch\\n*** Update File: calc.py\\n@@\\n...\\n*** End Patch'.",
    ),
  }),
  output: z.looseObject({ workspace_id: z.string(), changed: z.boolean(), files: z.array(changeEntry) }),
  annotations: mutating({ destructive: true, idempotent: false }),
  run: (a, ctx) => applyPatch(ctx.ws, a.workspace_id, a.patch),
  render: (r) =>
    r.changed
      ? `patched ${r.files.map((f) => `${f.status} ${f.path}`).join(", ")}`
      : "the patch changed nothing",
});

export const workspaceDiff = defineTool({
  name: "workspace_diff",
  title: "Diff against the baseline",
  description:
    "The changes in /workspace against the baseline (the seed) or a named snapshot: a unified diff (patch), a summary {total, added, modified, deleted} and one entry per changed path. Use it to review your work before exporting or reporting; workspace_reset throws the changes away.",
  next: [
    ["workspace_export", "take the changed files out"],
    ["workspace_reset", "start over from the baseline"],
  ],
  input: z.strictObject({ workspace_id: workspaceIdArg, snapshot: snapshotArg.optional() }),
  output: z.looseObject({
    workspace_id: z.string(),
    base_snapshot: z.string(),
    changed: z.boolean(),
    patch: z.string(),
    summary: diffSummary,
    entries: z.array(changeEntry),
    truncated: z.boolean(),
  }),
  annotations: READ_ONLY,
  run: (a, ctx) => diffWorkspace(ctx.ws, a.workspace_id, defined({ snapshot: a.snapshot })),
  render: (r) =>
    r.changed
      ? `${r.summary.total} changed file(s) against ${r.base_snapshot} (${r.summary.added} added, ${r.summary.modified} modified, ${r.summary.deleted} deleted)${r.truncated ? "; patch truncated" : ""}\n${r.patch}`
      : `no changes against ${r.base_snapshot}`,
});

export const workspaceExport = defineTool({
  name: "workspace_export",
  title: "Export to the host",
  description:
    "Copy a file or directory out of the workspace to a path on the host, inside the server's project directory (or a directory the user allowed). An existing file at output_path is replaced only with overwrite: true; a directory needs a new or empty output_path. The only way results leave a workspace. Exports are recorded in workspace_summary.",
  ...EXPORT_SHAPE,
  annotations: mutating({ destructive: true, idempotent: true }),
  long: "exporting",
  async run(a, ctx) {
    const output = await ctx.hostPath(a.output_path, "write");
    if (a.overwrite !== true) await refuseOverwrite(output, a.output_path);
    return exportFromWorkspace(ctx.ws, a.workspace_id, a.path, output, ctx.signal);
  },
  render: (r) =>
    `exported ${r.artifact_type} ${r.path} to ${r.output_path} (${r.bytes} bytes, ${r.entries} entr${r.entries === 1 ? "y" : "ies"})`,
});

export const workspaceSyncPush = defineTool({
  name: "workspace_sync_push",
  title: "Copy from the host",
  description:
    "Copy a file or directory from the host into the workspace (into /workspace, or dest). Use it to bring in files created after the workspace was seeded, or data the seed did not contain; existing files with the same names are replaced.",
  next: [["workspace_exec", "use the files"]],
  input: z.strictObject({
    workspace_id: workspaceIdArg,
    source_path: hostPathArg.describe(`File or directory on the host. ${hostPathNote}`),
    dest: workspacePathArg
      .optional()
      .describe("Directory inside the workspace to copy into (default /workspace)."),
  }),
  output: z.looseObject({
    workspace_id: z.string(),
    source: z.string(),
    dest: z.string(),
    files: count,
    bytes: count,
  }),
  annotations: mutating({ destructive: true, idempotent: true }),
  long: "copying into the workspace",
  async run(a, ctx) {
    const source = await ctx.hostPath(a.source_path, "read");
    return syncPush(ctx.ws, a.workspace_id, source, a.dest ?? "/workspace", ctx.signal);
  },
  render: (r) => `copied ${r.source} into ${r.dest} (${r.files} file(s), ${r.bytes} bytes)`,
});
