import { join } from "node:path";
import type { AgentClient } from "../agent/client.js";
import type { SandboxSpec, SandboxState, WorkspaceBackend } from "../backends/backend.js";
import { ACTIONS, PyroError, toPyroError } from "../errors.js";
import type { StateStore } from "../state/store.js";
import type { WorkspacePatch, WorkspaceRow, WorkspaceState } from "../state/types.js";
import { acquireLock } from "../util/lock.js";
import { AgentConnections } from "./connections.js";
import type { EngineEvent } from "./events.js";
import { assertTransition, type Operation } from "./lifecycle.js";
import { WorkspaceNetwork } from "./network.js";
import { interrupted } from "./recovery.js";
import { WorkspaceSecrets } from "./secrets.js";
import { workspaceListItem, workspaceView } from "./views.js";
import { type AgentCall, withAgent } from "./workspace-agent.js";
import { createWorkspace } from "./workspace-create.js";
import {
  type JournalReader,
  type JournalWriter,
  label,
  sandboxState,
  type WorkspaceDeps,
  type WorkspaceInternals,
} from "./workspace-deps.js";
import { sandboxSpecOf, workspaceDirOf } from "./workspace-paths.js";
import { deleteWorkspace, destroyWorkspace, ReapSchedule, reapExpired } from "./workspace-removal.js";
import type { CreateOptions } from "./workspace-spec.js";
import { refreshState, startWorkspace, stopWorkspace, syncNetwork } from "./workspace-starts.js";
import {
  approveNetwork,
  networkBlocks,
  reportNetworkBlocks,
  updateWorkspace,
  type WorkspaceUpdate,
} from "./workspace-update.js";

/**
 * The workspace service: every workspace operation of every surface goes through here.
 * It owns the lifecycle, the state store and the agent connections; backends own the
 * sandboxes. Agent connections are cached per instance, so an SDK user or the MCP server
 * gets warm round trips while a CLI call makes one connection.
 *
 * The operations live in modules of their own (workspace-create.ts, workspace-starts.ts,
 * workspace-agent.ts, workspace-update.ts, workspace-removal.ts); this class keeps the
 * state they share, hands them its private steps as one WorkspaceInternals, and keeps
 * the sandbox's starts and restarts.
 */
export class Workspaces {
  private readonly agents = new AgentConnections();
  private readonly reaping = new ReapSchedule(10_000);
  private readonly secrets: WorkspaceSecrets;
  /** What the operation modules get of this class (never handed to feature modules). */
  private readonly inner: WorkspaceInternals;

  readonly net: WorkspaceNetwork;

  constructor(private readonly engine: WorkspaceDeps) {
    this.secrets = new WorkspaceSecrets(engine.paths.home, engine.env, (id) => this.secretsFile(id));
    this.net = new WorkspaceNetwork({
      dbPath: join(engine.paths.home, "state.db"),
      workspaceDir: (id) => this.workspaceDir(id),
      appDir: engine.appDir,
      ...(engine.networkTestHosts ? { testHosts: engine.networkTestHosts } : {}),
    });
    this.inner = {
      ws: this,
      deps: engine,
      secrets: this.secrets,
      setState: (id, to, patch) => this.setState(id, to, patch),
      startNetwork: (w, backend) => this.startNetwork(w, backend),
      startSandbox: (w, spec) => this.startSandbox(w, spec),
      client: (w, backend) => this.client(w, backend),
      dropClient: (id) => this.dropClient(id),
      liveClient: (w) => this.agents.live(w.workspace_id, sandboxState(w)),
    };
  }

  private get store(): StateStore {
    return this.engine.store();
  }

  /** The journal's read side: command history, review events, snapshots. */
  get history(): JournalReader {
    return this.engine.store();
  }

  /**
   * The workspace's row as stored now (null once deleted), without the reaping and the
   * recovery of `get`: for a caller that holds the start lock and must see what a racing
   * start wrote (core/disk.ts).
   */
  stored(id: string): WorkspaceRow | null {
    return this.store.getWorkspace(id);
  }

  executionMode(w: WorkspaceRow) {
    return this.engine.backend(w.backend).executionMode;
  }

  /** The backend that owns `w` (the disk tools ask it for a reader: core/disk.ts). */
  backendOf(w: WorkspaceRow): WorkspaceBackend {
    return this.engine.backend(w.backend);
  }

  agentSnapshotPath(w: WorkspaceRow, name: string): string {
    return this.engine.backend(w.backend).agentSnapshotPath(this.sandboxSpec(w), name);
  }

  /** The proxy variables every command of `w` gets (none while its policy is off). */
  networkEnv(w: WorkspaceRow): Promise<Record<string, string>> {
    return this.net.env(w, this.engine.backend(w.backend));
  }

  /** Makes a snapshot tree visible to the agent where the backend cannot share host trees (VMs). */
  async exposeSnapshot(w: WorkspaceRow, name: string, agent: AgentClient): Promise<void> {
    const state = sandboxState(w);
    if (state) await this.engine.backend(w.backend).exposeSnapshot?.(this.sandboxSpec(w), state, name, agent);
  }

