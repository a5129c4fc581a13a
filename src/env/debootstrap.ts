import { mkdir, readdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { PyroError } from "../errors.js";
import { treeSize } from "../util/fs.js";
import { firstLine, run, which } from "../util/run.js";
import type { BuildContext, Builder, BuildOutput, BuildProgress } from "./builder.js";
import type { EnvironmentSpec } from "./catalog.js";
import { resolveMirror } from "./mirror.js";

export interface DebootstrapOptions {
  /** Debian mirror; default: PYRO_DEBIAN_MIRROR, else the host's apt mirror (see mirror.ts). */
  mirror?: string;
  /** Shared .deb download cache, so a second environment does not download again. */
  debCacheDir: string;
  /** Hard limit for one build (default 30 min). */
  timeoutMs?: number;
}

/** Builds Debian environments with `debootstrap` from Debian's archive (needs root). */
export class DebootstrapBuilder implements Builder {
  readonly kind = "debootstrap" as const;

  constructor(private readonly options: DebootstrapOptions) {}

  /** The exact argv, separate from running it so tests can pin it. */
  argv(spec: EnvironmentSpec, rootfs: string, mirror: string, debootstrap = "debootstrap"): string[] {
    const src = spec.source;
    if (src.kind !== "debootstrap") throw new Error(`not a debootstrap recipe: ${spec.name}`);
    const argv = [
      debootstrap,
      `--variant=${src.variant}`,
      `--arch=${src.arch}`,
      `--cache-dir=${this.options.debCacheDir}`,
    ];
    if (src.include.length > 0) argv.push(`--include=${src.include.join(",")}`);
    argv.push(src.suite, rootfs, mirror);
    return argv;
  }

  async build(spec: EnvironmentSpec, ctx: BuildContext): Promise<BuildOutput> {
    const bin = await which("debootstrap");
    if (!bin) {
      throw new PyroError(
        "build_failed",
        "debootstrap is not installed",
        "run `npm run setup` as root (installs debootstrap)",
      );
    }
    if (process.getuid?.() !== 0) {
      throw new PyroError(
        "permission_denied",
        "building a Debian environment needs root (debootstrap)",
        "run `sudo pyro env pull ...` or `npm run setup` as root",
      );
    }
    await mkdir(this.options.debCacheDir, { recursive: true });
    const mirror = this.options.mirror ?? (await resolveMirror());
    const tracker = new PhaseTracker(ctx.onProgress);
    // Size sampling for the progress line; cheap enough every 2 s for a ~200 MB tree.
    const sampler = ctx.onProgress
      ? setInterval(() => {
          treeSize(ctx.rootfs).then(
            (s) => tracker.size(s.bytes),
            () => {},
          );
        }, 2000)
      : undefined;
    let result: Awaited<ReturnType<typeof run>>;
    try {
      const runOpts: Parameters<typeof run>[1] = {
        timeoutMs: this.options.timeoutMs ?? 30 * 60 * 1000,
        onLine: (line) => tracker.line(line),
        env: { ...process.env, DEBIAN_FRONTEND: "noninteractive", LC_ALL: "C" },
      };
      if (ctx.signal) runOpts.signal = ctx.signal;
      // setpriv --pdeathsig: if pyro itself is killed (even SIGKILL), debootstrap dies with
      // it instead of writing into a directory the next pull will remove.
      result = await run(
        ["setpriv", "--pdeathsig", "KILL", "--", ...this.argv(spec, ctx.rootfs, mirror, bin)],
        runOpts,
      );
    } finally {
      if (sampler) clearInterval(sampler);
    }
    if (ctx.signal?.aborted) throw new PyroError("cancelled", `build of ${spec.name} was cancelled`);
    if (result.timedOut) throw new PyroError("timeout", `debootstrap for ${spec.name} timed out`);
    if (result.exitCode !== 0) {
      const tail = (result.stdout + result.stderr).trim().split("\n").slice(-5).join(" | ");
      throw new PyroError(
        "build_failed",
        `debootstrap failed for ${spec.name} (exit ${result.exitCode ?? result.signal}): ${tail}`,
        `check the mirror (${mirror}); set PYRO_DEBIAN_MIRROR to use another`,
      );
    }
    await this.clean(ctx.rootfs);
    ctx.onProgress?.({ phase: "finish", message: "base system installed" });
    return {
      source_detail: { mirror, debootstrap: firstLine((await run([bin, "--version"])).stdout) },
      package_count: await countPackages(ctx.rootfs),
    };
  }

  /** Drops what a workspace never needs from the image: downloaded .debs and apt lists stay small. */
  private async clean(rootfs: string): Promise<void> {
    const archives = join(rootfs, "var/cache/apt/archives");
    try {
      for (const f of await readdir(archives))
        if (f.endsWith(".deb")) await rm(join(archives, f), { force: true });
    } catch {
      // nothing to clean
    }
    await rm(join(rootfs, "debootstrap"), { recursive: true, force: true });
  }
}

async function countPackages(rootfs: string): Promise<number | undefined> {
  try {
    const files = await readdir(join(rootfs, "var/lib/dpkg/info"));
    return files.filter((f) => f.endsWith(".list")).length;
  } catch {
    return undefined;
  }
}

/** Turns debootstrap's `I: ...` lines into phases and counts. */
export class PhaseTracker {
  private phase: BuildProgress["phase"] = "resolve";
  private count = 0;
  private bytes = 0;
  private last = "";

  constructor(private readonly emit?: (p: BuildProgress) => void) {}

  line(raw: string): void {
    const m = /^I: (\S+)\s*(.*?)(?:\.\.\.)?\s*$/.exec(raw);
    if (!m) return;
    const verb = m[1] ?? "";
    const rest = m[2] ?? "";
    const next = PHASES[verb];
    if (next && next !== this.phase) {
      this.phase = next;
      this.count = 0;
    }
    if (next && rest && !/^(core packages|packages|release|inrelease|release signature)$/i.test(rest))
      this.count++;
    this.last = `${verb} ${rest}`.trim();
    this.publish();
  }

  size(bytes: number): void {
    this.bytes = bytes;
    this.publish();
  }

  private publish(): void {
    const p: BuildProgress = { phase: this.phase, message: this.last };
    if (this.count > 0) p.count = this.count;
    if (this.bytes > 0) p.bytes = this.bytes;
    this.emit?.(p);
  }
}

const PHASES: Record<string, BuildProgress["phase"]> = {
  Resolving: "resolve",
  Checking: "resolve",
  Found: "resolve",
  Retrieving: "retrieve",
  Validating: "retrieve",
  Extracting: "extract",
  Installing: "install",
  Unpacking: "unpack",
  Configuring: "configure",
  Base: "finish",
};
