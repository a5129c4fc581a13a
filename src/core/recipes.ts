/**
 * Recipe builds: a base environment plus apt packages, copied files and commands, run in
 * a real sandbox with network `egress` (docs/environments.md "Recipes").
 *
 * How: a build workspace on the base (bwrap, else gVisor: the backends whose writable
 * root layer is an overlay upper directory pyro can read back), the steps run through
 * the agent like any command, the workspace stops, and its root layer is merged over the
 * base by the kernel's own overlayfs in a private mount namespace and copied (`cp -a`,
 * owners, modes, hard links and xattrs kept) into the new environment. Deletions
 * (whiteouts) and replaced directories (opaque) are the kernel's business, not ours.
 * The result is an ordinary environment directory, so every backend (docker's image,
 * the VMs' ext4 disk) uses it as it uses the official ones.
 */
import { randomBytes } from "node:crypto";
import { lstat, mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { basename, join, resolve } from "node:path";
import type { BackendName } from "../backends/backend.js";
import { isLegacyLayout, sandboxLayout } from "../backends/linux/layout.js";
import type { BuildContext, BuildOutput } from "../env/builder.js";
import type { PullOptions, PullResult } from "../env/cache.js";
import type { EnvironmentSpec } from "../env/catalog.js";
import { type CheckedRecipe, copySource, readRecipeFile, recipeSource } from "../env/recipe.js";
import { PyroError } from "../errors.js";
import { run } from "../util/run.js";
import type { Engine } from "./engine.js";
import { execInWorkspace } from "./exec.js";

const STEP_TIMEOUT_S = 1800;
/** How captureRoot mounts a build workspace's disk image (written by the sandbox). */
const CAPTURE_DISK_OPTIONS = "loop,ro,noload,nosuid,nodev,noexec,nosymfollow";
const OUTPUT_TAIL_LINES = 25;

/** Host paths of copy sources by content hash, per engine, for the builds about to run. */
const copySources = new WeakMap<Engine, Map<string, string>>();

function sourcesOf(engine: Engine): Map<string, string> {
  let m = copySources.get(engine);
  if (!m) {
    m = new Map();
    copySources.set(engine, m);
  }
  return m;
}

/** Options of `buildRecipe`, a core operation: spelled snake_case (docs/architecture.md, "Naming"). */
export interface BuildRecipeOptions {
  signal?: AbortSignal | undefined;
  /** Progress of the base environment's pull and of the build. */
  on_progress?: PullOptions["onProgress"];
}

/** Builds (or finds cached) the environment a recipe describes. */
export function buildRecipe(
  engine: Engine,
  recipe: CheckedRecipe,
  options: BuildRecipeOptions = {},
): Promise<PullResult & { cache_hit: boolean }> {
  return buildWith(engine, recipe, {
    ...(options.signal ? { signal: options.signal } : {}),
    ...(options.on_progress ? { onProgress: options.on_progress } : {}),
  });
}

/** The build, with the environment cache's own pull options. */
async function buildWith(
  engine: Engine,
  recipe: CheckedRecipe,
  options: PullOptions,
): Promise<PullResult & { cache_hit: boolean }> {
  const base = await engine.environments.pull(recipe.from, options);
  const baseKey = `${base.recipe_key}${base.digest ? `@${base.digest}` : ""}`;
  const source = await recipeSource(recipe, baseKey);
  for (const [i, c] of recipe.copy.entries()) sourcesOf(engine).set(source.copy[i]?.sha256 ?? "", c.src);
  const spec: EnvironmentSpec = {
    name: recipe.name,
    description: `built from ${recipe.from}`,
    source,
  };
  const r = await engine.environments.pullSpec(spec, options);
  return { ...r, cache_hit: !r.built };
}

/** The build itself (RecipeBuilder's runner): fills `ctx.rootfs`. */
export async function runRecipe(
  engine: Engine,
  spec: EnvironmentSpec,
  ctx: BuildContext,
): Promise<BuildOutput> {
  const src = spec.source;
  if (src.kind !== "recipe") throw new Error(`not a recipe: ${spec.name}`);
  const backend = await buildBackend(engine);
  // Outside pyro's home: seeding never copies from there.
  const scratch = await mkdtemp(join(tmpdir(), "pyro-recipe-"));
  const seed = join(scratch, "seed");
  await mkdir(seed);
  const steps: { label: string; command: string }[] = [];
  for (const [i, c] of src.copy.entries()) {
    const from = sourcesOf(engine).get(c.sha256);
    if (!from) throw new PyroError("internal", `the source of copy ${c.dest} is not known to this build`);
    await copySource(from, join(seed, `copy-${i}`));
    steps.push({
      label: `copy → ${c.dest}`,
      command: `mkdir -p "$(dirname ${shq(c.dest)})" && rm -rf ${shq(c.dest)} && cp -a /workspace/copy-${i} ${shq(c.dest)}`,
    });
  }
  if (src.apt.length > 0) {
    // apt's download sandbox user (_apt) does not exist in a one-uid user namespace.
    const apt = "apt-get -o APT::Sandbox::User=root -o Dpkg::Use-Pty=0 -q";
    steps.push({
      label: `apt ${src.apt.join(" ")}`,
      command:
        `export DEBIAN_FRONTEND=noninteractive && ${apt} update && ${apt} install -y --no-install-recommends ${src.apt.map(shq).join(" ")}` +
        ` && ${apt} clean && rm -rf /var/lib/apt/lists/*`,
    });
  }
  for (const r of src.run) steps.push({ label: r, command: r });

  const ws = engine.workspaces;
  let id: string | null = null;
  try {
    const created = await ws.create({
      environment: src.from,
      backend,
      network_policy: "egress",
      seed_path: seed,
      name: `pyro-build-${randomBytes(4).toString("hex")}`,
      labels: { "pyro.build": spec.name },
      ttl_seconds: 2 * 3600,
      ...(ctx.signal ? { signal: ctx.signal } : {}),
    });
    id = created.workspace_id;
    for (const [i, step] of steps.entries()) {
      ctx.onProgress?.({ phase: "step", message: step.label, done_count: i, total_count: steps.length });
      const r = await execInWorkspace(ws, id, step.command, { timeout_seconds: STEP_TIMEOUT_S });
      if (r.exit_code !== 0 || r.timed_out) {
        const tail = `${r.stdout}${r.stderr ? `\n${r.stderr}` : ""}`
          .trim()
          .split("\n")
          .slice(-OUTPUT_TAIL_LINES)
          .join("\n");
        throw new PyroError(
          "build_failed",
          `step ${i + 1}/${steps.length} of ${spec.name} failed (${r.timed_out ? "timed out" : `exit ${r.exit_code}`}): ${step.label}\n${tail}`,
          "fix the step and build again; nothing was cached",
        );
      }
    }
    ctx.onProgress?.({
      phase: "finish",
      message: "saving the environment",
      done_count: steps.length,
      total_count: steps.length,
    });
    await ws.stop(id);
    const row = await ws.get(id);
    const base = String(row.runtime.rootfs ?? "");
    await captureRoot(join(ws.workspaceDir(id), "sandbox"), base, ctx.rootfs);
  } finally {
    if (id) await ws.delete(id).catch(() => {});
    await rm(scratch, { recursive: true, force: true });
  }
  return { source_detail: { backend, steps: steps.map((s) => s.label) } };
}

/** bwrap, else gVisor (the backends with an overlay root layer); refused otherwise. */
async function buildBackend(engine: Engine): Promise<BackendName> {
  for (const name of ["bwrap", "gvisor"] as const) {
    const b = await engine.chooseBackend(name, false).catch(() => null);
    if (b) return name;
  }
  throw new PyroError(
    "backend_unavailable",
    "building an environment needs the bwrap or gvisor backend",
    "run `pyro doctor`; recipe builds run as root with bubblewrap or runsc installed",
  );
}

/**
 * Merges a stopped Linux sandbox's root layer over `base` and copies the result into
 * `dest`: the layer lives in the workspace's disk image, loop-mounted read-only in a
 * private mount namespace that dies with the command.
 */
export async function captureRoot(sandboxDir: string, base: string, dest: string): Promise<void> {
  const legacy = await isLegacyLayout(sandboxDir);
  const l = sandboxLayout(sandboxDir, legacy);
  const mnt = join(sandboxDir, "capture");
  await mkdir(join(mnt, "disk"), { recursive: true });
  await mkdir(join(mnt, "merged"), { recursive: true });
  const script = [
    "set -e",
    // The image was written by the build's sandbox: no journal replay, no setuid, no
    // devices, no execution, and no symbolic link followed on the way to its root layer
    // (a planted `root/upper -> /etc` would make the host's /etc the environment).
    legacy ? ":" : `mount -o ${CAPTURE_DISK_OPTIONS} "$1" "$2"`,
    'mount -t overlay -o ro,nosuid,nodev,lowerdir="$3":"$4" pyro-capture "$5"',
    'cp -a "$5"/. "$6"/',
  ].join("\n");
  const r = await run(
    [
      "unshare",
      "-m",
      "--propagation",
      "private",
      "sh",
      "-c",
      script,
      "sh",
      l.disk,
      join(mnt, "disk"),
      legacy ? l.rootUpper : join(mnt, "disk", "root", "upper"),
      base,
      join(mnt, "merged"),
      dest,
    ],
    { timeoutMs: 30 * 60 * 1000 },
  );
  await rm(mnt, { recursive: true, force: true });
  if (r.exitCode !== 0) {
    throw new PyroError(
      "build_failed",
      `could not save the built environment: ${r.stderr.trim().split("\n").slice(-3).join(" | ")}`,
    );
  }
  // Mount points the backend makes at every start: nothing of the build's agent stays.
  // The tree is the sandbox's work: `run` is only entered when it is a real directory
  // (a planted `/run -> /etc` must not aim this removal at the host).
  const runDir = await lstat(join(dest, "run")).catch(() => null);
  if (runDir?.isDirectory()) await rm(join(dest, "run", "pyro"), { recursive: true, force: true });
}

/** Single-quotes a string for sh. */
function shq(s: string): string {
  return `'${s.replaceAll("'", `'"'"'`)}'`;
}

/**
 * The environment a workspace seeded from `seedPath` should use when the caller named
 * none: the seed's `.pyro/environment.toml`, built (or found cached), or null when the
 * seed has no recipe.
 */
export async function seedRecipeEnvironment(
  engine: Engine,
  seedPath: string,
  options: PullOptions = {},
): Promise<string | null> {
  const name = `repo-${
    basename(resolve(seedPath))
      .toLowerCase()
      .replace(/[^a-z0-9._-]/g, "-")
      .replace(/^[^a-z0-9]+/, "")
      .slice(0, 40) || "seed"
  }`;
  const recipe = await readRecipeFile(seedPath, name);
  if (!recipe) return null;
  const r = await buildWith(engine, recipe, options);
  return r.name;
}
