/**
 * Recipe builds on a real backend (bwrap, network egress during the build): the CLI's
 * `pyro env build` twice (the second a cache hit), a failing --run step (its output in
 * the error, nothing cached), an apt package from the configured Debian archive through
 * the egress proxy, and `.pyro/environment.toml` picked up by an MCP workspace_create
 * that names no environment. Every recipe carries a nonce so the shared cache never
 * serves a first build; what the tests built is removed after.
 */
import { randomBytes } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { readdir, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { cli } from "../helpers/cli.js";
import {
  bwrapSkipReason,
  ENV_CACHE,
  type Harness,
  openHarness,
  suiteTitle,
  writeTree,
} from "../helpers/sandbox.js";
import { launchStdio } from "./mcp/helpers.js";

const skip = bwrapSkipReason();
const nonce = randomBytes(4).toString("hex");

describe.skipIf(skip !== "")(suiteTitle("environment recipes, built on bwrap", skip), () => {
  let h: Harness;
  let src: string;

  beforeAll(async () => {
    h = await openHarness("recipes");
    src = await h.tempDir("recipe-src");
    await writeTree(src, { "conf/app.ini": "[app]\nname=demo\n", "tool.sh": "#!/bin/sh\necho tool\n" });
  });
  afterAll(async () => {
    await h?.cleanup();
    for (const d of await readdir(ENV_CACHE).catch(() => [] as string[]))
      if (d.includes(nonce) || /^(t-recipe|t-fail|t-apt|repo-pyro-it-)/.test(d)) {
        const m = join(ENV_CACHE, d, "manifest.json");
        if (!existsSync(m) || readFileSync(m, "utf8").includes(nonce))
          await rm(join(ENV_CACHE, d), { recursive: true, force: true });
      }
  });

  it("builds a recipe (copies and run steps) once; the second build is a cache hit; a workspace runs on it", async () => {
    const args = [
      "env",
      "build",
      "t-recipe",
      "--from",
      "debian:12",
      "--copy",
      `${join(src, "conf")}:/etc/demo`,
      "--copy",
      `${join(src, "tool.sh")}:/usr/local/bin/tool`,
      "--run",
      `echo ${nonce} > /etc/recipe-nonce`,
      "--run",
      "rm /etc/debian_version && chmod +x /usr/local/bin/tool",
      "--json",
    ];
    const first = await cli(args, h.cliEnv);
    expect(first.code, first.stderr).toBe(0);
    const a = first.json();
    expect(a).toMatchObject({ name: "t-recipe", cache_hit: false, built: true });
    expect(readFileSync(join(a.rootfs, "etc/recipe-nonce"), "utf8").trim()).toBe(nonce);
    expect(readFileSync(join(a.rootfs, "etc/demo/app.ini"), "utf8")).toContain("name=demo");
    expect(existsSync(join(a.rootfs, "etc/debian_version"))).toBe(false);
    expect(existsSync(join(a.rootfs, "run/pyro"))).toBe(false);
    const second = (await cli(args, h.cliEnv)).json();
    expect(second).toMatchObject({ cache_hit: true, recipe_key: a.recipe_key, path: a.path });
    expect(second.duration_ms).toBeLessThan(2000);
    // Listed as built, with its size; a workspace starts on it by name.
    const list = (await cli(["env", "list", "--json"], h.cliEnv)).json();
    expect(list.environments.find((e: { name: string }) => e.name === "t-recipe")).toMatchObject({
      kind: "built",
      status: "cached",
      size_bytes: expect.any(Number),
    });
    const ws = await h.create({ environment: "t-recipe" });
    const r = await h.pyro.execWorkspace(ws.workspace_id, "tool && cat /etc/recipe-nonce");
    expect(r.stdout).toBe(`tool\n${nonce}\n`);
    // No build workspace is left behind.
    expect((await h.pyro.listWorkspaces()).workspaces.map((w) => w.workspace_id)).toEqual([ws.workspace_id]);
  }, 180_000);

  it("a failing --run step fails the build with that step's output, and caches nothing", async () => {
    const r = await cli(
      [
        "env",
        "build",
        `t-fail`,
        "--from",
        "debian:12",
        "--run",
        `echo ${nonce}-ok`,
        "--run",
        `echo ${nonce}-boom >&2; exit 3`,
        "--json",
      ],
      h.cliEnv,
    );
    expect(r.code).not.toBe(0);
    const err = JSON.parse(r.stdout).error;
    expect(err.code).toBe("build_failed");
    expect(err.message).toContain("step 2/2");
    expect(err.message).toContain("exit 3");
    expect(err.message).toContain(`${nonce}-boom`);
    expect(
      (await readdir(ENV_CACHE)).filter((d) => d.startsWith("t-fail@") || d.includes(".building-")),
    ).toEqual([]);
  }, 180_000);

  it("installs an apt package through the egress proxy during the build only", async () => {
    const r = await cli(
      [
        "env",
        "build",
        "t-apt",
        "--from",
        "debian:12",
        "--apt",
        "jq",
        "--run",
        `echo ${nonce} > /etc/nonce`,
        "--json",
      ],
      h.cliEnv,
    );
    expect(r.code, r.stdout + r.stderr).toBe(0);
    const built = r.json();
    expect(existsSync(join(built.rootfs, "usr/bin/jq"))).toBe(true);
    // apt's lists are not kept (small environments).
    expect(
      (await readdir(join(built.rootfs, "var/lib/apt/lists"))).filter((f) => f.endsWith("_Packages")),
    ).toEqual([]);
  }, 300_000);

  it("workspace_create without environment builds and uses the seed repository's .pyro/environment.toml", async () => {
    const repo = await h.tempDir("recipe-repo");
    await writeTree(repo, {
      ".pyro/environment.toml": `from = "debian:12"\nrun = ["echo ${nonce} > /etc/from-recipe"]\ncopy = ["files/motd:/etc/motd-recipe"]\n`,
      "files/motd": "hello from the repo\n",
      "main.py": "print('hi')\n",
    });
    const server = await launchStdio({ cwd: repo, env: h.cliEnv });
    try {
      const w = await server.ok("workspace_create", { backend: "bwrap", seed_path: repo });
      expect(w.environment).toMatch(/^repo-pyro-it-recipe-repo-/);
      const r = await server.ok("workspace_exec", {
        workspace_id: w.workspace_id,
        command: "cat /etc/from-recipe /etc/motd-recipe && ls /workspace",
      });
      expect(r.stdout).toContain(nonce);
      expect(r.stdout).toContain("hello from the repo");
      expect(r.stdout).toContain("main.py");
      // Named explicitly, the environment wins over the recipe.
      const plain = await server.ok("workspace_create", {
        backend: "bwrap",
        seed_path: repo,
        environment: "debian:12",
      });
      expect(plain.environment).toBe("debian:12");
      await server.ok("workspace_delete", { workspace_id: plain.workspace_id });
      await server.ok("workspace_delete", { workspace_id: w.workspace_id });
    } finally {
      await server.close();
    }
    // A recipe copying from outside its repository is refused.
    await writeFile(
      join(repo, ".pyro/environment.toml"),
      `from = "debian:12"\ncopy = ["../../etc/passwd:/x"]\n`,
    );
    const bad = await h.pyro.createWorkspace({ backend: "bwrap", seedPath: repo }).catch((e) => e);
    expect(bad.code).toBe("invalid_argument");
  }, 300_000);
});
