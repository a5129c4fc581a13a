import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { Engine } from "../../../src/core/engine.js";
import { spareRootfsSync } from "../../../src/core/pool.js";

/**
 * What the pool's records tell the rest of the engine (core/pool.ts); the pool itself
 * runs real bwrap spares in tests/integration/bwrap/pool.test.ts.
 */
describe("pool records", () => {
  let home: string;
  beforeEach(async () => {
    home = await mkdtemp(join(tmpdir(), "pyro-pool-unit-"));
    await mkdir(join(home, "pool", "spare_a"), { recursive: true });
    const record = (rootfs: string) =>
      JSON.stringify({ owner: { pid: 1, start_time: "1" }, backend: "bwrap", spec: { rootfs } });
    await writeFile(join(home, "pool", "spare_a.json"), record("/envs/a/rootfs"));
    await writeFile(join(home, "pool", "spare_b.taken.json"), record("/envs/b/rootfs"));
    // Neither a record nor a finished one: a temp file and a damaged record.
    await writeFile(join(home, "pool", ".spare_c.json.123.ab.tmp"), record("/envs/c/rootfs"));
    await writeFile(join(home, "pool", "spare_d.json"), "{");
  });
  afterEach(async () => {
    await rm(home, { recursive: true, force: true });
  });

  it("name the environments spares run on, taken or not", () => {
    expect([...spareRootfsSync(join(home, "pool"))].sort()).toEqual(["/envs/a/rootfs", "/envs/b/rootfs"]);
    expect(spareRootfsSync(join(home, "missing")).size).toBe(0);
  });

  it("keep a spare's environment from being pruned", async () => {
    const engine = new Engine({ home, environmentsDir: join(home, "envs"), env: {} });
    try {
      const inUse = (engine as unknown as { rootfsInUse(): Set<string> }).rootfsInUse();
      expect(inUse.has("/envs/a/rootfs")).toBe(true);
      expect(inUse.has("/envs/b/rootfs")).toBe(true);
    } finally {
      await engine.close();
    }
  });
});
