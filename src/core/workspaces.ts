import { randomBytes } from "node:crypto";
import { rm } from "node:fs/promises";
import { join } from "node:path";
import type { AgentClient } from "../agent/client.js";
import { AgentError } from "../agent/errors.js";
import type { BackendName, SandboxSpec, SandboxState, WorkspaceBackend } from "../backends/backend.js";
import type { EnvironmentCache, PullOptions } from "../env/cache.js";
import { ACTIONS, PyroError, toPyroError } from "../errors.js";
import type { StateStore } from "../state/store.js";
import type {
  NetworkPolicy,
  PublishedPort,
  WorkspacePatch,
  WorkspaceRow,
  WorkspaceSeed,
  WorkspaceState,
} from "../state/types.js";
import { treeSize } from "../util/fs.js";
import { acquireLock } from "../util/lock.js";
import { removeTree } from "../util/mounts.js";
import type { PyroPaths } from "./config.js";
import { AgentConnections, stillRunningAfterBreak } from "./connections.js";
import type { EngineEvent, EngineEvents } from "./events.js";
import { assertAllowed, assertTransition, type Operation } from "./lifecycle.js";
import {
  approvedPolicy,
  checkNetworkSupport,
  checkPublishedPorts,
  parseNetworkPolicy,
  WorkspaceNetwork,
} from "./network.js";
import { currentOwner, interrupted, makeWorkspaceDir, recoverInterrupted } from "./recovery.js";
import { secretKeyPaths } from "./secret-key.js";
import { redactError, resolveSecrets, WorkspaceSecrets } from "./secrets.js";
import { seedInto } from "./seed.js";
import { restartServices } from "./services.js";
import { workspaceListItem, workspaceView } from "./views.js";
import {
  type CreateOptions,
  checkDiskMib,
  checkLimits,
  createSpec,
  DEFAULTS,
  validateName,
} from "./workspace-spec.js";

/** What an operation may write to the journal. */
export type JournalWriter = Pick<
  StateStore,
  "recordCommand" | "recordEvent" | "updateWorkspace" | "getWorkspace" | "upsertSnapshot" | "deleteSnapshot"
>;

/**
 * What an operation may read of the journal: its history (commands, their output, review
 * events) and its snapshots. Feature modules read through this and write through
 * `journal`; the store itself stays inside Workspaces.
 */
export type JournalReader = Pick<
  StateStore,
  | "listCommands"
  | "getCommand"
  | "countCommands"
  | "commandOutputSizes"
  | "commandOutput"
  | "listEvents"
  | "countEvents"
  | "getSnapshot"
  | "listSnapshots"
>;

/**
 * What Workspaces needs from the engine, and nothing more: the store, the backends (one
 * by name, or the default choice), the environment cache, the paths, the environment
 * and where the pyro package is. The Engine provides it; tests may provide less.
 */
export interface WorkspaceDeps {
  store(): StateStore;
  backend(name: BackendName): WorkspaceBackend;
  chooseBackend(requested: BackendName | undefined, allowHostCompat: boolean): Promise<WorkspaceBackend>;
  readonly environments: Pick<EnvironmentCache, "pull">;
  readonly paths: Pick<PyroPaths, "home" | "environmentsDir">;
  readonly env: NodeJS.ProcessEnv;
  readonly appDir: string;
  /** Test-only destination overrides for the egress proxy (EngineOptions.networkTestHosts). */
  readonly networkTestHosts?: Record<string, string> | undefined;
  /** The environment a seed's `.pyro/environment.toml` builds, or null without one (core/recipes.ts). */
  seedRecipe?(seedPath: string, options: PullOptions): Promise<string | null>;
  /** Where lifecycle events go (sandbox starts and restarts, workspaces created and removed). */
  readonly events?: EngineEvents;
}

/**
 * The workspace service: every workspace operation of every surface goes through here.
 * It owns the lifecycle, the state store and the agent connections; backends own the
 * sandboxes. Agent connections are cached per instance, so an SDK user or the MCP server
 * gets warm round trips while a CLI call makes one connection.
 */
export class Workspaces {
  private readonly agents = new AgentConnections();
  private readonly secrets: WorkspaceSecrets;

  readonly net: WorkspaceNetwork;

