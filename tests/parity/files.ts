import { createHash, randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readdir, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect } from "vitest";
import type { Scenario, ScenarioContext } from "./scenarios.js";
import { code, fsRootExtras, sandboxed, sh, withWorkspace } from "./util.js";

/**
 * The file tools on every backend: list, read, write, binary content, and containment as
 * src/agent/guest/paths.ts rules it (`..`, absolute paths elsewhere and symlinks leading
 * out are refused, and so is any regular file with more than one hard link).
 */

async function listReadWrite(ctx: ScenarioContext, id: string) {
  const p = ctx.pyro;
  const file = (path: string, size_bytes: number) => ({
    path,
    artifact_type: "file",
    size_bytes,
    link_target: null,
  });
  const dir = (path: string) => ({ path, artifact_type: "directory", size_bytes: 0, link_target: null });
  expect((await p.listWorkspaceFiles(id, "/workspace", { recursive: true })).entries).toEqual([
    file("app.py", 15),
    dir("bin"),
    file("bin/run.sh", 19),
    { path: "link", artifact_type: "symlink", size_bytes: 6, link_target: "app.py" },
    ...fsRootExtras(ctx).map(dir),
    dir("src"),
    file("src/lib.txt", 8),
  ]);
  expect((await p.listWorkspaceFiles(id, "/workspace")).entries.map((e) => e.path)).toEqual(
    ["app.py", "bin", "link", "src", ...fsRootExtras(ctx)].sort(),
  );
  expect(await p.readWorkspaceFile(id, "app.py")).toMatchObject({
    path: "app.py",
    content: "print('hello')\n",
    encoding: "utf8",
    size_bytes: 15,
    truncated: false,
  });
  expect((await p.readWorkspaceFile(id, "/workspace/link")).content).toBe("print('hello')\n");
  expect(await p.writeWorkspaceFile(id, "dir/deep/note.txt", "hello\n")).toMatchObject({
    path: "dir/deep/note.txt",
    size_bytes: 6,
    created: true,
  });
  expect(await p.writeWorkspaceFile(id, "/workspace/dir/deep/note.txt", "again\n")).toMatchObject({
    created: false,
  });
  expect(await sh(p, id, "cat dir/deep/note.txt")).toBe("again\n");
  expect(await code(p.readWorkspaceFile(id, "nope.txt"))).toBe("not_found");
  // Plain coreutils metadata calls work (gVisor needs its statx shim for these).
  expect(await sh(p, id, "ls -l dir/deep/note.txt | cut -c1-10; stat -c %s dir/deep/note.txt")).toBe(
    "-rw-r--r--\n6\n",
  );
}

async function binary(ctx: ScenarioContext, id: string) {
  const p = ctx.pyro;
  const bytes = Buffer.concat([
    Buffer.from(Array.from({ length: 256 }, (_, i) => i)),
    randomBytes(64 * 1024),
  ]);
  expect(await p.writeWorkspaceFile(id, "bin.dat", bytes)).toMatchObject({
    size_bytes: bytes.length,
    created: true,
  });
  const back = await p.readWorkspaceFile(id, "bin.dat");
  expect(back.encoding).toBe("base64");
  expect(Buffer.from(back.content, "base64").equals(bytes)).toBe(true);
  expect((await sh(p, id, "sha256sum bin.dat")).split(" ")[0]).toBe(
    createHash("sha256").update(bytes).digest("hex"),
  );
}

/** Every way out is refused with path_outside_workspace, and none of them changed a thing. */
async function escapes(ctx: ScenarioContext, id: string) {
  const p = ctx.pyro;
  const passwd = await sh(p, id, "sha256sum /etc/passwd");
  await sh(p, id, "ln -s /etc escape-link && ln -s ../../.. up");
  const before = (await p.diffWorkspace(id)).entries;
  const throughLink = ["--- /dev/null", "+++ b/escape-link/pyro-evil", "@@ -0,0 +1 @@", "+x", ""].join("\n");
  const refusals: [string, () => Promise<unknown>][] = [
    ["write ../outside.txt", () => p.writeWorkspaceFile(id, "../outside.txt", "x")],
    ["read ../outside.txt", () => p.readWorkspaceFile(id, "../outside.txt")],
    ["write src/../../x", () => p.writeWorkspaceFile(id, "src/../../x", "escaped")],
    ["read /etc/passwd", () => p.readWorkspaceFile(id, "/etc/passwd")],
    ["write /etc/passwd", () => p.writeWorkspaceFile(id, "/etc/passwd", "root::0:0::/:/bin/sh\n")],
    ["read escape-link/passwd", () => p.readWorkspaceFile(id, "escape-link/passwd")],
    ["write escape-link/passwd", () => p.writeWorkspaceFile(id, "escape-link/passwd", "x")],
    ["write escape-link/pyro-evil", () => p.writeWorkspaceFile(id, "escape-link/pyro-evil", "x")],
    ["list escape-link", () => p.listWorkspaceFiles(id, "escape-link")],
    ["read up/etc/passwd", () => p.readWorkspaceFile(id, "up/etc/passwd")],
    ["patch escape-link/pyro-evil", () => p.applyWorkspacePatch(id, throughLink)],
  ];
  for (const [what, call] of refusals)
    expect([what, await code(call())]).toEqual([what, "path_outside_workspace"]);
  expect((await p.diffWorkspace(id)).entries).toEqual(before);
  expect(await sh(p, id, "sha256sum /etc/passwd")).toBe(passwd);
  expect(await sh(p, id, "test ! -e /x && test ! -e /etc/pyro-evil && echo clean")).toBe("clean\n");
  await sh(p, id, "rm escape-link up");
}

