import { mkdir, mkdtemp, readdir, rename, rm, stat, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { SandboxSpec } from "../../../src/backends/backend.js";
import {
  mkfsExt4,
  padTo,
  qcow2Overlay,
  SEED_DISK_BYTES,
  seedImage,
  seedsDir,
  treeId,
} from "../../../src/backends/vm/disks.js";
import { PyroError } from "../../../src/errors.js";
import { treeSize } from "../../../src/util/fs.js";
import { run, which } from "../../../src/util/run.js";

const MiB = 1024 ** 2;
const e2fs = (await which("mkfs.ext4")) && (await which("debugfs")) && (await which("dumpe2fs"));
const noE2fs = e2fs ? "" : "e2fsprogs (mkfs.ext4, debugfs, dumpe2fs) is not installed";
const noQemuImg = (await which("qemu-img")) ? "" : "qemu-img is not installed (qemu-utils)";
const skipped = (reason: string) => (reason ? ` (skipped: ${reason})` : "");

let dir = "";
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "pyro-disks-"));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

async function debugfs(image: string, request: string): Promise<string> {
  const r = await run(["debugfs", "-R", request, image], { timeoutMs: 30_000 });
  expect(r.exitCode).toBe(0);
  return r.stdout;
}

/** `ls` of a directory inside an image: entry names (without . and ..). */
async function lsImage(image: string, path: string): Promise<string[]> {
  // `ls -p`: one "/ino/mode/uid/gid/name/size/" line per entry (names may hold spaces).
  const out = await debugfs(image, `ls -p ${path}`);
  return out
    .split("\n")
    .map((l) => l.split("/")[5] ?? "")
    .filter((n) => n && n !== "." && n !== "..")
    .sort();
}

async function superblock(image: string): Promise<{ label: string; features: string[] }> {
  const r = await run(["dumpe2fs", "-h", image], { timeoutMs: 30_000 });
  expect(r.exitCode).toBe(0);
  return {
    label: /^Filesystem volume name:\s*(.*)$/m.exec(r.stdout)?.[1]?.trim() ?? "",
    features: (/^Filesystem features:\s*(.*)$/m.exec(r.stdout)?.[1] ?? "").trim().split(/\s+/),
  };
}

async function makeTree(root: string, files: Record<string, string>): Promise<void> {
  for (const [rel, content] of Object.entries(files)) {
    await mkdir(join(root, rel, ".."), { recursive: true });
    await writeFile(join(root, rel), content);
  }
}