  constructor(private readonly engine: WorkspaceDeps) {
    this.secrets = new WorkspaceSecrets(engine.paths.home, engine.env, (id) => this.secretsFile(id));
    this.net = new WorkspaceNetwork({
      dbPath: join(engine.paths.home, "state.db"),
      workspaceDir: (id) => this.workspaceDir(id),
      appDir: engine.appDir,
      ...(engine.networkTestHosts ? { testHosts: engine.networkTestHosts } : {}),
    });
  }

  private get store(): StateStore {
    return this.engine.store();
  }

  // ------------------------------------------------ journal reads (for feature modules)

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
    return join(this.engine.paths.home, "workspaces", id);
  }

  sandboxSpec(
    w: WorkspaceRow,
    snapshot = w.current_snapshot ?? "baseline",
    rootfs = String(w.runtime.rootfs ?? ""),
  ): SandboxSpec {
    const dir = this.workspaceDir(w.workspace_id);
    return {
      workspace_id: w.workspace_id,
      dir: join(dir, "sandbox"),
      rootfs,
      snapshotsDir: join(dir, "snapshots"),
      snapshot,
      limits: {
        vcpus: w.spec.vcpus,
        memory_mib: w.spec.memory_mib,
        pids_max: w.spec.pids_max ?? DEFAULTS.pids_max,
        disk_mib: w.spec.disk_mib ?? DEFAULTS.disk_mib,
      },
      appDir: this.engine.appDir,
      runtimeCacheDir: join(this.engine.paths.home, "runtime"),
      ...this.net.specFor(w.workspace_id, this.backendOrNull(w.backend)),
    };
  }

  private backendOrNull(name: BackendName | undefined): WorkspaceBackend | undefined {
    try {
      return name ? this.engine.backend(name) : undefined;
    } catch {
      return undefined;
    }
  }

  /**
   * Resolves an id or unique name; unknown → workspace_not_found. Reaps expired ones
   * first, and finishes a create or delete whose process died (then it is not found).
   */
  async get(idOrName: string): Promise<WorkspaceRow> {
    await this.reapExpiredSometimes();
    let w = this.store.getWorkspace(idOrName);
    if (w && (await interrupted(w))) {
      await this.destroy(w).catch(() => {});
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

  async create(options: CreateOptions) {
    // No environment named: the seed repository's recipe, when it has one.
    const recipeEnv =
      options.environment === undefined && options.seed_path && this.engine.seedRecipe
        ? await this.engine.seedRecipe(options.seed_path, {
            ...(options.signal ? { signal: options.signal } : {}),
            ...(options.on_progress ? { onProgress: options.on_progress } : {}),
          })
        : null;
    const environment = options.environment ?? recipeEnv ?? "debian:12";
    const backend = await this.engine.chooseBackend(options.backend, options.allow_host_compat === true);
    const { diskMib, policy, ports } = this.checkCreate(options, backend);
    // Secrets first: a missing host variable or terminal fails before anything is made.
    const secrets = await resolveSecrets(options.secrets ?? {}, this.engine.env, options.prompt_secret);
    const env = await this.engine.environments.pull(environment, {
      ...(options.signal ? { signal: options.signal } : {}),
      ...(options.on_progress ? { onProgress: options.on_progress } : {}),
    });
    const id = `ws_${randomBytes(6).toString("hex")}`;
    const dir = this.workspaceDir(id);
    const baseline = join(dir, "snapshots", "baseline");
    // Until the create is recorded as done, another client can tell whether this process
    // still works on it (recovery.ts rolls back creates whose process died).
    await makeWorkspaceDir(dir);
    let created: WorkspaceRow | null = null;
    try {
      const seed = await seedInto(
        baseline,
        options,
        options.signal,
        [this.engine.paths.home, this.engine.paths.environmentsDir, ...secretKeyPaths(this.engine.env)],
        join(this.engine.paths.home, "repos", id),
      );
      created = this.store.createWorkspace({
        workspace_id: id,
        name: options.name ?? null,
        labels: options.labels ?? {},
        environment,
        backend: backend.name,
        state: "creating",
        network_policy: policy,
        ttl_seconds: options.ttl_seconds === undefined ? DEFAULTS.ttl_seconds : options.ttl_seconds,
        workspace_seed: seed,
        spec: createSpec(options, diskMib, ports, env.image_env),
        runtime: { rootfs: env.rootfs, env_key: env.recipe_key, owner: await currentOwner() },
        current_snapshot: "baseline",
        secret_refs: secrets.refs,
      });
      this.secrets.save(id, secrets.values);
      this.store.upsertSnapshot({
        workspace_id: id,
        name: "baseline",
        kind: "baseline",
        layer: baseline,
        bytes: seed.bytes,
        file_count: seed.file_count,
      });
      created = await this.startNetwork(created, backend);
      const state = await backend.start(
        this.sandboxSpec(created),
        options.signal ? { signal: options.signal } : {},
      );
      const w = this.setState(id, "running", { runtime: { sandbox: state, owner: null } });
      this.recordCreated(w, environment, backend, seed);
      return workspaceView(w, backend.executionMode);
    } catch (err) {
      await this.rollbackCreate(id, created, backend);
      throw err;
    }
  }

  /** The create's event in the workspace's history, and the engine event hosts see. */
  private recordCreated(
    w: WorkspaceRow,
    environment: string,
    backend: WorkspaceBackend,
    seed: WorkspaceSeed,
  ): void {
    const id = w.workspace_id;
    this.store.recordEvent(id, "create", {
      environment,
      backend: backend.name,
      seed: seed.kind,
      source: seed.source,
    });
    this.emit({
      level: "notice",
      kind: "workspace",
      message: `workspace ${label(w)} created: ${environment} on ${backend.name}, sandbox started`,
      workspace_id: id,
      workspaces_changed: true,
      data: { environment, backend: backend.name },
    });
  }

  /** What a create is refused for before anything is made: limits, seed, policy, name. */
  private checkCreate(
    options: CreateOptions,
    backend: WorkspaceBackend,
  ): { diskMib: number; policy: NetworkPolicy; ports: PublishedPort[] } {
    const diskMib = checkDiskMib(options.disk_mib, backend.name);
    checkLimits(options);
    if (options.repo_ref !== undefined && !options.repo_url)
      throw new PyroError(
        "invalid_argument",
        "a repository ref (--repo-ref) needs a repository URL (--repo-url)",
        "give the repository with --repo-url, or drop --repo-ref",
      );
    const policy = parseNetworkPolicy(options.network_policy);
    const ports = checkPublishedPorts(options.published_ports);
    checkNetworkSupport(backend, policy, ports);
    if (options.name !== undefined) validateName(options.name);
    if (options.name && this.store.nameTaken(options.name)) {
      throw new PyroError(
        "conflict",
        `a workspace named '${options.name}' already exists`,
        "pick another name or delete the old one",
      );
    }
    return { diskMib, policy, ports };
  }

  /**
   * Starts (or stops) the workspace's network helper to match its row, recording the
   * published ports as bound (a host port 0 becomes the one picked, kept for restarts).
   */
  private async startNetwork(w: WorkspaceRow, backend: WorkspaceBackend): Promise<WorkspaceRow> {
    const bound = await this.net.ensure(w, backend);
    const asked = w.spec.published_ports ?? [];
    if (!bound || JSON.stringify(bound) === JSON.stringify(asked)) return w;
    return this.store.updateWorkspace(w.workspace_id, { spec: { ...w.spec, published_ports: bound } });
  }

  /** Undoes a create that failed: its row, its sandbox and its directory (best effort). */
  private async rollbackCreate(
    id: string,
    created: WorkspaceRow | null,
    backend: WorkspaceBackend,
  ): Promise<void> {
    await this.net.stop(id).catch(() => {});
    if (created) this.store.deleteWorkspace(id);
    const row =
      created ?? ({ workspace_id: id, spec: { vcpus: 1, memory_mib: 1 }, runtime: {} } as WorkspaceRow);
    await backend.destroy(this.sandboxSpec(row), null).catch(() => {});
    await removeTree(this.workspaceDir(id)).catch(() => {});
  }

  async list() {
    await this.reapExpired();
    const rows = this.store.listWorkspaces();
    return { count: rows.length, workspaces: rows.map(workspaceListItem) };
  }

  async status(idOrName: string) {
    // An `error` workspace is shown as it is (with why); a use retries its start.
    const found = await this.get(idOrName);
    const w = found.state === "error" ? found : await this.refreshState(found);
    return workspaceView(w, this.engine.backend(w.backend).executionMode);
  }

  async update(
    idOrName: string,
    patch: {
      name?: string;
      set_labels?: Record<string, string>;
      clear_labels?: string[];
      network_policy?: string;
    },
  ) {
    const w = await this.get(idOrName);
    assertAllowed(w.state, "update", w.workspace_id);
    const policy = patch.network_policy === undefined ? undefined : parseNetworkPolicy(patch.network_policy);
    if (policy !== undefined)
      checkNetworkSupport(this.engine.backend(w.backend), policy, w.spec.published_ports ?? []);
    if (patch.name !== undefined) {
      validateName(patch.name);
      if (this.store.nameTaken(patch.name, w.workspace_id))
        throw new PyroError("conflict", `a workspace named '${patch.name}' already exists`);
    }
    const updated = this.journal(w.workspace_id, (store) => {
      const row = store.updateWorkspace(w.workspace_id, {
        ...(patch.name !== undefined ? { name: patch.name } : {}),
        ...(patch.set_labels ? { set_labels: patch.set_labels } : {}),
        ...(patch.clear_labels ? { clear_labels: patch.clear_labels } : {}),
        ...(policy !== undefined ? { network_policy: policy } : {}),
      });
      store.recordEvent(w.workspace_id, "update", patch as Record<string, unknown>);
      return row;
    });
    // The helper reads the policy per connection: starting or stopping it is all a change needs.
    if (policy !== undefined && updated.state === "running")
      await this.startNetwork(updated, this.engine.backend(w.backend));
    return workspaceView(updated, this.engine.backend(w.backend).executionMode);
  }

  /** The capability blocks of a workspace: destinations its proxy refused. */
  async networkBlocks(idOrName: string) {
    const w = await this.get(idOrName);
    const blocks = this.store.listNetworkBlocks(w.workspace_id).map((b) => ({
      kind: b.kind,
      target: b.target,
      reason: b.reason,
      count: b.count,
      first_at: b.first_at,
      last_at: b.last_at,
    }));
    return { workspace_id: w.workspace_id, network_policy: w.network_policy, count: blocks.length, blocks };
  }

  /**
   * A human's approval of `target` (`host[:port]`): allowed from the next connection
   * on (the helper reads the row per connection). Never an MCP tool: a model must not
   * approve its own egress.
   */
  async approveNetwork(idOrName: string, target: string) {
    const w = await this.get(idOrName);
    assertAllowed(w.state, "update", w.workspace_id);
    const next = approvedPolicy(w, target);
    const updated = this.journal(w.workspace_id, (store) => {
      const row = store.updateWorkspace(w.workspace_id, {
        network_policy: next.policy,
        spec: { ...w.spec, network_approved: next.approved },
      });
      store.recordEvent(w.workspace_id, "network_approve", { target: next.target });
      return row;
    });
    return {
      workspace_id: w.workspace_id,
      target: next.target,
      network_policy: updated.network_policy,
      approved: next.approved,
    };
  }

  async delete(idOrName: string) {
    const w = await this.get(idOrName);
    await this.destroy(w);
    this.emit({
      level: "info",
      kind: "workspace",
      message: `workspace ${label(w)} deleted`,
      workspaces_changed: true,
      data: { workspace_id: w.workspace_id },
    });
    return { workspace_id: w.workspace_id, name: w.name, deleted: true };
  }

  private async destroy(w: WorkspaceRow): Promise<void> {
    this.setState(w.workspace_id, "deleting", { runtime: { owner: await currentOwner() } });
    await this.dropClient(w.workspace_id);
    await this.net.stop(w.workspace_id);
    const backend = this.engine.backend(w.backend);
    await backend.destroy(this.sandboxSpec(w), sandboxState(w));
    await removeTree(this.workspaceDir(w.workspace_id));
    this.store.deleteWorkspace(w.workspace_id);
    this.secrets.forget(w.workspace_id);
  }

  private lastReap = 0;

  /**
   * Reaping costs a query; on the hot path (every exec of a warm SDK or MCP client) it
   * runs at most once every 10 s per client. Listing always reaps.
   */
  private async reapExpiredSometimes(): Promise<void> {
    const now = Date.now();
    if (now - this.lastReap < 10_000) return;
    this.lastReap = now;
    await this.reapExpired();
  }

  /**
   * Deletes workspaces whose TTL ran out, and cleans up after clients that died mid-create
   * or mid-delete (recovery.ts). Errors on one do not block the others.
   */
  async reapExpired(): Promise<string[]> {
    const reaped: string[] = await recoverInterrupted({
      rows: () => this.store.listWorkspaces(),
      row: (id) => this.store.getWorkspace(id),
      workspacesDir: join(this.engine.paths.home, "workspaces"),
      destroy: (w) => this.destroy(w),
    });
    for (const id of reaped)
      this.emit({
        level: "notice",
        kind: "workspace",
        message: `workspace ${id} removed: an interrupted create or delete was cleaned up`,
        workspaces_changed: true,
        data: { workspace_id: id, reason: "interrupted" },
      });
    for (const w of this.store.expiredWorkspaces()) {
      try {
        await this.destroy(w);
        reaped.push(w.workspace_id);
        this.emit({
          level: "notice",
          kind: "workspace",
          message: `workspace ${label(w)} reaped: it expired at ${w.expires_at}`,
          workspaces_changed: true,
          data: { workspace_id: w.workspace_id, reason: "expired" },
        });
      } catch {
        // retried at the next reap
      }
    }
    return reaped;
  }

  async stop(idOrName: string) {
    const w = await this.get(idOrName);
    assertAllowed(w.state, "stop", w.workspace_id);
    await this.dropClient(w.workspace_id);
    const state = sandboxState(w);
    if (state) await this.engine.backend(w.backend).stop(state);
    await this.net.stop(w.workspace_id);
    const updated = this.setState(w.workspace_id, "stopped", { runtime: { sandbox: null } });
    this.store.recordEvent(w.workspace_id, "stop", {});
    this.emit({
      level: "info",
      kind: "sandbox",
      message: `workspace ${label(w)}: sandbox stopped`,
      workspace_id: w.workspace_id,
    });
    return workspaceView(updated, this.engine.backend(w.backend).executionMode);
  }

  async start(idOrName: string) {
    const w = await this.get(idOrName);
    if (w.state === "running") return this.status(idOrName);
    assertAllowed(w.state, "start", w.workspace_id);
    const started = await this.ensureStarted(w, true);
    this.store.recordEvent(w.workspace_id, "start", {});
    return workspaceView(started, this.engine.backend(w.backend).executionMode);
  }

  /**
   * A workspace marked running whose sandbox died (host reboot, OOM of the sandbox) is
   * restarted on its kept writable layer; one marked stopped stays stopped.
   */
  private async refreshState(w: WorkspaceRow): Promise<WorkspaceRow> {
    // An `error` workspace is one whose last start failed: every use tries again.
    if (w.state !== "running" && w.state !== "error") return w;
    const state = sandboxState(w);
    const backend = this.engine.backend(w.backend);
    if (state && (await backend.isRunning(state))) {
      // A helper that died (killed, host restarted it away) is started again on its own.
      if (this.net.needed(w) && !(await this.net.running(w.workspace_id)))
        return this.startNetwork(w, backend);
      return w;
    }
    return this.ensureStarted(w, false);
  }

  private async ensureStarted(w: WorkspaceRow, explicit: boolean): Promise<WorkspaceRow> {
    const release = await acquireLock(join(this.workspaceDir(w.workspace_id), "start.lock"), {
      timeoutMs: 60_000,
    });
    try {
      const fresh = this.store.getWorkspace(w.workspace_id);
      if (!fresh) throw new PyroError("workspace_not_found", `workspace ${w.workspace_id} was deleted`);
      const backend = this.engine.backend(fresh.backend);
      const state = sandboxState(fresh);
      if (state && (await backend.isRunning(state))) return fresh;
      if (!explicit && fresh.state !== "running") assertAllowed(fresh.state, "exec", fresh.workspace_id);
      if (state) await backend.stop(state);
      const started = await this.startSandbox(fresh, this.sandboxSpec(fresh));
      this.emit(
        explicit
          ? {
              level: "info",
              kind: "sandbox",
              message: `workspace ${label(fresh)}: sandbox started on ${fresh.backend}`,
              workspace_id: fresh.workspace_id,
            }
          : {
              level: "warning",
              kind: "sandbox",
              message: `workspace ${label(fresh)}: its sandbox was not running (${fresh.state === "error" ? "its last start failed" : "it died"}); restarted on its kept files${(started.spec.services ?? []).length > 0 ? ", services starting again" : ""}`,
              workspace_id: fresh.workspace_id,
            },
      );
      // Its services died with the sandbox: the kept ones start again (core/services.ts).
      if ((started.spec.services ?? []).length > 0) {
        await this.dropClient(started.workspace_id);
        await restartServices(this, await this.client(started, backend), started);
      }
      return started;
    } finally {
      await release();
    }
  }

  /**
   * The journal of a workspace: what an operation did (a command row, its review event,
   * a snapshot, a counter), written in one transaction with the workspace's activity time.
   */
  journal<R>(id: string, write: (store: JournalWriter) => R): R {
    return this.store.atomically(() => {
      const r = write(this.store);
      this.store.touch(id);
      return r;
    });
  }

  /**
   * Runs `fn` with a connected agent of a running workspace; reconnects once on a dead
   * channel. `fn` records what it did through `journal` (one transaction, activity
   * included); a call that journals nothing still counts as activity.
   */
  async withAgent<T>(
    idOrName: string,
    op: Operation,
    fn: (
      agent: AgentClient,
      w: WorkspaceRow,
      journal: <R>(write: (store: JournalWriter) => R) => R,
    ) => Promise<T>,
  ): Promise<T> {
    let w = await this.get(idOrName);
    assertAllowed(w.state, op, w.workspace_id);
    w = await this.refreshState(w);
    const backend = this.engine.backend(w.backend);
    for (let attempt = 0; ; attempt++) {
      let client: AgentClient;
      try {
        client = await this.client(w, backend);
        // A cached connection whose sandbox went away (restarted by another process, or
        // died): reconnect before sending anything.
        if (client.closed)
          throw new PyroError("backend_unavailable", "the cached agent connection is closed");
      } catch (err) {
        await this.dropClient(w.workspace_id);
        if (attempt > 0) throw toPyroError(err);
        w = await this.refreshState(this.store.getWorkspace(w.workspace_id) ?? w);
        continue;
      }
      try {
        let journaled = false;
        const id = w.workspace_id;
        const journal = <R>(write: (store: JournalWriter) => R): R => {
          journaled = true;
          return this.journal(id, write);
        };
        const result = await fn(client, w, journal);
        if (!journaled) this.store.touch(id);
        return result;
      } catch (err) {
        if (
          err instanceof AgentError &&
          (err.code === "agent_disconnected" || err.code === "protocol_violation")
        ) {
          // The connection broke while the request was in flight: it may have run in part,
          // so it is not run again. The next request finds the sandbox dead and restarts it.
          await this.dropClient(w.workspace_id);
          const state = sandboxState(w);
          const alive = state ? await stillRunningAfterBreak(backend, state) : false;
          throw redactError(
            new PyroError(
              "backend_unavailable",
              alive
                ? `the connection to workspace ${w.workspace_id}'s agent broke during the request (${(err as Error).message})`
                : `workspace ${w.workspace_id}'s sandbox died during the request`,
              alive
                ? "retry the request"
                : "retry: the next request restarts the sandbox with the workspace's files kept",
            ),
            await this.secretValues(w),
          );
        }
        throw redactError(toPyroError(err), await this.secretValues(w));
      }
    }
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
    await this.dropClient(w.workspace_id);
    const state = sandboxState(w);
    if (state) await backend.stop(state);
    const spec = this.sandboxSpec(w, snapshot);
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
   * Starts a workspace's sandbox and records it running; a start that fails records the
   * `error` state with the reason (the files are kept; the next use tries again).
   */
  private async startSandbox(w: WorkspaceRow, spec: SandboxSpec): Promise<WorkspaceRow> {
    let started: SandboxState;
    try {
      const backend = this.engine.backend(w.backend);
      await this.startNetwork(w, backend);
      started = await backend.start(spec);
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
    if (!this.engine.events?.listening || w.network_policy === "off") return;
    for (const b of this.store.listNetworkBlocks(w.workspace_id)) {
      if (b.last_at < since) break; // most recent first
      this.emit({
        level: "warning",
        kind: "network",
        message: `workspace ${label(w)}: network policy ${w.network_policy} refused ${b.target} (${b.reason}; ${b.count} time(s) so far); a person can approve it with \`pyro workspace network approve ${w.workspace_id} ${b.target}\``,
        workspace_id: w.workspace_id,
        data: { target: b.target, count: b.count, reason: b.reason },
      });
    }
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

  async snapshotSize(dir: string) {
    return treeSize(dir);
  }

  async removeSnapshotDir(w: WorkspaceRow, name: string): Promise<void> {
    await rm(this.snapshotDir(w, name), { recursive: true, force: true });
  }
}

export function sandboxState(w: WorkspaceRow): SandboxState | null {
  const s = w.runtime.sandbox;
  return s && typeof s === "object" ? (s as SandboxState) : null;
}

/** How events name a workspace: its id, and its name when it has one. */
function label(w: { workspace_id: string; name: string | null }): string {
  return w.name ? `${w.workspace_id} (${w.name})` : w.workspace_id;
}