  secretsFile(id: string): string {
    return join(this.workspaceDir(id), "secrets.enc");
  }

  /** A workspace's secret values (decrypted once per client). */
  secretValues(w: WorkspaceRow): Promise<Map<string, string>> {
    try {
      return Promise.resolve(this.secrets.values(w.workspace_id, w.secret_refs.length));
    } catch (err) {
      return Promise.reject(err);
    }
  }

  /**
   * The redactor the state store applies to what it stores for workspace `id` (called
   * inside its write transactions, hence synchronous).
   */
  secretRedactorById(id: string): (text: string) => string {
    return this.secrets.redactor(id);
  }

  workspaceDir(id: string): string {
    return workspaceDirOf(this.engine.paths.home, id);
  }

  /** What a backend is given for `w`'s sandbox (workspace-paths.ts). */
  sandboxSpec(
    w: WorkspaceRow,
    snapshot = w.current_snapshot ?? "baseline",
    rootfs = String(w.runtime.rootfs ?? ""),
  ): SandboxSpec {
    return sandboxSpecOf(this.engine, this.net, w, snapshot, rootfs);
  }

  /**
   * Resolves an id or unique name; unknown → workspace_not_found. Reaps expired ones
   * first, and finishes a create or delete whose process died (then it is not found).
   */
  async get(idOrName: string): Promise<WorkspaceRow> {
    // Reaping costs a query: on the hot path (every exec of a warm SDK or MCP client) it
    // runs at most once every 10 s per client. Listing always reaps.
    if (this.reaping.due()) await this.reapExpired();
    let w = this.store.getWorkspace(idOrName);
    if (w && (await interrupted(w))) {
      await destroyWorkspace(this.inner, w).catch(() => {});
      w = this.store.getWorkspace(idOrName);
    }
    if (!w) {
      throw new PyroError(
        "workspace_not_found",
        `no workspace '${idOrName}'`,
        "list workspaces with {action}",
        { action: ACTIONS.listWorkspaces },
      );
    }
    return w;
  }

  create(options: CreateOptions) {
    return createWorkspace(this.inner, options);
  }

  /** Starts (or stops) the network helper to match `w`'s row (workspace-starts.ts). */
  private startNetwork(w: WorkspaceRow, backend: WorkspaceBackend): Promise<WorkspaceRow> {
    return syncNetwork(this.inner, w, backend);
  }

  async list() {
    await this.reapExpired();
    const rows = this.store.listWorkspaces();
    return { count: rows.length, workspaces: rows.map(workspaceListItem) };
  }

  async status(idOrName: string) {
    // An `error` workspace is shown as it is (with why); a use retries its start.
    const found = await this.get(idOrName);
    const w = found.state === "error" ? found : await refreshState(this.inner, found);
    return workspaceView(w, this.engine.backend(w.backend).executionMode);
  }

  update(idOrName: string, patch: WorkspaceUpdate) {
    return updateWorkspace(this.inner, idOrName, patch);
  }

  /** The capability blocks of a workspace: destinations its proxy refused. */
  networkBlocks(idOrName: string) {
    return networkBlocks(this.inner, idOrName);
  }

  /** A human's approval of `target` (`host[:port]`); never an MCP tool (workspace-update.ts). */
  approveNetwork(idOrName: string, target: string) {
    return approveNetwork(this.inner, idOrName, target);
  }

  delete(idOrName: string) {
    return deleteWorkspace(this.inner, idOrName);
  }

  /** Deletes expired workspaces and finishes interrupted creates and deletes (workspace-removal.ts). */
  reapExpired(): Promise<string[]> {
    return reapExpired(this.inner);
  }

  stop(idOrName: string) {
    return stopWorkspace(this.inner, idOrName);
  }

  start(idOrName: string) {
    return startWorkspace(this.inner, idOrName);
  }

  /**
   * The journal of a workspace: what an operation did (a command row, its review event,
   * a snapshot, a counter), written in one transaction with the workspace's activity time.
   */
  journal<R>(id: string, write: (store: JournalWriter) => R): R {
    return this.store.atomically(() => {
      const r = write(this.store);
      this.store.recordActivity(id);
      return r;
    });
  }

  /**
   * Runs `fn` with a connected agent of a running workspace; reconnects once on a dead
   * channel; errors leave redacted (workspace-agent.ts).
   */
  withAgent<T>(idOrName: string, op: Operation, fn: AgentCall<T>): Promise<T> {
    return withAgent(this.inner, idOrName, op, fn);
  }

  private client(w: WorkspaceRow, backend: WorkspaceBackend): Promise<AgentClient> {
    return this.agents.get(w.workspace_id, sandboxState(w), backend);
  }

  private dropClient(id: string): Promise<void> {
    return this.agents.drop(id);
  }

  /** Closes every agent connection (the sandboxes keep running). */
  close(): Promise<void> {
    return this.agents.closeAll();
  }

