import { spawn } from "node:child_process";
import { chmod, mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { EnvironmentCache } from "../../../src/env/cache.js";
import { entryDirName, findEnvironment, recipeKey } from "../../../src/env/catalog.js";
import { REPO_ROOT } from "../../helpers/cli.js";
import { FakeBuilder } from "../../helpers/fake-builder.js";

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "pyro-cache-"));
});
afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

describe("environment cache", () => {
  it("builds once, then answers from the cache without building", async () => {
    const builder = new FakeBuilder();
    const cache = new EnvironmentCache(root, [builder]);
    const first = await cache.pull("debian:12");
    expect(first.built).toBe(true);
    expect(await readFile(join(first.rootfs, "etc/os-release"), "utf8")).toContain("debian:12");
    const second = await cache.pull("debian:12");
    expect(second.built).toBe(false);
    expect(second.path).toBe(first.path);
    expect(second.duration_ms).toBeLessThan(1000);
    expect(builder.builds).toBe(1);
    expect((await cache.info("debian:12")).status).toBe("cached");
  });

  it("names entries by recipe key so a recipe change means a rebuild", async () => {
    const cache = new EnvironmentCache(root, [new FakeBuilder()]);
    const r = await cache.pull("debian:12-base");
    const spec = findEnvironment("debian:12-base");
    expect(r.path).toBe(join(root, entryDirName(spec, recipeKey(spec))));
    const manifest = JSON.parse(await readFile(join(r.path, "manifest.json"), "utf8"));
    expect(manifest).toMatchObject({ name: "debian:12-base", recipe_key: recipeKey(spec), package_count: 1 });
  });

  it("leaves nothing half-made when a build fails, and the next pull succeeds", async () => {
    const failing = new EnvironmentCache(root, [new FakeBuilder({ failAfterFiles: true })]);
    await expect(failing.pull("debian:12")).rejects.toThrow(/halfway/);
    expect((await readdir(root)).filter((d) => !d.startsWith(".locks"))).toEqual([]);
    expect((await failing.info("debian:12")).status).toBe("missing");
    const ok = await new EnvironmentCache(root, [new FakeBuilder()]).pull("debian:12");
    expect(ok.built).toBe(true);
  });

  it("builds once when two pulls of the same environment race", async () => {
    const a = new FakeBuilder({ delayMs: 300 });
    const b = new FakeBuilder({ delayMs: 300 });
    const [ra, rb] = await Promise.all([
      new EnvironmentCache(root, [a]).pull("debian:12", { lockTimeoutMs: 10_000 }),
      new EnvironmentCache(root, [b]).pull("debian:12", { lockTimeoutMs: 10_000 }),
    ]);
    expect(a.builds + b.builds).toBe(1);
    expect(ra.path).toBe(rb.path);
    expect([ra.built, rb.built].sort()).toEqual([false, true]);
  });

  it("reports an older recipe's build as stale, and prune removes it with partial builds", async () => {
    const cache = new EnvironmentCache(root, [new FakeBuilder()]);
    const old = join(root, "debian_12@0000000000000000");
    await mkdir(join(old, "rootfs"), { recursive: true });
    await writeFile(join(old, "manifest.json"), JSON.stringify({ name: "debian:12", size_bytes: 10 }));
    const partial = join(root, ".building-abc-999999999-ff");
    await mkdir(partial, { recursive: true });
    const info = await cache.info("debian:12");
    expect(info.status).toBe("stale");
    expect(info.stale_keys).toEqual(["0000000000000000"]);
    await cache.pull("debian:12-base");
    const pruned = await cache.prune();
    expect(pruned.removed.map((r) => [r.path, r.reason]).sort()).toEqual(
      [
        [old, "stale"],
        [partial, "partial"],
      ].sort(),
    );
    expect((await cache.info("debian:12-base")).status).toBe("cached");
    const all = await cache.prune({ all: true });
    expect(all.removed.map((r) => r.reason)).toEqual(["all"]);
    expect((await cache.info("debian:12-base")).status).toBe("missing");
  });

  it("recovers after a builder process is killed halfway: clean state, next pull succeeds", async () => {
    // A child process starts a slow build and is SIGKILLed mid-way (no cleanup runs).
    const script = `
      import { EnvironmentCache } from ${JSON.stringify(join(REPO_ROOT, "dist/env/cache.js"))};
      import { mkdir, writeFile } from "node:fs/promises";
      const slow = { kind: "debootstrap", async build(spec, ctx) {
        await mkdir(ctx.rootfs + "/etc", { recursive: true });
        await writeFile(ctx.rootfs + "/etc/half", "x");
        process.stdout.write("building\\n");
        await new Promise((r) => setTimeout(r, 60000));
        return { source_detail: {} };
      } };
      await new EnvironmentCache(${JSON.stringify(root)}, [slow]).pull("debian:12");
    `;
    const child = spawn(process.execPath, ["--input-type=module", "-e", script], {
      stdio: ["ignore", "pipe", "inherit"],
    });
    await new Promise<void>((resolve, reject) => {
      child.stdout.on("data", (d: Buffer) => d.toString().includes("building") && resolve());
      child.on("exit", () => reject(new Error("child exited before building")));
    });
    expect((await readdir(root)).some((d) => d.startsWith(".building-"))).toBe(true);
    child.kill("SIGKILL");
    await new Promise((r) => child.on("close", r));

    const cache = new EnvironmentCache(root, [new FakeBuilder()]);
    expect((await cache.info("debian:12")).status).toBe("missing");
    const r = await cache.pull("debian:12", { lockTimeoutMs: 5000 });
    expect(r.built).toBe(true);
    expect((await readdir(root)).filter((d) => d.startsWith(".building-"))).toEqual([]);
    expect(await readdir(join(r.rootfs, "etc"))).toEqual(["os-release"]);
  });

  it("keeps the cache owner-only: a new root, a build directory and an existing 0755 root are 0700", async () => {
    // Image layers keep setuid-root files: other local users must not reach them.
    const builder = new FakeBuilder();
    let buildDirMode = -1;
    const spy = {
      kind: builder.kind,
      build: async (spec: Parameters<FakeBuilder["build"]>[0], ctx: Parameters<FakeBuilder["build"]>[1]) => {
        buildDirMode = (await stat(dirname(ctx.rootfs))).mode & 0o777;
        return builder.build(spec, ctx);
      },
    };
    const fresh = join(root, "new", "environments");
    await new EnvironmentCache(fresh, [spy]).pull("debian:12");
    expect((await stat(fresh)).mode & 0o777).toBe(0o700);
    expect(buildDirMode).toBe(0o700);
    const old = join(root, "old");
    await mkdir(old, { mode: 0o755 });
    await chmod(old, 0o755);
    await new EnvironmentCache(old, [new FakeBuilder()]).pull("debian:12");
    expect((await stat(old)).mode & 0o777).toBe(0o700);
  });
});
