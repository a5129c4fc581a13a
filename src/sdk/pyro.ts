import { commitWorkspace } from "../core/commit.js";
import { demo, prepare } from "../core/demo.js";
import { exportDisk, listDisk, readDisk } from "../core/disk.js";
import { doctor } from "../core/doctor.js";
import { Engine, type EngineOptions } from "../core/engine.js";
import { execInWorkspace, workspaceLogs } from "../core/exec.js";
import {
  applyPatch,
  diffWorkspace,
  exportFromWorkspace,
  listFiles,
  readFileFromWorkspace,
  syncPush,
  writeFileToWorkspace,
} from "../core/files.js";
import { runOnce } from "../core/oneshot.js";
import { buildRecipe } from "../core/recipes.js";
import { listServices, serviceLogs, serviceStatus, startService, stopService } from "../core/services.js";
import {
  closeShell,
  listShells,
  openShell,
  readShell,
  resizeShell,
  signalShell,
  writeShell,
} from "../core/shells.js";
import { createSnapshot, deleteSnapshot, listSnapshots, resetWorkspace } from "../core/snapshots.js";
import { summarizeWorkspace } from "../core/summary.js";
import { checkRecipe } from "../core/vocabulary.js";
import { coreOptions } from "./case.js";
import type {
  BuildEnvironmentOptions,
  CommitOptions,
  CreateWorkspaceOptions,
  DemoOptions,
  DoctorOptions,
  EnvironmentRecipe,
  ExecOptions,
  ExportOptions,
  ListFilesOptions,
  LogsOptions,
  OpenShellOptions,
  PrepareOptions,
  PruneOptions,
  PullOptions,
  ReadFileOptions,
  ReadShellOptions,
  RunOptions,
  ServiceLogsOptions,
  SnapshotOptions,
  StartServiceOptions,
  StopServiceOptions,
  SyncPushOptions,
  UpdateWorkspacePatch,
  WriteShellOptions,
} from "./schemas.js";
import type {
  BuildEnvironmentResult,
  CommitResult,
  DemoResult,
  DiffResult,
  DoctorReport,
  EnvironmentInfo,
  EnvironmentList,
  ExecResult,
  ExportResult,
  FileListResult,
  FileReadResult,
  FileWriteResult,
  LogsResult,
  NetworkApproval,
  NetworkBlocks,
  PatchResult,
  PrepareResult,
  PruneResult,
  PullResult,
  ResetResult,
  RunResult,
  ServiceList,
  ServiceLogsResult,
  ServiceStartResult,
  ServiceStopResult,
  ServiceView,
  ShellCloseResult,
  ShellList,
  ShellReadResult,
  ShellSignalResult,
  ShellView,
  ShellWriteResult,
  SnapshotDeleteResult,
  SnapshotList,
  SnapshotView,
  SyncPushResult,
  WorkspaceDeleteResult,
  WorkspaceList,
  WorkspaceSummary,
  WorkspaceView,
} from "./types.js";
import { checkArgs } from "./validate.js";

export type PyroOptions = EngineOptions;

/**
 * The SDK: the same operations and the same snake_case result objects as the CLI's
 * `--json` and the MCP tools (types.ts names each result type). Option keys are camelCase
 * (`timeoutSeconds`, `maxOutputBytes`, `seedPath`). One instance per client; it keeps
 * agent connections warm, so call `close()` when done (workspaces keep running after it).
 *
 * Every method checks its arguments first (schemas.ts): a wrong type, a number out of
 * range or an unknown option key rejects with an `invalid_argument` PyroError that names
 * the method and the argument, and nothing has been changed.
 */
export class Pyro {
  readonly engine: Engine;
  private readonly ws: Engine["workspaces"];

  constructor(options: PyroOptions = {}) {
    this.engine = new Engine(options);
    this.ws = this.engine.workspaces;
    // With a pool (option `pool`, PYRO_POOL; `pyro mcp serve` by default), spares start now.
    if (this.engine.pool.enabled) void this.engine.warmPool().catch(() => {});
  }

  async doctor(options: DoctorOptions = {}): Promise<DoctorReport> {
    checkArgs("doctor", [options]);
    return doctor(this.engine, coreOptions(options));
  }

