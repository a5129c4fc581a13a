import { existsSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { TreeOps } from "../../../src/core/tree-ops.js";
import { IN_FLIGHT_BYTES, SwitchingSteps, WorkerSteps, workerScript } from "../../../src/core/tree-worker.js";

/**
 * The steps of an extraction on a worker thread (core/tree-worker.ts): the same steps as
 * on the main thread, in order, with the data in flight bounded, the first failure
 * reported and nothing written once the thread is stopped. Needs the build (the worker
 * runs dist/core/tree-worker.js), which every test run here has.
 */
const script = workerScript();

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "pyro-tree-worker-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe.skipIf(!script)(
  `WorkerSteps${script ? "" : " (skipped: no build, dist/core/tree-worker.js)"}`,
  () => {
    it("writes files, symlinks and directories with their modes and times, as TreeOps does", async () => {
      const problems: string[] = [];
      const w = new WorkerSteps(script!, (p) => problems.push(p));
      w.mkdir(join(dir, "d"), "d");
      w.open(join(dir, "d", "f"), "d/f");
      w.write(Buffer.from("hello "));
      w.write(Buffer.from("world"));
      w.close({ mode: 0o640, times: [1_000_000, 1_000_000] });
      w.symlink("f", join(dir, "d", "l"), "d/l");
      w.finishDirs([{ at: join(dir, "d"), name: "d", mode: 0o750, mtime: 2_000_000 }]);
      await w.done();
      expect(problems).toEqual([]);
      expect(readFileSync(join(dir, "d", "f"), "utf8")).toBe("hello world");
      expect(statSync(join(dir, "d", "f")).mode & 0o777).toBe(0o640);
      expect(statSync(join(dir, "d", "f")).mtimeMs).toBe(1_000_000_000);
      expect(statSync(join(dir, "d")).mode & 0o777).toBe(0o750);
      expect(statSync(join(dir, "d")).mtimeMs).toBe(2_000_000_000);
    });

    it("bounds the data in flight: past IN_FLIGHT_BYTES the writer waits until the worker catches up", async () => {
      const w = new WorkerSteps(script!, () => {});
      w.open(join(dir, "big"), "big");
      const chunk = Buffer.alloc(256 * 1024, 7);
      const n = Math.ceil((IN_FLIGHT_BYTES * 1.5) / chunk.length);
      for (let i = 0; i < n; i++) w.write(chunk);
      w.flush();
      // Nothing acknowledged yet (this thread has not yielded): the bound is reached.
      const room = w.room();
      expect(room).not.toBeNull();
      await room;
      expect(w.room()).toBeNull();
      w.close({ mode: 0o600 });
      w.finishDirs([]);
      await w.done();
      expect(statSync(join(dir, "big")).size).toBe(n * chunk.length);
    });

    it("reports the first failure once and then writes nothing more", async () => {
      const problems: string[] = [];
      const w = new WorkerSteps(script!, (p) => problems.push(p));
      w.open(join(dir, "missing", "f"), "missing/f");
      w.write(Buffer.from("x"));
      w.close({ mode: 0o600 });
      w.mkdir(join(dir, "after"), "after");
      w.finishDirs([]);
      await w.done();
      expect(problems).toHaveLength(1);
      expect(problems[0]).toMatch(/^'missing\/f' could not be written \(ENOENT/);
      expect(existsSync(join(dir, "after"))).toBe(false);
    });

    it("SwitchingSteps stays on this thread for a small tree and moves between files for a large one", async () => {
      const small = new SwitchingSteps(script!, () => {}, { bytes: 1000, files: 3 });
      small.open(join(dir, "a"), "a");
      small.write(Buffer.alloc(100, 1));
      small.close({ mode: 0o600 });
      small.finishDirs([]);
      await small.done();
      expect(small.onWorker).toBe(false);
      const problems: string[] = [];
      const big = new SwitchingSteps(script!, (p) => problems.push(p), { bytes: 1000, files: 3 });
      for (let i = 0; i < 6; i++) {
        big.open(join(dir, `f${i}`), `f${i}`);
        big.write(Buffer.alloc(400, i));
        big.write(Buffer.alloc(100, i));
        big.close({ mode: 0o644 });
        if (i === 1) expect(big.onWorker).toBe(false);
        big.flush();
      }
      expect(big.onWorker).toBe(true);
      big.finishDirs([]);
      await big.done();
      expect(problems).toEqual([]);
      for (let i = 0; i < 6; i++) {
        const got = readFileSync(join(dir, `f${i}`));
        expect(got.length).toBe(500);
        expect(got.every((b) => b === i)).toBe(true);
      }
    });

    it("a worker that dies refuses the archive and releases every wait", async () => {
      const broken = join(dir, "broken.mjs");
      writeFileSync(broken, 'throw new Error("boom");\n');
      const problems: string[] = [];
      const w = new WorkerSteps(broken, (p) => problems.push(p));
      w.open(join(dir, "f"), "f");
      for (let i = 0; i < 40; i++) w.write(Buffer.alloc(256 * 1024));
      w.flush();
      await w.room(); // released by the death, not left waiting
      w.finishDirs([]);
      await w.done();
      expect(problems).toHaveLength(1);
      expect(problems[0]).toContain("the writer's thread ended");
      expect(w.room()).toBeNull();
    });

    it("writes nothing once stopped", async () => {
      const w = new WorkerSteps(script!, () => {});
      await w.stop();
      w.mkdir(join(dir, "late"), "late");
      w.finishDirs([]);
      await new Promise((r) => setTimeout(r, 50));
      expect(existsSync(join(dir, "late"))).toBe(false);
    });
  },
);

it("TreeOps refuses to open a file over an existing one or through a symlink (O_EXCL | O_NOFOLLOW)", async () => {
  const problems: string[] = [];
  const ops = new TreeOps((p) => problems.push(p));
  ops.open(join(dir, "f"), "f");
  ops.close({ mode: 0o600 });
  ops.open(join(dir, "f"), "f");
  expect(problems).toHaveLength(1);
  expect(problems[0]).toContain("EEXIST");
});
