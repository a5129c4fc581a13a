import { createReadStream } from "node:fs";
import { mkdir, open, readdir, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import type { Readable } from "node:stream";
import { createGunzip } from "node:zlib";
import { PyroError } from "../../errors.js";
import { compressionOf, MAGIC_BYTES } from "../../util/compression.js";
import { pidAlive, treeSizeSync } from "../../util/fs.js";
import { acquireLock } from "../../util/lock.js";
import type { BuildContext, Builder, BuildOutput, VersionCheck } from "../builder.js";
import type { EnvironmentSpec } from "../catalog.js";
import { type ApplyStats, applyLayer, LAYER_LIMITS } from "./apply.js";
import { LayerFollower } from "./follow.js";
import { formatReference, type ImageReference, parseReference } from "./reference.js";
import { type Descriptor, RegistryClient, RegistryUnreachable } from "./registry.js";
import {
  checkDownloadSpace,
  LayerBudget,
  LayerRefused,
  type Statfs,
  type UnpackBounds,
} from "./unpack-budget.js";
import { zstdStream } from "./zstd.js";

/** How many layers download at once (the rest of the image applies meanwhile, in order). */
const PARALLEL = 3;
const CHUNK = 1 << 20;

/** What an image pull records in the environment's manifest (`source_detail`). */
export interface OciDetail extends Record<string, unknown> {
  reference: string;
  digest: string;
  index_digest: string | null;
  config_digest: string;
  layers: { digest: string; size: number; media_type: string }[];
  platform: string;
  env: string[];
  working_dir: string | null;
  user: string | null;
  skipped_entries: number;
}

/**
 * Pulls an OCI/Docker image into a root filesystem. Compressed layers land in a
 * content-addressed store (`<blobs>/sha256/<hex>`) shared by every image, so a base
 * layer two images share is downloaded and kept once; a `.partial` file resumes.
 */
export class OciBuilder implements Builder {
  readonly kind = "oci" as const;

  constructor(
    private readonly options: {
      /** Root of the layer store (`<environments>/.oci`). */
      storeDir: string;
      env: NodeJS.ProcessEnv;
      /** PYRO_REGISTRY_AUTH (core/config.ts). */
      registryAuth?: string | undefined;
      /** What a layer may write (unpack-budget.ts UNPACK_BOUNDS); tests pass smaller ones. */
      bounds?: UnpackBounds;
      /** Free space of the cache's filesystem (statfs); tests pass a fake. */
      statfs?: Statfs;
    },
  ) {}

  blobPath(digest: string): string {
    return join(this.options.storeDir, "blobs", "sha256", digest.slice("sha256:".length));
  }

  private client(ref: ImageReference, ctx: Pick<BuildContext, "signal" | "insecureRegistry">) {
    return new RegistryClient(ref, {
      env: this.options.env,
      registryAuth: this.options.registryAuth,
      ...(ctx.insecureRegistry ? { insecure: true } : {}),
      ...(ctx.signal ? { signal: ctx.signal } : {}),
    });
  }

  /** What the image's tag names now (a HEAD of its manifest); `unreachable` when the registry does not answer. */
  async currentVersion(
    spec: EnvironmentSpec,
    ctx: Pick<BuildContext, "signal" | "insecureRegistry">,
  ): Promise<VersionCheck> {
    if (spec.source.kind !== "oci") throw new Error(`not an image: ${spec.name}`);
    try {
      return { digest: await this.client(parseReference(spec.source.reference), ctx).tagDigest() };
    } catch (err) {
      if (err instanceof RegistryUnreachable) return { unreachable: err.message };
      throw err;
    }
  }

  async build(spec: EnvironmentSpec, ctx: BuildContext): Promise<BuildOutput> {
    if (spec.source.kind !== "oci") throw new Error(`not an image: ${spec.name}`);
    const ref = parseReference(spec.source.reference);
    // Stops this pull's downloads when a layer fails (or the caller cancels).
    const stop = new AbortController();
    const signal = ctx.signal ? AbortSignal.any([ctx.signal, stop.signal]) : stop.signal;
    // A tag pinned to the digest it was resolved to: the tag moving meanwhile changes nothing.
    const client = this.client(ctx.version ? { ...ref, digest: ctx.version } : ref, { ...ctx, signal });
    ctx.onProgress?.({ phase: "resolve", message: `resolving ${formatReference(ref)}` });
    const image = await client.resolve();
    const layers = image.manifest.layers;
    const total = layers.reduce((a, l) => a + Math.max(l.size, 0), 0);
    let got = 0;
    let applied = 0;
    const report = (message: string) =>
      ctx.onProgress?.({
        phase: "download",
        message,
        bytes: got,
        total_bytes: total,
        done_count: applied,
        total_count: layers.length,
      });
    for (const d of ["blobs/sha256", "partial", "locks"])
      await mkdir(join(this.options.storeDir, d), { recursive: true, mode: 0o700 });
    await this.sweepPartials();
    await this.checkDownloads(layers);

    // Layers apply strictly in order, each as soon as its turn comes: from the store, or
    // followed while it still downloads.
    const { fetched, started, startNext } = this.downloads(client, layers, signal, (i, n) => {
      got += n;
      report(`layer ${i + 1}/${layers.length}`);
    });
    // The root's size as the layers add to it; walked again only when a layer removed something.
    const sum: Tally = { skipped: 0, removed: 0, size: { bytes: 0, files: 0, dirs: 0 } };
    for (let i = 0; i < layers.length; i++) {
      const l = layers[i] as Descriptor;
      try {
        const partial = await Promise.race([
          (fetched[i] as Promise<void>).then(() => null),
          started[i] as Promise<string>,
        ]);
        ctx.onProgress?.({
          phase: "extract",
          message: `applying layer ${i + 1}/${layers.length}`,
          bytes: got,
          total_bytes: total,
          done_count: applied,
          total_count: layers.length,
        });
        const label = `layer ${i + 1}/${layers.length} (${l.digest})`;
        tally(sum, await this.applyOne(ctx.rootfs, l, label, partial, fetched[i] as Promise<void>));
      } catch (err) {
        await this.abandon(err, l, stop, fetched);
        throw err;
      }
      applied++;
      startNext();
      if (ctx.signal?.aborted) throw new PyroError("cancelled", `pull of ${spec.name} was cancelled`);
    }
    report("done");
    const cfg = image.config.config ?? {};
    const detail: OciDetail = {
      reference: formatReference(ref),
      digest: image.digest,
      index_digest: image.index_digest,
      config_digest: image.manifest.config.digest,
      layers: layers.map((l) => ({ digest: l.digest, size: l.size, media_type: l.mediaType })),
      platform: `${image.config.os ?? "linux"}/${image.config.architecture ?? "amd64"}`,
      env: cfg.Env ?? [],
      working_dir: cfg.WorkingDir || null,
      user: cfg.User || null,
      skipped_entries: sum.skipped,
    };
    return { source_detail: detail, size: sum.removed === 0 ? sum.size : treeSizeSync(ctx.rootfs) };
  }

  /**
   * Starts the layers' downloads, PARALLEL at a time (`startNext` starts one more).
   * `started[i]` resolves with the partial file when layer i is being downloaded (it was
   * not in the store); `fetched[i]` when it is stored and verified.
   */
  private downloads(
    client: RegistryClient,
    layers: Descriptor[],
    signal: AbortSignal,
    onBytes: (i: number, n: number) => void,
  ) {
    const fetched: Promise<void>[] = new Array(layers.length);
    const started: Promise<string>[] = new Array(layers.length);
    let next = 0;
    const startNext = () => {
      const i = next++;
      if (i >= layers.length) return;
      let onStart: (partial: string) => void = () => {};
      started[i] = new Promise((r) => {
        onStart = r;
      });
      fetched[i] = this.fetchLayer(client, layers[i] as Descriptor, signal, (n) => onBytes(i, n), onStart);
      // A failure surfaces when that layer's turn comes; keep unhandled rejections away.
      fetched[i].catch(() => {});
    };
    for (let k = 0; k < PARALLEL; k++) startNext();
    return { fetched, started, startNext };
  }

  /**
   * Applies one layer: from the store, or (`partial` set) followed while it downloads,
   * every byte unpacked hashed and checked against the digest (follow.ts), and the
   * download itself finished and verified before the layer counts.
   */
  private async applyOne(
    rootfs: string,
    l: Descriptor,
    label: string,
    partial: string | null,
    download: Promise<void>,
  ): Promise<ApplyStats> {
    // Held to the bounds whether followed or from the store: a digest the registry
    // named (a tag's manifest) vouches for nothing (unpack-budget.ts).
    const budget = new LayerBudget({
      dir: rootfs,
      label,
      size: l.size,
      ...(this.options.bounds ? { bounds: this.options.bounds } : {}),
      ...(this.options.statfs ? { statfs: this.options.statfs } : {}),
    });
    const follower = partial
      ? new LayerFollower(partial, this.blobPath(l.digest), l.digest, l.size, download)
      : null;
    try {
      const input = await this.decompressed(l, follower, budget);
      const stats = await applyLayer(rootfs, input, l.digest.slice(7, 19), undefined, {
        ...LAYER_LIMITS,
        check: budget.check,
      });
      await follower?.finish();
      await download;
      return stats;
    } finally {
      await follower?.close();
    }
  }

  /** Refuses, before downloading, layers that would not fit on the cache's filesystem. */
  private async checkDownloads(layers: Descriptor[]): Promise<void> {
    let need = 0;
    for (const l of layers)
      if (!(await stat(this.blobPath(l.digest)).catch(() => null))?.isFile()) need += l.size;
    checkDownloadSpace(this.options.storeDir, need, this.options.statfs, this.options.bounds);
  }

  /**
   * After layer `l` failed: stops the pull's downloads and waits for them, so nothing is
   * written once the pull has failed; a refused layer's blob and partial download are
   * removed (it would be refused again; nothing of it stays in the store as verified).
   * Other layers' partial downloads stay, to resume, as after a cancel.
   */
  private async abandon(
    err: unknown,
    l: Descriptor,
    stop: AbortController,
    fetched: Promise<void>[],
  ): Promise<void> {
    stop.abort();
    await Promise.allSettled(fetched.filter(Boolean));
    if (!(err instanceof LayerRefused)) return;
    const hex = l.digest.slice("sha256:".length);
    // Briefly: a lock held this long is another pull's download of it, which refuses it too.
    const release = await acquireLock(join(this.options.storeDir, "locks", `${hex}.lock`), {
      timeoutMs: 10_000,
    }).catch(() => null);
    if (!release) return;
    try {
      await rm(join(this.options.storeDir, "partial", hex), { force: true });
      await rm(this.blobPath(l.digest), { force: true });
    } finally {
      await release();
    }
  }

  /** Makes sure the blob is in the store: already there, or downloaded (resumed) and verified. */
  private async fetchLayer(
    client: RegistryClient,
    l: Descriptor,
    signal: AbortSignal,
    onBytes: (n: number) => void,
    onStart: (partial: string) => void,
  ): Promise<void> {
    const dest = this.blobPath(l.digest);
    const have = await stat(dest).catch(() => null);
    if (have?.isFile()) {
      onBytes(have.size);
      return;
    }
    const hex = l.digest.slice("sha256:".length);
    const release = await acquireLock(join(this.options.storeDir, "locks", `${hex}.lock`), { signal });
    try {
      const raced = await stat(dest).catch(() => null);
      if (raced?.isFile()) {
        onBytes(raced.size);
        return;
      }
      const partial = join(this.options.storeDir, "partial", hex);
      onStart(partial);
      await client.download(l, partial, dest, onBytes);
    } finally {
      await release();
    }
  }

  /**
   * The layer's tar stream, from the store or from a follower: gzip and zstd told apart
   * by their magic bytes, not only the media type. A read error (a digest mismatch the
   * follower found) fails the decompressed stream too.
   */
  private async decompressed(
    l: Descriptor,
    follower: LayerFollower | null,
    budget: LayerBudget,
  ): Promise<Readable> {
    let head: Buffer;
    let source: Readable;
    if (follower) ({ head, stream: source } = await follower.stream(MAGIC_BYTES));
    else {
      const path = this.blobPath(l.digest);
      head = Buffer.alloc(MAGIC_BYTES);
      const fh = await open(path, "r");
      try {
        await fh.read(head, 0, MAGIC_BYTES, 0);
      } finally {
        await fh.close();
      }
      source = createReadStream(path, { highWaterMark: CHUNK });
    }
    // What the decompressor is handed is counted: the ratio bound's denominator.
    const raw = source.pipe(budget.meter());
    source.once("error", (err) => raw.destroy(err));
    // The unpacker destroys what it reads on a failure: the file (or the follower) goes too.
    raw.once("close", () => source.destroy());
    let out: Readable;
    // 1 MiB chunks: with zlib's 16 KiB default the unpacker waits on the thread pool's
    // round trips (measured: most of an unpack's time was idle).
    const kind = compressionOf(head);
    if (kind === "gzip") out = raw.pipe(createGunzip({ chunkSize: CHUNK }));
    else if (kind === "zstd") out = zstdStream(raw);
    else if (/gzip|zstd/.test(l.mediaType)) {
      source.destroy();
      raw.destroy();
      throw new LayerRefused(
        `layer ${l.digest} says ${l.mediaType} but is not`,
        "the image is broken or was tampered with; nothing was kept",
      );
    } else return raw;
    raw.once("error", (err) => out.destroy(err));
    // An unpacker that stops early (a refusal) stops the reading behind it too.
    out.once("close", () => raw.destroy());
    return out;
  }

  /** Removes partial downloads nobody is resuming (their lock is free) older than a day. */
  private async sweepPartials(): Promise<void> {
    const dir = join(this.options.storeDir, "partial");
    for (const name of await readdir(dir).catch(() => [] as string[])) {
      const st = await stat(join(dir, name)).catch(() => null);
      if (!st || Date.now() - st.mtimeMs < 24 * 3600 * 1000) continue;
      const lock = await import("node:fs/promises").then((m) =>
        m.readFile(join(this.options.storeDir, "locks", `${name}.lock`), "utf8").catch(() => null),
      );
      const pid = lock ? Number((JSON.parse(lock) as { pid?: number }).pid) : 0;
      if (!pid || !pidAlive(pid)) await rm(join(dir, name), { force: true });
    }
  }
}

/** A pull's running totals over its layers. */
interface Tally {
  skipped: number;
  removed: number;
  size: { bytes: number; files: number; dirs: number };
}

function tally(sum: Tally, s: ApplyStats): void {
  sum.skipped += s.skipped;
  sum.removed += s.removed;
  sum.size.bytes += s.added.bytes;
  sum.size.files += s.added.files;
  sum.size.dirs += s.added.dirs;
}
