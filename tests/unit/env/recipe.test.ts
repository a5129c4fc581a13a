/**
 * A seed repository's `.pyro/environment.toml` is untrusted content: its `copy` sources
 * must be real files of the repository, never reached through a symbolic link (F2), and
 * copying a directory copies the links inside it as links.
 */
import { lstat, mkdir, mkdtemp, readlink, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { copySource, hashTree, readRecipeFile } from "../../../src/env/recipe.js";
import { PyroError } from "../../../src/errors.js";

let dir: string;
let host: string;

async function repo(name: string, toml: string, files: Record<string, string> = {}): Promise<string> {
  const r = join(dir, name);
  await mkdir(join(r, ".pyro"), { recursive: true });
  await writeFile(join(r, ".pyro", "environment.toml"), toml);
  for (const [p, c] of Object.entries(files)) {
    await mkdir(join(r, p, ".."), { recursive: true });
    await writeFile(join(r, p), c);
  }
  return r;
}

async function refusal(p: Promise<unknown>): Promise<PyroError> {
  const err = await p.then(
    () => null,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(PyroError);
  return err as PyroError;
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "pyro-recipe-test-"));
  host = join(dir, "host");
  await mkdir(host);
  await writeFile(join(host, "secret"), "host secret\n");
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe("a repository's recipe copies only the repository's own files", () => {
  it("reads plain copy sources inside the repository", async () => {
    const r = await repo(
      "plain",
      'from = "debian:12"\ncopy = ["conf/app.ini:/etc/app.ini", "conf:/etc/conf"]\n',
      {
        "conf/app.ini": "x=1\n",
      },
    );
    const recipe = await readRecipeFile(r, "repo-plain");
    expect(recipe?.copy).toEqual([
      { src: join(r, "conf/app.ini"), dest: "/etc/app.ini" },
      { src: join(r, "conf"), dest: "/etc/conf" },
    ]);
  });

  it("refuses a source under a symlinked directory (link -> host dir)", async () => {
    const r = await repo("parent-link", 'from = "debian:12"\ncopy = ["link/secret:/leak"]\n');
    await symlink(host, join(r, "link"));
    const err = await refusal(readRecipeFile(r, "repo-x"));
    expect(err.code).toBe("invalid_argument");
    expect(err.message).toContain("link/secret:/leak");
    expect(err.message).toContain("symbolic link 'link'");
  });

  it("refuses a source that is itself a symlink, and a link deeper in the path", async () => {
    const r = await repo("self-link", 'from = "debian:12"\ncopy = ["s:/leak"]\n');
    await symlink(join(host, "secret"), join(r, "s"));
    expect((await refusal(readRecipeFile(r, "repo-x"))).message).toContain("symbolic link 's'");
    const r2 = await repo("deep-link", 'from = "debian:12"\ncopy = ["a/b/secret:/leak"]\n', { "a/keep": "" });
    await symlink(host, join(r2, "a", "b"));
    expect((await refusal(readRecipeFile(r2, "repo-x"))).message).toContain("symbolic link 'a/b'");
  });

  it("refuses a symlinked recipe file or .pyro directory", async () => {
    const r = join(dir, "linked-pyro");
    await mkdir(r);
    await mkdir(join(host, "pyro"));
    await writeFile(join(host, "pyro", "environment.toml"), 'from = "debian:12"\nrun = ["true"]\n');
    await symlink(join(host, "pyro"), join(r, ".pyro"));
    expect((await refusal(readRecipeFile(r, "repo-x"))).code).toBe("invalid_argument");
  });

  it("refuses a source that does not exist, and one outside the repository", async () => {
    const r = await repo("missing", 'from = "debian:12"\ncopy = ["nope:/x"]\n');
    expect((await refusal(readRecipeFile(r, "repo-x"))).message).toContain("does not exist");
    const r2 = await repo("outside", 'from = "debian:12"\ncopy = ["../host/secret:/x"]\n');
    expect((await refusal(readRecipeFile(r2, "repo-x"))).message).toContain("outside the repository");
  });

  it("a repository reached through a symlink is fine (only links inside it count)", async () => {
    const r = await repo("real", 'from = "debian:12"\ncopy = ["f:/f"]\n', { f: "1" });
    await symlink(r, join(dir, "alias"));
    expect((await readRecipeFile(join(dir, "alias"), "repo-x"))?.copy[0]?.dest).toBe("/f");
  });
});

describe("copying a directory keeps the links inside it as links", () => {
  it("copies and hashes a link to a host file as the link, never the file's content", async () => {
    const src = join(dir, "tree");
    await mkdir(join(src, "d"), { recursive: true });
    await symlink(join(host, "secret"), join(src, "d", "s"));
    await symlink(host, join(src, "h"));
    const out = join(dir, "tree-out");
    await copySource(src, out);
    expect((await lstat(join(out, "d", "s"))).isSymbolicLink()).toBe(true);
    expect(await readlink(join(out, "d", "s"))).toBe(join(host, "secret"));
    expect((await lstat(join(out, "h"))).isSymbolicLink()).toBe(true);
    const before = await hashTree(src);
    await writeFile(join(host, "secret"), "changed\n");
    expect(await hashTree(src)).toBe(before);
  });
});
