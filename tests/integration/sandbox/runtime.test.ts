import { existsSync } from "node:fs";
import { lstat, mkdir, mkdtemp, readdir, rm, symlink } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type NodeRuntime, prepareNodeRuntime, RUNTIME_MOUNT } from "../../../src/backends/runtime.js";
import { run } from "../../../src/util/run.js";

const bwrap = ["/usr/bin/bwrap", "/bin/bwrap"].find((p) => existsSync(p));
const isRoot = process.getuid?.() === 0;
const skipReal = !bwrap || !isRoot;
const why = !bwrap ? "skipped: bwrap is not installed" : !isRoot ? "skipped: needs root" : "";

describe("node runtime for sandboxes", () => {
  let scratch = "";
  let cache = "";
  let rt: NodeRuntime;
  let firstMs = 0;

  beforeAll(async () => {
    scratch = await mkdtemp(join(tmpdir(), "pyro-runtime-"));
    cache = join(scratch, "cache");
    const t0 = performance.now();
    rt = await prepareNodeRuntime(cache);
    firstMs = performance.now() - t0;
  });
  afterAll(async () => {
    if (scratch) await rm(scratch, { recursive: true, force: true });
  });

  it("copies node, each library under its soname and the loader, as real files", async () => {
    expect(rt.dir).toBe(join(cache, `node-${rt.key}`));
    expect(rt.version).toBe(process.version);
    expect((await lstat(rt.nodeBin)).isFile()).toBe(true);
    const libs = await readdir(rt.libDir);
    expect(libs).toContain("ld-linux-x86-64.so.2");
    expect(libs).toContain("libc.so.6");
    for (const name of libs) expect((await lstat(join(rt.libDir, name))).isFile(), name).toBe(true);
    expect(rt.loader).toBe(join(rt.libDir, "ld-linux-x86-64.so.2"));
    console.error(
      `node runtime: ${libs.length} files in lib/, ${(rt.bytes / 1048576).toFixed(1)} MiB, built in ${firstMs.toFixed(0)} ms`,
    );
  });

  it("is built once and then reused from the cache", async () => {
    const t0 = performance.now();
    const again = await prepareNodeRuntime(cache);
    const ms = performance.now() - t0;
    expect(again.key).toBe(rt.key);
    expect(again.dir).toBe(rt.dir);
    expect(ms).toBeLessThan(Math.max(200, firstMs / 5));
    // A symlink to the same binary resolves to the same runtime.
    const link = join(scratch, "node-link");
    await symlink(process.execPath, link);
    expect((await prepareNodeRuntime(cache, { nodePath: link })).key).toBe(rt.key);
    expect((await readdir(cache)).filter((n) => n.startsWith("."))).toEqual([]);
  });

  it("builds at most one visible copy when two callers race", async () => {
    const racing = join(scratch, "race");
    const [a, b] = await Promise.all([prepareNodeRuntime(racing), prepareNodeRuntime(racing)]);
    expect(a.dir).toBe(b.dir);
    expect(await readdir(racing)).toEqual([`node-${a.key}`]); // the loser's temp dir is gone
  });

  it("builds the in-sandbox command through the copied loader", () => {
    expect(rt.argv(RUNTIME_MOUNT, "/run/pyro/app/agent.js", "--listen", "/s")).toEqual([
      "/run/pyro/runtime/lib/ld-linux-x86-64.so.2",
      "--library-path",
      "/run/pyro/runtime/lib",
      "/run/pyro/runtime/bin/node",
      "/run/pyro/app/agent.js",
      "--listen",
      "/s",
    ]);
  });

  it.skipIf(skipReal)(`runs node inside bwrap on a root filesystem with no libc at all ${why}`, async () => {
    const root = join(scratch, "emptyroot");
    for (const d of ["proc", "dev", "tmp", RUNTIME_MOUNT.slice(1)])
      await mkdir(join(root, d), { recursive: true });
    const r = await run(
      [
        bwrap!,
        "--unshare-all",
        "--die-with-parent",
        "--cap-drop",
        "ALL",
        "--ro-bind",
        root,
        "/",
        "--ro-bind",
        rt.dir,
        RUNTIME_MOUNT,
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--clearenv",
        "--",
        ...rt.argv(
          RUNTIME_MOUNT,
          "-e",
          'const fs = require("fs"); console.log(process.version, fs.readdirSync("/").sort().join(","), fs.existsSync("/lib"))',
        ),
      ],
      { timeoutMs: 30_000 },
    );
    expect(r.stderr).toBe("");
    expect(r.stdout.trim()).toBe(`${process.version} dev,proc,run,tmp false`);
    expect(r.exitCode).toBe(0);
  });
});
