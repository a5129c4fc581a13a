import { existsSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import {
  BACKEND_NAMES,
  type BackendName,
  type BackendProbe,
  type BackendSettings,
  type WorkspaceBackend,
} from "../backends/backend.js";
import { type KvmCheck, kvmCheck } from "../backends/kvm.js";
import { LaunchKeeper } from "../backends/launch-keeper.js";
import { LazyBackend } from "../backends/lazy.js";
import { BACKENDS, backendEntry, chooseDefault } from "../backends/registry.js";
import type { Builder } from "../env/builder.js";
import { OCI_DIR, type PullOptions } from "../env/cache.js";
import { LazyBuilder } from "../env/lazy-builder.js";
import { PyroError } from "../errors.js";
import { StateStore } from "../state/store.js";
import { makeDirsSync } from "../util/fs.js";
import { type ConfigOptions, loadConfig, type PyroConfig, type PyroPaths } from "./config.js";
import { EngineEvents, ObservedEnvironmentCache } from "./events.js";
import { poolDirOf, SandboxPool, spareRootfsSync } from "./pool.js";
import { cachedProbe, verdictsFile } from "./probe-cache.js";
import { Workspaces } from "./workspaces.js";

/** Paths, env and mirror come from ConfigOptions (src/core/config.ts). */
export interface EngineOptions extends ConfigOptions {
  /** Replace the environment builders (tests use a fake builder). */
  builders?: readonly Builder[];
  /** Replace or add workspace backends (tests use a fake backend). */
  backends?: Partial<Record<BackendName, WorkspaceBackend>>;
  /**
   * Test-only: names the egress proxy resolves to these addresses, exempt from its
   * address checks (so tests can aim at loopback servers). Never read from the
   * environment; see docs/network.md.
   */
  networkTestHosts?: Record<string, string>;
}

/** The directory of the built pyro package (holds dist/ and node_modules/), mounted for the agent. */
const APP_DIR = fileURLToPath(new URL("../..", import.meta.url));

/**
 * The core: one instance per client (CLI call, SDK object, MCP server). Holds no global
 * state; two engines with different homes never interfere.
 */
export class Engine {
  readonly paths: PyroPaths;
  readonly env: NodeJS.ProcessEnv;
  /** Option → PYRO_* variable → default, read once (src/core/config.ts). */
  readonly config: PyroConfig;
  /** What backends are configured with (they never read PYRO_* themselves). */
  readonly backendSettings: BackendSettings;
  /** The engine's one KVM verdict, shared by its probes and backends. */
  readonly kvm: KvmCheck;
  readonly environments: ObservedEnvironmentCache;
  /** What the engine reports to watchers (builds, sandbox starts, workspaces coming and going); secrets redacted. */
  readonly events: EngineEvents;
  readonly workspaces: Workspaces;
  /** Started sandboxes handed to new workspaces (core/pool.ts); off unless configured. */
  readonly pool: SandboxPool;
  /** One-shot launches prepared between runs when the pool is on (core/oneshot.ts). */
  readonly launches = new LaunchKeeper();
  readonly appDir = APP_DIR;
  readonly networkTestHosts: Record<string, string> | undefined;
  private readonly backends: Partial<Record<BackendName, WorkspaceBackend>>;
  private stateStore: StateStore | undefined;
  private readonly injected: ReadonlySet<BackendName>;

  constructor(options: EngineOptions = {}) {
    this.env = options.env ?? process.env;
    this.networkTestHosts = options.networkTestHosts;
    this.config = loadConfig({ ...options, env: this.env });
    this.paths = this.config.paths;
    const mirror = this.config.debianMirror;
    // Imported when they first build (LazyBuilder): most engines only read the cache.
    const builders = options.builders ?? [
      new LazyBuilder(
        "debootstrap",
        async () =>
          new (await import("../env/debootstrap.js")).DebootstrapBuilder({
            debCacheDir: this.paths.debCacheDir,
            ...(mirror ? { mirror } : {}),
          }),
      ),
      new LazyBuilder(
        "oci",
        async () =>
          new (await import("../env/oci/builder.js")).OciBuilder({
            storeDir: join(this.paths.environmentsDir, OCI_DIR),
            env: this.env,
            registryAuth: this.config.registryAuth,
          }),
        { versioned: true },
      ),
      new LazyBuilder("recipe", async () => {
        const [{ RecipeBuilder }, { runRecipe }] = await Promise.all([
          import("../env/recipe.js"),
          import("./recipes.js"),
        ]);
        return new RecipeBuilder((spec, ctx) => runRecipe(this, spec, ctx));
      }),
    ];
    this.environments = new ObservedEnvironmentCache(this.paths.environmentsDir, builders, () =>
      this.rootfsInUse(),
    );
    this.events = new EngineEvents((id) => this.workspaces.secretRedactorById(id));
    this.environments.events = this.events;
    this.backendSettings = { firecrackerBin: this.config.firecrackerBin };
    this.kvm = kvmCheck(this.env);
    const ctx = { env: this.env, kvm: this.kvm, settings: this.backendSettings };
    // Each backend is imported on first use (LazyBackend): most calls need one or none.
    this.backends = {
      ...Object.fromEntries(BACKENDS.map((e) => [e.name, new LazyBackend(e, () => e.load(ctx))])),
      ...options.backends,
    };
    this.injected = new Set(Object.keys(options.backends ?? {}) as BackendName[]);
    this.pool = new SandboxPool({
      size: this.config.pool,
      dir: poolDirOf(this.paths.home),
      appDir: APP_DIR,
      runtimeCacheDir: join(this.paths.home, "runtime"),
      backend: (name) => this.backend(name),
      warn: (message, id) =>
        this.events.emit({
          level: "warning",
          kind: "sandbox",
          message,
          ...(id ? { workspace_id: id } : {}),
        }),
    });
    this.workspaces = new Workspaces(this);
  }

  /**
   * Fills the pool (when it is on) for the default backend and `environment`, if that
   * environment is already cached: `pyro mcp serve` calls it at start, so its first
   * create gets a started sandbox. Never builds or downloads anything.
   */
  async warmPool(environment = "debian:12"): Promise<void> {
    if (!this.pool.enabled) return;
    const backend = await this.chooseBackend(undefined, false).catch(() => null);
    if (!backend?.adoptSpare) return;
    const info = await this.environments.info(environment).catch(() => null);
    if (info?.status !== "cached") return;
    const env = await this.environments.pull(environment);
    this.pool.want(backend, env.rootfs);
  }

  /** The environment a seed repository's `.pyro/environment.toml` builds (null without one). */
  async seedRecipe(seedPath: string, options: PullOptions = {}): Promise<string | null> {
    return (await import("./recipes.js")).seedRecipeEnvironment(this, seedPath, options);
  }

  /** Root filesystems of every workspace and of the pool's spares (environment prune keeps them). */
  private rootfsInUse(): Set<string> {
    // A spare runs on its environment like a workspace (core/pool.ts), whoever owns it.
    const used = spareRootfsSync(poolDirOf(this.paths.home));
    if (!existsSync(join(this.paths.home, "state.db"))) return used;
    for (const w of this.store().listWorkspaces()) {
      const rootfs = (w.runtime as { rootfs?: unknown }).rootfs;
      if (typeof rootfs === "string") used.add(rootfs);
    }
    return used;
  }

  /** The state store, opened on first use (commands like `doctor` never touch it). */
  store(): StateStore {
    if (!this.stateStore) {
      makeDirsSync(this.paths.home, 0o700);
      this.stateStore = StateStore.open(join(this.paths.home, "state.db"));
      // Secret values never reach the store: it redacts with each workspace's secrets.
      this.stateStore.useRedactors((id) => this.workspaces.secretRedactorById(id));
    }
    return this.stateStore;
  }

  backend(name: BackendName): WorkspaceBackend {
    const b = this.backends[name];
    if (!b)
      throw new PyroError(
        "backend_unavailable",
        `backend '${name}' is not implemented in this build`,
        `implemented: ${this.implemented().join(", ")}`,
      );
    return b;
  }

  /**
   * The backend's implementation itself, imported if it was not yet (for callers that
   * need its own methods beyond WorkspaceBackend: the qemu bench and tests).
   */
  async loadBackend(name: BackendName): Promise<WorkspaceBackend> {
    const b = this.backend(name);
    return b instanceof LazyBackend ? b.load() : b;
  }

  implemented(): BackendName[] {
    return BACKEND_NAMES.filter((n) => this.backends[n] !== undefined);
  }

  /**
   * Chooses the backend for a new workspace: the explicit one (option, then PYRO_BACKEND),
   * else the registry's default choice (chooseDefault: the strongest isolating backend
   * that works here). `host` only with allowHostCompat, and never silently: when asked
   * for nothing and no isolating backend works, host-compat is used only if allowed.
   * Fails closed otherwise.
   */
  async chooseBackend(
    requested: BackendName | undefined,
    allowHostCompat: boolean,
  ): Promise<WorkspaceBackend> {
    const explicit = requested ?? (this.config.backend as BackendName | undefined);
    if (explicit !== undefined) {
      if (!BACKEND_NAMES.includes(explicit)) {
        throw new PyroError(
          "invalid_argument",
          `unknown backend '${explicit}'`,
          `backends: ${BACKEND_NAMES.join(", ")}`,
        );
      }
      if (!backendEntry(explicit).isolating && !allowHostCompat) {
        throw new PyroError(
          "backend_unavailable",
          "the host backend gives no isolation",
          "pass {action} to use it anyway",
          { action: { cli: "--allow-host-compat", tool: "the server's --allow-host-compat flag" } },
        );
      }
      const backend = this.backend(explicit);
      if (!this.backendsOverridden(explicit)) await this.assertAvailable(explicit);
      return backend;
    }
    const choice = await chooseDefault(
      // Injected backends (tests) are taken as working; real ones are proved by their probe.
      (name) =>
        this.backendsOverridden(name) ? { available: true, opt_in: false, reason: null } : this.probe(name),
      { allowHostCompat },
    );
    if (choice.name) return this.backend(choice.name);
    throw new PyroError(
      "backend_unavailable",
      `no isolating backend works on this host (${choice.failures.join("; ") || "none implemented"})`,
      "run `pyro doctor`; install bubblewrap (npm run setup) or run without isolation with {action}",
      { action: { cli: "--allow-host-compat", tool: "the server's --allow-host-compat flag" } },
    );
  }

  private backendsOverridden(name: BackendName): boolean {
    return this.injected.has(name);
  }

  private readonly probes = new Map<BackendName, ReturnType<BackendProbe["probe"]>>();

  /** Probes a backend once per engine: a long-lived SDK client or server pays it once. */
  private probe(name: BackendName): ReturnType<BackendProbe["probe"]> {
    let p = this.probes.get(name);
    if (!p) {
      // Remembered across processes for a while when it proved the backend works
      // (probe-cache.ts): a CLI create or run otherwise starts a probe sandbox each time.
      p = cachedProbe(name, verdictsFile(this.paths.home), this.env, () =>
        backendEntry(name).probe({
          env: this.env,
          settings: this.backendSettings,
          scratchDir: join(this.paths.home, "probe", name),
          timeoutMs: 10_000,
          kvm: this.kvm,
        }),
      );
      this.probes.set(name, p);
    }
    return p;
  }

  private async assertAvailable(name: BackendName): Promise<void> {
    const r = await this.probe(name);
    if (!r.available)
      throw new PyroError(
        "backend_unavailable",
        `backend '${name}' does not work here: ${r.reason}`,
        "run `pyro doctor` for details",
      );
  }

  async close(): Promise<void> {
    await this.pool.close();
    await this.launches.close();
    await this.workspaces.close();
    this.stateStore?.close();
    this.stateStore = undefined;
  }
}