/** A hard-linked file is refused to read, write and export; a link out of /workspace cannot be made. */
async function hardLinks(ctx: ScenarioContext, id: string) {
  const p = ctx.pyro;
  await sh(p, id, "mkdir hl && echo twin > hl/a.txt && ln hl/a.txt hl/b.txt");
  expect(await code(p.readWorkspaceFile(id, "hl/a.txt"))).toBe("path_outside_workspace");
  expect(await code(p.readWorkspaceFile(id, "hl/b.txt"))).toBe("path_outside_workspace");
  expect(await code(p.writeWorkspaceFile(id, "hl/b.txt", "overwritten\n"))).toBe("path_outside_workspace");
  expect(await sh(p, id, "cat hl/a.txt hl/b.txt")).toBe("twin\ntwin\n");
  // Refused mid-stream: the caller neither crashes nor finds a partial output.
  const parent = await mkdtemp(join(tmpdir(), "pyro-parity-hl-"));
  try {
    expect(await code(p.exportWorkspace(id, "hl", join(parent, "out")))).toBe("path_outside_workspace");
    await new Promise((r) => setTimeout(r, 200)); // let a late extractor error surface
    expect(await readdir(parent)).toEqual([]);
  } finally {
    await rm(parent, { recursive: true, force: true });
  }
  await sh(p, id, "rm -r hl");
  // /workspace is its own mount in a sandbox: the kernel refuses a link to anything outside
  // it (host-compat's and the fake's /workspace are host directories).
  if (sandboxed(ctx)) {
    const cross = await p.execWorkspace(id, "ln /etc/hostname /workspace/host-twin");
    expect(cross.exit_code).not.toBe(0);
    expect(cross.stderr).toMatch(/cross-device/i);
  }
}

/** sync push and export: a host directory in, a directory and a binary file out, byte for byte. */
async function transfers(ctx: ScenarioContext, id: string) {
  const p = ctx.pyro;
  const before = (await p.diffWorkspace(id)).entries;
  const host = await mkdtemp(join(tmpdir(), "pyro-parity-xfer-"));
  try {
    await mkdir(join(host, "push", "nested"), { recursive: true });
    await writeFile(join(host, "push", "a.txt"), "pushed\n");
    await writeFile(join(host, "push", "nested", "b.txt"), "deeper\n");
    expect(await p.syncPushWorkspace(id, join(host, "push"), { dest: "/workspace/incoming" })).toMatchObject({
      workspace_id: id,
      dest: "incoming",
      files: 2,
    });
    expect(await sh(p, id, "cat incoming/a.txt incoming/nested/b.txt")).toBe("pushed\ndeeper\n");
    expect((await p.diffWorkspace(id)).entries).toEqual(
      [
        ...before,
        { path: "incoming/a.txt", status: "added" },
        { path: "incoming/nested/b.txt", status: "added" },
      ].sort((x, y) => x.path.localeCompare(y.path)),
    );
    await mkdir(join(host, "bad"));
    await writeFile(join(host, "bad", "c.txt"), "c\n");
    await symlink("/etc", join(host, "bad", "etc"));
    expect(await code(p.syncPushWorkspace(id, join(host, "bad"), { dest: "sub2" }))).toBe(
      "path_outside_workspace",
    );
    expect(await sh(p, id, "test ! -e sub2 && echo untouched")).toBe("untouched\n");
    await p.exportWorkspace(id, "incoming", join(host, "out"));
    expect(await readFile(join(host, "out", "nested", "b.txt"), "utf8")).toBe("deeper\n");
    const blob = Buffer.from(Array.from({ length: 200_000 }, (_, i) => (i * 7919) % 256));
    await p.writeWorkspaceFile(id, "blob.bin", blob);
    await p.exportWorkspace(id, "blob.bin", join(host, "blob.bin"));
    expect((await readFile(join(host, "blob.bin"))).equals(blob)).toBe(true);
    await exportRefusals(ctx, id, host);
  } finally {
    await rm(host, { recursive: true, force: true });
  }
}

/** One workspace for the file: a workspace start is the dear part on qemu. */
export const FILE_SCENARIOS: Scenario[] = [
  {
    name: "files and transfers: list, read, write, binary round trip, sync push, export; every escape, hard link and symlink leading out refused without changes",
    run: (ctx) =>
      withWorkspace(ctx, async (id) => {
        await listReadWrite(ctx, id);
        await binary(ctx, id);
        await escapes(ctx, id);
        await hardLinks(ctx, id);
        expect((await ctx.pyro.diffWorkspace(id)).entries.map((e) => e.path)).toEqual([
          "bin.dat",
          "dir/deep/note.txt",
        ]);
        await transfers(ctx, id);
      }),
  },
];

/** An export of a directory holding a symlink that leads out writes nothing at all. */
async function exportRefusals(ctx: ScenarioContext, id: string, host: string) {
  const p = ctx.pyro;
  await sh(
    p,
    id,
    "mkdir -p leak/deeper && echo fine > leak/ok.txt && ln -s /etc leak/etc && ln -s ../../../../etc leak/deeper/up",
  );
  const parent = join(host, "export-parent");
  await mkdir(parent);
  const out = join(parent, "out");
  expect(await code(p.exportWorkspace(id, "leak", out))).toBe("path_outside_workspace");
  expect(existsSync(out)).toBe(false);
  expect(await readdir(parent)).toEqual([]);
  // The relative escape alone is refused too.
  await sh(p, id, "rm leak/etc");
  expect(await code(p.exportWorkspace(id, "leak", out))).toBe("path_outside_workspace");
  expect(await readdir(parent)).toEqual([]);
}
