/**
 * What a layer may write on the host while it is unpacked (docs/environments.md, "Bounds
 * on unpacking"). A layer is unpacked while it downloads, before its digest is checked,
 * and even a verified digest proves only that the registry sent what its manifest named:
 * for a tag, the manifest is the registry's word. So every layer, from the store or
 * followed, tag or digest, is held to bounds a hostile gzip cannot stretch:
 *
 * - Ratio, checked as the bytes flow: what the layer has written (file contents) may be
 *   at most `floorBytes + ratio × compressed bytes read so far`. A gzip bomb (~1000×) is
 *   refused after about `floorBytes`, whatever size it claims; real layers unpack to 2-5×.
 * - Entries: at most `floorEntries + compressed bytes read / entryBytes` (an empty file
 *   costs about 6 gzip bytes; a real layer's entries a few hundred).
 * - Free space of the cache's filesystem (statfs): the layer's charge (contents plus
 *   one 4 KiB block per entry, an upper bound of what ext4 allocates) must leave
 *   `reserveBytes` free, and its entries `reserveInodes` free inodes. The filesystem is
 *   asked again every REFRESH bytes, so other writers on it count too.
 *
 * A refusal is a LayerRefused (`build_failed`) naming the layer and the bound; the caller
 * discards the tree and the layer's blob (builder.ts).
 */
import { statfsSync } from "node:fs";
import { Transform, type TransformCallback } from "node:stream";
import { PyroError } from "../../errors.js";

const MiB = 1024 * 1024;
const GiB = 1024 * MiB;

export interface UnpackBounds {
  /** Unpacked bytes allowed per compressed byte read. */
  ratio: number;
  /** Unpacked bytes allowed on top of the ratio (small layers, a compressible stretch). */
  floorBytes: number;
  /** Compressed bytes read per entry allowed beyond `floorEntries`. */
  entryBytes: number;
  floorEntries: number;
  /** Free bytes the cache's filesystem keeps after a pull's downloads and layers. */
  reserveBytes: number;
  /** Free inodes kept (filesystems that count inodes). */
  reserveInodes: number;
}

export const UNPACK_BOUNDS: UnpackBounds = {
  ratio: 20,
  floorBytes: 256 * MiB,
  entryBytes: 16,
  floorEntries: 100_000,
  reserveBytes: 1 * GiB,
  reserveInodes: 50_000,
};

/** The part of statfs(2) the bounds read; `files` 0 means the filesystem has no inode count (btrfs). */
export interface SpaceInfo {
  bavail: number;
  bsize: number;
  ffree: number;
  files: number;
}

/** Synchronous, since the unpacker asks it from inside its (synchronous) per-entry step. */
export type Statfs = (path: string) => SpaceInfo;
export const hostStatfs: Statfs = (path) => statfsSync(path);

/** The filesystem is asked again after this much charge. */
const REFRESH = 256 * MiB;
/** What an entry may take on disk beyond its contents: a block (directory, inode's data). */
const ENTRY_CHARGE = 4096;

/** A layer refused by a bound or a safety rule: its blob is not kept either. */
export class LayerRefused extends PyroError {
  constructor(message: string, hint: string) {
    super("build_failed", message, hint);
  }
}

export function fmtBytes(n: number): string {
  if (n >= GiB) return `${(n / GiB).toFixed(1)} GiB`;
  if (n >= MiB) return `${(n / MiB).toFixed(1)} MiB`;
  return `${n} bytes`;
}

function noSpace(dir: string, what: string, free: string, keep: string): LayerRefused {
  return new LayerRefused(
    `${what}: the filesystem of ${dir} has ${free} free and pyro keeps ${keep} free`,
    "free space there (pyro env prune removes unused environments and layers) or set PYRO_ENV_CACHE to a larger filesystem; nothing was kept",
  );
}

/**
 * Refuses a pull whose downloads (`bytes`, the layers not yet in the store) would not fit
 * on the cache's filesystem, before anything is downloaded.
 */
