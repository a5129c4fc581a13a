import { link, lstat, mkdir, readdir, readFile, readlink, symlink, writeFile } from "node:fs/promises";
import path from "node:path";
import { Readable } from "node:stream";
import { Header } from "tar";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { AgentError } from "../../../src/agent/errors.js";
import { type AgentFixture, startAgent } from "./helpers.js";

let fx: AgentFixture;
beforeEach(async () => {
  fx = await startAgent();
});
afterEach(() => fx.cleanup());

/** Builds a tar by hand, so tests can make archives a well-behaved packer never would. */
function craftTar(
  entries: {
    path: string;
    type?: "File" | "Directory" | "SymbolicLink" | "Link";
    body?: string;
    linkpath?: string;
  }[],
): Buffer {
  const blocks: Buffer[] = [];
  for (const e of entries) {
    const body = Buffer.from(e.body ?? "");
    const header = new Header({
      path: e.path,
      type: e.type ?? "File",
      size: body.length,
      mode: e.type === "Directory" ? 0o755 : 0o644,
      mtime: new Date(0),
      ...(e.linkpath ? { linkpath: e.linkpath } : {}),
    });
    const block = Buffer.alloc(512);
    header.encode(block, 0);
    blocks.push(block);
    if (body.length) blocks.push(Buffer.concat([body, Buffer.alloc((512 - (body.length % 512)) % 512)]));
  }
  blocks.push(Buffer.alloc(1024));
  return Buffer.concat(blocks);
}

async function tarOut(
  p: string,
): Promise<{ tar: Buffer; result: Awaited<ReturnType<AgentFixture["client"]["request"]>> }> {
  const chunks: Buffer[] = [];
  const result = await fx.client.request("tar_out", { path: p }, { onData: (c) => chunks.push(c) });
  return { tar: Buffer.concat(chunks), result };
}

const tarIn = (dest: string, tar: Buffer) =>
  fx.client.request("tar_in", { dest }, { upload: Readable.from([tar.subarray(0, 700), tar.subarray(700)]) });

