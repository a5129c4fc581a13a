import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readdir, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { LAUNCH_ENV } from "../../../src/backends/common.js";
import { claimDiskImage, ensureDiskImage, MIN_DISK_MIB } from "../../../src/backends/disk-image.js";

const mkfs = ["/sbin/mkfs.ext4", "/usr/sbin/mkfs.ext4"].some((p) => existsSync(p));

/** The block count and size dumpe2fs reads from an image's superblock. */
function superblock(image: string): { blockCount: number; blockSize: number } {
  const out = execFileSync("dumpe2fs", ["-h", image], {
    env: { ...LAUNCH_ENV },
    stdio: ["ignore", "pipe", "ignore"],
  }).toString();
  const field = (name: string) => out.match(new RegExp(`^${name}:\\s+(.+)$`, "m"))?.[1]?.trim() ?? "";
  return {
    blockCount: Number(field("Block count")),
    blockSize: Number(field("Block size")),
    uuid: field("Filesystem UUID"),
  };
}

describe.skipIf(!mkfs)("disk images (needs mkfs.ext4 from e2fsprogs)", () => {
  const dirs: string[] = [];
  afterAll(async () => {
    for (const d of dirs) await rm(d, { recursive: true, force: true });
  });
  const temp = async () => {
    const d = await mkdtemp(join(tmpdir(), "pyro-disk-"));
    dirs.push(d);
    return d;
  };

  it("takes a spare copied ahead by rename, copies the next one, and removes a dead process's partial copy", async () => {
    const dir = await temp();
    const templates = join(dir, "templates");
    const spares = join(templates, "spare");
    // No spare yet: the image is copied from the template, and a spare is copied after.
    const first = await claimDiskImage(join(dir, "a.img"), 128, templates);
    expect(first.spare).toBe(false);
    await first.refill;
    const [spare] = await readdir(spares);
    expect(spare).toMatch(/^ext4-128m\.\d+\.[0-9a-f]+\.img$/);
    const spareIno = (await stat(join(spares, spare!))).ino;
    // A partial copy of a process that is gone (pid 2^22 + 1 is above pid_max's ceiling).
    await mkdir(spares, { recursive: true });
    await writeFile(join(spares, "ext4-128m.4194305.abcd.img.partial"), "");
    const second = await claimDiskImage(join(dir, "b.img"), 128, templates);
    expect(second.spare).toBe(true);
    expect((await stat(join(dir, "b.img"))).ino).toBe(spareIno);
    await second.refill;
    const now = await readdir(spares);
    expect(now).toHaveLength(1);
    expect(now[0]).toMatch(/^ext4-128m\.\d+\.[0-9a-f]+\.img$/);
    expect(now[0]).not.toBe(spare);
    expect(superblock(join(dir, "b.img")).blockCount * superblock(join(dir, "b.img")).blockSize).toBe(
      128 * 1024 * 1024,
    );
  });

  it("leaves the next spare's copy to the caller when asked (a CLI one-shot's cleaner), naming what to copy", async () => {
    const dir = await temp();
    const templates = join(dir, "templates");
    const first = await claimDiskImage(join(dir, "a.img"), 128, templates, { deferRefill: true });
    await first.refill;
    // Nothing copied ahead here; what a cleaner needs to copy the next one instead.
    expect(existsSync(join(templates, "spare"))).toBe(false);
    expect(first.deferred).toEqual({
      template: join(templates, "ext4-128m.img"),
      dir: join(templates, "spare"),
      prefix: "ext4-128m.",
    });
    // With a spare left after the claim, there is nothing to copy.
    await mkdir(join(templates, "spare"));
    for (const n of ["ext4-128m.1.a.img", "ext4-128m.1.b.img"])
      execFileSync("cp", ["--sparse=always", join(templates, "ext4-128m.img"), join(templates, "spare", n)]);
    const second = await claimDiskImage(join(dir, "b.img"), 128, templates, { deferRefill: true });
    expect(second.spare).toBe(true);
    expect(second.deferred).toBeUndefined();
    expect(await readdir(join(templates, "spare"))).toHaveLength(1);
  });

  it("copies a blank image of the size from the template directory, made once per size, sparse", async () => {
    const dir = await temp();
    const templates = join(dir, "templates");
    await ensureDiskImage(join(dir, "a.img"), 1024, templates);
    const template = join(templates, "ext4-1024m.img");
    const first = await stat(template);
    await ensureDiskImage(join(dir, "b.img"), 1024, templates);
    await ensureDiskImage(join(dir, "c.img"), 128, templates);
    // The 1 GiB template was not made again; a second size has its own.
    expect((await stat(template)).ino).toBe(first.ino);
    expect((await readdir(templates)).sort()).toEqual(["ext4-1024m.img", "ext4-128m.img"]);
    for (const [name, mib] of [
      ["a.img", 1024],
      ["b.img", 1024],
      ["c.img", 128],
    ] as const) {
      const image = join(dir, name);
      const sb = superblock(image);
      expect(sb.blockCount * sb.blockSize, name).toBe(mib * 1024 * 1024);
      const st = await stat(image);
      expect(st.size).toBe(mib * 1024 * 1024);
      // Sparse: only ext4's metadata is allocated (a full copy would be the whole size).
      expect(st.blocks * 512, name).toBeLessThan(32 * 1024 * 1024);
      expect(st.mode & 0o777).toBe(0o600);
    }
    // No partial file is left behind.
    expect((await readdir(dir)).sort()).toEqual(["a.img", "b.img", "c.img", "templates"]);
  });

  it("keeps an existing image and refuses a size below the minimum, changing nothing", async () => {
    const dir = await temp();
    const image = join(dir, "a.img");
    await ensureDiskImage(image, MIN_DISK_MIB, join(dir, "t"));
    const before = await stat(image);
    await ensureDiskImage(image, 1024, join(dir, "t"));
    expect((await stat(image)).ino).toBe(before.ino);
    await expect(
      ensureDiskImage(join(dir, "small.img"), MIN_DISK_MIB - 1, join(dir, "t")),
    ).rejects.toMatchObject({
      code: "invalid_argument",
    });
    expect(existsSync(join(dir, "small.img"))).toBe(false);
  });
});
