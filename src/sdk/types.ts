/**
 * The SDK's result types, one name each: what `Pyro`'s methods resolve to. They are the
 * core's own return types (the objects the CLI prints with `--json` and the MCP tools
 * return as `structuredContent`), so the fields are snake_case and cannot drift from the
 * other surfaces.
 */
import type { commitWorkspace } from "../core/commit.js";
import type { demo } from "../core/demo.js";
import type { Engine } from "../core/engine.js";
import type { workspaceLogs } from "../core/exec.js";
import type {
  applyPatch,
  diffWorkspace,
  exportFromWorkspace,
  listFiles,
  readFileFromWorkspace,
  syncPush,
  writeFileToWorkspace,
} from "../core/files.js";
import type { runOnce } from "../core/oneshot.js";
import type { buildRecipe } from "../core/recipes.js";
import type { listServices, serviceLogs, startService, stopService } from "../core/services.js";
import type {
  closeShell,
  listShells,
  openShell,
  readShell,
  signalShell,
  writeShell,
} from "../core/shells.js";
import type { createSnapshot, deleteSnapshot, listSnapshots, resetWorkspace } from "../core/snapshots.js";
import type { summarizeWorkspace } from "../core/summary.js";
import type { workspaceListItem } from "../core/views.js";
import type { BackendName } from "../core/vocabulary.js";
import type { Workspaces } from "../core/workspaces.js";

type Result<F extends (...args: never[]) => Promise<unknown>> = Awaited<ReturnType<F>>;

export type { DoctorReport } from "../core/doctor.js";
export type { ExecResult } from "../core/exec.js";
// A workspace: what createWorkspace, getWorkspace, updateWorkspace, stopWorkspace and startWorkspace return.
export type { WorkspaceView } from "../core/views.js";
/** `networkBlocks`: the destinations the workspace's proxy refused. */
export type NetworkBlocks = Result<Engine["workspaces"]["networkBlocks"]>;
/** `approveNetwork`: the approved target and the policy now in force. */
export type NetworkApproval = Result<Engine["workspaces"]["approveNetwork"]>;

/** One environment of the catalogue and its cache status (`inspectEnvironment`). */
export type EnvironmentInfo = Result<Engine["environments"]["info"]>;
/** `listEnvironments`. */
export interface EnvironmentList {
  count: number;
  environments: EnvironmentInfo[];
}
/** `pullEnvironment`: the cached environment, built or pulled when it was missing. */
export type PullResult = Result<Engine["environments"]["pull"]>;
/** `buildEnvironment`: the built (or cached: `cache_hit`) environment. */
export type BuildEnvironmentResult = Result<typeof buildRecipe>;
/** `pruneEnvironments`. */
export type PruneResult = Result<Engine["environments"]["prune"]>;

/** `run`: the one-shot command's result, with the environment and backend it ran on. */
export type RunResult = Result<typeof runOnce>;
/** `demo`: each step of the proved loop and whether it went as expected. */
export type DemoResult = Result<typeof demo>;
/**
 * `prepare`: the environment's manifest (what was proved, on which backend, how long each
 * step took) and whether an earlier one was reused. Spelt out here: the core reads the
 * manifest back from JSON, untyped.
 */
export interface PrepareResult {
  environment: string;
  recipe_key: string;
  backend: BackendName;
  pyro_version: string;
  prepared_at: string;
  /** Milliseconds per step: pull_ms, create_ms, exec_ms, reset_ms, delete_ms. */
  timings: Record<string, number>;
  /** An earlier prepare still holds (same environment, recipe, backend and version). */
  reused: boolean;
  duration_ms: number;
}

/** `listWorkspaces`: every workspace, most recent activity first. */
export type WorkspaceList = Result<Workspaces["list"]>;
/** One row of `listWorkspaces`. */
export type WorkspaceListItem = ReturnType<typeof workspaceListItem>;
/** `deleteWorkspace`. */
export type WorkspaceDeleteResult = Result<Workspaces["delete"]>;
/** `workspaceLogs`: the command history, or one command with its kept output. */
export type LogsResult = Result<typeof workspaceLogs>;
/** `summarizeWorkspace`: commands, edits, changes, exports and snapshots in one review. */
export type WorkspaceSummary = Result<typeof summarizeWorkspace>;

/** `listWorkspaceFiles`. */
export type FileListResult = Result<typeof listFiles>;
/** `readWorkspaceFile`. */
export type FileReadResult = Result<typeof readFileFromWorkspace>;
/** `writeWorkspaceFile`. */
export type FileWriteResult = Result<typeof writeFileToWorkspace>;
/** `applyWorkspacePatch`. */
export type PatchResult = Result<typeof applyPatch>;
/** `diffWorkspace`: the patch, a summary and one entry per changed path. */
export type DiffResult = Result<typeof diffWorkspace>;
/** `exportWorkspace`. */
export type ExportResult = Result<typeof exportFromWorkspace>;
/** `commitWorkspace`: the branch, the commit, where it was written and what it changed. */
export type CommitResult = Result<typeof commitWorkspace>;
/** `syncPushWorkspace`. */
export type SyncPushResult = Result<typeof syncPush>;

/** `resetWorkspace`: the workspace after the reset, and what it was reset to. */
export type ResetResult = Result<typeof resetWorkspace>;
/** `createSnapshot`: one snapshot. */
export type SnapshotView = Result<typeof createSnapshot>;
/** `listSnapshots`. */
export type SnapshotList = Result<typeof listSnapshots>;
/** `deleteSnapshot`. */
export type SnapshotDeleteResult = Result<typeof deleteSnapshot>;

/** `openShell`, `resizeShell`: one shell (state running or exited, pid, size, cursors). */
export type ShellView = Result<typeof openShell>;
/** `writeShell`: the shell, and the bytes sent. */
export type ShellWriteResult = Result<typeof writeShell>;
/** `readShell`: output from a cursor (raw or rendered), `cursor`, `next_cursor`, `truncated`, `has_more`. */
export type ShellReadResult = Result<typeof readShell>;
/** `signalShell`: the shell, the signal and the process group it went to. */
export type ShellSignalResult = Result<typeof signalShell>;
/** `closeShell`: the shell as it ended. */
export type ShellCloseResult = Result<typeof closeShell>;
/** `listShells`: the workspace's open shells. */
export type ShellList = Result<typeof listShells>;
/** `serviceStatus`: one service (state starting, ready, failed or stopped; pid; ready time; probe). */
export type { ServiceView } from "../core/services.js";
/** `startService`: the service once ready (or failed), with its last log lines. */
export type ServiceStartResult = Result<typeof startService>;
/** `listServices`: every service of the workspace, with counts. */
export type ServiceList = Result<typeof listServices>;
/** `serviceLogs`: the last lines of a service's stdout and stderr. */
export type ServiceLogsResult = Result<typeof serviceLogs>;
/** `stopService`: the stopped service, and whether it had to be killed. */
export type ServiceStopResult = Result<typeof stopService>;
