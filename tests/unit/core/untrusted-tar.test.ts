import { lstat, mkdir, mkdtemp, readdir, readlink, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gzipSync } from "node:zlib";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { ExportWriter } from "../../../src/core/transfer.js";

/**
 * Archives as a hijacked agent could send them, built header by header (no tar library
 * would write most of these), and what the host makes of them.
 */

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "pyro-untar-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

interface Header {
  name: string;
  type: string; // one character: 0 file, 2 symlink, 3 char dev, 5 dir, 6 fifo, x pax, K/L GNU long names
  mode?: number;
  uid?: number;
  gid?: number;
  linkname?: string;
  body?: Buffer;
}

function octal(n: number, width: number): string {
  return `${n.toString(8).padStart(width - 1, "0")}\0`;
}

/** One ustar header block plus its body padded to 512 bytes. */
function block(h: Header): Buffer {
  const body = h.body ?? Buffer.alloc(0);
  const head = Buffer.alloc(512);
  head.write(h.name.slice(0, 100), 0, "utf8");
  head.write(octal(h.mode ?? 0o644, 8), 100);
  head.write(octal(h.uid ?? 0, 8), 108);
  head.write(octal(h.gid ?? 0, 8), 116);
  head.write(octal(body.length, 12), 124);
  head.write(octal(0, 12), 136);
  head.write("        ", 148);
  head.write(h.type, 156);
  head.write((h.linkname ?? "").slice(0, 100), 157);
  head.write("ustar\0", 257);
  head.write("00", 263);
  let sum = 0;
  for (const b of head) sum += b;
  head.write(`${sum.toString(8).padStart(6, "0")}\0 `, 148);
  const pad = Buffer.alloc((512 - (body.length % 512)) % 512);
  return Buffer.concat([head, body, pad]);
}

function pax(records: Record<string, string>): Buffer {
  let text = "";
  for (const [k, v] of Object.entries(records)) {
    const rest = ` ${k}=${v}\n`;
    let len = rest.length + 1;
    while (`${len}${rest}`.length !== len) len = `${len}${rest}`.length;
    text += `${len}${rest}`;
  }
  return Buffer.from(text);
}

function tarOf(...blocks: Buffer[]): Buffer {
  return Buffer.concat([...blocks, Buffer.alloc(1024)]);
}

async function commit(
  out: string,
  data: Buffer,
  type: "file" | "directory",
  mode: "export" | "snapshot" = "export",
) {
  const w = new ExportWriter(out, mode);
  await w.begin();
  w.write(data);
  return w.commit(type);
}

/** Every path under `root`, with lstat, never following symlinks. */
async function walk(root: string): Promise<{ rel: string; st: import("node:fs").Stats; link?: string }[]> {
  const out: { rel: string; st: import("node:fs").Stats; link?: string }[] = [];
  const visit = async (rel: string) => {
    for (const n of await readdir(join(root, rel))) {
      const r = rel ? `${rel}/${n}` : n;
      const st = await lstat(join(root, r));
      out.push(st.isSymbolicLink() ? { rel: r, st, link: await readlink(join(root, r)) } : { rel: r, st });
      if (st.isDirectory()) await visit(r);
    }
  };
  await visit("");
  return out;
}

