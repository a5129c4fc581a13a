import { randomBytes } from "node:crypto";
import { chmod, mkdir, readdir, readFile, rename, rm, stat } from "node:fs/promises";
import { dirname, join } from "node:path";
import { PyroError } from "../errors.js";
import { atomicWriteFile, fsyncDir, makeDirs, pidAlive, treeSize } from "../util/fs.js";
import { acquireLock } from "../util/lock.js";
import { removeTree } from "../util/mounts.js";
import type { Builder, BuildOutput, BuildProgress } from "./builder.js";
import {
  type EnvironmentSpec,
  entryDirName,
  findEnvironment,
  OFFICIAL_ENVIRONMENTS,
  recipeKey,
} from "./catalog.js";
import {
  isMovable,
  isSuperseded,
  readPointer,
  readPointers,
  removeDanglingPointers,
  tagDigestOf,
  versionKey,
  writePointer,
} from "./tags.js";

/** What a finished entry records about itself, next to its `rootfs/`. */
export interface EnvironmentManifest {
  name: string;
  description: string;
  recipe_key: string;
  source: EnvironmentSpec["source"];
  source_detail: Record<string, unknown>;
  built_at: string;
  build_duration_ms: number;
  size_bytes: number;
  file_count: number;
  package_count?: number;
}

export type EnvironmentKind = "official" | "pulled" | "built";

/** `cached`: current recipe built; `stale`: only an older recipe's build; `missing`: nothing. */
export type CacheStatus = "cached" | "stale" | "missing";

export interface EnvironmentInfo {
  name: string;
  /** `official` (the catalog), `pulled` (an OCI image) or `built` (a recipe). */
  kind: EnvironmentKind;
  /** The image's manifest digest (pulled images), else null. */
  digest: string | null;
  description: string;
  source: EnvironmentSpec["source"];
  recipe_key: string;
  status: CacheStatus;
  path: string | null;
  size_bytes: number | null;
  built_at: string | null;
  package_count: number | null;
  stale_keys: string[];
}

export interface PullResult {
  name: string;
  /** The image's manifest digest (pulled images), else null. */
  digest: string | null;
  /** Variables the image's config sets (`Env`); a workspace starts with them. */
  image_env: Record<string, string>;
  recipe_key: string;
  path: string;
  rootfs: string;
  built: boolean;
  duration_ms: number;
  size_bytes: number;
  package_count: number | null;
  /** Set when an image tag could not be re-resolved (registry unreachable) and the cached version is used. */
  warning?: string;
}

export interface PruneResult {
  removed: {
    path: string;
    reason: "stale" | "partial" | "unknown" | "all" | "unused_layer";
    size_bytes: number;
  }[];
  /** Environments `--all` kept because a workspace uses them. */
  kept_in_use: string[];
  freed_bytes: number;
}

const BUILDING_PREFIX = ".building-";
/** The OCI layer store (content-addressed blobs shared by every pulled image). */
export const OCI_DIR = ".oci";
const LOCK_DIR = ".locks";

/**
 * The content-addressed environment cache. Layout under `root`:
 *   `<name>@<recipe_key>/manifest.json` and `rootfs/`: finished entries, never modified;
 *   `.building-<key>-<pid>-<rand>/`: an in-progress build, renamed into place when done;
 *   `.locks/<key>.lock`: one builder per recipe at a time.
 * An entry exists only once it is complete (the rename is the commit), so a killed build
 * leaves at most a `.building-*` directory that the next pull or prune removes.
 */
export class EnvironmentCache {
  private rootReady = false;

  constructor(
    readonly root: string,
    private readonly builders: readonly Builder[],
    /** Root filesystems that workspaces use (prune never removes those). */
    private readonly inUse: () => Promise<Set<string>> | Set<string> = () => new Set(),
  ) {}

