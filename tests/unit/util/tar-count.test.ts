import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { TarCounter } from "../../../src/util/tar-count.js";

/** A header block with `size` in the size field as given and type `type`. */
function header(name: string, type: string, size: Buffer): Buffer {
  const h = Buffer.alloc(512);
  h.write(name, 0, "latin1");
  size.copy(h, 124);
  h.write(type, 156, "latin1");
  h.write("ustar  \0", 257, "latin1");
  return h;
}

describe("TarCounter", () => {
  const dir = mkdtempSync(join(tmpdir(), "tar-count-"));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it("counts GNU tar's entries and file data, in chunks of any size", () => {
    const src = join(dir, "src");
    mkdirSync(join(src, "d".repeat(120), "e"), { recursive: true });
    writeFileSync(join(src, "a.txt"), "hello\n");
    writeFileSync(join(src, "empty"), "");
    writeFileSync(join(src, "d".repeat(120), "e", `${"long".repeat(40)}.bin`), Buffer.alloc(70_000, 1));
    symlinkSync(`${"t".repeat(150)}`, join(src, "link"));
    const archive = execFileSync("tar", ["-C", src, "--format=gnu", "-cf", "-", "."], { maxBuffer: 1 << 24 });
    // ., a.txt, empty, d…, d…/e, d…/e/long…, link: 7 entries, 6 + 70000 bytes of data.
    for (const size of [1, 7, 512, 513, 65_536, archive.length]) {
      const c = new TarCounter();
      for (let i = 0; i < archive.length; i += size) c.push(archive.subarray(i, i + size));
      expect([c.entries, c.bytes], `chunks of ${size}`).toEqual([7, 70_006]);
    }
  });

  it("reads base-256 sizes (files over 8 GiB) and refuses a size that is not octal", () => {
    const big = Buffer.alloc(12);
    big[0] = 0x80;
    big.writeUIntBE(10 * 2 ** 30, 6, 6);
    const c = new TarCounter();
    c.push(header("big", "0", big));
    expect([c.entries, c.bytes]).toEqual([1, 10 * 2 ** 30]);
    // Its data is skipped, not read as headers: a zero block of it counts nothing.
    c.push(Buffer.alloc(4096));
    expect(c.entries).toBe(1);
    expect(() => new TarCounter().push(header("bad", "0", Buffer.from("12x\0")))).toThrow(/not octal/);
  });

  it("counts no data for directories, links and long-name records", () => {
    const c = new TarCounter();
    const octal = (n: number) => Buffer.from(`${n.toString(8).padStart(11, "0")}\0`);
    c.push(header("././@LongLink", "L", octal(300)));
    c.push(Buffer.alloc(512));
    c.push(header("x", "5", octal(0)));
    c.push(header("y", "2", octal(0)));
    c.push(header("z", "0", octal(5)));
    c.push(Buffer.alloc(512));
    expect([c.entries, c.bytes]).toEqual([3, 5]);
  });

  it("bounds names (long-name records too), depth and entries, and refuses record types GNU tar does not write", () => {
    const octal = (n: number) => Buffer.from(`${n.toString(8).padStart(11, "0")}\0`);
    const bounds = { nameBytes: 50, depth: 3, entries: 2 };
    const long = Buffer.alloc(512);
    long.write("x".repeat(60));
    expect(() =>
      new TarCounter(bounds).push(Buffer.concat([header("././@LongLink", "L", octal(61)), long])),
    ).toThrow(/too long/);
    expect(() => new TarCounter(bounds).push(header("a/b/c/d", "5", octal(0)))).toThrow(/too deep/);
    expect(() => new TarCounter(bounds).push(header("./a/b/c", "5", octal(0)))).not.toThrow();
    const three = Buffer.concat(["a", "b", "c"].map((n) => header(n, "5", octal(0))));
    expect(() => new TarCounter(bounds).push(three)).toThrow(/too many/);
    for (const type of ["x", "g", "S", "V"])
      expect(() => new TarCounter().push(header("p", type, octal(0))), type).toThrow(/has type/);
  });

  it("keeps a leading ./ entry's mode and mtime, and counts FIFOs", () => {
    const src = join(dir, "root");
    mkdirSync(src);
    execFileSync("mkfifo", [join(src, "fifo")]);
    execFileSync("chmod", ["500", src]);
    execFileSync("touch", ["-d", "2001-01-01 00:00:00", src]);
    const c = new TarCounter();
    c.push(execFileSync("tar", ["-C", src, "--format=gnu", "-cf", "-", "."]));
    expect(c.root).toEqual({ mode: 0o500, mtime: Date.UTC(2001, 0, 1) / 1000 });
    expect([c.entries, c.fifos]).toEqual([2, 1]);
    execFileSync("chmod", ["700", src]);
  });
});
