import { execFileSync } from "node:child_process";
import { createReadStream } from "node:fs";
import { lstat, mkdir, mkdtemp, rm, stat, utimes } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { applyLayer } from "../../../src/env/oci/apply.js";
import type { PyroError } from "../../../src/errors.js";
import { treeSizeSync } from "../../../src/util/fs.js";

/** One entry of `tarOf`: a directory, a file (its text, repeated), a symlink, a hard link or a FIFO. */
type Entry = ["d", string] | ["f", string, string?, number?] | ["s" | "h", string, string] | ["p", string];

const TAR_SCRIPT = `import tarfile, sys, io, json
t = tarfile.open(sys.argv[1], "w")
for e in json.loads(sys.argv[2]):
    i = tarfile.TarInfo(e[1]); i.mode = 0o755; i.mtime = 1000000000
    if e[0] == "f":
        data = (e[2] if len(e) > 2 else "").encode() * (e[3] if len(e) > 3 else 1)
        i.size = len(data); t.addfile(i, io.BytesIO(data)); continue
    i.type = {"d": tarfile.DIRTYPE, "s": tarfile.SYMTYPE, "h": tarfile.LNKTYPE, "p": tarfile.FIFOTYPE}[e[0]]
    if len(e) > 2: i.linkname = e[2]
    t.addfile(i)
t.close()`;

/** Writes a tar of `entries`, in order (mode 0755, dated 2001), with python3's tarfile; returns its path. */
function tarOf(path: string, entries: Entry[]): string {
  execFileSync("python3", ["-c", TAR_SCRIPT, path, JSON.stringify(entries)]);
  return path;
}

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
    // Directories a, b and b/x dated 2001, then a -> the victim and b -> the victim's parent.
    const layer = tarOf(join(dir, "layer.tar"), [
      ["d", "a"],
      ["d", "b"],
      ["d", "b/x"],
      ["s", "a", victim],
      ["s", "b", victim],
    ]);
    const root = join(dir, "root");
    await mkdir(root);
    await applyLayer(root, createReadStream(layer), "test");
    expect((await lstat(join(root, "a"))).isSymbolicLink()).toBe(true);
    expect((await stat(victim)).mtime.toISOString()).toBe(fixed.toISOString());
    expect((await stat(join(victim, "x"))).mtime.toISOString()).toBe(fixed.toISOString());
  });

  it("refuses a layer past its bounds (bytes or entries) with build_failed", async () => {
    const layer = tarOf(
      join(dir, "big.tar"),
      [0, 1, 2, 3, 4].map((n): Entry => ["f", `f${n}`, "x", 4096]),
    );
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
    // Directories (one only implied by a file under it, one made where a symlink points
    // because a file is written through it), files, an empty file, symlinks, hard links
    // (counted with their size each time, as the walk does), a FIFO (skipped) and a
    // repeated directory entry.
    const first = tarOf(join(dir, "tally-1.tar"), [
      ["d", "etc"],
      ["f", "etc/passwd", "root:x:0:0:"],
      ["f", "usr/lib/deep/file.so", "y", 70000],
      ["f", "empty"],
      ["s", "lib", "usr/lib"],
      ["f", "lib/via-link", "z", 10],
      ["h", "hard", "usr/lib/deep/file.so"],
      ["p", "fifo"],
      ["d", "etc"],
      ["s", "lnk", "newdir"],
      ["f", "lnk/f", "q"],
    ]);
    const second = tarOf(join(dir, "tally-2.tar"), [
      ["f", "etc/.wh.passwd"],
      ["f", "empty", "now full"],
    ]);
    const root = await mkdtemp(join(dir, "tally-"));
    const one = await applyLayer(root, createReadStream(first), "one");
    expect(one.removed).toBe(0);
    expect(one.skipped).toBe(1);
    expect(one.added).toEqual(treeSizeSync(root));
    expect(one.added).toEqual({ bytes: 10 + 70000 * 2 + 11 + 1, files: 8, dirs: 5 });
    const two = await applyLayer(root, createReadStream(second), "two");
    // The whiteout and the replaced file: the tally is no longer the root's size.
    expect(two.removed).toBe(2);
  });

  it("resolves a parent again once a missing component it climbed back over became a symlink", async () => {
    // `a -> zqx/../zqb` resolves to zqb while zqx is missing; once zqx is a symlink to
    // zqc/zqa, a is zqc/zqb. Entries under a must follow (as with no cache at all).
    const layer = tarOf(join(dir, "stale.tar"), [
      ["s", "a", "zqx/../zqb"],
      ["f", "a/f", "x"],
      ["s", "zqx", "zqc/zqa"],
      ["d", "zqc"],
      ["d", "zqc/zqa"],
      ["f", "a/g", "x"],
      ["f", "a/sub/h", "x"],
    ]);
    const root = await mkdtemp(join(dir, "stale-"));
    await applyLayer(root, createReadStream(layer), "stale");
    expect((await lstat(join(root, "zqb", "f"))).isFile()).toBe(true);
    expect((await lstat(join(root, "zqc", "zqb", "g"))).isFile()).toBe(true);
    expect((await lstat(join(root, "zqc", "zqb", "sub", "h"))).isFile()).toBe(true);
  });
});
