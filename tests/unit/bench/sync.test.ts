import { mkdir, mkdtemp, readdir, rm, truncate } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { BIG_TREE, createCostUs, expectTree, makeTree, treeStats } from "../../../src/bench/sync.js";

/**
 * The sync rows check every copy they time (bench/sync.ts): the export row once timed an
 * empty workspace (~15 ms for "100 MB") because its seed sat inside pyro's home. A small
 * tree stands in for the 10k-file one here.
 */
const SHAPE = { dirs: 3, files: 4, size: 100 };
let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "pyro-bench-sync-"));
});
afterAll(() => rm(dir, { recursive: true, force: true }));

describe("the sync rows' tree check", () => {
  it("is 10,000 files and 100 MB for the rows", () => {
    expect(BIG_TREE).toEqual({ files: 10_000, bytes: 102_400_000 });
  });

  it("accepts the whole tree and refuses an empty copy or one short of a file's bytes", async () => {
    const tree = join(dir, "tree");
    await makeTree(tree, SHAPE);
    expect(await treeStats(tree)).toEqual({ files: 12, bytes: 1200 });
    await expectTree(tree, "the tree", SHAPE);
    const empty = join(dir, "empty");
    await mkdir(empty);
    await expect(expectTree(empty, "an empty export", SHAPE)).rejects.toThrow(
      /an empty export holds 0 files \/ 0 bytes, not 12 \/ 1200/,
    );
    // The default shape is the rows' tree: this small one is not it.
    await expect(expectTree(tree, "a small tree")).rejects.toThrow(/not 10000 \/ 102400000/);
    await truncate(join(tree, "d1", "f2.bin"), 10);
    await expect(expectTree(tree, "a short copy", SHAPE)).rejects.toThrow(/12 files \/ 1110 bytes/);
  });
});

describe("the creation-cost probe beside the push and export rows", () => {
  it("creates n empty files in directories of 100 and returns the microseconds per file", async () => {
    const probe = join(dir, "probe");
    const us = createCostUs(probe, 250);
    expect(Number.isFinite(us) && us > 0).toBe(true);
    expect(await treeStats(probe)).toEqual({ files: 250, bytes: 0 });
    expect((await readdir(probe)).sort()).toEqual(["c0", "c1", "c2"]);
  });
});