describe("tar_out and tar_in", () => {
  it("round-trips a directory tree with files, modes, symlinks and binary content", async () => {
    const binary = Buffer.from(Array.from({ length: 70_000 }, (_, i) => (i * 7) & 0xff));
    await mkdir(path.join(fx.root, "proj/src"), { recursive: true });
    await writeFile(path.join(fx.root, "proj/src/main.py"), "print('hi')\n");
    await writeFile(path.join(fx.root, "proj/run.sh"), "#!/bin/sh\n", { mode: 0o755 });
    await writeFile(path.join(fx.root, "proj/data.bin"), binary);
    await symlink("src/main.py", path.join(fx.root, "proj/entry"));
    const { tar, result } = await tarOut("proj");
    expect(result).toEqual({ artifact_type: "directory", bytes: tar.length, entries: 6 });

    const back = await tarIn("copy", tar);
    expect(back).toEqual({ dest: "copy", files: 3, bytes: binary.length + 12 + 10 });
    expect(await readFile(path.join(fx.root, "copy/src/main.py"), "utf8")).toBe("print('hi')\n");
    expect((await readFile(path.join(fx.root, "copy/data.bin"))).equals(binary)).toBe(true);
    expect((await lstat(path.join(fx.root, "copy/run.sh"))).mode & 0o777).toBe(0o755);
    expect(await readlink(path.join(fx.root, "copy/entry"))).toBe("src/main.py");
  });

  it("exports a single file as one entry named by its basename", async () => {
    await mkdir(path.join(fx.root, "out"));
    await writeFile(path.join(fx.root, "out/report.txt"), "done\n");
    const { tar, result } = await tarOut("out/report.txt");
    expect(result).toMatchObject({ artifact_type: "file", entries: 1 });
    await tarIn("restored", tar);
    expect(await readdir(path.join(fx.root, "restored"))).toEqual(["report.txt"]);
  });

  it("refuses to export a hard-linked file", async () => {
    await mkdir(path.join(fx.root, "d"));
    await writeFile(path.join(fx.outside, "secret"), "s3cret");
    await link(path.join(fx.outside, "secret"), path.join(fx.root, "d/hard"));
    const err = (await tarOut("d").catch((e: AgentError) => e)) as AgentError;
    expect(err.code).toBe("path_outside_workspace");
    expect(err.message).toMatch(/hard link/);
  });

  it("refuses an archive with a '..' entry and writes nothing, not even its good entries", async () => {
    const tar = craftTar([
      { path: "good.txt", body: "fine" },
      { path: "../evil", body: "pwned" },
    ]);
    const err = (await tarIn("dest", tar).catch((e: AgentError) => e)) as AgentError;
    expect(err.code).toBe("path_outside_workspace");
    expect(err.message).toMatch(/\.\.\/evil/);
    expect(await readdir(fx.root)).toEqual([]);
    expect(await readdir(fx.outside)).toEqual([]);
  });

  it("refuses symlinks that lead outside, directly or by climbing through another link", async () => {
    for (const entries of [
      [{ path: "escape", type: "SymbolicLink" as const, linkpath: "/etc" }],
      [{ path: "escape", type: "SymbolicLink" as const, linkpath: "../../outside" }],
      [
        { path: "a", type: "SymbolicLink" as const, linkpath: "." },
        { path: "b", type: "SymbolicLink" as const, linkpath: "a/../.." },
      ],
    ]) {
      const err = (await tarIn("dest", craftTar(entries)).catch((e: AgentError) => e)) as AgentError;
      expect(err.code).toBe("path_outside_workspace");
      expect(err.message).toMatch(/symlink/);
    }
    expect(await readdir(fx.root)).toEqual([]);
  });

  it("refuses absolute names, hard links and writing through a symlink", async () => {
    const cases = [
      craftTar([{ path: "/tmp/pyro-abs-evil", body: "x" }]),
      craftTar([{ path: "hard", type: "Link", linkpath: "etc/passwd" }]),
      craftTar([
        { path: "inside", type: "SymbolicLink", linkpath: "sub" },
        { path: "inside/file", body: "through the link" },
      ]),
    ];
    for (const tar of cases) {
      const err = (await tarIn("dest", tar).catch((e: AgentError) => e)) as AgentError;
      expect(err.code).toBe("path_outside_workspace");
    }
    expect(await readdir(fx.root)).toEqual([]);
  });

  it("refuses a destination outside the workspace and garbage uploads", async () => {
    const tar = craftTar([{ path: "a.txt", body: "a" }]);
    expect(((await tarIn("../x", tar).catch((e: AgentError) => e)) as AgentError).code).toBe(
      "path_outside_workspace",
    );
    const garbage = Buffer.from("definitely not a tar archive ".repeat(40));
    expect(((await tarIn("dest", garbage).catch((e: AgentError) => e)) as AgentError).code).toBe(
      "invalid_argument",
    );
    expect(await readdir(fx.root)).toEqual([]);
  });

  it("takes the archive of no entries (an empty directory's) as the destination directory alone", async () => {
    const r = await tarIn("made/empty", Buffer.alloc(10_240));
    expect(r).toMatchObject({ files: 0, bytes: 0 });
    expect(await readdir(path.join(fx.root, "made/empty"))).toEqual([]);
    // Zeros, then something that is not a header: still refused.
    const bad = Buffer.concat([Buffer.alloc(1024), Buffer.from("not a header ".repeat(40))]);
    expect(((await tarIn("other", bad).catch((e: AgentError) => e)) as AgentError).code).toBe(
      "invalid_argument",
    );
  });

  it("refuses a file or symlink onto an existing directory before writing anything", async () => {
    await mkdir(path.join(fx.root, "dest/sub"), { recursive: true });
    await writeFile(path.join(fx.root, "dest/sub/keep"), "k");
    for (const entry of [
      { path: "sub", body: "file" },
      { path: "sub", type: "SymbolicLink" as const, linkpath: "elsewhere" },
    ]) {
      const tar = craftTar([{ path: "first.txt", body: "1" }, entry]);
      const err = (await tarIn("dest", tar).catch((e: AgentError) => e)) as AgentError;
      expect([err.code, err.message]).toEqual([
        "conflict",
        `'sub' exists as a directory where the archive has a ${entry.type ? "symlink" : "file"}`,
      ]);
      expect((await readdir(path.join(fx.root, "dest"))).sort()).toEqual(["sub"]);
    }
  });

  it("allows symlinks that stay inside the extracted tree", async () => {
    const tar = craftTar([
      { path: "lib", type: "Directory" },
      { path: "lib/real.txt", body: "r" },
      { path: "lib/alias", type: "SymbolicLink", linkpath: "real.txt" },
      { path: "lib/sub/up", type: "SymbolicLink", linkpath: "../../lib/real.txt" },
    ]);
    const r = await tarIn("dest", tar);
    expect(r.files).toBe(1);
    expect(await readlink(path.join(fx.root, "dest/lib/alias"))).toBe("real.txt");
    expect(await readFile(path.join(fx.root, "dest/lib/sub/up"), "utf8")).toBe("r");
  });

  it("refuses, before writing anything, a symlink that leaves the extracted tree even if it stays in the workspace", async () => {
    // tar's own guard would stop such a link half-way through; we refuse it up front.
    const tar = craftTar([
      { path: "first.txt", body: "1" },
      { path: "up", type: "SymbolicLink", linkpath: "../other" },
    ]);
    const err = (await tarIn("dest", tar).catch((e: AgentError) => e)) as AgentError;
    expect(err.code).toBe("path_outside_workspace");
    expect(await readdir(fx.root)).toEqual([]);
  });

  it("streams a large upload through to the file system intact", async () => {
    const big = Buffer.alloc(12 * 1024 * 1024);
    for (let i = 0; i < big.length; i += 4) big.writeUInt32LE((i * 2654435761) >>> 0, i);
    await writeFile(path.join(fx.root, "big.bin"), big);
    const { tar } = await tarOut("big.bin");
    // Many small chunks, as a real upload from a file would arrive.
    const chunks = Array.from({ length: Math.ceil(tar.length / 65536) }, (_, i) =>
      tar.subarray(i * 65536, (i + 1) * 65536),
    );
    const r = await fx.client.request("tar_in", { dest: "copy" }, { upload: Readable.from(chunks) });
    expect(r).toEqual({ dest: "copy", files: 1, bytes: big.length });
    expect((await readFile(path.join(fx.root, "copy/big.bin"))).equals(big)).toBe(true);
  });

  it("fails the request and writes nothing when the upload source breaks", async () => {
    const tar = craftTar([{ path: "a.txt", body: "a" }]);
    async function* broken() {
      yield tar.subarray(0, 512);
      throw new Error("disk went away");
    }
    const err = (await fx.client
      .request("tar_in", { dest: "dest" }, { upload: broken() })
      .catch((e: AgentError) => e)) as AgentError;
    expect(err.code).toBe("cancelled");
    expect(err.message).toMatch(/disk went away/);
    expect(await readdir(fx.root)).toEqual([]);
  });
});
