import { existsSync } from "node:fs";
import { mkdir, mkdtemp, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { ensureTmpfs, mountsUnder, removeTree } from "../../../src/util/mounts.js";

const isRoot = process.getuid?.() === 0;

/**
 * Host mounts below a path that is reached through a symlink (a PYRO_HOME under
 * /home -> /var/home): mountinfo names the canonical path, so a lookup by the given path
 * found nothing, a second mount was stacked, and a removal descended into the mount.
 */
describe.skipIf(!isRoot)(
  `mounts below a symlinked path${isRoot ? "" : " (skipped: mounting needs root)"}`,
  () => {
    it("finds, reuses and detaches a mount reached through a symlink", async () => {
      const base = await mkdtemp(join(tmpdir(), "pyro-mounts-"));
      try {
        await mkdir(join(base, "real", "ws", "fs"), { recursive: true });
        await symlink(join(base, "real"), join(base, "home"));
        const viaLink = join(base, "home", "ws", "fs");
        await ensureTmpfs(viaLink, "size=1m,mode=0700");
        await ensureTmpfs(viaLink, "size=1m,mode=0700");
        expect(await mountsUnder(join(base, "home"))).toEqual([join(base, "real", "ws", "fs")]);
        await writeFile(join(viaLink, "inside"), "x");
        await removeTree(join(base, "home", "ws"));
        expect(existsSync(join(base, "real", "ws"))).toBe(false);
        expect(await mountsUnder(join(base, "real"))).toEqual([]);
      } finally {
        for (const p of await mountsUnder(base)) await removeTree(p).catch(() => {});
        await rm(base, { recursive: true, force: true });
      }
    });
  },
);