  /**
   * Stops the sandbox, discards its writable layers and starts it again on `snapshot`,
   * under the start lock (a killed reset leaves at most an unrecorded sandbox, which the
   * backend's next start ends).
   */
  async restartOn(w: WorkspaceRow, snapshot: string): Promise<WorkspaceRow> {
    const release = await acquireLock(join(this.workspaceDir(w.workspace_id), "start.lock"), {
      timeoutMs: 60_000,
    });
    try {
      return await this.restartLocked(w, snapshot);
    } finally {
      await release();
    }
  }

  private async restartLocked(w: WorkspaceRow, snapshot: string): Promise<WorkspaceRow> {
    const backend = this.engine.backend(w.backend);
    const spec = this.sandboxSpec(w, snapshot);
    const inPlace = await this.resetInPlace(w, backend, spec);
    if (inPlace) return inPlace;
    await this.dropClient(w.workspace_id);
    const state = sandboxState(w);
    // The writable layers go next: nothing to flush (a VM is ended without syncing its disks).
    if (state) await backend.stop(state, { discarding: true });
    await backend.discardChanges(spec);
    // A reset ends the services with the sandbox, for good.
    const updated = this.store.updateWorkspace(w.workspace_id, {
      current_snapshot: snapshot,
      runtime: { sandbox: null },
      spec: { ...w.spec, services: [] },
    });
    if (w.state === "stopped") return updated;
    const started = await this.startSandbox(updated, spec);
    this.emit({
      level: "info",
      kind: "sandbox",
      message: `workspace ${label(w)}: sandbox restarted on snapshot ${snapshot}`,
      workspace_id: w.workspace_id,
    });
    return started;
  }

  /**
   * A reset that keeps the running sandbox (the backend's resetInPlace), or null when the
   * backend has none or could not (the caller then restarts the sandbox, which also ends
   * whatever a failed attempt left). Recorded as not running meanwhile (`in_place_reset`),
   * so a process killed halfway leaves a sandbox the next use replaces.
   */
  private async resetInPlace(w: WorkspaceRow, backend: WorkspaceBackend, spec: SandboxSpec) {
    const state = sandboxState(w);
    if (w.state !== "running" || !state || !backend.resetInPlace) return null;
    if (!(await backend.isRunning(state).catch(() => false))) return null;
    const agent = await this.client(w, backend).catch(() => null);
    if (!agent) return null;
    this.store.updateWorkspace(w.workspace_id, { runtime: { sandbox: { ...state, in_place_reset: true } } });
    const kept = await backend.resetInPlace(spec, state, agent).catch(() => null);
    if (!kept) return null;
    const updated = this.store.updateWorkspace(w.workspace_id, {
      current_snapshot: spec.snapshot,
      runtime: { sandbox: kept },
      spec: { ...w.spec, services: [] },
    });
    this.emit({
      level: "info",
      kind: "sandbox",
      message: `workspace ${label(w)}: reset in place on snapshot ${spec.snapshot}`,
      workspace_id: w.workspace_id,
    });
    return updated;
  }

  /**
   * Starts a workspace's sandbox and records it running; a start that fails records the
   * `error` state with the reason (the files are kept; the next use tries again).
   */
  private async startSandbox(w: WorkspaceRow, spec: SandboxSpec): Promise<WorkspaceRow> {
    let started: SandboxState;
    try {
      const backend = this.engine.backend(w.backend);
      await this.startNetwork(w, backend);
      started = await backend.start(spec);
      await this.net.attach(w, backend, started);
    } catch (err) {
      const e = toPyroError(err);
      if (e.code !== "cancelled")
        this.emit({
          level: "error",
          kind: "sandbox",
          message: `workspace ${label(w)}: sandbox failed to start: [${e.code}] ${e.message}`,
          workspace_id: w.workspace_id,
        });
      if (e.code !== "cancelled")
        this.setState(w.workspace_id, "error", {
          runtime: { sandbox: null },
          error: {
            code: e.code,
            message: e.message,
            ...(e.hint ? { hint: e.hint } : {}),
            at: new Date().toISOString(),
          },
        });
      throw e;
    }
    return this.setState(w.workspace_id, "running", { runtime: { sandbox: started }, error: null });
  }

  /**
   * Reports the connections the workspace's proxy refused since `since` (an ISO time),
   * after a command that may have dialled out: one warning per refused destination.
   */
  reportNetworkBlocks(w: WorkspaceRow, since: string): void {
    reportNetworkBlocks(this.inner, w, since);
  }

  /** Reports a lifecycle event to the engine's watchers (none in tests that provide no events). */
  emit(event: EngineEvent): void {
    this.engine.events?.emit(event);
  }

  /** The one place a workspace's state is written: the lifecycle checks the change. */
  private setState(id: string, to: WorkspaceState, patch: Omit<WorkspacePatch, "state"> = {}): WorkspaceRow {
    const current = this.store.getWorkspace(id);
    if (!current) throw new PyroError("workspace_not_found", `workspace ${id} was deleted`);
    assertTransition(current.state, to, id);
    return this.store.updateWorkspace(id, { ...patch, state: to });
  }

  snapshotDir(w: WorkspaceRow, name: string): string {
    return join(this.workspaceDir(w.workspace_id), "snapshots", name);
  }
}