describe("mkfsExt4", () => {
  it.skipIf(noE2fs)(`builds a read-only image of a directory${skipped(noE2fs)}`, async () => {
    const tree = join(dir, "tree1");
    await makeTree(tree, {
      "hello.txt": "hello\n",
      "sub/deeper/data.bin": "x".repeat(100_000),
      "with space.txt": "s",
    });
    await symlink("hello.txt", join(tree, "link"));
    const out = join(dir, "tree1.ext4");
    await mkfsExt4(out, { dir: tree, label: "pyro-test", readOnly: true });

    expect(await lsImage(out, "/")).toEqual(["hello.txt", "link", "lost+found", "sub", "with space.txt"]);
    expect(await lsImage(out, "/sub/deeper")).toEqual(["data.bin"]);
    expect(await debugfs(out, "cat /hello.txt")).toBe("hello\n");
    // Sized from the tree: its bytes plus per-entry overhead (directories too), plus 64 MiB to spare.
    const t = await treeSize(tree);
    expect(t.dirs).toBe(2);
    const expectedMib = Math.ceil((t.bytes * 1.15 + (t.files + t.dirs) * 6144) / MiB) + 64;
    expect((await stat(out)).size).toBe(expectedMib * MiB);
    const sb = await superblock(out);
    expect(sb.label).toBe("pyro-test");
    expect(sb.features).not.toContain("has_journal");
    // Written atomically: no temp file left beside it.
    expect((await readdir(dir)).filter((f) => f.startsWith("tree1.ext4"))).toEqual(["tree1.ext4"]);
  });

  it.skipIf(noE2fs)(
    `counts directories as inodes: a tree of 6000 empty directories fits${skipped(noE2fs)}`,
    async () => {
      const tree = join(dir, "many-dirs");
      for (let i = 0; i < 6000; i++) await mkdir(join(tree, `d${i}`), { recursive: true });
      const out = join(dir, "many-dirs.ext4");
      await mkfsExt4(out, { dir: tree, label: "pyro-test", readOnly: true });
      expect((await lsImage(out, "/")).length).toBe(6001); // plus lost+found
    },
  );

  it.skipIf(noE2fs)(
    `builds a blank writable image of a given size, with a journal${skipped(noE2fs)}`,
    async () => {
      const out = join(dir, "blank.ext4");
      await mkfsExt4(out, { sizeMib: 40, label: "pyro-state", readOnly: false });
      expect((await stat(out)).size).toBe(40 * MiB);
      const sb = await superblock(out);
      expect(sb.label).toBe("pyro-state");
      expect(sb.features).toContain("has_journal");
      expect(await lsImage(out, "/")).toEqual(["lost+found"]);
    },
  );

  it.skipIf(noE2fs)(`fails with an internal error when the tree does not fit${skipped(noE2fs)}`, async () => {
    const tree = join(dir, "big");
    await makeTree(tree, { "big.bin": "y".repeat(3 * MiB) });
    const out = join(dir, "small.ext4");
    const err = (await mkfsExt4(out, { dir: tree, sizeMib: 1, label: "x", readOnly: true }).catch(
      (e: unknown) => e,
    )) as PyroError;
    expect(err).toBeInstanceOf(PyroError);
    expect(err.code).toBe("internal");
    expect(err.message).toContain("mkfs.ext4");
    expect((await readdir(dir)).filter((f) => f.startsWith("small.ext4"))).toEqual([]);
  });
});

describe("padTo", () => {
  it("grows a file sparsely and never shrinks it", async () => {
    const f = join(dir, "pad");
    await writeFile(f, "abc");
    await padTo(f, 64 * MiB);
    const st = await stat(f);
    expect(st.size).toBe(64 * MiB);
    expect(st.blocks * 512).toBeLessThan(MiB);
    await padTo(f, 10);
    expect((await stat(f)).size).toBe(64 * MiB);
  });
});

