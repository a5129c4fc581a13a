import type { BuildContext, Builder, BuildOutput, VersionCheck } from "./builder.js";
import type { EnvironmentSource, EnvironmentSpec } from "./catalog.js";

/**
 * A builder whose implementation is imported when it first builds or asks a registry:
 * most engines never build anything (a `pyro run` on a cached environment), and the
 * image client alone is ~15 modules. `currentVersion` exists only when the builder has
 * one: the cache tests its presence (an image tag moves; a recipe does not).
 */
export class LazyBuilder implements Builder {
  declare currentVersion?: Builder["currentVersion"];
  private loading: Promise<Builder> | undefined;

  constructor(
    readonly kind: EnvironmentSource["kind"],
    private readonly loader: () => Promise<Builder>,
    options: { versioned?: boolean } = {},
  ) {
    if (options.versioned)
      this.currentVersion = async (spec, ctx): Promise<VersionCheck> => {
        const b = await this.load();
        if (!b.currentVersion) throw new Error(`the ${this.kind} builder has no currentVersion`);
        return b.currentVersion(spec, ctx);
      };
  }

  async build(spec: EnvironmentSpec, ctx: BuildContext): Promise<BuildOutput> {
    return (await this.load()).build(spec, ctx);
  }

  /** The implementation, imported once (a failed import is tried again next time). */
  private load(): Promise<Builder> {
    this.loading ??= this.loader().catch((err: unknown) => {
      this.loading = undefined;
      throw err;
    });
    return this.loading;
  }
}
