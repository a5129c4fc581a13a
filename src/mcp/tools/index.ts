import type { ToolName, ToolSet } from "../profiles.js";
import type { ToolDefinition } from "../tool.js";
import { workspaceCommit } from "./commit.js";
import { workspaceDiskExport, workspaceDiskList, workspaceDiskRead } from "./disk.js";
import { environmentBuild } from "./environments.js";
import { vmRun, workspaceExec, workspaceLogs, workspaceSummary } from "./exec.js";
import {
  workspaceDiff,
  workspaceExport,
  workspaceFileList,
  workspaceFileRead,
  workspaceFileWrite,
  workspacePatchApply,
  workspaceSyncPush,
} from "./files.js";
import { serviceList, serviceLogs, serviceStart, serviceStatus, serviceStop } from "./services.js";
import { shellClose, shellOpen, shellRead, shellSignal, shellWrite } from "./shells.js";
import { snapshotCreate, snapshotDelete, snapshotList, workspaceReset } from "./snapshots.js";
import {
  workspaceCreate,
  workspaceDelete,
  workspaceList,
  workspaceNetworkBlocks,
  workspaceStart,
  workspaceStatus,
  workspaceStop,
  workspaceUpdate,
} from "./workspaces.js";

/** Every tool definition, by name, for one tool set (workspace_create varies with it). */
export function toolDefinitions(set: ToolSet): ToolDefinition[] {
  const all: Record<ToolName, ToolDefinition> = {
    vm_run: vmRun,
    workspace_create: workspaceCreate(set.fullCreate),
    workspace_list: workspaceList,
    workspace_update: workspaceUpdate,
    workspace_status: workspaceStatus,
    workspace_sync_push: workspaceSyncPush,
    workspace_exec: workspaceExec,
    workspace_logs: workspaceLogs,
    workspace_summary: workspaceSummary,
    workspace_file_list: workspaceFileList,
    workspace_file_read: workspaceFileRead,
    workspace_file_write: workspaceFileWrite,
    workspace_patch_apply: workspacePatchApply,
    workspace_diff: workspaceDiff,
    workspace_export: workspaceExport,
    workspace_reset: workspaceReset,
    workspace_delete: workspaceDelete,
    snapshot_create: snapshotCreate,
    snapshot_list: snapshotList,
    snapshot_delete: snapshotDelete,
    workspace_stop: workspaceStop,
    workspace_start: workspaceStart,
    workspace_network_blocks: workspaceNetworkBlocks,
    service_start: serviceStart,
    service_list: serviceList,
    service_status: serviceStatus,
    service_logs: serviceLogs,
    service_stop: serviceStop,
    shell_open: shellOpen,
    shell_read: shellRead,
    shell_write: shellWrite,
    shell_signal: shellSignal,
    shell_close: shellClose,
    workspace_disk_list: workspaceDiskList,
    workspace_disk_read: workspaceDiskRead,
    workspace_disk_export: workspaceDiskExport,
    workspace_commit: workspaceCommit,
    environment_build: environmentBuild,
  };
  return set.tools.map((name) => all[name]);
}
