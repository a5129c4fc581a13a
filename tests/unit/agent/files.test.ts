import { link, lstat, mkdir, readFile, readlink, symlink, utimes, writeFile } from "node:fs/promises";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { AgentError } from "../../../src/agent/errors.js";
import { type AgentFixture, startAgent } from "./helpers.js";

let fx: AgentFixture;
beforeEach(async () => {
  fx = await startAgent();
});
afterEach(() => fx.cleanup());

const codeOf = (p: Promise<unknown>) =>
  p.then(
    () => "resolved",
    (e: AgentError) => e.code,
  );

describe("file_list", () => {
  it("lists entries sorted, relative to the root, without following symlinks", async () => {
    await mkdir(path.join(fx.root, "src/pkg"), { recursive: true });
    await writeFile(path.join(fx.root, "src/a.txt"), "hello");
    await writeFile(path.join(fx.root, "src/pkg/b.txt"), "x");
    await symlink("/etc", path.join(fx.root, "src/etc-link"));
    const flat = await fx.client.request("file_list", { path: "src" });
    expect(flat.path).toBe("src");
    expect(flat.entries).toEqual([
      { path: "src/a.txt", artifact_type: "file", size_bytes: 5, link_target: null },
      { path: "src/etc-link", artifact_type: "symlink", size_bytes: 4, link_target: "/etc" },
      { path: "src/pkg", artifact_type: "directory", size_bytes: 0, link_target: null },
    ]);
    const deep = await fx.client
      .request("file_list", { path: "/", recursive: true })
      .catch((e: AgentError) => e);
    expect((deep as AgentError).code).toBe("path_outside_workspace");
    const all = await fx.client.request("file_list", { path: ".", recursive: true });
    expect(all.entries.map((e) => e.path)).toEqual([
      "src",
      "src/a.txt",
      "src/etc-link",
      "src/pkg",
      "src/pkg/b.txt",
    ]);
    expect(all.truncated).toBe(false);
  });

  it("reports a missing path as not_found", async () => {
    expect(await codeOf(fx.client.request("file_list", { path: "nope" }))).toBe("not_found");
  });
});