describe("archives from a hijacked agent", () => {
  it("never writes a symlink that leaves the tree when a PAX linkpath and a GNU long link disagree", async () => {
    // The red team's archive: PAX linkpath=/etc/shadow, then a GNU 'K' long link with a
    // harmless name, then the symlink itself. Whichever the parser believes, the host must
    // write only what it checked.
    const data = tarOf(
      block({ name: "PaxHeader", type: "x", body: pax({ linkpath: "/etc/shadow" }) }),
      block({ name: "././@LongLink", type: "K", body: Buffer.from("harmless\0") }),
      block({ name: "d/shadow", type: "2", linkname: "" }),
      block({ name: "d/", type: "5", mode: 0o755 }),
    );
    const out = join(dir, "out");
    const result = await commit(out, data, "directory").then(
      () => "extracted",
      (e: { code?: string }) => e.code,
    );
    if (result === "extracted") {
      for (const e of await walk(out)) if (e.link !== undefined) expect(e.link).not.toMatch(/^\/|\.\./);
    } else {
      expect(result).toBe("path_outside_workspace");
      expect(await readdir(dir)).toEqual([]);
    }
  });

  it("refuses a PAX linkpath that points out, whatever the header's own link name says", async () => {
    const data = tarOf(
      block({ name: "PaxHeader", type: "x", body: pax({ linkpath: "/etc/shadow" }) }),
      block({ name: "shadow", type: "2", linkname: "harmless" }),
    );
    await expect(commit(join(dir, "out"), data, "directory")).rejects.toMatchObject({
      code: "path_outside_workspace",
    });
    expect(await readdir(dir)).toEqual([]);
  });

  it("refuses a PAX path that climbs out though the header's name is harmless", async () => {
    const data = tarOf(
      block({ name: "PaxHeader", type: "x", body: pax({ path: "../../escaped" }) }),
      block({ name: "harmless", type: "0", body: Buffer.from("x") }),
    );
    await expect(commit(join(dir, "sub", "out"), data, "directory")).rejects.toMatchObject({
      code: "path_outside_workspace",
    });
    expect(await readdir(dir)).toEqual(["sub"]);
    expect(await readdir(join(dir, "sub"))).toEqual([]);
  });

  it("exports setuid-root and setgid files as plain files owned by the invoking user", async () => {
    const data = tarOf(
      block({ name: "bin/", type: "5", mode: 0o7755 }),
      block({ name: "bin/su", type: "0", mode: 0o4755, uid: 0, gid: 0, body: Buffer.from("#!/bin/sh\n") }),
      block({ name: "bin/sg", type: "0", mode: 0o2755, uid: 4242, gid: 4242, body: Buffer.from("x") }),
      block({ name: "bin/ro", type: "0", mode: 0o400, uid: 4242, body: Buffer.from("x") }),
    );
    const out = join(dir, "out");
    await commit(out, data, "directory");
    const uid = process.getuid?.() ?? 0;
    for (const e of await walk(out)) {
      expect(e.st.mode & 0o7000, e.rel).toBe(0);
      expect(e.st.uid, e.rel).toBe(uid);
    }
    expect((await stat(join(out, "bin", "su"))).mode & 0o777).toBe(0o755);
    // The owner can always read and write what it got.
    expect((await stat(join(out, "bin", "ro"))).mode & 0o600).toBe(0o600);
  });

  it("exports a single setuid file without its setuid bit", async () => {
    const data = tarOf(block({ name: "su", type: "0", mode: 0o4755, body: Buffer.from("x") }));
    await commit(join(dir, "su"), data, "file");
    expect((await stat(join(dir, "su"))).mode & 0o7777).toBe(0o755);
  });

  for (const [what, type] of [
    ["a character device", "3"],
    ["a block device", "4"],
    ["a FIFO", "6"],
  ] as const) {
    it(`refuses ${what} and writes nothing, in exports and snapshots`, async () => {
      for (const mode of ["export", "snapshot"] as const) {
        const data = tarOf(
          block({ name: "ok.txt", type: "0", body: Buffer.from("x") }),
          block({ name: "dev", type }),
        );
        await expect(commit(join(dir, `out-${mode}`), data, "directory", mode)).rejects.toMatchObject({
          code: "path_outside_workspace",
        });
      }
      expect(await readdir(dir)).toEqual([]);
    });
  }

  it("refuses a compressed archive before parsing it (gzip and zstd magic, however the bytes are split)", async () => {
    const plain = tarOf(block({ name: "a", type: "0", body: Buffer.alloc(4096, 1) }));
    const gz = gzipSync(plain);
    for (const [i, data] of [gz, Buffer.concat([Buffer.from([0x28, 0xb5, 0x2f, 0xfd]), plain])].entries()) {
      const w = new ExportWriter(join(dir, `out${i}`), "export");
      await w.begin();
      for (const b of data) w.write(Buffer.from([b])); // one byte at a time: the magic split
      await expect(w.commit("directory")).rejects.toMatchObject({
        code: "path_outside_workspace",
        message: expect.stringContaining("compressed"),
      });
    }
    expect(await readdir(dir)).toEqual([]);
  });

  it("refuses a hard link, even to a file inside the archive", async () => {
    const data = tarOf(
      block({ name: "a", type: "0", body: Buffer.from("x") }),
      block({ name: "b", type: "1", linkname: "a" }),
    );
    await expect(commit(join(dir, "out"), data, "directory")).rejects.toMatchObject({
      code: "path_outside_workspace",
    });
    expect(await readdir(dir)).toEqual([]);
  });

  it("refuses to write through a symlink the archive made earlier", async () => {
    await mkdir(join(dir, "victim"));
    const data = tarOf(
      block({ name: "link", type: "2", linkname: "." }),
      block({ name: "link/../../victim/x", type: "0", body: Buffer.from("pwned") }),
      block({ name: "d", type: "2", linkname: "sub" }),
      block({ name: "sub/", type: "5" }),
      block({ name: "d/f", type: "0", body: Buffer.from("through the link") }),
    );
    await expect(commit(join(dir, "out"), data, "directory")).rejects.toMatchObject({
      code: "path_outside_workspace",
    });
    expect(await readdir(join(dir, "victim"))).toEqual([]);
    expect((await readdir(dir)).sort()).toEqual(["victim"]);
  });

  it("refuses an entry under a file or a symlink the archive made, and a file over a directory it implied", async () => {
    for (const data of [
      tarOf(block({ name: "a", type: "0", body: Buffer.from("x") }), block({ name: "a/b", type: "0" })),
      tarOf(block({ name: "l", type: "2", linkname: "sub" }), block({ name: "l/f", type: "0" })),
      tarOf(block({ name: "p/q", type: "0" }), block({ name: "p", type: "0" })),
      tarOf(block({ name: "p/q", type: "0" }), block({ name: "p", type: "2", linkname: "." })),
    ]) {
      const out = join(dir, "out");
      await expect(commit(out, data, "directory")).rejects.toMatchObject({ code: "path_outside_workspace" });
      expect(await readdir(dir)).toEqual([]);
    }
  });

  it("extracts an archive fed in small pieces as it arrives, with modes, times and nested directories", async () => {
    const files = Array.from({ length: 200 }, (_, i) =>
      block({ name: `d${i % 7}/s${i % 3}/f${i}`, type: "0", mode: 0o640, body: Buffer.alloc(700 + i, i) }),
    );
    const data = tarOf(block({ name: "d0/", type: "5", mode: 0o500 }), ...files);
    const out = join(dir, "out");
    const w = new ExportWriter(out);
    await w.begin();
    for (let at = 0; at < data.length; at += 333) await w.write(data.subarray(at, at + 333));
    const got = await w.commit("directory");
    expect(got).toMatchObject({ files: 200, entries: 201 });
    const f = await stat(join(out, "d3", "s1", "f10"));
    expect(f.size).toBe(710);
    expect(f.mode & 0o777).toBe(0o640);
    expect(f.mtimeMs).toBe(0); // the header says 1970
    // A read-only directory is still written into; its mode comes after (plus the owner's rwx in an export).
    expect((await stat(join(out, "d0"))).mode & 0o777).toBe(0o700);
    expect((await readdir(join(out, "d0", "s0"))).length).toBeGreaterThan(0);
    expect((await readdir(dir)).sort()).toEqual(["out"]);
  });

  it("refuses a file export whose one entry is a directory or a symlink", async () => {
    for (const data of [
      tarOf(block({ name: "d/", type: "5" })),
      tarOf(block({ name: "l", type: "2", linkname: "x" })),
    ]) {
      await expect(commit(join(dir, "f"), data, "file")).rejects.toMatchObject({ code: "internal" });
    }
    expect(await readdir(dir)).toEqual([]);
  });

  it("reports the sizes it wrote, not what the agent claims", async () => {
    const data = tarOf(
      block({ name: "a.txt", type: "0", body: Buffer.from("32 bytes of text, exactly here.\n") }),
    );
    const got = await commit(join(dir, "a.txt"), data, "file");
    expect(got).toMatchObject({ files: 1, bytes: 32, entries: 1 });
  });

  it("keeps owners, modes and absolute symlinks in a snapshot", async () => {
    const data = tarOf(
      block({ name: "bin/", type: "5", mode: 0o755 }),
      block({ name: "bin/tool", type: "0", mode: 0o4755, uid: 0, body: Buffer.from("x") }),
      block({ name: "bin/sh", type: "2", linkname: "/bin/dash" }),
    );
    const out = join(dir, "snap");
    await commit(out, data, "directory", "snapshot");
    expect(await readlink(join(out, "bin", "sh"))).toBe("/bin/dash");
    if (process.getuid?.() === 0) expect((await stat(join(out, "bin", "tool"))).mode & 0o7777).toBe(0o4755);
  });
});

