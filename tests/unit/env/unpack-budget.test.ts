/**
 * LayerBudget (src/env/oci/unpack-budget.ts) fed to the unpacker directly: a gzip bomb and
 * a bomb of empty entries are refused as the bytes flow, with what was written on disk
 * held to the bound; free space and free inodes come from statfs (faked here), asked
 * again as the layer grows.
 */
import { lstatSync, readdirSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";
import { createGunzip, gzipSync } from "node:zlib";
import * as tar from "tar";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { applyLayer, LAYER_LIMITS } from "../../../src/env/oci/apply.js";
import {
  checkDownloadSpace,
  LayerBudget,
  LayerRefused,
  type SpaceInfo,
  UNPACK_BOUNDS,
} from "../../../src/env/oci/unpack-budget.js";

const MiB = 1024 * 1024;
const GiB = 1024 * MiB;
const plenty: SpaceInfo = { bavail: 1e9, bsize: 4096, ffree: 1e9, files: 1e9 };

function header(path: string, size: number): Buffer {
  const b = Buffer.alloc(512);
  new tar.Header({ path, type: "File", size, mode: 0o644, mtime: new Date(0) }).encode(b, 0);
  return b;
}

/**
 * Unpacks gzip `layer` into `root` through the budget, as builder.ts does (read in 16 KiB
 * pieces, as a download arrives); the refusal or null.
 */
async function unpack(root: string, layer: Buffer, budget: LayerBudget): Promise<LayerRefused | null> {
  const pieces: Buffer[] = [];
  for (let i = 0; i < layer.length; i += 16 * 1024) pieces.push(layer.subarray(i, i + 16 * 1024));
  const input = Readable.from(pieces).pipe(budget.meter()).pipe(createGunzip());
  return applyLayer(root, input, "test", undefined, { ...LAYER_LIMITS, check: budget.check }).then(
    () => null,
    (e: unknown) => {
      expect(e).toBeInstanceOf(LayerRefused);
      return e as LayerRefused;
    },
  );
}

describe("LayerBudget", () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "pyro-budget-"));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("refuses a gzip bomb once it writes past floor + ratio x compressed bytes, and no further", async () => {
    // 512 MiB of zeros in ~500 KiB of gzip (members concatenate into one gzip stream).
    const zeros = gzipSync(Buffer.alloc(64 * MiB));
    const layer = Buffer.concat([gzipSync(header("bomb", 512 * MiB)), ...new Array(8).fill(zeros)]);
    const root = await mkdtemp(join(dir, "root-"));
    const bounds = { ...UNPACK_BOUNDS, floorBytes: 4 * MiB };
    const err = await unpack(
      root,
      layer,
      new LayerBudget({
        dir: root,
        label: "layer 1/1 (x)",
        size: layer.length,
        bounds,
        statfs: () => plenty,
      }),
    );
    expect(err?.code).toBe("build_failed");
    expect(err?.message).toContain("refused layer 1/1 (x): it unpacks to more than 4.0 MiB + 20x");
    // On disk: at most the floor plus 20x everything there was to read (and one chunk).
    const written = lstatSync(join(root, "bomb")).size;
    expect(written).toBeGreaterThan(4 * MiB);
    expect(written).toBeLessThanOrEqual(4 * MiB + 20 * layer.length + MiB);
  });

  it("refuses a bomb of empty entries past floor + one per entryBytes compressed bytes", async () => {
    const blocks: Buffer[] = [];
    for (let i = 0; i < 40_000; i++) blocks.push(header(`d${i % 10}/f${i}`, 0));
    const layer = gzipSync(Buffer.concat([...blocks, Buffer.alloc(1024)]));
    // About 8 gzip bytes per empty file: far denser than the one entry per 64 allowed here
    // (16 by default; 64 keeps the files this test makes few).
    expect(layer.length / 40_000).toBeLessThan(10);
    const root = await mkdtemp(join(dir, "root-"));
    const bounds = { ...UNPACK_BOUNDS, floorEntries: 200, entryBytes: 64 };
    const err = await unpack(
      root,
      layer,
      new LayerBudget({ dir: root, label: "l", size: layer.length, bounds, statfs: () => plenty }),
    );
    expect(err?.message).toContain("more than 200 entries + one per 64 compressed bytes");
    const made = readdirSync(root).reduce((a, d) => a + readdirSync(join(root, d)).length, 0);
    expect(made).toBeLessThanOrEqual(200 + layer.length / 64);
    // Checked as the bytes flow: refused after a few reads (what the pipe buffers hold
    // counts as read), well before the whole layer's bound.
    expect(made).toBeLessThan(200 + layer.length / 64 / 2);
  });

  it("keeps the reserve of free inodes; a filesystem without an inode count is not held to one", async () => {
    const bounds = { ...UNPACK_BOUNDS, reserveInodes: 100 };
    const few: SpaceInfo = { ...plenty, ffree: 110 };
    const b = new LayerBudget({ dir: "/x", label: "l", size: 1, bounds, statfs: () => few });
    b.check(0, 10);
    expect(() => b.check(0, 11)).toThrow(/has 110 inodes free and pyro keeps 100 inodes free/);
    const btrfs = new LayerBudget({
      dir: "/x",
      label: "l",
      size: 1,
      bounds,
      statfs: () => ({ ...plenty, ffree: 0, files: 0 }),
    });
    expect(() => btrfs.check(0, 5000)).not.toThrow();
  });

  it("charges a block per entry and asks the filesystem again as the layer grows", async () => {
    const frees = [10 * GiB, 1 * GiB + 100 * MiB];
    let asked = 0;
    const statfs = () => ({ ...plenty, bavail: (frees[Math.min(asked++, 1)] as number) / 4096 });
    const bounds = { ...UNPACK_BOUNDS, floorBytes: 4 * GiB };
    const b = new LayerBudget({ dir: "/x", label: "l", size: 1, bounds, statfs });
    b.check(100 * MiB, 1);
    expect(asked).toBe(1);
    // Past 256 MiB of charge: asked again; another writer left 1 GiB + 100 MiB free.
    b.check(300 * MiB, 2);
    expect(asked).toBe(2);
    b.check(390 * MiB, 2);
    expect(() => b.check(410 * MiB, 2)).toThrow(/has 1\.1 GiB free and pyro keeps 1\.0 GiB free/);
    // 4 KiB per entry: 25,600 empty entries are 100 MiB.
    const left = () => ({ ...plenty, bavail: (GiB + 100 * MiB) / 4096 });
    const c = new LayerBudget({ dir: "/x", label: "l", size: 1, bounds, statfs: left });
    c.check(0, 25_600);
    expect(() => c.check(0, 25_601)).toThrow(LayerRefused);
  });

  it("refuses downloads that would not leave the reserve free", () => {
    const statfs = () => ({ ...plenty, bavail: (GiB + 10 * MiB) / 4096 });
    expect(() => checkDownloadSpace("/x", 9 * MiB, statfs)).not.toThrow();
    expect(() => checkDownloadSpace("/x", 11 * MiB, statfs)).toThrow(
      /its layers need 11\.0 MiB of downloads/,
    );
  });
});
