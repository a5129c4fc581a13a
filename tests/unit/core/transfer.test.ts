import { mkdir, mkdtemp, readFile, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as tar from "tar";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { ExportWriter, safeEntry } from "../../../src/core/transfer.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "pyro-xfer-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

async function tarOf(files: Record<string, string>): Promise<Buffer> {
  const src = join(dir, "src");
  await mkdir(src, { recursive: true });
  for (const [n, c] of Object.entries(files)) await writeFile(join(src, n), c);
  const chunks: Buffer[] = [];
  for await (const c of tar.c({ cwd: src, portable: true }, Object.keys(files)) as AsyncIterable<Buffer>) chunks.push(c);
  return Buffer.concat(chunks);
}

describe("export safety", () => {
  it("refuses entries that climb out, absolute names, hard links and escaping symlinks", () => {
    expect(safeEntry("../x", "File", undefined)).toMatch(/leaves/);
    expect(safeEntry("/etc/passwd", "File", undefined)).toMatch(/leaves/);
    expect(safeEntry("a/../../x", "File", undefined)).toMatch(/leaves/);
    expect(safeEntry("x", "Link", "y")).toMatch(/hard link/);
    expect(safeEntry("l", "SymbolicLink", "/etc")).toMatch(/absolute/);
    expect(safeEntry("d/l", "SymbolicLink", "../../etc")).toMatch(/out of the export/);
    expect(safeEntry("d/l", "SymbolicLink", "../x")).toBeNull();
    expect(safeEntry("dev", "CharacterDevice", undefined)).toMatch(/unsupported/);
    expect(safeEntry("l", "SymbolicLink", "/usr/bin/python3", true)).toBeNull();
  });

  it("writes a file export into place only when complete", async () => {
    const w = new ExportWriter(join(dir, "out.txt"));
    await w.begin();
    w.write(await tarOf({ "a.txt": "hello" }));
    await w.commit("file");
    expect(await readFile(join(dir, "out.txt"), "utf8")).toBe("hello");
    expect((await readdir(dir)).filter((n) => n.startsWith(".pyro-export-"))).toEqual([]);
  });

  it("refuses to export into a non-empty directory and leaves it alone", async () => {
    await mkdir(join(dir, "full"));
    await writeFile(join(dir, "full", "keep"), "k");
    const w = new ExportWriter(join(dir, "full"));
    await expect(w.begin()).rejects.toMatchObject({ code: "conflict" });
    expect(await readdir(join(dir, "full"))).toEqual(["keep"]);
  });
});
