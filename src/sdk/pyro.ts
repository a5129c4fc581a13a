import type { BackendName } from "../backends/backend.js";
import { doctor } from "../core/doctor.js";
import { Engine, type EngineOptions } from "../core/engine.js";
import { type ExecOptions, execInWorkspace, workspaceLogs } from "../core/exec.js";
import {
  applyPatch,
  diffWorkspace,
  exportFromWorkspace,
  listFiles,
  readFileFromWorkspace,
  syncPush,
  writeFileToWorkspace,
} from "../core/files.js";
import { demo, prepare, type RunOptions, runOnce } from "../core/oneshot.js";
import { createSnapshot, deleteSnapshot, listSnapshots, resetWorkspace } from "../core/snapshots.js";
import { summarizeWorkspace } from "../core/summary.js";
import type { CreateOptions } from "../core/workspaces.js";

export type PyroOptions = EngineOptions;

/**
 * The SDK: the same operations and the same snake_case result objects as the CLI's
 * `--json` and the MCP tools. One instance per client; it keeps agent connections warm,
 * so call `close()` when done (workspaces keep running after it).
 */
export class Pyro {
  readonly engine: Engine;
  private readonly ws: Engine["workspaces"];

  constructor(options: PyroOptions = {}) {
    this.engine = new Engine(options);
    this.ws = this.engine.workspaces;
  }

  doctor(options: { environment?: string } = {}) {
    return doctor(this.engine, options);
  }

  listEnvironments() {
    return this.engine.environments
      .list()
      .then((environments) => ({ count: environments.length, environments }));
  }
  pullEnvironment(name: string, options: { signal?: AbortSignal } = {}) {
    return this.engine.environments.pull(name, options);
  }
  inspectEnvironment(name: string) {
    return this.engine.environments.info(name);
  }
  pruneEnvironments(options: { all?: boolean } = {}) {
    return this.engine.environments.prune(options);
  }

  /** `maxOutputBytes` (or `max_output_bytes`): per stream; past it a stream keeps its head and tail. */
  run(
    environment: string,
    command: string,
    options: Omit<RunOptions, "environment"> & { maxOutputBytes?: number } = {},
  ) {
    const { maxOutputBytes, ...rest } = options;
    return runOnce(this.engine, command, {
      ...rest,
      ...(maxOutputBytes !== undefined ? { max_output_bytes: maxOutputBytes } : {}),
      environment,
    });
  }
  demo(options: { backend?: BackendName; allowHostCompat?: boolean } = {}) {
    return demo(this.engine, {
      ...(options.backend ? { backend: options.backend } : {}),
      allow_host_compat: options.allowHostCompat === true,
    });
  }
  prepare(
    environment: string,
    options: { backend?: BackendName; allowHostCompat?: boolean; force?: boolean } = {},
  ) {
    return prepare(this.engine, environment, {
      ...(options.backend ? { backend: options.backend } : {}),
      allow_host_compat: options.allowHostCompat === true,
      force: options.force === true,
    });
  }

  createWorkspace(
    options: CreateOptions & {
      promptSecret?: import("../core/secrets.js").SecretPrompt;
      allowHostCompat?: boolean;
      seedPath?: string;
      repoUrl?: string;
      repoRef?: string;
      networkPolicy?: string;
    } = {},
  ) {
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
  getWorkspace(workspaceId: string) {
    return this.ws.status(workspaceId);
  }
  workspaceStatus(workspaceId: string) {
    return this.ws.status(workspaceId);
  }
  updateWorkspace(
    workspaceId: string,
    patch: { name?: string; labels?: Record<string, string>; clearLabels?: string[] },
  ) {
    return this.ws.update(workspaceId, {
      ...(patch.name !== undefined ? { name: patch.name } : {}),
      ...(patch.labels ? { set_labels: patch.labels } : {}),
      ...(patch.clearLabels ? { clear_labels: patch.clearLabels } : {}),
    });
  }
  deleteWorkspace(workspaceId: string) {
    return this.ws.delete(workspaceId);
  }
  stopWorkspace(workspaceId: string) {
    return this.ws.stop(workspaceId);
  }
  startWorkspace(workspaceId: string) {
    return this.ws.start(workspaceId);
  }

  /** `maxOutputBytes` (or `max_output_bytes`): per stream; past it a stream keeps its head and tail. */
  execWorkspace(
    workspaceId: string,
    command: string,
    options: ExecOptions & { timeoutSeconds?: number; maxOutputBytes?: number } = {},
  ) {
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
  workspaceLogs(
    workspaceId: string,
    options: { limit?: number; seq?: number; maxOutputBytes?: number } = {},
  ) {
    const { maxOutputBytes, ...rest } = options;
    return workspaceLogs(this.ws, workspaceId, {
      ...rest,
      ...(maxOutputBytes !== undefined ? { max_output_bytes: maxOutputBytes } : {}),
    });
  }
  summarizeWorkspace(workspaceId: string) {
    return summarizeWorkspace(this.ws, workspaceId);
  }

  listWorkspaceFiles(workspaceId: string, path = "/workspace", options: { recursive?: boolean } = {}) {
    return listFiles(this.ws, workspaceId, path, options.recursive === true);
  }
  readWorkspaceFile(workspaceId: string, path: string, options: { maxBytes?: number } = {}) {
    return readFileFromWorkspace(
      this.ws,
      workspaceId,
      path,
      options.maxBytes !== undefined ? { max_bytes: options.maxBytes } : {},
    );
  }
  writeWorkspaceFile(workspaceId: string, path: string, content: string | Buffer) {
    return writeFileToWorkspace(this.ws, workspaceId, path, content);
  }
  applyWorkspacePatch(workspaceId: string, patch: string) {
    return applyPatch(this.ws, workspaceId, patch);
  }
  diffWorkspace(workspaceId: string, options: { snapshot?: string } = {}) {
    return diffWorkspace(this.ws, workspaceId, options);
  }
  exportWorkspace(
    workspaceId: string,
    path: string,
    outputPath: string,
    options: { signal?: AbortSignal } = {},
  ) {
    return exportFromWorkspace(this.ws, workspaceId, path, outputPath, options.signal);
  }
  syncPushWorkspace(
    workspaceId: string,
    source: string,
    options: { dest?: string; signal?: AbortSignal } = {},
  ) {
    return syncPush(this.ws, workspaceId, source, options.dest, options.signal);
  }
  resetWorkspace(workspaceId: string, options: { snapshot?: string } = {}) {
    return resetWorkspace(this.ws, workspaceId, options);
  }

  createSnapshot(workspaceId: string, name: string) {
    return createSnapshot(this.ws, workspaceId, name);
  }
  listSnapshots(workspaceId: string) {
    return listSnapshots(this.ws, workspaceId);
  }
  deleteSnapshot(workspaceId: string, name: string) {
    return deleteSnapshot(this.ws, workspaceId, name);
  }

  /** Closes agent connections and the state store; workspaces keep running. */
  close() {
    return this.engine.close();
  }
}