  async listEnvironments(): Promise<EnvironmentList> {
    const environments = await this.engine.environments.list();
    return { count: environments.length, environments };
  }
  async pullEnvironment(name: string, options: PullOptions = {}): Promise<PullResult> {
    checkArgs("pullEnvironment", [name, options]);
    // Like `pyro env pull`: an image tag is re-resolved at the registry (a new digest is a
    // new version). The core's option is spelled `insecureRegistry` too (coreOptions
    // would pass it on as `insecure_registry`, which the core does not read).
    return this.engine.environments.pull(name, {
      ...(options.signal ? { signal: options.signal } : {}),
      ...(options.insecureRegistry ? { insecureRegistry: true } : {}),
      refresh: true,
    });
  }
  /**
   * Builds an environment from a recipe in a sandbox with network egress (contract §10),
   * or finds it cached (`cache_hit`). Relative copy sources are taken from the process's
   * working directory.
   */
  async buildEnvironment(
    recipe: EnvironmentRecipe,
    options: BuildEnvironmentOptions = {},
  ): Promise<BuildEnvironmentResult> {
    checkArgs("buildEnvironment", [recipe, options]);
    return buildRecipe(this.engine, checkRecipe(recipe, process.cwd()), coreOptions(options));
  }
  async inspectEnvironment(name: string): Promise<EnvironmentInfo> {
    checkArgs("inspectEnvironment", [name]);
    return this.engine.environments.info(name);
  }
  async pruneEnvironments(options: PruneOptions = {}): Promise<PruneResult> {
    checkArgs("pruneEnvironments", [options]);
    return this.engine.environments.prune(coreOptions(options));
  }

  /** One-shot: create, run `command`, capture, destroy. `maxOutputBytes` is per stream. */
  async run(environment: string, command: string, options: RunOptions = {}): Promise<RunResult> {
    checkArgs("run", [environment, command, options]);
    return runOnce(this.engine, command, { ...coreOptions(options), environment });
  }
  async demo(options: DemoOptions = {}): Promise<DemoResult> {
    checkArgs("demo", [options]);
    return demo(this.engine, coreOptions(options));
  }
  async prepare(environment: string, options: PrepareOptions = {}): Promise<PrepareResult> {
    checkArgs("prepare", [environment, options]);
    return prepare(this.engine, environment, coreOptions(options));
  }

  async createWorkspace(options: CreateWorkspaceOptions = {}): Promise<WorkspaceView> {
    checkArgs("createWorkspace", [options]);
    return this.ws.create(coreOptions(options));
  }
  listWorkspaces(): Promise<WorkspaceList> {
    return this.ws.list();
  }
  /** One workspace (by id or name) as it is now: what `pyro workspace status` shows. */
  async getWorkspace(workspaceId: string): Promise<WorkspaceView> {
    checkArgs("getWorkspace", [workspaceId]);
    return this.ws.status(workspaceId);
  }
  async updateWorkspace(workspaceId: string, patch: UpdateWorkspacePatch): Promise<WorkspaceView> {
    checkArgs("updateWorkspace", [workspaceId, patch]);
    // Not a spelling change: the core calls merged labels set_labels.
    return this.ws.update(workspaceId, {
      ...(patch.name !== undefined ? { name: patch.name } : {}),
      ...(patch.labels ? { set_labels: patch.labels } : {}),
      ...(patch.clearLabels ? { clear_labels: patch.clearLabels } : {}),
      ...(patch.networkPolicy !== undefined ? { network_policy: patch.networkPolicy } : {}),
    });
  }
  /** Destinations the workspace's egress proxy refused (capability blocks), most recent first. */
  async networkBlocks(workspaceId: string): Promise<NetworkBlocks> {
    checkArgs("networkBlocks", [workspaceId]);
    return this.ws.networkBlocks(workspaceId);
  }
  /**
   * Allows `target` (`host[:port]`) from the next connection on: a human's decision, so
   * the SDK and the CLI have it and the MCP server does not.
   */
  async approveNetwork(workspaceId: string, target: string): Promise<NetworkApproval> {
    checkArgs("approveNetwork", [workspaceId, target]);
    return this.ws.approveNetwork(workspaceId, target);
  }
  async deleteWorkspace(workspaceId: string): Promise<WorkspaceDeleteResult> {
    checkArgs("deleteWorkspace", [workspaceId]);
    return this.ws.delete(workspaceId);
  }
  async stopWorkspace(workspaceId: string): Promise<WorkspaceView> {
    checkArgs("stopWorkspace", [workspaceId]);
    return this.ws.stop(workspaceId);
  }
  async startWorkspace(workspaceId: string): Promise<WorkspaceView> {
    checkArgs("startWorkspace", [workspaceId]);
    return this.ws.start(workspaceId);
  }

  /** `maxOutputBytes`: per stream; past it a stream keeps its head and tail. */
  async execWorkspace(workspaceId: string, command: string, options: ExecOptions = {}): Promise<ExecResult> {
    checkArgs("execWorkspace", [workspaceId, command, options]);
    return execInWorkspace(this.ws, workspaceId, command, coreOptions(options));
  }
  /**
   * Command history; with `seq`, that one command with the whole output the history kept
   * (`maxOutputBytes` cuts it again, head and tail).
   */
  async workspaceLogs(workspaceId: string, options: LogsOptions = {}): Promise<LogsResult> {
    checkArgs("workspaceLogs", [workspaceId, options]);
    return workspaceLogs(this.ws, workspaceId, coreOptions(options));
  }
  async summarizeWorkspace(workspaceId: string): Promise<WorkspaceSummary> {
    checkArgs("summarizeWorkspace", [workspaceId]);
    return summarizeWorkspace(this.ws, workspaceId);
  }