  /**
   * Creates the cache root owner-only (0700), or makes an existing one (of this user)
   * owner-only. Image layers keep their setuid-root files: a root other users can
   * traverse would let any local user run them. Once per process.
   */
  async ensureRoot(): Promise<void> {
    if (this.rootReady) return;
    await makeDirs(dirname(this.root));
    await mkdir(this.root, { mode: 0o700 }).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== "EEXIST") throw err;
    });
    const st = await stat(this.root);
    if (!st.isDirectory())
      throw new PyroError("invalid_argument", `the environment cache ${this.root} is not a directory`);
    if ((st.mode & 0o077) !== 0 && st.uid === process.getuid?.()) await chmod(this.root, 0o700);
    this.rootReady = true;
  }

  entryPath(spec: EnvironmentSpec): string {
    return join(this.root, entryDirName(spec, recipeKey(spec)));
  }

  async readManifest(dir: string): Promise<EnvironmentManifest | null> {
    try {
      return JSON.parse(await readFile(join(dir, "manifest.json"), "utf8")) as EnvironmentManifest;
    } catch {
      return null;
    }
  }

  async info(name: string): Promise<EnvironmentInfo> {
    return this.infoOf(await this.resolve(name));
  }

  /**
   * The spec a name stands for: an official environment, else an environment built
   * under that name (`pyro env build NAME`, newest build first), else an image reference.
   */
  async resolve(name: string): Promise<EnvironmentSpec> {
    if (!OFFICIAL_ENVIRONMENTS.some((e) => e.name === name)) {
      const built = await this.findBuilt(name);
      if (built) return this.specOf(built);
    }
    return findEnvironment(name);
  }

  /** The newest finished build of a recipe named `name`, if any. */
  async findBuilt(name: string): Promise<EnvironmentManifest | null> {
    const prefix = entryDirName({ name, description: "", source: { kind: "oci", reference: "" } }, "");
    let best: EnvironmentManifest | null = null;
    for (const d of await this.dirNames()) {
      if (!d.startsWith(prefix)) continue;
      const m = await this.readManifest(join(this.root, d));
      if (m?.name === name && m.source.kind === "recipe" && (!best || m.built_at > best.built_at)) best = m;
    }
    return best;
  }

  async infoOf(spec: EnvironmentSpec): Promise<EnvironmentInfo> {
    const current = await this.currentEntry(spec);
    const manifest = current?.manifest ?? null;
    const key = manifest?.recipe_key ?? recipeKey(spec);
    const staleKeys = (await this.entriesOf(spec)).filter((k) => k !== key);
    const status: CacheStatus = manifest ? "cached" : staleKeys.length > 0 ? "stale" : "missing";
    return {
      name: spec.name,
      kind: kindOf(spec),
      digest: digestOf(manifest),
      description: spec.description,
      source: spec.source,
      recipe_key: key,
      status,
      path: current?.dir ?? null,
      size_bytes: manifest?.size_bytes ?? null,
      built_at: manifest?.built_at ?? null,
      package_count: manifest?.package_count ?? null,
      stale_keys: staleKeys,
    };
  }

  /** Official environments (cached or not), then every pulled or built one in the cache. */
  async list(): Promise<EnvironmentInfo[]> {
    const official = await Promise.all(OFFICIAL_ENVIRONMENTS.map((e) => this.info(e.name)));
    const officialNames = new Set(OFFICIAL_ENVIRONMENTS.map((e) => e.name));
    const others = new Map<string, EnvironmentInfo>();
    for (const d of await this.dirNames()) {
      if (d.startsWith(".") || !d.includes("@")) continue;
      const m = await this.readManifest(join(this.root, d));
      if (!m?.source || officialNames.has(m.name) || others.has(m.name)) continue;
      others.set(m.name, await this.infoOf(this.specOf(m)));
    }
    return [...official, ...[...others.values()].sort((a, b) => a.name.localeCompare(b.name))];
  }

  /** The spec an entry was made from (its manifest records it). */
  specOf(m: EnvironmentManifest): EnvironmentSpec {
    return { name: m.name, description: m.description, source: m.source };
  }

  /**
   * Makes sure the environment is cached and returns it. Fast path: the finished entry
   * exists (one stat and one read). Slow path: take the recipe's lock, re-check, build
   * into a private directory, write the manifest, rename into place.
   */
  async pull(name: string, options: PullOptions = {}): Promise<PullResult> {
    return this.pullSpec(await this.resolve(name), options);
  }

  /** `pull` for a spec that is not in the catalog (recipes). */
  async pullSpec(spec: EnvironmentSpec, options: PullOptions = {}): Promise<PullResult> {
    const started = performance.now();
    await this.ensureRoot();
    if (isMovable(spec)) return this.pullTag(spec, options, started);
    const final = this.entryPath(spec);
    const existing = await this.readManifest(final);
    if (existing) return this.pullResult(spec, final, existing, false, started);
    return this.buildEntry(spec, recipeKey(spec), options, started);
  }

  /**
   * An image named by tag (tags.ts): the current version when there is one and no
   * `refresh` was asked; else the tag is resolved at the registry (one HEAD), the current
   * version kept when the digest is the same, and a new version built beside it when not.
   * A registry that cannot be reached leaves the current version in use, with a warning.
   */
  private async pullTag(spec: EnvironmentSpec, options: PullOptions, started: number): Promise<PullResult> {
    const current = await this.currentEntry(spec);
    const hit = (m: EnvironmentManifest, dir: string, warning?: string) => ({
      ...this.pullResult(spec, dir, m, false, started),
      ...(warning ? { warning } : {}),
    });
    if (current && !options.refresh) return hit(current.manifest, current.dir);
    const builder = this.builderFor(spec);
    const check = builder.currentVersion
      ? await builder.currentVersion(spec, {
          ...(options.signal ? { signal: options.signal } : {}),
          ...(options.insecureRegistry ? { insecureRegistry: true } : {}),
        })
      : { unreachable: "the source cannot be resolved" };
    if ("unreachable" in check) {
      if (!current)
        throw new PyroError("build_failed", check.unreachable, "check the network and the reference");
      return hit(
        current.manifest,
        current.dir,
        `${check.unreachable}; using the version pulled at ${current.manifest.built_at} (${digestOf(current.manifest)}), which may be out of date`,
      );
    }
    if (current && tagDigestOf(current.manifest) === check.digest) return hit(current.manifest, current.dir);
    const key = versionKey(spec, check.digest);
    const dir = join(this.root, entryDirName(spec, key));
    // The tag may have moved back to a version still on disk.
    const had = await this.readManifest(dir);
    const r = had
      ? this.pullResult(spec, dir, had, false, started)
      : await this.buildEntry(spec, key, options, started, check.digest);
    await writePointer(this.tagsDir(), spec, {
      entry: entryDirName(spec, key),
      digest: check.digest,
      resolved_at: new Date().toISOString(),
    });
    return r;
  }

  private tagsDir(): string {
    return join(this.root, OCI_DIR, "tags");
  }

  /**
   * The version of an environment in use: for an image tag, the version its pointer
   * names (or one pulled before versions existed, `<name>@<key>`); else the entry of the
   * current recipe.
   */
  async currentEntry(spec: EnvironmentSpec): Promise<{ dir: string; manifest: EnvironmentManifest } | null> {
    const candidates = [this.entryPath(spec)];
    if (isMovable(spec)) {
      const p = await readPointer(this.tagsDir(), spec);
      if (p) candidates.unshift(join(this.root, p.entry));
    }
    for (const dir of candidates) {
      const manifest = await this.readManifest(dir);
      if (manifest) return { dir, manifest };
    }
    return null;
  }

  private builderFor(spec: EnvironmentSpec): Builder {
    const builder = this.builders.find((b) => b.kind === spec.source.kind);
    if (!builder) throw new PyroError("build_failed", `no builder for source kind '${spec.source.kind}'`);
    return builder;
  }

  /**
   * Slow path of a pull: take the key's lock, re-check, build into a private directory,
   * write the manifest, rename into place (`<name>@<key>`).
   */
  private async buildEntry(
    spec: EnvironmentSpec,
    key: string,
    options: PullOptions,
    started: number,
    version?: string,
  ): Promise<PullResult> {
    const name = spec.name;
    const final = join(this.root, entryDirName(spec, key));
    const builder = this.builderFor(spec);
    await makeDirs(join(this.root, LOCK_DIR));
    const release = await acquireLock(join(this.root, LOCK_DIR, `${key}.lock`), {
      ...(options.lockTimeoutMs !== undefined ? { timeoutMs: options.lockTimeoutMs } : {}),
      ...(options.signal ? { signal: options.signal } : {}),
      onWait: (o) =>
        options.onProgress?.({
          phase: "lock",
          message: `waiting for pid ${o.pid}, which is building ${name}`,
        }),
    });
    try {
      const raced = await this.readManifest(final);
      if (raced) return this.pullResult(spec, final, raced, false, started);
      await this.removePartials(key);
      const tmp = join(
        this.root,
        `${BUILDING_PREFIX}${key}-${process.pid}-${randomBytes(3).toString("hex")}`,
      );
      const rootfs = join(tmp, "rootfs");
      await mkdir(tmp, { mode: 0o700 });
      await mkdir(rootfs);
      try {
        const out = await builder.build(spec, {
          rootfs,
          ...(options.onProgress ? { onProgress: options.onProgress } : {}),
          ...(options.signal ? { signal: options.signal } : {}),
          ...(options.insecureRegistry ? { insecureRegistry: true } : {}),
          ...(version ? { version } : {}),
        });
        const manifest = await this.finish(spec, key, tmp, out, started);
        await rename(tmp, final);
        await fsyncDir(this.root);
        options.onProgress?.({ phase: "done", message: `${name} ready`, bytes: manifest.size_bytes });
        return this.pullResult(spec, final, manifest, true, started);
      } catch (err) {
        await removeTree(tmp);
        throw err;
      }
    } finally {
      await release();
    }
  }

  /** Writes the finished build's manifest into its directory (before the rename commits it). */
  private async finish(
    spec: EnvironmentSpec,
    key: string,
    tmp: string,
    out: BuildOutput,
    started: number,
  ): Promise<EnvironmentManifest> {
    const size = out.size ?? (await treeSize(join(tmp, "rootfs")));
    const manifest: EnvironmentManifest = {
      name: spec.name,
      description: spec.description,
      recipe_key: key,
      source: spec.source,
      source_detail: out.source_detail,
      built_at: new Date().toISOString(),
      build_duration_ms: Math.round(performance.now() - started),
      size_bytes: size.bytes,
      file_count: size.files,
      ...(out.package_count !== undefined ? { package_count: out.package_count } : {}),
    };
    await atomicWriteFile(join(tmp, "manifest.json"), `${JSON.stringify(manifest, null, 2)}\n`);
    return manifest;
  }

  private pullResult(
    spec: EnvironmentSpec,
    dir: string,
    m: EnvironmentManifest,
    built: boolean,
    started: number,
  ): PullResult {
    return {
      name: spec.name,
      digest: digestOf(m),
      image_env: imageEnv(m),
      recipe_key: m.recipe_key,
      path: dir,
      rootfs: join(dir, "rootfs"),
      built,
      duration_ms: Math.round(performance.now() - started),
      size_bytes: m.size_bytes,
      package_count: m.package_count ?? null,
    };
  }

  /** Removes partial builds of this key whose builder process is gone. */
  private async removePartials(key: string): Promise<void> {
    for (const d of await this.dirNames()) {
      if (!d.startsWith(`${BUILDING_PREFIX}${key}-`)) continue;
      const pid = Number(d.slice(`${BUILDING_PREFIX}${key}-`.length).split("-")[0]);
      if (!pidAlive(pid) || pid === process.pid) await removeTree(join(this.root, d));
    }
  }

  /** Recipe keys present on disk for an environment name (finished entries only). */
  private async entriesOf(spec: EnvironmentSpec): Promise<string[]> {
    const prefix = `${entryDirName(spec, "")}`;
    const keys: string[] = [];
    for (const d of await this.dirNames()) {
      if (d.startsWith(prefix) && (await this.readManifest(join(this.root, d))))
        keys.push(d.slice(prefix.length));
    }
    return keys;
  }

  private async dirNames(): Promise<string[]> {
    try {
      return await readdir(this.root);
    } catch {
      return [];
    }
  }

  /**
   * Removes stale entries (older recipes of official environments), partial builds whose
   * builder is gone, and unknown directories; with `all`, every environment no workspace
   * uses (pulled and built ones too) and the VM images. Layers of the OCI store that no
   * remaining pulled environment names go too.
   */
  async prune(options: { all?: boolean } = {}): Promise<PruneResult> {
    const current = new Set(OFFICIAL_ENVIRONMENTS.map((e) => entryDirName(e, recipeKey(e))));
    const used = new Set([...(await this.inUse())].map((p) => (p.endsWith("/rootfs") ? p.slice(0, -7) : p)));
    const removed: PruneResult["removed"] = [];
    const keptInUse: string[] = [];
    const keptLayers = new Set<string>();
    const pointers = await readPointers(this.tagsDir());
    for (const d of await this.dirNames()) {
      if (d === LOCK_DIR || d === ".debs" || d === OCI_DIR) continue;
      // VM images (kernel, disks, templates): kept unless everything goes.
      if (d === ".vm") {
        if (options.all) {
          const path = join(this.root, d);
          const size = (await treeSize(path)).bytes;
          await removeTree(path);
          removed.push({ path, reason: "all", size_bytes: size });
        }
        continue;
      }
      const path = join(this.root, d);
      const manifest = await this.readManifest(path);
      let reason: PruneResult["removed"][number]["reason"] | null = null;
      if (d.startsWith(BUILDING_PREFIX)) {
        const pid = Number(d.slice(BUILDING_PREFIX.length).split("-")[1]);
        if (!pidAlive(pid)) reason = "partial";
      } else if (isSuperseded(d, manifest, pointers)) {
        // An older version of an image tag (a pull found the tag moved).
        reason = "stale";
      } else if (current.has(d) || (manifest?.source && manifest.source.kind !== "debootstrap")) {
        if (options.all) reason = "all";
      } else if (d.includes("@")) {
        reason = "stale";
      } else {
        reason = "unknown";
      }
      if (reason && used.has(path)) {
        if (manifest) keptInUse.push(manifest.name);
        reason = null;
      }
      if (!reason) {
        for (const l of layersOf(manifest)) keptLayers.add(l);
        continue;
      }
      const st = await stat(path).catch(() => null);
      if (!st?.isDirectory()) continue;
      const size = manifest?.size_bytes ?? (await treeSize(path)).bytes;
      await removeTree(path);
      removed.push({ path, reason, size_bytes: size });
    }
    if (options.all) await rm(join(this.root, ".debs"), { recursive: true, force: true });
    await removeDanglingPointers(this.root, this.tagsDir());
    const blobs = join(this.root, OCI_DIR, "blobs", "sha256");
    for (const hex of await readdir(blobs).catch(() => [] as string[])) {
      if (keptLayers.has(`sha256:${hex}`)) continue;
      const path = join(blobs, hex);
      const size = (await stat(path).catch(() => null))?.size ?? 0;
      await rm(path, { force: true });
      removed.push({ path, reason: "unused_layer", size_bytes: size });
    }
    return {
      removed,
      freed_bytes: removed.reduce((a, r) => a + r.size_bytes, 0),
      kept_in_use: keptInUse.sort(),
    };
  }
}

