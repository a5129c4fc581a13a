import { mkdtemp, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeDirs, makeDirsSync } from "../../../src/util/fs.js";

/**
 * makeDirs replaces Node's recursive mkdir, which spins forever on a parent that mkdir
 * answers ENOENT for (`workspace export W . --output /proc/nope/x` hung at 100% CPU).
 */
let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "pyro-fs-"));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe("makeDirs", () => {
  it("fails at once under a parent that cannot be made, sync and async", async () => {
    await expect(makeDirs("/proc/nope/x")).rejects.toMatchObject({ code: "ENOENT" });
    expect(() => makeDirsSync("/proc/nope/x/y")).toThrow(expect.objectContaining({ code: "ENOENT" }));
  });

  it("makes every missing component with the mode, and accepts what exists", async () => {
    await makeDirs(join(dir, "a", "b", "c"), 0o700);
    expect((await stat(join(dir, "a", "b", "c"))).mode & 0o777).toBe(0o700);
    await makeDirs(join(dir, "a", "b"));
    makeDirsSync(join(dir, "a", "b", "d"));
    expect((await stat(join(dir, "a", "b", "d"))).isDirectory()).toBe(true);
    await makeDirs("/");
  });

  it("refuses a path through a file with ENOTDIR", async () => {
    await writeFile(join(dir, "f"), "x");
    await expect(makeDirs(join(dir, "f", "g"))).rejects.toMatchObject({ code: "ENOTDIR" });
    expect(() => makeDirsSync(join(dir, "f", "g"))).toThrow(expect.objectContaining({ code: "ENOTDIR" }));
  });
});
