import { execFileSync } from "node:child_process";
import { createReadStream } from "node:fs";
import { lstat, mkdir, mkdtemp, rm, stat, utimes } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { applyLayer } from "../../../src/env/oci/apply.js";
import type { PyroError } from "../../../src/errors.js";
import { treeSizeSync } from "../../../src/util/fs.js";

/** Layers are hostile: applying one writes nothing outside its root, timestamps included. */
describe("applyLayer and directory times", () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "pyro-oci-apply-"));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("does not date a host directory that a later entry put a symlink in front of", async () => {
    const victim = join(dir, "victim");
    await mkdir(join(victim, "x"), { recursive: true });
    const fixed = new Date("2020-02-02T00:00:00Z");
    await utimes(victim, fixed, fixed);
    await utimes(join(victim, "x"), fixed, fixed);
    const layer = join(dir, "layer.tar");
    // Directories a, b and b/x dated 2001, then a -> the victim and b -> the victim's parent.
    execFileSync("python3", [
      "-c",
      `import tarfile, sys
t = tarfile.open(sys.argv[1], "w")
for name in ("a", "b", "b/x"):
    d = tarfile.TarInfo(name); d.type = tarfile.DIRTYPE; d.mode = 0o755; d.mtime = 1000000000; t.addfile(d)
for name, target in (("a", sys.argv[2]), ("b", sys.argv[3])):
    s = tarfile.TarInfo(name); s.type = tarfile.SYMTYPE; s.linkname = target; t.addfile(s)
t.close()`,
      layer,
      victim,
      victim,
    ]);
    const root = join(dir, "root");
    await mkdir(root);
    await applyLayer(root, createReadStream(layer), "test");
    expect((await lstat(join(root, "a"))).isSymbolicLink()).toBe(true);
    expect((await stat(victim)).mtime.toISOString()).toBe(fixed.toISOString());
    expect((await stat(join(victim, "x"))).mtime.toISOString()).toBe(fixed.toISOString());
  });

  it("refuses a layer past its bounds (bytes or entries) with build_failed", async () => {
    const layer = join(dir, "big.tar");
    execFileSync("python3", [
      "-c",
      `import tarfile, sys, io
t = tarfile.open(sys.argv[1], "w")
for i in range(5):
    data = b"x" * 4096
    f = tarfile.TarInfo(f"f{i}"); f.size = len(data); t.addfile(f, io.BytesIO(data))
t.close()`,
      layer,
    ]);
    for (const [limits, why] of [
      [{ bytes: 10_000, entries: 100 }, /more than 10000 bytes/],
      [{ bytes: 1e9, entries: 3 }, /more than 3 entries/],
    ] as const) {
      const root = await mkdtemp(join(dir, "root-"));
      const err = await applyLayer(root, createReadStream(layer), "big", undefined, limits).then(
        () => null,
        (e: PyroError) => e,
      );
      expect(err?.code).toBe("build_failed");
      expect(err?.message).toMatch(why);
    }
    const ok = await mkdtemp(join(dir, "root-"));
    expect((await applyLayer(ok, createReadStream(layer), "big")).files).toBe(5);
  });

  it("tallies what a layer adds as a walk of the root would, and counts what it replaces", async () => {
    const first = join(dir, "tally-1.tar");
    const second = join(dir, "tally-2.tar");
    // Directories (one only implied by a file under it), files, an empty file, symlinks,
    // hard links (counted with their size each time, as the walk does), a FIFO (skipped)
    // and a repeated directory entry.
    execFileSync("python3", [
      "-c",
      `import tarfile, sys, io
def add(t, name, kind, data=b"", target=""):
    i = tarfile.TarInfo(name); i.type = kind; i.mode = 0o755
    if kind == tarfile.REGTYPE: i.size = len(data); t.addfile(i, io.BytesIO(data))
    else:
        i.linkname = target; t.addfile(i)
t = tarfile.open(sys.argv[1], "w")
add(t, "etc", tarfile.DIRTYPE)
add(t, "etc/passwd", tarfile.REGTYPE, b"root:x:0:0:")
add(t, "usr/lib/deep/file.so", tarfile.REGTYPE, b"y" * 70000)
add(t, "empty", tarfile.REGTYPE)
add(t, "lib", tarfile.SYMTYPE, target="usr/lib")
add(t, "lib/via-link", tarfile.REGTYPE, b"z" * 10)
add(t, "hard", tarfile.LNKTYPE, target="usr/lib/deep/file.so")
add(t, "fifo", tarfile.FIFOTYPE)
add(t, "etc", tarfile.DIRTYPE)
t.close()
t = tarfile.open(sys.argv[2], "w")
add(t, "etc/.wh.passwd", tarfile.REGTYPE)
add(t, "empty", tarfile.REGTYPE, b"now full")
t.close()`,
      first,
      second,
    ]);
    const root = await mkdtemp(join(dir, "tally-"));
    const one = await applyLayer(root, createReadStream(first), "one");
    expect(one.removed).toBe(0);
    expect(one.skipped).toBe(1);
    expect(one.added).toEqual(treeSizeSync(root));
    expect(one.added).toEqual({ bytes: 10 + 70000 * 2 + 11, files: 6, dirs: 4 });
    const two = await applyLayer(root, createReadStream(second), "two");
    // The whiteout and the replaced file: the tally is no longer the root's size.
    expect(two.removed).toBe(2);
  });

  it("resolves a parent again once a missing component it climbed back over became a symlink", async () => {
    // `a -> zqx/../zqb` resolves to zqb while zqx is missing; once zqx is a symlink to
    // zqc/zqa, a is zqc/zqb. Entries under a must follow (as with no cache at all).
    const layer = join(dir, "stale.tar");
    execFileSync("python3", [
      "-c",
      `import tarfile, sys, io
t = tarfile.open(sys.argv[1], "w")
def add(name, kind, target=""):
    i = tarfile.TarInfo(name); i.type = kind; i.mode = 0o755
    if kind == tarfile.REGTYPE: i.size = 1; t.addfile(i, io.BytesIO(b"x"))
    else:
        i.linkname = target; t.addfile(i)
add("a", tarfile.SYMTYPE, "zqx/../zqb")
add("a/f", tarfile.REGTYPE)
add("zqx", tarfile.SYMTYPE, "zqc/zqa")
add("zqc", tarfile.DIRTYPE)
add("zqc/zqa", tarfile.DIRTYPE)
add("a/g", tarfile.REGTYPE)
add("a/sub/h", tarfile.REGTYPE)
t.close()`,
      layer,
    ]);
    const root = await mkdtemp(join(dir, "stale-"));
    await applyLayer(root, createReadStream(layer), "stale");
    expect((await lstat(join(root, "zqb", "f"))).isFile()).toBe(true);
    expect((await lstat(join(root, "zqc", "zqb", "g"))).isFile()).toBe(true);
    expect((await lstat(join(root, "zqc", "zqb", "sub", "h"))).isFile()).toBe(true);
  });
});