describe("file_read and file_write", () => {
  it("round-trips text as utf8 and binary as base64, byte for byte", async () => {
    const binary = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
    const w1 = await fx.client.request("file_write", {
      path: "bin/all-bytes",
      content: binary.toString("base64"),
      encoding: "base64",
    });
    expect(w1).toEqual({ path: "bin/all-bytes", size_bytes: 256, created: true });
    expect((await readFile(path.join(fx.root, "bin/all-bytes"))).equals(binary)).toBe(true);
    const r1 = await fx.client.request("file_read", { path: "bin/all-bytes" });
    expect(r1.encoding).toBe("base64");
    expect(Buffer.from(r1.content, "base64").equals(binary)).toBe(true);

    const w2 = await fx.client.request("file_write", {
      path: "notes.md",
      content: "héllo ✓\n",
      encoding: "utf8",
    });
    expect(w2.size_bytes).toBe(Buffer.byteLength("héllo ✓\n"));
    const r2 = await fx.client.request("file_read", { path: "notes.md" });
    expect(r2).toEqual({
      path: "notes.md",
      content: "héllo ✓\n",
      encoding: "utf8",
      size_bytes: w2.size_bytes,
      truncated: false,
    });
  });

  it("reports created: false and keeps the file mode when overwriting", async () => {
    await writeFile(path.join(fx.root, "run.sh"), "#!/bin/sh\n", { mode: 0o755 });
    const w = await fx.client.request("file_write", {
      path: "run.sh",
      content: "#!/bin/sh\necho hi\n",
      encoding: "utf8",
    });
    expect(w.created).toBe(false);
    expect((await lstat(path.join(fx.root, "run.sh"))).mode & 0o777).toBe(0o755);
  });

  it("moves a rewritten file's mtime to a later whole second, so (mtime, size) caches like Python's .pyc see a same-size edit", async () => {
    const file = path.join(fx.root, "calc.py");
    await writeFile(file, "return a - b\n");
    const now = new Date();
    await utimes(file, now, now);
    const before = Math.floor((await lstat(file)).mtimeMs / 1000);
    await fx.client.request("file_write", { path: "calc.py", content: "return a + b\n", encoding: "utf8" });
    expect(Math.floor((await lstat(file)).mtimeMs / 1000)).toBeGreaterThan(before);
    // A patch as well (same size again).
    const second = Math.floor((await lstat(file)).mtimeMs / 1000);
    await fx.client.request("patch_apply", {
      patch: "--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n-return a + b\n+return a * b\n",
    });
    expect(await readFile(file, "utf8")).toBe("return a * b\n");
    expect(Math.floor((await lstat(file)).mtimeMs / 1000)).toBeGreaterThan(second);
  });

  it("truncates a read at max_bytes and says so", async () => {
    await writeFile(path.join(fx.root, "long.txt"), "a".repeat(1000));
    const r = await fx.client.request("file_read", { path: "long.txt", max_bytes: 10 });
    expect(r).toMatchObject({ content: "a".repeat(10), size_bytes: 1000, truncated: true });
  });

  it("streams a large file as data frames when asked", async () => {
    const big = Buffer.alloc(3 * 1024 * 1024 + 17);
    for (let i = 0; i < big.length; i++) big[i] = (i * 31) & 0xff;
    await writeFile(path.join(fx.root, "big.bin"), big);
    const chunks: Buffer[] = [];
    const r = await fx.client.request(
      "file_read",
      { path: "big.bin", stream: true },
      { onData: (c) => chunks.push(c) },
    );
    expect(r).toMatchObject({ encoding: "stream", content: "", size_bytes: big.length, truncated: false });
    expect(Buffer.concat(chunks).equals(big)).toBe(true);
  });

  it("stops reading while onData's promise is pending (a slow consumer bounds the memory), in order", async () => {
    const big = Buffer.alloc(3 * 1024 * 1024 + 17);
    for (let i = 0; i < big.length; i++) big[i] = (i * 13) & 0xff;
    await writeFile(path.join(fx.root, "slow.bin"), big);
    const chunks: Buffer[] = [];
    let pending = 0;
    let arrivedWhilePending = 0;
    await fx.client.request(
      "file_read",
      { path: "slow.bin", stream: true },
      {
        onData: (c) => {
          chunks.push(c);
          if (pending > 0) arrivedWhilePending++;
          pending++;
          return new Promise<void>((r) => setTimeout(r, 5)).then(() => {
            pending--;
          });
        },
      },
    );
    expect(Buffer.concat(chunks).equals(big)).toBe(true);
    // Only chunks already read from the socket may arrive before the pause takes hold;
    // without it, nearly every chunk would arrive while an earlier one is pending.
    expect(arrivedWhilePending, `${arrivedWhilePending} of ${chunks.length}`).toBeLessThan(chunks.length / 2);
  });

  it("refuses to read or write through '..', absolute paths elsewhere, symlinks out and hard links, changing nothing", async () => {
    await writeFile(path.join(fx.outside, "secret"), "s3cret");
    await symlink(fx.outside, path.join(fx.root, "out"));
    await symlink(path.join(fx.outside, "secret"), path.join(fx.root, "secret-link"));
    await link(path.join(fx.outside, "secret"), path.join(fx.root, "hard"));
    for (const p of [
      "../outside/secret",
      path.join(fx.outside, "secret"),
      "out/secret",
      "secret-link",
      "hard",
    ]) {
      expect(await codeOf(fx.client.request("file_read", { path: p }))).toBe("path_outside_workspace");
      expect(
        await codeOf(fx.client.request("file_write", { path: p, content: "pwned", encoding: "utf8" })),
      ).toBe("path_outside_workspace");
    }
    expect(
      await codeOf(fx.client.request("file_write", { path: "out/new.txt", content: "x", encoding: "utf8" })),
    ).toBe("path_outside_workspace");
    expect(await readFile(path.join(fx.outside, "secret"), "utf8")).toBe("s3cret");
    expect((await lstat(path.join(fx.outside))).isDirectory()).toBe(true);
    await expect(lstat(path.join(fx.outside, "new.txt"))).rejects.toThrow();
  });

  it("writes through a symlink that stays inside, keeping the link", async () => {
    await mkdir(path.join(fx.root, "real"));
    await writeFile(path.join(fx.root, "real/config"), "old");
    await symlink("real/config", path.join(fx.root, "config"));
    await fx.client.request("file_write", { path: "config", content: "new", encoding: "utf8" });
    expect(await readlink(path.join(fx.root, "config"))).toBe("real/config");
    expect(await readFile(path.join(fx.root, "real/config"), "utf8")).toBe("new");
  });

  it("rejects malformed base64 and writing over a directory", async () => {
    expect(
      await codeOf(
        fx.client.request("file_write", { path: "x", content: "not base64!", encoding: "base64" }),
      ),
    ).toBe("invalid_argument");
    await mkdir(path.join(fx.root, "d"));
    expect(await codeOf(fx.client.request("file_write", { path: "d", content: "", encoding: "utf8" }))).toBe(
      "invalid_argument",
    );
    expect(await codeOf(fx.client.request("file_read", { path: "d" }))).toBe("invalid_argument");
    expect(await codeOf(fx.client.request("file_read", { path: "missing" }))).toBe("not_found");
  });
});
