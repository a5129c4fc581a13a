import { existsSync } from "node:fs";
import { readdir, readFile } from "node:fs/promises";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { isRoot, pyro } from "../helpers/cli.js";
import { ENV_CACHE } from "../helpers/sandbox.js";

/**
 * Builds debian:12-base for real with debootstrap into the shared environment cache
 * (PYRO_ENV_CACHE, else the default cache setup uses; CI keeps it outside the clone so
 * reruns are fast).
 */
const cacheDir = ENV_CACHE;
const hasDebootstrap = existsSync("/usr/sbin/debootstrap");
const reason = !isRoot ? "needs root" : !hasDebootstrap ? "debootstrap not installed" : "";

describe.skipIf(reason !== "")(`real debootstrap build${reason ? ` (skipped: ${reason})` : ""}`, () => {
  it("builds debian:12-base, caches it, and a second pull returns in under a second", {
    timeout: 20 * 60_000,
  }, async () => {
    const env = { PYRO_ENV_CACHE: cacheDir };
    const first = pyro(["env", "pull", "debian:12-base", "--json"], env, 20 * 60_000);
    expect(first.stderr).toBe("");
    expect(first.code).toBe(0);
    const r = first.json();
    expect(r).toMatchObject({ name: "debian:12-base", rootfs: expect.stringContaining(cacheDir!) });
    expect((await readFile(join(r.rootfs, "etc/debian_version"), "utf8")).trim()).toMatch(/^12\./);
    expect(existsSync(join(r.rootfs, "usr/bin/python3"))).toBe(false); // minbase only
    expect(
      (await readdir(join(r.rootfs, "var/cache/apt/archives"))).filter((f) => f.endsWith(".deb")),
    ).toEqual([]);

    const started = Date.now();
    const second = pyro(["env", "pull", "debian:12-base", "--json"], env);
    expect(second.code).toBe(0);
    expect(second.json()).toMatchObject({ built: false, path: r.path });
    expect(second.json().duration_ms).toBeLessThan(1000);
    expect(Date.now() - started).toBeLessThan(3000); // whole CLI process, node start included

    const doctor = pyro(["doctor", "--environment", "debian:12-base", "--json"], env);
    expect(doctor.json().environment.readiness).toBe("warm");
  });
});