describe("bounds on what an archive may make the host do", () => {
  it("refuses more file data than the budget, before writing the file that passes it, and takes what fits", async () => {
    // A workspace's disk limit bounds its archives: a sparse file the host would write in full.
    const files = (...sizes: number[]) =>
      tarOf(
        block({ name: "./", type: "5" }),
        ...sizes.map((n, i) => block({ name: `./f${i}`, type: "0", body: Buffer.alloc(n, 1) })),
      );
    for (const mode of ["export", "snapshot"] as const) {
      const out = join(dir, `out-${mode}`);
      const w = new ExportWriter(out, mode, 1000);
      await w.begin();
      w.write(files(600, 600));
      // The caller cancels the agent's request on this: the rest of the archive is not read.
      expect(w.refused.aborted).toBe(true);
      await expect(w.commit("directory")).rejects.toMatchObject({
        code: "conflict",
        message: expect.stringContaining("more than 1000 bytes of file data"),
      });
      expect(await readdir(dir)).toEqual([]);
      const fits = new ExportWriter(out, mode, 1000);
      await fits.begin();
      fits.write(files(600, 400));
      expect((await fits.commit("directory")).bytes).toBe(1000);
      await rm(out, { recursive: true });
    }
  });

  it("applies the invoking user's umask to an export's modes (world-writable entries land 755/644)", async () => {
    const old = process.umask(0o022);
    try {
      const data = tarOf(
        block({ name: "./", type: "5", mode: 0o777 }),
        block({ name: "./bin/", type: "5", mode: 0o777 }),
        block({ name: "./bin/run.sh", type: "0", mode: 0o777, body: Buffer.from("#!/bin/sh\n") }),
        block({ name: "./notes.txt", type: "0", mode: 0o666, body: Buffer.from("x") }),
      );
      const out = join(dir, "out");
      await commit(out, data, "directory");
      expect((await stat(out)).mode & 0o7777).toBe(0o755);
      expect((await stat(join(out, "bin"))).mode & 0o7777).toBe(0o755);
      expect((await stat(join(out, "bin", "run.sh"))).mode & 0o7777).toBe(0o755);
      expect((await stat(join(out, "notes.txt"))).mode & 0o7777).toBe(0o644);
    } finally {
      process.umask(old);
    }
  });

  it("refuses a name past PATH_MAX or deeper than 256 levels, writing nothing", async () => {
    const deep = `${Array.from({ length: 300 }, () => "a").join("/")}/f`;
    const long = `${"b".repeat(5000)}`;
    for (const name of [deep, long]) {
      const data = tarOf(
        block({ name: "PaxHeader", type: "x", body: pax({ path: name }) }),
        block({ name: "f", type: "0", body: Buffer.from("x") }),
      );
      const out = join(dir, "out");
      await expect(commit(out, data, "directory")).rejects.toMatchObject({
        code: "path_outside_workspace",
        message: expect.stringMatching(/deeper than 256 levels|longer than 4096 bytes/),
      });
      expect(await readdir(dir)).toEqual([]);
    }
  });

  it("refuses an archive whose entries imply far more directories than it names", async () => {
    // Ten files, each 200 directories deep under its own top: 2000 implied directories
    // for 10 entries (pyro's own archives name every directory).
    const blocks: Buffer[] = [];
    for (let i = 0; i < 10; i++) {
      const name = `t${i}/${Array.from({ length: 199 }, () => "d").join("/")}/f`;
      blocks.push(block({ name: "PaxHeader", type: "x", body: pax({ path: name }) }));
      blocks.push(block({ name: "f", type: "0", body: Buffer.from("x") }));
    }
    const out = join(dir, "out");
    await expect(commit(out, tarOf(...blocks), "directory")).rejects.toMatchObject({
      code: "path_outside_workspace",
      message: expect.stringContaining("implies more directories than the archive names"),
    });
    expect(await readdir(dir)).toEqual([]);
  });

  it("still makes a few directories an entry implies", async () => {
    const data = tarOf(block({ name: "a/b/c/f.txt", type: "0", body: Buffer.from("x") }));
    const out = join(dir, "out");
    await commit(out, data, "directory");
    expect((await stat(join(out, "a", "b", "c", "f.txt"))).size).toBe(1);
  });
});
