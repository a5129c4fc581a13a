import type { Builder } from "../env/builder.js";
import { EnvironmentCache } from "../env/cache.js";
import { DebootstrapBuilder } from "../env/debootstrap.js";
import { type PathOptions, type PyroPaths, resolvePaths } from "./config.js";

export interface EngineOptions extends PathOptions {
  /** Debian mirror for environment builds (default: PYRO_DEBIAN_MIRROR, else the host's apt mirror). */
  mirror?: string;
  /** Replace the environment builders (tests use a fake builder). */
  builders?: readonly Builder[];
}

/**
 * The core: one instance per client (CLI call, SDK object, MCP server). Holds no global
 * state; two engines with different homes never interfere.
 */
export class Engine {
  readonly paths: PyroPaths;
  readonly env: NodeJS.ProcessEnv;
  readonly environments: EnvironmentCache;

  constructor(options: EngineOptions = {}) {
    this.env = options.env ?? process.env;
    this.paths = resolvePaths(options);
    const mirror = options.mirror ?? this.env.PYRO_DEBIAN_MIRROR;
    const builders = options.builders ?? [
      new DebootstrapBuilder({ debCacheDir: this.paths.debCacheDir, ...(mirror ? { mirror } : {}) }),
    ];
    this.environments = new EnvironmentCache(this.paths.environmentsDir, builders);
  }
}
