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
import { demo, prepare, runOnce } from "../core/oneshot.js";
import { createSnapshot, deleteSnapshot, listSnapshots, resetWorkspace } from "../core/snapshots.js";
import { summarizeWorkspace } from "../core/summary.js";
import type {
  CreateCallOptions,
  DemoCallOptions,
  DoctorCallOptions,
  ExecCallOptions,
  ExportCallOptions,
  ListFilesCallOptions,
  LogsCallOptions,
  PrepareCallOptions,
  PruneCallOptions,
  PullCallOptions,
  ReadFileCallOptions,
  RunCallOptions,
  SnapshotCallOptions,
  SyncPushCallOptions,
  UpdateCallPatch,
} from "./schemas.js";
import { checkArgs } from "./validate.js";

export type PyroOptions = EngineOptions;

/**
 * The SDK: the same operations and the same snake_case result objects as the CLI's
 * `--json` and the MCP tools. One instance per client; it keeps agent connections warm,
 * so call `close()` when done (workspaces keep running after it).
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
  }

  async doctor(options: DoctorCallOptions = {}) {
    checkArgs("doctor", [options]);
    return doctor(this.engine, options);
  }

  listEnvironments() {
    return this.engine.environments
      .list()
      .then((environments) => ({ count: environments.length, environments }));
  }
  async pullEnvironment(name: string, options: PullCallOptions = {}) {
    checkArgs("pullEnvironment", [name, options]);
    return this.engine.environments.pull(name, options);
  }
  async inspectEnvironment(name: string) {
    checkArgs("inspectEnvironment", [name]);
    return this.engine.environments.info(name);
  }
  async pruneEnvironments(options: PruneCallOptions = {}) {
    checkArgs("pruneEnvironments", [options]);
    return this.engine.environments.prune(options);
  }

  /** `maxOutputBytes` (or `max_output_bytes`): per stream; past it a stream keeps its head and tail. */
  async run(environment: string, command: string, options: RunCallOptions = {}) {
    checkArgs("run", [environment, command, options]);
    const { maxOutputBytes, ...rest } = options;
    return runOnce(this.engine, command, {
      ...rest,
      ...(maxOutputBytes !== undefined ? { max_output_bytes: maxOutputBytes } : {}),
      environment,
    });
  }
  async demo(options: DemoCallOptions = {}) {
    checkArgs("demo", [options]);
    return demo(this.engine, {
      ...(options.backend ? { backend: options.backend } : {}),
      allow_host_compat: options.allowHostCompat === true,
    });
  }
  async prepare(environment: string, options: PrepareCallOptions = {}) {
    checkArgs("prepare", [environment, options]);
    return prepare(this.engine, environment, {
      ...(options.backend ? { backend: options.backend } : {}),
      allow_host_compat: options.allowHostCompat === true,
      force: options.force === true,
    });
  }

  async createWorkspace(options: CreateCallOptions = {}) {
    checkArgs("createWorkspace", [options]);
    const { allowHostCompat, seedPath, repoUrl, repoRef, networkPolicy, promptSecret, ...rest } = options;
    return this.ws.create({
      ...rest,
      ...(seedPath !== undefined ? { seed_path: seedPath } : {}),
      ...(repoUrl !== undefined ? { repo_url: repoUrl } : {}),
      ...(repoRef !== undefined ? { repo_ref: repoRef } : {}),
      ...(networkPolicy !== undefined ? { network_policy: networkPolicy } : {}),
      ...(promptSecret ? { prompt_secret: promptSecret } : {}),
      allow_host_compat: allowHostCompat === true || rest.allow_host_compat === true,
    });
  }
  listWorkspaces() {
    return this.ws.list();
  }
  async getWorkspace(workspaceId: string) {
    checkArgs("getWorkspace", [workspaceId]);
    return this.ws.status(workspaceId);
  }
  async workspaceStatus(workspaceId: string) {
    checkArgs("workspaceStatus", [workspaceId]);
    return this.ws.status(workspaceId);
  }
  async updateWorkspace(workspaceId: string, patch: UpdateCallPatch) {
    checkArgs("updateWorkspace", [workspaceId, patch]);
    return this.ws.update(workspaceId, {
      ...(patch.name !== undefined ? { name: patch.name } : {}),
      ...(patch.labels ? { set_labels: patch.labels } : {}),
      ...(patch.clearLabels ? { clear_labels: patch.clearLabels } : {}),
    });
  }
  async deleteWorkspace(workspaceId: string) {
    checkArgs("deleteWorkspace", [workspaceId]);
    return this.ws.delete(workspaceId);
  }
  async stopWorkspace(workspaceId: string) {
    checkArgs("stopWorkspace", [workspaceId]);
    return this.ws.stop(workspaceId);
  }
  async startWorkspace(workspaceId: string) {
    checkArgs("startWorkspace", [workspaceId]);
    return this.ws.start(workspaceId);
  }

  /** `maxOutputBytes` (or `max_output_bytes`): per stream; past it a stream keeps its head and tail. */
  async execWorkspace(workspaceId: string, command: string, options: ExecCallOptions = {}) {
    checkArgs("execWorkspace", [workspaceId, command, options]);
    const { timeoutSeconds, maxOutputBytes, ...rest } = options;
    return execInWorkspace(this.ws, workspaceId, command, {
      ...rest,
      ...(timeoutSeconds !== undefined ? { timeout_seconds: timeoutSeconds } : {}),
      ...(maxOutputBytes !== undefined ? { max_output_bytes: maxOutputBytes } : {}),
    });
  }
  /**
   * Command history; with `seq`, that one command with the whole output the history kept
   * (`maxOutputBytes` cuts it again, head and tail).
   */
  async workspaceLogs(workspaceId: string, options: LogsCallOptions = {}) {
    checkArgs("workspaceLogs", [workspaceId, options]);
    const { maxOutputBytes, ...rest } = options;
    return workspaceLogs(this.ws, workspaceId, {
      ...rest,
      ...(maxOutputBytes !== undefined ? { max_output_bytes: maxOutputBytes } : {}),
    });
  }
  async summarizeWorkspace(workspaceId: string) {
    checkArgs("summarizeWorkspace", [workspaceId]);
    return summarizeWorkspace(this.ws, workspaceId);
  }

  async listWorkspaceFiles(workspaceId: string, path = "/workspace", options: ListFilesCallOptions = {}) {
    checkArgs("listWorkspaceFiles", [workspaceId, path, options]);
    return listFiles(this.ws, workspaceId, path, options.recursive === true);
  }
  async readWorkspaceFile(workspaceId: string, path: string, options: ReadFileCallOptions = {}) {
    checkArgs("readWorkspaceFile", [workspaceId, path, options]);
    return readFileFromWorkspace(
      this.ws,
      workspaceId,
      path,
      options.maxBytes !== undefined ? { max_bytes: options.maxBytes } : {},
    );
  }
  /** `content`: a string (written as UTF-8) or bytes (a Buffer or any Uint8Array). */
  async writeWorkspaceFile(workspaceId: string, path: string, content: string | Uint8Array) {
    checkArgs("writeWorkspaceFile", [workspaceId, path, content]);
    const data =
      typeof content === "string" || Buffer.isBuffer(content)
        ? content
        : Buffer.from(content.buffer, content.byteOffset, content.byteLength);
    return writeFileToWorkspace(this.ws, workspaceId, path, data);
  }
  async applyWorkspacePatch(workspaceId: string, patch: string) {
    checkArgs("applyWorkspacePatch", [workspaceId, patch]);
    return applyPatch(this.ws, workspaceId, patch);
  }
  async diffWorkspace(workspaceId: string, options: SnapshotCallOptions = {}) {
    checkArgs("diffWorkspace", [workspaceId, options]);
    return diffWorkspace(this.ws, workspaceId, options);
  }
  async exportWorkspace(
    workspaceId: string,
    path: string,
    outputPath: string,
    options: ExportCallOptions = {},
  ) {
    checkArgs("exportWorkspace", [workspaceId, path, outputPath, options]);
    return exportFromWorkspace(this.ws, workspaceId, path, outputPath, options.signal);
  }
  async syncPushWorkspace(workspaceId: string, source: string, options: SyncPushCallOptions = {}) {
    checkArgs("syncPushWorkspace", [workspaceId, source, options]);
    return syncPush(this.ws, workspaceId, source, options.dest, options.signal);
  }
  async resetWorkspace(workspaceId: string, options: SnapshotCallOptions = {}) {
    checkArgs("resetWorkspace", [workspaceId, options]);
    return resetWorkspace(this.ws, workspaceId, options);
  }

  async createSnapshot(workspaceId: string, name: string) {
    checkArgs("createSnapshot", [workspaceId, name]);
    return createSnapshot(this.ws, workspaceId, name);
  }
  async listSnapshots(workspaceId: string) {
    checkArgs("listSnapshots", [workspaceId]);
    return listSnapshots(this.ws, workspaceId);
  }
  async deleteSnapshot(workspaceId: string, name: string) {
    checkArgs("deleteSnapshot", [workspaceId, name]);
    return deleteSnapshot(this.ws, workspaceId, name);
  }

  /** Closes agent connections and the state store; workspaces keep running. */
  close() {
    return this.engine.close();
  }
}
