import { exportDisk, listDisk, readDisk } from "../../core/disk.js";
import { refuseOverwrite } from "../host-paths.js";
import { defineTool, mutating, READ_ONLY } from "../tool.js";
import { defined } from "./common.js";
import { EXPORT_SHAPE, FILE_LIST_SHAPE, FILE_READ_SHAPE, renderFileList, renderFileRead } from "./files.js";

/**
 * The disk tools: a stopped workspace's files, read without starting it (core/disk.ts).
 * Same arguments, results and path refusals as the file tools; `conflict` while it runs.
 */

const STOPPED_ONLY =
  "Only for a STOPPED workspace (workspace_stop): it is not started, nothing in it runs or changes. On a running one it answers conflict: use the file tools there.";

export const workspaceDiskList = defineTool({
  name: "workspace_disk_list",
  title: "List a stopped workspace's files",
  description: `List the entries of a directory of a stopped workspace (default /workspace): path, artifact_type (file, directory, symlink), size_bytes and link_target, as workspace_file_list does. recursive: true walks the whole tree. ${STOPPED_ONLY}`,
  next: [["workspace_disk_read", "read a file"]],
  ...FILE_LIST_SHAPE,
  annotations: READ_ONLY,
  long: "reading the stopped workspace's disk",
  run: (a, ctx) => listDisk(ctx.ws, a.workspace_id, a.path ?? "/workspace", a.recursive === true),
  render: renderFileList,
});

export const workspaceDiskRead = defineTool({
  name: "workspace_disk_read",
  title: "Read a stopped workspace's file",
  description: `Read a file of a stopped workspace, as workspace_file_read does: text as is (encoding utf8), anything else base64. content_only: true makes the text part of the result the bare content. Reads over max_bytes (default 1 MiB) are cut (truncated: true). ${STOPPED_ONLY}`,
  ...FILE_READ_SHAPE,
  annotations: READ_ONLY,
  long: "reading the stopped workspace's disk",
  run: (a, ctx) => readDisk(ctx.ws, a.workspace_id, a.path, defined({ max_bytes: a.max_bytes })),
  render: renderFileRead,
});

export const workspaceDiskExport = defineTool({
  name: "workspace_disk_export",
  title: "Export from a stopped workspace",
  description: `Copy a file or directory of a stopped workspace to a path on the host, as workspace_export does (inside the server's project directory or a directory the user allowed; an existing file is replaced only with overwrite: true; a directory needs a new or empty output_path). ${STOPPED_ONLY}`,
  ...EXPORT_SHAPE,
  // It writes on the host, never in the workspace.
  annotations: mutating({ destructive: true, idempotent: true }),
  long: "exporting from the stopped workspace's disk",
  async run(a, ctx) {
    const output = await ctx.hostPath(a.output_path, "write");
    if (a.overwrite !== true) await refuseOverwrite(output, a.output_path);
    return exportDisk(ctx.ws, a.workspace_id, a.path, output, ctx.signal);
  },
  render: (r) => `exported ${r.path} to ${r.output_path} (${r.artifact_type}, ${r.bytes} bytes)`,
});
