import { existsSync, readFileSync } from "node:fs";
import { mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PyroError } from "../../../src/errors.js";
import { defaultSeed, NO_SEED, prefetch } from "../../../src/mcp/seed.js";
import { git as gitIn, makeGitRepo } from "../../helpers/git.js";

const git = (cwd: string, ...args: string[]) => gitIn(cwd, ...args).trim();

let root: string;
let checkout: string;
let bare: string;
let firstCommit: string;
let secondCommit: string;

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "pyro-mcp-seed-"));
  checkout = join(root, "checkout");
  firstCommit = (await makeGitRepo(checkout, { "src/app.py": "print(1)\n" }, "one")).commit;
  await writeFile(join(checkout, "src", "app.py"), "print(2)\n");
  git(checkout, "commit", "--quiet", "-am", "two");
  secondCommit = git(checkout, "rev-parse", "HEAD");
  git(checkout, "branch", "old", firstCommit);
  bare = join(root, "repo.git");
  git(root, "clone", "--quiet", "--bare", checkout, bare);
});
afterAll(async () => {
  await rm(root, { recursive: true, force: true });
});

async function codeOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (err) {
    expect(err).toBeInstanceOf(PyroError);
    return (err as PyroError).code;
  }
  throw new Error("expected a failure");
}

describe("the default seed of an MCP server", () => {
  it("is the Git checkout the server was started in (from any of its subdirectories)", async () => {
    const seed = await defaultSeed({ cwd: join(checkout, "src") });
    expect(await seed.resolve()).toEqual({ origin: "cwd", path: checkout });
    expect(seed.describe()).toContain(checkout);
  });

  it("is none outside a Git checkout: an arbitrary directory is never copied", async () => {
    const plain = await mkdtemp(join(tmpdir(), "pyro-mcp-plain-"));
    try {
      const seed = await defaultSeed({ cwd: plain });
      expect(seed).toBe(NO_SEED);
      expect(await seed.resolve()).toBeNull();
    } finally {
      await rm(plain, { recursive: true, force: true });
    }
  });

  it("is --project-path when given (the top of its checkout, or the plain directory), relative to cwd", async () => {
    expect(await (await defaultSeed({ cwd: root, projectPath: "checkout/src" })).resolve()).toEqual({
      origin: "project_path",
      path: checkout,
    });
    const plain = join(root, "plain");
    await mkdir(plain, { recursive: true });
    expect(await (await defaultSeed({ cwd: "/", projectPath: plain })).resolve()).toEqual({
      origin: "project_path",
      path: plain,
    });
    expect(await codeOf(defaultSeed({ cwd: root, projectPath: "missing" }))).toBe("invalid_argument");
  });

  it("refuses contradictory flags", async () => {
    expect(await codeOf(defaultSeed({ cwd: root, repoRef: "main" }))).toBe("invalid_argument");
    expect(await codeOf(defaultSeed({ cwd: root, repoUrl: bare, projectPath: checkout }))).toBe(
      "invalid_argument",
    );
  });

  it("clones --repo-url once per server, reuses the clone and removes it on close", async () => {
    const seed = await defaultSeed({ cwd: "/", repoUrl: bare });
    const [a, b] = await Promise.all([seed.resolve(), seed.resolve()]);
    expect(a).toMatchObject({ origin: "repo_url", repo_url: bare, commit: secondCommit });
    expect(b).toEqual(a);
    expect(readFileSync(join(a!.path, "src", "app.py"), "utf8")).toBe("print(2)\n");
    expect(seed.describe()).toContain(bare);
    await seed.close();
    expect(existsSync(a!.path)).toBe(false);
  });

  it("keeps a --repo-url clone under reposDir once a workspace used it (its branches go there), and drops an unused one", async () => {
    const reposDir = join(root, "repos");
    const unused = await defaultSeed({ cwd: "/", repoUrl: bare, reposDir });
    prefetch(unused);
    await unused.close();
    const used = await defaultSeed({ cwd: "/", repoUrl: bare, reposDir });
    const info = await used.resolve();
    expect(info!.path.startsWith(`${reposDir}/server-`)).toBe(true);
    await used.close();
    expect(readFileSync(join(info!.path, "src", "app.py"), "utf8")).toBe("print(2)\n");
    // Only the used clone is left.
    expect((await readdir(reposDir)).length).toBe(1);
  });

  it("checks out --repo-ref, a branch or a commit", async () => {
    for (const ref of ["old", firstCommit]) {
      const seed = await defaultSeed({ cwd: "/", repoUrl: bare, repoRef: ref });
      try {
        const info = await seed.resolve();
        expect(info).toMatchObject({ origin: "repo_url", repo_ref: ref, commit: firstCommit });
        expect(readFileSync(join(info!.path, "src", "app.py"), "utf8")).toBe("print(1)\n");
      } finally {
        await seed.close();
      }
    }
  });

  it("reports a clone failure as invalid_argument at use, and tries again next time", async () => {
    const seed = await defaultSeed({ cwd: "/", repoUrl: join(root, "nope.git") });
    try {
      expect(await codeOf(seed.resolve())).toBe("invalid_argument");
      expect(await codeOf(seed.resolve())).toBe("invalid_argument");
    } finally {
      await seed.close();
    }
  });

  it("lets a cancelled create stop waiting for the shared clone", async () => {
    const seed = await defaultSeed({ cwd: "/", repoUrl: bare });
    try {
      const abort = new AbortController();
      abort.abort();
      expect(await codeOf(seed.resolve(abort.signal))).toBe("cancelled");
      expect(await seed.resolve()).toMatchObject({ origin: "repo_url" });
    } finally {
      await seed.close();
    }
  });
});