export interface PullOptions {
  onProgress?: (p: BuildProgress) => void;
  signal?: AbortSignal;
  lockTimeoutMs?: number;
  /** Plain HTTP to a loopback registry. */
  insecureRegistry?: boolean;
  /**
   * Re-resolve an image tag at the registry even when a version is cached (`env pull`);
   * without it a cached version is used as is (workspace create, like `docker run`).
   */
  refresh?: boolean;
}

function kindOf(spec: EnvironmentSpec): EnvironmentKind {
  if (OFFICIAL_ENVIRONMENTS.some((e) => e.name === spec.name)) return "official";
  if (spec.source.kind === "oci") return "pulled";
  if (spec.source.kind === "recipe") return "built";
  return "official";
}

function digestOf(m: EnvironmentManifest | null): string | null {
  const d = m?.source_detail.digest;
  return typeof d === "string" ? d : null;
}

function layersOf(m: EnvironmentManifest | null): string[] {
  const layers = m?.source_detail.layers;
  return Array.isArray(layers) ? layers.map((l) => String((l as { digest?: unknown }).digest)) : [];
}

/** The image config's `Env` (`K=V` strings) as an object; later entries win. */
function imageEnv(m: EnvironmentManifest): Record<string, string> {
  const env = m.source_detail.env;
  const out: Record<string, string> = {};
  if (!Array.isArray(env)) return out;
  for (const item of env) {
    if (typeof item !== "string") continue;
    const eq = item.indexOf("=");
    if (eq > 0) out[item.slice(0, eq)] = item.slice(eq + 1);
  }
  return out;
}