export function checkDownloadSpace(
  dir: string,
  bytes: number,
  statfs: Statfs = hostStatfs,
  bounds: UnpackBounds = UNPACK_BOUNDS,
): void {
  const s = statfs(dir);
  const free = s.bavail * s.bsize;
  if (bytes > free - bounds.reserveBytes)
    throw noSpace(
      dir,
      `refused the pull: its layers need ${fmtBytes(bytes)} of downloads`,
      fmtBytes(free),
      fmtBytes(bounds.reserveBytes),
    );
}

/** One layer's budget: `meter()` counts the compressed bytes read, `check` is the unpacker's hook. */
export class LayerBudget {
  private read = 0;
  /** Charge, entries and free space at the last statfs. */
  private at = { charge: 0, entries: 0, freeBytes: 0, freeInodes: Number.POSITIVE_INFINITY };

  constructor(
    private readonly o: {
      /** A directory on the filesystem the layer is written to. */
      dir: string;
      /** Names the layer in refusals, e.g. `layer 2/3 (sha256:…)`. */
      label: string;
      /** The layer's compressed size (its manifest's, which the download is held to). */
      size: number;
      bounds?: UnpackBounds;
      statfs?: Statfs;
    },
  ) {
    this.refresh(0, 0);
  }

  private get bounds(): UnpackBounds {
    return this.o.bounds ?? UNPACK_BOUNDS;
  }

  /** A pass-through that counts what the decompressor is handed. */
  meter(): Transform {
    return new Transform({
      transform: (chunk: Buffer, _enc: BufferEncoding, done: TransformCallback) => {
        this.read += chunk.length;
        done(null, chunk);
      },
    });
  }

  /** Throws when a layer that has written `bytes` of contents in `entries` entries passed a bound. */
  readonly check = (bytes: number, entries: number): void => {
    const b = this.bounds;
    if (bytes > b.floorBytes + b.ratio * this.read) {
      throw new LayerRefused(
        `refused ${this.o.label}: it unpacks to more than ${fmtBytes(b.floorBytes)} + ${b.ratio}x its compressed bytes (${fmtBytes(bytes)} from ${fmtBytes(this.read)} read, of ${fmtBytes(this.o.size)})`,
        `a decompression bomb or a broken image: pyro bounds what a layer may write (docs/environments.md, "Bounds on unpacking"); nothing was kept`,
      );
    }
    if (entries > b.floorEntries + this.read / b.entryBytes) {
      throw new LayerRefused(
        `refused ${this.o.label}: it holds more than ${b.floorEntries} entries + one per ${b.entryBytes} compressed bytes (${entries} entries from ${fmtBytes(this.read)} read)`,
        `a bomb of empty entries or a broken image: pyro bounds what a layer may write (docs/environments.md, "Bounds on unpacking"); nothing was kept`,
      );
    }
    this.checkSpace(bytes + entries * ENTRY_CHARGE, entries);
  };

  private checkSpace(charge: number, entries: number): void {
    if (charge - this.at.charge >= REFRESH) this.refresh(charge, entries);
    const b = this.bounds;
    const what = `refused ${this.o.label} after ${fmtBytes(charge)} and ${entries} entries`;
    if (charge - this.at.charge > this.at.freeBytes - b.reserveBytes)
      throw noSpace(this.o.dir, what, fmtBytes(this.at.freeBytes), fmtBytes(b.reserveBytes));
    if (entries - this.at.entries > this.at.freeInodes - b.reserveInodes)
      throw noSpace(this.o.dir, what, `${this.at.freeInodes} inodes`, `${b.reserveInodes} inodes`);
  }

  private refresh(charge: number, entries: number): void {
    const s = (this.o.statfs ?? hostStatfs)(this.o.dir);
    this.at = {
      charge,
      entries,
      freeBytes: s.bavail * s.bsize,
      freeInodes: s.files > 0 ? s.ffree : Number.POSITIVE_INFINITY,
    };
  }
}
