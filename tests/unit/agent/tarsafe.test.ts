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

describe("packTree without GNU tar (node-tar)", () => {
  it("packs hard-linked files as separate regular files, many times over without an uncaught error", async () => {
    const { packTree } = await import("../../../src/agent/tarsafe.js");
    await mkdir(join(dir, "p"));
    await writeFile(join(dir, "p", "a"), "same\n");
    await link(join(dir, "p", "a"), join(dir, "p", "b"));
    // node-tar's Pack wrote after its end with a Link entry (seen on a busy machine):
    // no Link entries are made, so that path is never taken.
    for (let i = 0; i < 50; i++) {
      const { stream } = await packTree(join(dir, "p"), ["a", "b"], { nodeTar: true });
      const entries: string[] = [];
      const parser = new tar.Parser({
        onReadEntry: (e) => {
          entries.push(`${e.type}:${e.path}:${e.size}`);
          e.resume();
        },
      });
      const done = new Promise((r) => parser.on("end", r));
      for await (const c of stream as AsyncIterable<Buffer>) parser.write(c);
      parser.end();
      await done;
      expect(entries).toEqual(["File:a:5", "File:b:5"]);
    }
  });
});

describe("packTree with GNU tar", () => {
  it("writes 64 KiB records (not tar's 10 KiB), and the archive still extracts whole", async (ctx) => {
    const { findGnuTar, packTree, PACK_BLOCKING } = await import("../../../src/agent/tarsafe.js");
    if (!(await findGnuTar())) ctx.skip(); // the node-tar fallback has no records to size
    await mkdir(join(dir, "p"));
    for (let i = 0; i < 30; i++) await writeFile(join(dir, "p", `f${i}`), Buffer.alloc(3000, i));
    const { stream } = await packTree(join(dir, "p"), ["."]);
    const chunks: Buffer[] = [];
    for await (const c of stream as AsyncIterable<Buffer>) chunks.push(c);
    const archive = Buffer.concat(chunks);
    // ~110 KiB of headers and data: two 64 KiB records; 10 KiB records would make 110 KiB.
    expect(PACK_BLOCKING * 512).toBe(65536);
    expect(archive.length % 65536).toBe(0);
    const sizes: number[] = [];
    const parser = new tar.Parser({
      onReadEntry: (e) => {
        if (e.type === "File") sizes.push(e.size ?? -1);
        e.resume();
      },
    });
    const done = new Promise((r) => parser.on("end", r));
    parser.end(archive);
    await done;
    expect(sizes).toEqual(Array.from({ length: 30 }, () => 3000));
  });
});

describe("archiveValidator", () => {
  /** One ustar header block (type flag `type`) plus its body padded to 512 bytes. */
  function block(name: string, type: string, body: Buffer): Buffer {
    const head = Buffer.alloc(512);
    const octal = (n: number, w: number) => `${n.toString(8).padStart(w - 1, "0")}\0`;
    head.write(name, 0);
    head.write(octal(0o644, 8), 100);
    head.write(octal(0, 8), 108);
    head.write(octal(0, 8), 116);
    head.write(octal(body.length, 12), 124);
    head.write(octal(0, 12), 136);
    head.write("        ", 148);
    head.write(type, 156);
    head.write("ustar\0", 257);
    head.write("00", 263);
    let sum = 0;
    for (const b of head) sum += b;
    head.write(`${sum.toString(8).padStart(6, "0")}\0 `, 148);
    return Buffer.concat([head, body, Buffer.alloc((512 - (body.length % 512)) % 512)]);
  }

  it("refuses an entry of a type node-tar skips but GNU tar would extract (through a planted symlink)", async () => {
    const { archiveValidator } = await import("../../../src/agent/tarsafe.js");
    const archive = Buffer.concat([
      block("ok.txt", "0", Buffer.from("fine\n")),
      block("ln/planted", "Z", Buffer.from("written through the symlink\n")),
      Buffer.alloc(1024),
    ]);
    const v = archiveValidator({ destReal: dir, destLabel: "/workspace" });
    await v.write(archive);
    await expect(v.finish()).rejects.toThrow(/unknown type/);
  });
});
