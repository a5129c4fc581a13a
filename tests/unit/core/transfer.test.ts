import { execFileSync } from "node:child_process";
import { link, mkdir, mkdtemp, readdir, readFile, readlink, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as tar from "tar";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { ExportWriter, packHostPath, pushThrough } from "../../../src/core/transfer.js";
import { PyroError } from "../../../src/errors.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "pyro-xfer-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

/**
 * A tar (made by GNU tar, as a hostile agent could) of entries set up by `make`. Not
 * node-tar's Pack: given a hard link it can write after it ended on a busy machine, an
 * uncaught error that failed the whole run.
 */
async function archive(make: (src: string) => Promise<void>, names: string[]): Promise<Buffer> {
  const src = join(dir, `src-${Math.random().toString(36).slice(2)}`);
  await mkdir(src, { recursive: true });
  await make(src);
  return execFileSync("tar", ["-c", "-f", "-", "--format=posix", "-C", src, "--", ...names]);
}

async function exportInto(
  out: string,
  data: Buffer,
  type: "file" | "directory",
  mode: "export" | "snapshot" = "export",
) {
  const w = new ExportWriter(out, mode);
  await w.begin();
  w.write(data);
  await w.commit(type);
}

describe("export and snapshot extraction on the host", () => {
  it("writes a file export into place only when complete, leaving no temp files", async () => {
    const data = await archive((s) => writeFile(join(s, "a.txt"), "hello"), ["a.txt"]);
    await exportInto(join(dir, "out.txt"), data, "file");
    expect(await readFile(join(dir, "out.txt"), "utf8")).toBe("hello");
    expect((await readdir(dir)).filter((n) => n.startsWith(".pyro-export-"))).toEqual([]);
  });

  it("refuses a symlink to an absolute path in an export, writing nothing, but keeps it in a snapshot", async () => {
    const data = await archive(
      async (s) => {
        await mkdir(join(s, "d"));
        await symlink("/etc", join(s, "d", "etc"));
      },
      ["d"],
    );
    await expect(exportInto(join(dir, "out"), data, "directory")).rejects.toMatchObject({
      code: "path_outside_workspace",
    });
    expect((await readdir(dir)).filter((n) => !n.startsWith("src-"))).toEqual([]);
    await exportInto(join(dir, "snap"), data, "directory", "snapshot");
    expect(await readlink(join(dir, "snap", "d", "etc"))).toBe("/etc");
  });

  it("refuses hard links and symlinks that climb out, in every mode", async () => {
    const hard = await archive(
      async (s) => {
        await writeFile(join(s, "a"), "a");
        await link(join(s, "a"), join(s, "b"));
      },
      ["a", "b"],
    );
    await expect(exportInto(join(dir, "o1"), hard, "directory", "snapshot")).rejects.toMatchObject({
      code: "path_outside_workspace",
    });
    const climb = await archive((s) => symlink("../../outside", join(s, "l")), ["l"]);
    await expect(exportInto(join(dir, "o2"), climb, "directory", "snapshot")).rejects.toMatchObject({
      code: "path_outside_workspace",
    });
  });

  it("refuses to export into a non-empty directory and leaves it alone", async () => {
    await mkdir(join(dir, "full"));
    await writeFile(join(dir, "full", "keep"), "k");
    const w = new ExportWriter(join(dir, "full"));
    await expect(w.begin()).rejects.toMatchObject({ code: "conflict" });
    expect(await readdir(join(dir, "full"))).toEqual(["keep"]);
  });

  it("packs a host directory without following symlinks", async () => {
    await mkdir(join(dir, "p"));
    await writeFile(join(dir, "p", "f"), "x");
    await symlink("/etc/passwd", join(dir, "p", "l"));
    const names: string[] = [];
    const { stream } = await packHostPath(join(dir, "p"));
    const parser = new tar.Parser({
      onReadEntry: (e) => {
        names.push(`${e.type}:${e.path}`);
        e.resume();
      },
    });
    const done = new Promise((r) => parser.on("end", r));
    for await (const c of stream as AsyncIterable<Buffer>) parser.write(c);
    parser.end();
    await done;
    expect(names.sort()).toEqual(["File:f", "SymbolicLink:l"]);
  });

  it("fails a push through the agent whose source lost a file while it was read (conflict), after the agent took what was read", async () => {
    await mkdir(join(dir, "src"));
    // The first file is larger than every buffer on the way: tar is still writing it when
    // the agent begins to read, and the second file is gone by then.
    await writeFile(join(dir, "src", "a.bin"), Buffer.alloc(8 * 1024 * 1024, 1));
    await writeFile(join(dir, "src", "b.txt"), "b");
    const names: string[] = [];
    const agent = {
      request: async (_op: string, _args: unknown, o: { upload: NodeJS.ReadableStream }) => {
        await rm(join(dir, "src", "b.txt"));
        const parser = new tar.Parser({
          onReadEntry: (e) => {
            names.push(e.path);
            e.resume();
          },
        });
        for await (const c of o.upload as AsyncIterable<Buffer>) parser.write(c);
        parser.end();
        return { dest: "d", files: names.length, bytes: 0 };
      },
    } as unknown as Parameters<typeof pushThrough>[0];
    await expect(pushThrough(agent, join(dir, "src"), "d")).rejects.toMatchObject({
      code: "conflict",
      message: expect.stringMatching(/could not read all of .*src \(exit 2\)/),
    });
    expect(names[0]).toBe("a.bin");
    // A slow reader: tar's failure ends the upload with an error first, and the agent
    // fails it; the push is still the conflict, and nothing was pushed.
    await writeFile(join(dir, "src", "b.txt"), "b");
    const slow = {
      request: async (_o: string, _a: unknown, o: { upload: NodeJS.ReadableStream }) => {
        await rm(join(dir, "src", "b.txt"));
        try {
          for await (const _c of o.upload as AsyncIterable<Buffer>)
            await new Promise((r) => setTimeout(r, 5));
        } catch (err) {
          throw new PyroError("internal", `the upload failed: ${(err as Error).message}`);
        }
        return { dest: "d", files: 0, bytes: 0 };
      },
    } as unknown as Parameters<typeof pushThrough>[0];
    await expect(pushThrough(slow, join(dir, "src"), "d")).rejects.toMatchObject({
      code: "conflict",
      message: expect.stringMatching(/\(exit 2\).*nothing was pushed/),
    });
    // An unchanged source: the agent's answer.
    await writeFile(join(dir, "src", "b.txt"), "b");
    const ok = {
      request: async (_o: string, _a: unknown, o: { upload: NodeJS.ReadableStream }) => {
        for await (const _c of o.upload as AsyncIterable<Buffer>);
        return { dest: "d", files: 2, bytes: 3 };
      },
    } as unknown as Parameters<typeof pushThrough>[0];
    expect(await pushThrough(ok, join(dir, "src"), "d")).toEqual({ dest: "d", files: 2, bytes: 3 });
  });
});