  /**
   * Starts service `name` (a long-running `command`) and waits for its `readiness` probe:
   * state `ready`, or `failed` with its exit code when it exits first. A probe that never
   * passes within `readiness.timeout_seconds` (default 30) rejects with a `timeout` PyroError
   * carrying the last log lines; the service keeps running. `workspace start` starts it again.
   */
  async startService(
    workspaceId: string,
    name: string,
    command: string,
    options: StartServiceOptions = {},
  ): Promise<ServiceStartResult> {
    checkArgs("startService", [workspaceId, name, command, options]);
    return startService(this.ws, workspaceId, name, command, coreOptions(options));
  }
  async listServices(workspaceId: string): Promise<ServiceList> {
    checkArgs("listServices", [workspaceId]);
    return listServices(this.ws, workspaceId);
  }
  async serviceStatus(workspaceId: string, name: string): Promise<ServiceView> {
    checkArgs("serviceStatus", [workspaceId, name]);
    return serviceStatus(this.ws, workspaceId, name);
  }
  /** The last `tailLines` (default 100) lines of its stdout and stderr, interleaved as they came. */
  async serviceLogs(
    workspaceId: string,
    name: string,
    options: ServiceLogsOptions = {},
  ): Promise<ServiceLogsResult> {
    checkArgs("serviceLogs", [workspaceId, name, options]);
    return serviceLogs(this.ws, workspaceId, name, options.tailLines);
  }
  /** TERM to its whole process group, KILL after `graceSeconds` (default 5); not started again. */
  /**
   * Opens an interactive shell (bash on a PTY) in a running workspace; it lives until
   * `closeShell`, or the workspace's stop, reset or delete.
   */
  async openShell(workspaceId: string, options: OpenShellOptions = {}): Promise<ShellView> {
    checkArgs("openShell", [workspaceId, options]);
    return openShell(this.ws, workspaceId, options);
  }
  /** Types `input` into the shell, followed by Enter unless `newline: false`. */
  async writeShell(
    workspaceId: string,
    shellId: string,
    input: string,
    options: WriteShellOptions = {},
  ): Promise<ShellWriteResult> {
    checkArgs("writeShell", [workspaceId, shellId, input, options]);
    return writeShell(this.ws, workspaceId, shellId, input, options);
  }
  /** The shell's output from a cursor: raw terminal bytes, or with `plain` the text a person would see. */
  async readShell(
    workspaceId: string,
    shellId: string,
    options: ReadShellOptions = {},
  ): Promise<ShellReadResult> {
    checkArgs("readShell", [workspaceId, shellId, options]);
    return readShell(this.ws, workspaceId, shellId, coreOptions(options));
  }
  /** INT, TERM or KILL to the shell's foreground job (the shell itself when idle). */
  async signalShell(
    workspaceId: string,
    shellId: string,
    signal: "INT" | "TERM" | "KILL",
  ): Promise<ShellSignalResult> {
    checkArgs("signalShell", [workspaceId, shellId, signal]);
    return signalShell(this.ws, workspaceId, shellId, signal);
  }
  async resizeShell(workspaceId: string, shellId: string, cols: number, rows: number): Promise<ShellView> {
    checkArgs("resizeShell", [workspaceId, shellId, cols, rows]);
    return resizeShell(this.ws, workspaceId, shellId, cols, rows);
  }
  /** Ends the shell and everything started in it. */
  async closeShell(workspaceId: string, shellId: string): Promise<ShellCloseResult> {
    checkArgs("closeShell", [workspaceId, shellId]);
    return closeShell(this.ws, workspaceId, shellId);
  }
  async listShells(workspaceId: string): Promise<ShellList> {
    checkArgs("listShells", [workspaceId]);
    return listShells(this.ws, workspaceId);
  }
  async stopService(
    workspaceId: string,
    name: string,
    options: StopServiceOptions = {},
  ): Promise<ServiceStopResult> {
    checkArgs("stopService", [workspaceId, name, options]);
    return stopService(this.ws, workspaceId, name, options.graceSeconds);
  }

