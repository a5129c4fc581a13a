import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { BuildContext, Builder, BuildOutput } from "../../src/env/builder.js";
import type { EnvironmentSpec } from "../../src/env/catalog.js";

/** A builder that writes a tiny rootfs; can be slowed down or made to fail. */
export class FakeBuilder implements Builder {
  readonly kind = "debootstrap" as const;
  builds = 0;

  constructor(private readonly opts: { delayMs?: number; failAfterFiles?: boolean } = {}) {}

  async build(spec: EnvironmentSpec, ctx: BuildContext): Promise<BuildOutput> {
    this.builds++;
    await mkdir(join(ctx.rootfs, "etc"), { recursive: true });
    await writeFile(join(ctx.rootfs, "etc/os-release"), `NAME=fake ${spec.name}\n`);
    ctx.onProgress?.({ phase: "unpack", message: "fake", count: 1 });
    if (this.opts.delayMs) await new Promise((r) => setTimeout(r, this.opts.delayMs));
    if (this.opts.failAfterFiles) throw new Error("fake build failed halfway");
    return { source_detail: { fake: true }, package_count: 1 };
  }
}
