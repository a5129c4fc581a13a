import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { hostname, tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { acquireLock } from "../../../src/util/lock.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "pyro-lock-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe("file lock", () => {
  it("is exclusive: a second holder waits until the first releases", async () => {
    const path = join(dir, "a.lock");
    const release = await acquireLock(path);
    const order: string[] = [];
    let waited = false;
    const second = acquireLock(path, { pollMs: 20, onWait: () => (waited = true) }).then((r) => {
      order.push("second");
      return r;
    });
    await new Promise((r) => setTimeout(r, 150));
    order.push("first-release");
    await release();
    const release2 = await second;
    expect(order).toEqual(["first-release", "second"]);
    expect(waited).toBe(true);
    await release2();
  });

  it("takes over a lock whose owner process is dead", async () => {
    const path = join(dir, "b.lock");
    await writeFile(path, JSON.stringify({ pid: 999_999_999, host: hostname(), started_at: "x" }));
    const release = await acquireLock(path, { timeoutMs: 2000 });
    expect(JSON.parse(await readFile(path, "utf8")).pid).toBe(process.pid);
    await release();
  });

  it("times out with a clear error while a live process holds it", async () => {
    const path = join(dir, "c.lock");
    await writeFile(path, JSON.stringify({ pid: process.ppid, host: hostname(), started_at: "x" }));
    await expect(acquireLock(path, { timeoutMs: 200, pollMs: 20 })).rejects.toMatchObject({
      code: "timeout",
    });
  });
});
