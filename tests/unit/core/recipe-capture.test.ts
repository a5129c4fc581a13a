/**
 * captureRoot reads a build workspace's disk image, which the build's sandbox wrote (F7):
 * the image is mounted without journal replay, setuid, devices, execution or symlink
 * following, so a planted `root/upper -> /etc` cannot make the host's /etc the
 * environment. Real mounts: needs root, unshare, mount and mkfs.ext4.
 */
import { execFileSync } from "node:child_process";
import { chmod, mkdir, mkdtemp, readdir, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { captureRoot } from "../../../src/core/recipes.js";

function skipReason(): string {
  if (process.getuid?.() !== 0) return "needs root (loop and overlay mounts)";
  for (const t of ["unshare", "mount", "mkfs.ext4"]) {
    try {
      execFileSync("sh", ["-c", `command -v ${t}`], { stdio: "ignore" });
    } catch {
      return `needs ${t}`;
    }
  }
  return "";
}
const skip = skipReason();

let dir: string;
let savedPath: string | undefined;
const mountLog = () => join(dir, "mount.log");

/** A stopped sandbox directory whose disk.img holds `tree` (made by mkfs.ext4 -d). */
async function sandbox(name: string, fill: (root: string) => Promise<void>): Promise<string> {
  const sb = join(dir, name);
  const src = join(dir, `${name}-src`);
  await mkdir(sb, { recursive: true });
  await mkdir(src, { recursive: true });
  await fill(src);
  execFileSync("truncate", ["-s", "32M", join(sb, "disk.img")]);
  execFileSync("mkfs.ext4", ["-q", "-d", src, join(sb, "disk.img")]);
  return sb;
}

describe.skipIf(skip !== "")(
  `captureRoot on a sandbox-written disk image${skip ? ` (skipped: ${skip})` : ""}`,
  () => {
    let base: string;
    beforeAll(async () => {
      dir = await mkdtemp(join(tmpdir(), "pyro-capture-"));
      base = join(dir, "base");
      await mkdir(join(base, "etc"), { recursive: true });
      await writeFile(join(base, "etc", "base"), "base\n");
      // A `mount` that records its arguments, then runs the real one.
      const bin = join(dir, "bin");
      await mkdir(bin);
      const real = execFileSync("sh", ["-c", "command -v mount"], { encoding: "utf8" }).trim();
      await writeFile(join(bin, "mount"), `#!/bin/sh\necho "$*" >> ${mountLog()}\nexec ${real} "$@"\n`);
      await chmod(join(bin, "mount"), 0o755);
      savedPath = process.env.PATH;
      process.env.PATH = `${bin}:${savedPath}`;
    });
    afterAll(async () => {
      process.env.PATH = savedPath;
      await rm(dir, { recursive: true, force: true });
    });

    it("merges the root layer over the base, mounting the image noload,nosuid,nodev", async () => {
      const sb = await sandbox("ok", async (s) => {
        await mkdir(join(s, "root", "upper", "etc"), { recursive: true });
        await writeFile(join(s, "root", "upper", "etc", "built"), "built\n");
      });
      const dest = join(dir, "ok-dest");
      await mkdir(dest);
      await captureRoot(sb, base, dest);
      expect((await readdir(join(dest, "etc"))).sort()).toEqual(["base", "built"]);
      const loop = (await readFile(mountLog(), "utf8")).split("\n").find((l) => l.includes("disk.img")) ?? "";
      for (const o of ["ro", "noload", "nosuid", "nodev", "noexec", "nosymfollow"])
        expect(loop.split(/[ ,]/)).toContain(o);
    });

    it("refuses a root layer that the sandbox replaced by a link to a host directory", async () => {
      const host = join(dir, "host-secret");
      await mkdir(host);
      await writeFile(join(host, "secret"), "host\n");
      const sb = await sandbox("planted", async (s) => {
        await mkdir(join(s, "root"));
        await symlink(host, join(s, "root", "upper"));
      });
      const dest = join(dir, "planted-dest");
      await mkdir(dest);
      await expect(captureRoot(sb, base, dest)).rejects.toMatchObject({ code: "build_failed" });
      expect(await readdir(dest)).not.toContain("secret");
    });
  },
);
