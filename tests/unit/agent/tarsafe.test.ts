import { link, mkdir, mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as tar from "tar";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { extractArchive } from "../../../src/agent/tarsafe.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "pyro-tarsafe-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe("extractArchive", () => {
  it("replaces a file that is a hard link instead of writing through it to the other name", async () => {
    await mkdir(join(dir, "src"));
    await mkdir(join(dir, "dest"));
    await writeFile(join(dir, "src", "a"), "from the archive\n");
    await writeFile(join(dir, "outside"), "must not change\n");
    await link(join(dir, "outside"), join(dir, "dest", "a"));
    await tar.c({ cwd: join(dir, "src"), file: join(dir, "a.tar"), portable: true }, ["a"]);
    await extractArchive(join(dir, "a.tar"), join(dir, "dest"));
    expect(await readFile(join(dir, "dest", "a"), "utf8")).toBe("from the archive\n");
    expect(await readFile(join(dir, "outside"), "utf8")).toBe("must not change\n");
    expect((await stat(join(dir, "outside"))).nlink).toBe(1);
  });
});
