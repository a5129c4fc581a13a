import { join } from "node:path";
import { fileURLToPath } from "node:url";
import {
  BACKEND_NAMES,
  type BackendName,
  type BackendProbe,
  type WorkspaceBackend,
} from "../backends/backend.js";
import { BwrapBackend } from "../backends/bwrap/backend.js";
import { DockerBackend } from "../backends/docker/backend.js";
import { FirecrackerBackend } from "../backends/firecracker/backend.js";
import { GvisorBackend } from "../backends/gvisor/backend.js";
import { HostBackend } from "../backends/host/backend.js";
import { probeKvm } from "../backends/kvm.js";
import { QemuBackend } from "../backends/qemu/backend.js";
import { BACKEND_PROBES } from "../backends/registry.js";
import type { Builder } from "../env/builder.js";
import { EnvironmentCache } from "../env/cache.js";
import { DebootstrapBuilder } from "../env/debootstrap.js";
import { PyroError } from "../errors.js";
import { StateStore } from "../state/store.js";
import { makeDirsSync } from "../util/fs.js";
import { type PathOptions, type PyroPaths, resolvePaths } from "./config.js";
import { Workspaces } from "./workspaces.js";

export interface EngineOptions extends PathOptions {
  /** Debian mirror for environment builds (default: PYRO_DEBIAN_MIRROR, else the host's apt mirror). */
  mirror?: string;
  /** Replace the environment builders (tests use a fake builder). */
  builders?: readonly Builder[];
  /** Replace or add workspace backends (tests use a fake backend). */
  backends?: Partial<Record<BackendName, WorkspaceBackend>>;
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
  readonly environments: EnvironmentCache;
  readonly workspaces: Workspaces;
  readonly appDir = APP_DIR;
  private readonly backends: Partial<Record<BackendName, WorkspaceBackend>>;
  private stateStore: StateStore | undefined;
  private readonly injected: ReadonlySet<BackendName>;

  constructor(options: EngineOptions = {}) {
    this.env = options.env ?? process.env;
    this.paths = resolvePaths(options);
    const mirror = options.mirror ?? this.env.PYRO_DEBIAN_MIRROR;
    const builders = options.builders ?? [
      new DebootstrapBuilder({ debCacheDir: this.paths.debCacheDir, ...(mirror ? { mirror } : {}) }),
    ];
    this.environments = new EnvironmentCache(this.paths.environmentsDir, builders);
    this.backends = {
      firecracker: new FirecrackerBackend(),
      qemu: new QemuBackend(),
      gvisor: new GvisorBackend(),
      docker: new DockerBackend(this.env),
      bwrap: new BwrapBackend(),
      host: new HostBackend(),
      ...options.backends,
    };
    this.injected = new Set(Object.keys(options.backends ?? {}) as BackendName[]);
    this.workspaces = new Workspaces(this);
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

  implemented(): BackendName[] {
    return BACKEND_NAMES.filter((n) => this.backends[n] !== undefined);
  }

  /**
   * Chooses the backend for a new workspace: the explicit one (option, then PYRO_BACKEND),
   * else the strongest isolating backend that works here. `host` only with
   * allowHostCompat, and never silently: when asked for nothing and no isolating backend
   * works, host-compat is used only if allowed. Fails closed otherwise.
   */
  async chooseBackend(
    requested: BackendName | undefined,
    allowHostCompat: boolean,
  ): Promise<WorkspaceBackend> {
    const explicit = requested ?? (this.env.PYRO_BACKEND as BackendName | undefined);
    if (explicit !== undefined) {
      if (!BACKEND_NAMES.includes(explicit)) {
        throw new PyroError(
          "invalid_argument",
          `unknown backend '${explicit}'`,
          `backends: ${BACKEND_NAMES.join(", ")}`,
        );
      }
      if (explicit === "host" && !allowHostCompat) {
        throw new PyroError(
          "backend_unavailable",
          "the host backend gives no isolation",
          "pass --allow-host-compat to use it anyway",
        );
      }
      const backend = this.backend(explicit);
      if (!this.backendsOverridden(explicit)) await this.assertAvailable(explicit);
      return backend;
    }
    const failures: string[] = [];
    for (const probe of BACKEND_PROBES) {
      if (probe.strength === 0 || !this.backends[probe.name]) continue;
      if (this.backendsOverridden(probe.name)) return this.backend(probe.name);
      const r = await this.probe(probe.name);
      if (r.available && !r.opt_in) return this.backend(probe.name);
      failures.push(`${probe.name}: ${r.reason}`);
    }
    if (allowHostCompat) return this.backend("host");
    throw new PyroError(
      "backend_unavailable",
      `no isolating backend works on this host (${failures.join("; ") || "none implemented"})`,
      "run `pyro doctor`; install bubblewrap (npm run setup) or pass --allow-host-compat to run without isolation",
    );
  }

  /** Injected backends (tests) are taken as working; real ones are proved by their probe. */
  private backendsOverridden(name: BackendName): boolean {
    return this.injected.has(name);
  }

  private readonly probes = new Map<BackendName, ReturnType<BackendProbe["probe"]>>();

  /** Probes a backend once per engine: a long-lived SDK client or server pays it once. */
  private probe(name: BackendName): ReturnType<BackendProbe["probe"]> {
    let p = this.probes.get(name);
    if (!p) {
      p = this.probeNow(name);
      this.probes.set(name, p);
    }
    return p;
  }

  private async probeNow(name: BackendName) {
    const p = BACKEND_PROBES.find((x) => x.name === name)!;
    let kvm: ReturnType<typeof probeKvm> | undefined;
    return p.probe({
      env: this.env,
      scratchDir: join(this.paths.home, "probe", name),
      timeoutMs: 10_000,
      kvm: () => {
        kvm ??= probeKvm(this.env, join(this.paths.home, "probe", "kvm"), 10_000);
        return kvm;
      },
    });
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
    await this.workspaces.close();
    this.stateStore?.close();
    this.stateStore = undefined;
  }
}
