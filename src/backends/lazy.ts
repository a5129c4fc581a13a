import type { Duplex } from "node:stream";
import type { AgentClient } from "../agent/client.js";
import { PyroError } from "../errors.js";
import type {
  BackendName,
  ExecutionMode,
  OneShotResult,
  OneShotSpec,
  PackedPath,
  SandboxSpec,
  SandboxState,
  WorkspaceBackend,
  WorkspaceWriter,
} from "./backend.js";

/**
 * The optional WorkspaceBackend methods whose presence the core tests (`if
 * (backend.runOnce)`) before it has loaded the backend. `exposeSnapshot`, `resetInPlace`,
 * `packWorkspacePath` and `workspaceWriter` are not: the facade always has them, and answers nothing (or
 * null) for a backend without them.
 */
export const BACKEND_FEATURES = [
  "connectPort",
  "connectNet",
  "openDisk",
  "runOnce",
  "adoptSpare",
  "diskLimitSupport",
  "egressNamespace",
] as const;
export type BackendFeature = (typeof BACKEND_FEATURES)[number];

/** What a LazyBackend knows before loading (a registry entry). */
export interface LazyTraits {
  readonly name: BackendName;
  readonly executionMode: ExecutionMode;
  readonly features: readonly BackendFeature[];
  /**
   * Imports the backend's one-shot runner alone (`runOnce` without the rest of the
   * backend: a `pyro run` needs no sandbox state, reset or pool code, and the state's
   * schemas alone are ~300 KB of zod to compile). Used while the backend is not loaded.
   */
  readonly oneShot?: () => Promise<OneShotRunner>;
}

/** A backend's `runOnce`, bound to what it needs. */
export type OneShotRunner = (spec: OneShotSpec) => Promise<OneShotResult>;

/**
 * A backend whose implementation is imported on first use: the engine holds one per
 * registry entry, so `pyro workspace list` or a bwrap-only process never loads the Docker
 * client or the VM backends. Every asynchronous method loads and forwards; the
 * synchronous members are the registry's data, except the two path helpers, which need
 * the loaded backend (the core calls them only after it started, connected to or
 * exposed a snapshot of the workspace, all of which load it).
 */
export class LazyBackend implements WorkspaceBackend {
  readonly name: BackendName;
  readonly executionMode: ExecutionMode;
  // `declare`: no own property unless the backend has the method (presence is the contract).
  declare connectPort?: WorkspaceBackend["connectPort"];
  declare connectNet?: WorkspaceBackend["connectNet"];
  declare openDisk?: WorkspaceBackend["openDisk"];
  declare runOnce?: WorkspaceBackend["runOnce"];
  declare adoptSpare?: WorkspaceBackend["adoptSpare"];
  declare diskLimitSupport?: WorkspaceBackend["diskLimitSupport"];
  declare egressNamespace?: WorkspaceBackend["egressNamespace"];
  private loading: Promise<WorkspaceBackend> | undefined;
  private real: WorkspaceBackend | undefined;
  private oneShot: Promise<OneShotRunner> | undefined;

  constructor(
    traits: LazyTraits,
    private readonly loader: () => Promise<WorkspaceBackend>,
  ) {
    this.name = traits.name;
    this.executionMode = traits.executionMode;
    for (const f of traits.features) {
      // biome-ignore lint/suspicious/noExplicitAny: forwards the method's own arguments unchanged
      (this as any)[f] = async (...args: unknown[]) => {
        const b = await this.load();
        const method = b[f] as ((...a: unknown[]) => Promise<unknown>) | undefined;
        if (!method) throw new PyroError("internal", `backend '${this.name}' has no ${f}`);
        return method.apply(b, args);
      };
    }
    const loadOneShot = traits.oneShot;
    if (loadOneShot && traits.features.includes("runOnce"))
      this.runOnce = async (spec) => {
        if (this.real?.runOnce) return this.real.runOnce(spec);
        this.oneShot ??= loadOneShot().catch((err: unknown) => {
          this.oneShot = undefined;
          throw err;
        });
        return (await this.oneShot)(spec);
      };
  }

  /** The implementation, imported and built once (a failed import is retried next time). */
  load(): Promise<WorkspaceBackend> {
    this.loading ??= this.loader().then(
      (b) => {
        this.real = b;
        return b;
      },
      (err) => {
        this.loading = undefined;
        throw err;
      },
    );
    return this.loading;
  }

  private loaded(): WorkspaceBackend {
    if (!this.real) throw new PyroError("internal", `backend '${this.name}' was used before it was loaded`);
    return this.real;
  }

  async start(spec: SandboxSpec, options?: { signal?: AbortSignal }): Promise<SandboxState> {
    return (await this.load()).start(spec, options);
  }
  async connect(state: SandboxState, options?: { timeoutMs?: number }): Promise<Duplex> {
    return (await this.load()).connect(state, options);
  }
  async isRunning(state: SandboxState): Promise<boolean> {
    return (await this.load()).isRunning(state);
  }
  async stop(state: SandboxState, options?: { discarding?: boolean }): Promise<void> {
    return (await this.load()).stop(state, options);
  }
  async discardChanges(spec: SandboxSpec): Promise<void> {
    return (await this.load()).discardChanges(spec);
  }
  async destroy(spec: SandboxSpec, state: SandboxState | null): Promise<void> {
    return (await this.load()).destroy(spec, state);
  }
  async exposeSnapshot(
    spec: SandboxSpec,
    state: SandboxState,
    name: string,
    agent: AgentClient,
  ): Promise<void> {
    await (await this.load()).exposeSnapshot?.(spec, state, name, agent);
  }
  async resetInPlace(
    spec: SandboxSpec,
    state: SandboxState,
    agent: AgentClient,
  ): Promise<SandboxState | null> {
    const backend = await this.load();
    return backend.resetInPlace ? backend.resetInPlace(spec, state, agent) : null;
  }
  async packWorkspacePath(spec: SandboxSpec, state: SandboxState, rel: string): Promise<PackedPath | null> {
    const backend = await this.load();
    return backend.packWorkspacePath ? backend.packWorkspacePath(spec, state, rel) : null;
  }
  async workspaceWriter(spec: SandboxSpec, state: SandboxState): Promise<WorkspaceWriter | null> {
    const backend = await this.load();
    return backend.workspaceWriter ? backend.workspaceWriter(spec, state) : null;
  }
  agentRoot(spec: SandboxSpec): string {
    return this.loaded().agentRoot(spec);
  }
  agentSnapshotPath(spec: SandboxSpec, name: string): string {
    return this.loaded().agentSnapshotPath(spec, name);
  }
}
