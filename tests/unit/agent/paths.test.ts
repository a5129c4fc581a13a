import { link, mkdir, symlink, writeFile } from "node:fs/promises";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { AgentError } from "../../../src/agent/errors.js";
import { Workspace } from "../../../src/agent/guest/paths.js";
import { tempDir } from "./helpers.js";

let base: string;
let root: string;
let outside: string;
let cleanup: () => Promise<void>;
let ws: Workspace;

beforeEach(async () => {
  ({ dir: base, cleanup } = await tempDir());
  root = path.join(base, "workspace");
  outside = path.join(base, "outside");
  await mkdir(path.join(root, "src"), { recursive: true });
  await mkdir(outside);
  await writeFile(path.join(outside, "secret"), "s3cret");
  await writeFile(path.join(root, "src", "app.py"), "print(1)\n");
  ws = await Workspace.open(root);
});
afterEach(() => cleanup());

async function refusal(arg: string): Promise<AgentError> {
  const err = await ws.resolve(arg).catch((e: unknown) => e);
  expect(err).toBeInstanceOf(AgentError);
  return err as AgentError;
}

describe("workspace containment", () => {
  it("treats relative paths and absolute paths under the root alike", async () => {
    const a = await ws.resolve("src/app.py");
    const b = await ws.resolve(path.join(root, "src/app.py"));
    expect(a.rel).toBe("src/app.py");
    expect(b.rel).toBe("src/app.py");
    expect(a.real).toBe(b.real);
    expect((await ws.resolve(".")).rel).toBe("");
    expect((await ws.resolve("src/../src/./app.py")).rel).toBe("src/app.py");
  });

  it("refuses '..' escapes", async () => {
    for (const arg of ["..", "../outside/secret", "src/../../outside", "./../x"]) {
      expect((await refusal(arg)).code).toBe("path_outside_workspace");
    }
  });

  it("refuses absolute paths outside the root, including a sibling with the same prefix", async () => {
    expect((await refusal("/etc/passwd")).code).toBe("path_outside_workspace");
    expect((await refusal(`${root}-other/x`)).code).toBe("path_outside_workspace");
    expect((await refusal(path.join(outside, "secret"))).code).toBe("path_outside_workspace");
  });

  it("refuses a symlink that leads outside, on the way or at the end, even when the tail does not exist", async () => {
    await symlink(outside, path.join(root, "out"));
    await symlink(path.join(outside, "secret"), path.join(root, "secret-link"));
    await symlink("../outside/nothing-yet", path.join(root, "dangling"));
    for (const arg of ["out", "out/secret", "out/new/file", "secret-link", "dangling"]) {
      const err = await refusal(arg);
      expect(err.code).toBe("path_outside_workspace");
      expect(err.message).toMatch(/symlink/);
    }
  });

  it("follows a symlink that stays inside", async () => {
    await symlink("src", path.join(root, "code"));
    const r = await ws.resolve("code/app.py");
    expect(r.rel).toBe("code/app.py");
    expect(r.real).toBe(path.join(root, "src", "app.py"));
    expect(r.stat?.isFile()).toBe(true);
  });

  it("refuses a regular file with more than one hard link", async () => {
    await link(path.join(outside, "secret"), path.join(root, "hard"));
    const err = await refusal("hard");
    expect(err.code).toBe("path_outside_workspace");
    expect(err.message).toMatch(/hard link/);
  });

  it("resolves a path that does not exist yet under the root", async () => {
    const r = await ws.resolve("new/dir/file.txt");
    expect(r.stat).toBeNull();
    expect(r.real).toBe(path.join(root, "new/dir/file.txt"));
  });

  it("refuses NUL bytes and paths through a regular file", async () => {
    expect((await refusal("a\0b")).code).toBe("invalid_argument");
    expect((await refusal("src/app.py/x")).code).toBe("invalid_argument");
  });
});