  async listWorkspaceFiles(
    workspaceId: string,
    path = "/workspace",
    options: ListFilesOptions = {},
  ): Promise<FileListResult> {
    checkArgs("listWorkspaceFiles", [workspaceId, path, options]);
    return listFiles(this.ws, workspaceId, path, options.recursive === true);
  }
  async readWorkspaceFile(
    workspaceId: string,
    path: string,
    options: ReadFileOptions = {},
  ): Promise<FileReadResult> {
    checkArgs("readWorkspaceFile", [workspaceId, path, options]);
    return readFileFromWorkspace(this.ws, workspaceId, path, coreOptions(options));
  }
  /** `content`: a string (written as UTF-8) or bytes (a Buffer or any Uint8Array). */
  async writeWorkspaceFile(
    workspaceId: string,
    path: string,
    content: string | Uint8Array,
  ): Promise<FileWriteResult> {
    checkArgs("writeWorkspaceFile", [workspaceId, path, content]);
    const data =
      typeof content === "string" || Buffer.isBuffer(content)
        ? content
        : Buffer.from(content.buffer, content.byteOffset, content.byteLength);
    return writeFileToWorkspace(this.ws, workspaceId, path, data);
  }
  async applyWorkspacePatch(workspaceId: string, patch: string): Promise<PatchResult> {
    checkArgs("applyWorkspacePatch", [workspaceId, patch]);
    return applyPatch(this.ws, workspaceId, patch);
  }
  async diffWorkspace(workspaceId: string, options: SnapshotOptions = {}): Promise<DiffResult> {
    checkArgs("diffWorkspace", [workspaceId, options]);
    return diffWorkspace(this.ws, workspaceId, options);
  }
  /**
   * Writes the workspace's changes since its baseline as one commit on a new branch of
   * its seed repository on the host (default `pyro/<name or id>`), parented on the seed
   * commit; the host's working tree, index, HEAD and other branches are not touched. An
   * existing branch is `conflict` unless `force`; a workspace not seeded from Git is
   * `conflict`; a name Git refuses is `invalid_argument`.
   */
  async commitWorkspace(workspaceId: string, options: CommitOptions = {}): Promise<CommitResult> {
    checkArgs("commitWorkspace", [workspaceId, options]);
    return commitWorkspace(this.ws, workspaceId, coreOptions(options));
  }
  async exportWorkspace(
    workspaceId: string,
    path: string,
    outputPath: string,
    options: ExportOptions = {},
  ): Promise<ExportResult> {
    checkArgs("exportWorkspace", [workspaceId, path, outputPath, options]);
    return exportFromWorkspace(this.ws, workspaceId, path, outputPath, options.signal);
  }
  /**
   * The disk tools: a STOPPED workspace's files, read without starting it (`conflict`
   * while it runs). Same results and path refusals as listWorkspaceFiles,
   * readWorkspaceFile and exportWorkspace.
   */
  async listWorkspaceDisk(
    workspaceId: string,
    path = "/workspace",
    options: ListFilesOptions = {},
  ): Promise<FileListResult> {
    checkArgs("listWorkspaceDisk", [workspaceId, path, options]);
    return listDisk(this.ws, workspaceId, path, options.recursive === true);
  }
  async readWorkspaceDisk(
    workspaceId: string,
    path: string,
    options: ReadFileOptions = {},
  ): Promise<FileReadResult> {
    checkArgs("readWorkspaceDisk", [workspaceId, path, options]);
    return readDisk(this.ws, workspaceId, path, coreOptions(options));
  }
  async exportWorkspaceDisk(
    workspaceId: string,
    path: string,
    outputPath: string,
    options: ExportOptions = {},
  ): Promise<ExportResult> {
    checkArgs("exportWorkspaceDisk", [workspaceId, path, outputPath, options]);
    return exportDisk(this.ws, workspaceId, path, outputPath, options.signal);
  }
  async syncPushWorkspace(
    workspaceId: string,
    source: string,
    options: SyncPushOptions = {},
  ): Promise<SyncPushResult> {
    checkArgs("syncPushWorkspace", [workspaceId, source, options]);
    return syncPush(this.ws, workspaceId, source, options.dest, options.signal);
  }
  async resetWorkspace(workspaceId: string, options: SnapshotOptions = {}): Promise<ResetResult> {
    checkArgs("resetWorkspace", [workspaceId, options]);
    return resetWorkspace(this.ws, workspaceId, options);
  }

  async createSnapshot(workspaceId: string, name: string): Promise<SnapshotView> {
    checkArgs("createSnapshot", [workspaceId, name]);
    return createSnapshot(this.ws, workspaceId, name);
  }
  async listSnapshots(workspaceId: string): Promise<SnapshotList> {
    checkArgs("listSnapshots", [workspaceId]);
    return listSnapshots(this.ws, workspaceId);
  }
  async deleteSnapshot(workspaceId: string, name: string): Promise<SnapshotDeleteResult> {
    checkArgs("deleteSnapshot", [workspaceId, name]);
    return deleteSnapshot(this.ws, workspaceId, name);
  }

  /** Closes agent connections and the state store; workspaces keep running. */
  close(): Promise<void> {
    return this.engine.close();
  }
}
