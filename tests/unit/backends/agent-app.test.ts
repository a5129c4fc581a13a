import { mkdir, mkdtemp, readdir, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join, relative } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { agentApp } from "../../../src/backends/agent-app.js";
import { prepareSpawnHelper } from "../../../src/backends/spawn-helper.js";

/** Every file below `dir`, relative, sorted. */
async function listing(dir: string): Promise<string[]> {
  const out: string[] = [];
  const walk = async (d: string) => {
    for (const e of await readdir(d, { withFileTypes: true })) {
      if (e.isDirectory()) await walk(join(d, e.name));
      else out.push(relative(dir, join(d, e.name)));
    }
  };
  await walk(dir);
  return out.sort();
}

async function put(root: string, files: Record<string, string>) {
  for (const [f, content] of Object.entries(files)) {
    await mkdir(dirname(join(root, f)), { recursive: true });
    await writeFile(join(root, f), content);
  }
}

describe("the agent's copy of the package (what a namespace sandbox sees at /run/pyro/app)", () => {
  let base: string;
  let app: string;
  let cache: string;
  beforeEach(async () => {
    base = await mkdtemp(join(tmpdir(), "pyro-agent-app-"));
    app = join(base, "app");
    cache = join(base, "cache");
    // A checkout: the agent bundle among everything else a sandbox must not see.
    await put(app, {
      "package.json": '{"name":"pyro-mcp","type":"module"}',
      "dist/agent/bundle/main.js": "export {};",
      "dist/agent/bundle/chunk-A.js": "export const a = 1;",
      "dist/core/engine.js": "host side",
      "src/core/engine.ts": "sources",
      ".git/config": "[remote] url = https://token@example.invalid/x",
      ".env": "SECRET=1",
      "node_modules/node-pty/package.json": '{"name":"node-pty","main":"lib/index.js"}',
      "node_modules/node-pty/lib/index.js": "module.exports = {};",
      "node_modules/node-pty/build/Release/pty.node": "addon",
      "node_modules/node-pty/build/Release/obj.target/pty.o": "object",
      "node_modules/node-pty/prebuilds/darwin-x64/pty.node": "other platform",
      "node_modules/node-pty/src/unix/pty.cc": "c++",
      "node_modules/better-sqlite3/package.json": "{}",
      "node_modules/zod/package.json": "{}",
    });
  });
  afterEach(async () => {
    await rm(base, { recursive: true, force: true });
  });

  it("holds the bundle, node-pty's loader and addon, and a module package.json: nothing else", async () => {
    const dir = await agentApp({ appDir: app, runtimeCacheDir: cache });
    expect(dirname(dir)).toBe(cache);
    // The command starter, built with the host's cc where there is one (spawn-helper.ts).
    const starter = (await prepareSpawnHelper(join(cache, "helpers"))) ? ["bin/pyro-spawn"] : [];
    expect(await listing(dir)).toEqual([
      ...starter,
      "dist/agent/bundle/chunk-A.js",
      "dist/agent/bundle/main.js",
      "node_modules/node-pty/build/Release/pty.node",
      "node_modules/node-pty/lib/index.js",
      "node_modules/node-pty/package.json",
      "package.json",
    ]);
    // No stage directory is left beside it.
    expect((await readdir(cache)).filter((n) => n.startsWith("."))).toEqual([]);
    if (starter.length > 0) expect((await stat(join(dir, "bin/pyro-spawn"))).mode & 0o777).toBe(0o755);
  });

  it("is one copy per content: the same bundle reuses it, a rebuilt one gets its own", async () => {
    const first = await agentApp({ appDir: app, runtimeCacheDir: cache });
    await put(app, { "dist/agent/bundle/main.js": "export const rebuilt = true;" });
    // Another process (the per-process memo is keyed by directories: a new cache path).
    const other = join(base, "cache2");
    const rebuilt = await agentApp({ appDir: app, runtimeCacheDir: other });
    expect(rebuilt.split("/").pop()).not.toBe(first.split("/").pop());
    const again = await agentApp({ appDir: app, runtimeCacheDir: cache });
    expect(again).toBe(first);
  });

  it("refuses a package without the agent bundle", async () => {
    await rm(join(app, "dist", "agent"), { recursive: true });
    await expect(agentApp({ appDir: app, runtimeCacheDir: cache })).rejects.toThrow(
      /agent bundle is missing/,
    );
  });
});
