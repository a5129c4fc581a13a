import { z } from "zod";
import { createSnapshot, deleteSnapshot, listSnapshots, resetWorkspace } from "../../core/snapshots.js";
import { snapshotArg, snapshotObject, workspaceIdArg, workspaceShape } from "../schemas.js";
import { defineTool, mutating, READ_ONLY } from "../tool.js";
import { defined, renderWorkspace } from "./common.js";

const snapshotNameArg = z
  .string()
  .min(1)
  .max(63)
  .describe("Snapshot name: letters, digits, '.', '_', '-' ('baseline' is the seed and is reserved).");

export const workspaceReset = defineTool({
  name: "workspace_reset",
  title: "Reset workspace",
  description:
    "Restore /workspace exactly to the baseline (the seed), or to a named snapshot: every change since is discarded, deletions included, every process is stopped and the system root is fresh again (packages installed since are gone). Use it to retry from a clean state after an experiment; export anything you want to keep first. reset_count counts resets.",
  next: [["workspace_exec", "reproduce again from the clean state"]],
  input: z.strictObject({ workspace_id: workspaceIdArg, snapshot: snapshotArg.optional() }),
  output: z.looseObject({
    ...workspaceShape,
    workspace_reset: z.looseObject({ snapshot_name: z.string(), duration_ms: z.number().min(0) }),
  }),
  annotations: mutating({ destructive: true, idempotent: true }),
  long: "resetting the workspace",
  run: (a, ctx) => resetWorkspace(ctx.ws, a.workspace_id, defined({ snapshot: a.snapshot })),
  render: (r) =>
    `reset to ${r.workspace_reset.snapshot_name} in ${r.workspace_reset.duration_ms} ms\n${renderWorkspace(r)}`,
});

export const snapshotCreate = defineTool({
  name: "snapshot_create",
  title: "Checkpoint (snapshot) a workspace",
  description:
    "Save the current content of /workspace as a named snapshot (a checkpoint). Later, workspace_reset with snapshot returns to it exactly, and workspace_diff with snapshot compares against it. Use it before a risky experiment or between evaluation rounds.",
  next: [
    ["workspace_reset", "return to the checkpoint"],
    ["workspace_diff", "compare against it"],
  ],
  input: z.strictObject({ workspace_id: workspaceIdArg, snapshot_name: snapshotNameArg }),
  output: snapshotObject,
  annotations: mutating({ destructive: false, idempotent: false }),
  long: "taking the snapshot",
  run: (a, ctx) => createSnapshot(ctx.ws, a.workspace_id, a.snapshot_name),
  render: (s) =>
    `snapshot ${s.snapshot_name} of ${s.workspace_id}: ${s.file_count} file(s), ${s.size_bytes} bytes`,
});

export const snapshotList = defineTool({
  name: "snapshot_list",
  title: "List snapshots",
  description:
    "List the snapshots of a workspace: the baseline (its seed) and the named checkpoints, with size and creation time.",
  input: z.strictObject({ workspace_id: workspaceIdArg }),
  output: z.looseObject({
    workspace_id: z.string(),
    count: z.number().int().min(0),
    snapshots: z.array(snapshotObject),
  }),
  annotations: READ_ONLY,
  run: (a, ctx) => listSnapshots(ctx.ws, a.workspace_id),
  render: (r) =>
    [
      `${r.count} snapshot(s) of ${r.workspace_id}:`,
      ...r.snapshots.map(
        (s) =>
          `- ${s.snapshot_name} (${s.kind}, ${s.file_count} files, ${s.size_bytes} bytes, ${s.created_at})`,
      ),
    ].join("\n"),
});

export const snapshotDelete = defineTool({
  name: "snapshot_delete",
  title: "Delete a snapshot",
  description:
    "Delete a named snapshot. The baseline cannot be deleted, nor the snapshot the workspace was last reset to (reset to another one first).",
  input: z.strictObject({ workspace_id: workspaceIdArg, snapshot_name: snapshotNameArg }),
  output: z.looseObject({ workspace_id: z.string(), snapshot_name: z.string(), deleted: z.boolean() }),
  annotations: mutating({ destructive: true, idempotent: true }),
  run: (a, ctx) => deleteSnapshot(ctx.ws, a.workspace_id, a.snapshot_name),
  render: (r) => `deleted snapshot ${r.snapshot_name} of ${r.workspace_id}`,
});