describe("seedImage", () => {
  const spec = (ws: string): SandboxSpec => ({
    workspace_id: "ws-1",
    dir: join(ws, "sandbox"),
    rootfs: "/nonexistent",
    snapshotsDir: join(ws, "snapshots"),
    snapshot: "baseline",
    limits: { vcpus: 1, memory_mib: 256, pids_max: 100 },
    appDir: "/nonexistent",
    runtimeCacheDir: "/nonexistent",
  });

  it.skipIf(noE2fs)(
    `builds a sparse, padded image named by the tree's identity, once${skipped(noE2fs)}`,
    async () => {
      const ws = join(dir, "ws-a");
      const s = spec(ws);
      await makeTree(join(s.snapshotsDir, "baseline"), { "README.md": "seed\n", "src/main.c": "int main;" });
      const id = treeId(await stat(join(s.snapshotsDir, "baseline")));

      const img = await seedImage(s, "baseline");
      expect(img).toBe(join(s.dir, "seeds", `baseline-${id}.ext4`));
      expect(seedsDir(s)).toBe(join(s.dir, "seeds"));
      const st = await stat(img);
      expect(st.size).toBe(SEED_DISK_BYTES);
      // Sparse: only the filesystem's metadata and the files take blocks.
      expect(st.blocks * 512).toBeLessThan(64 * MiB);
      expect(await lsImage(img, "/")).toEqual(["README.md", "lost+found", "src"]);
      expect(await debugfs(img, "cat /src/main.c")).toBe("int main;");
      expect((await superblock(img)).label).toBe("pyro-seed");
      expect((await stat(join(s.dir, "seeds"))).mode & 0o777).toBe(0o700);

      // Cached: the same file, not rebuilt.
      expect(await seedImage(s, "baseline")).toBe(img);
      expect((await stat(img)).mtimeMs).toBe(st.mtimeMs);
      expect((await stat(img)).ino).toBe(st.ino);
    },
  );

  it.skipIf(noE2fs)(
    `rebuilds for a re-created snapshot and removes the old image${skipped(noE2fs)}`,
    async () => {
      const ws = join(dir, "ws-b");
      const s = spec(ws);
      const tree = join(s.snapshotsDir, "snap");
      await makeTree(tree, { "v.txt": "one" });
      const first = await seedImage(s, "snap");
      expect(await debugfs(first, "cat /v.txt")).toBe("one");

      // Re-created under the same name: built beside and renamed in place, so the inode differs.
      const next = join(s.snapshotsDir, ".next");
      await makeTree(next, { "v.txt": "two" });
      await rm(tree, { recursive: true });
      await rename(next, tree);
      const id = treeId(await stat(tree));

      const second = await seedImage(s, "snap");
      expect(second).toBe(join(s.dir, "seeds", `snap-${id}.ext4`));
      expect(second).not.toBe(first);
      expect(await debugfs(second, "cat /v.txt")).toBe("two");
      expect(await readdir(join(s.dir, "seeds"))).toEqual([`snap-${id}.ext4`]);
    },
  );

  it("refuses a missing snapshot tree with not_found", async () => {
    const s = spec(join(dir, "ws-c"));
    const err = (await seedImage(s, "gone").catch((e: unknown) => e)) as PyroError;
    expect(err).toBeInstanceOf(PyroError);
    expect(err.code).toBe("not_found");
    expect(err.message).toContain(join(s.snapshotsDir, "gone"));
  });

  it("refuses a snapshot that is a file, not a tree", async () => {
    const s = spec(join(dir, "ws-d"));
    await mkdir(s.snapshotsDir, { recursive: true });
    await writeFile(join(s.snapshotsDir, "file"), "x");
    await expect(seedImage(s, "file")).rejects.toMatchObject({ code: "not_found" });
  });
});

describe("qcow2Overlay", () => {
  it.skipIf(noQemuImg)(`creates a qcow2 overlay over a raw backing file${skipped(noQemuImg)}`, async () => {
    const backing = join(dir, "backing.raw");
    await writeFile(backing, "");
    await padTo(backing, 8 * MiB);
    const overlay = join(dir, "state.qcow2");
    await qcow2Overlay(overlay, backing, "raw");
    const r = await run(["qemu-img", "info", "--output=json", overlay], { timeoutMs: 30_000 });
    expect(r.exitCode).toBe(0);
    const info = JSON.parse(r.stdout) as Record<string, unknown>;
    expect(info.format).toBe("qcow2");
    expect(info["backing-filename"]).toBe(backing);
    expect(info["backing-filename-format"]).toBe("raw");
    expect(info["virtual-size"]).toBe(8 * MiB);
    expect((await readdir(dir)).filter((f) => f.startsWith("state.qcow2"))).toEqual(["state.qcow2"]);
  });

  it.skipIf(noQemuImg)(
    `fails with an internal error when the backing file is missing${skipped(noQemuImg)}`,
    async () => {
      const overlay = join(dir, "orphan.qcow2");
      const err = (await qcow2Overlay(overlay, join(dir, "no-such-backing"), "raw").catch(
        (e: unknown) => e,
      )) as PyroError;
      expect(err).toBeInstanceOf(PyroError);
      expect(err.code).toBe("internal");
      expect((await readdir(dir)).filter((f) => f.startsWith("orphan.qcow2"))).toEqual([]);
    },
  );
});
