import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { PyroError } from "../../../src/errors.js";
import type { Pyro } from "../../../src/sdk/pyro.js";
import { codeOf, fakePyro } from "../../helpers/engine.js";

let t: Awaited<ReturnType<typeof fakePyro>>;
let pyro: Pyro;
let seed: string;
let out: string;

beforeEach(async () => {
  t = await fakePyro();
  pyro = t.pyro;
  seed = await mkdtemp(join(tmpdir(), "pyro-seed-"));
  out = await mkdtemp(join(tmpdir(), "pyro-out-"));
  await writeFile(join(seed, "keep.txt"), "kept\n");
  await writeFile(join(seed, "mod.txt"), "old\n");
  await mkdir(join(seed, "src"));
  await writeFile(join(seed, "src", "lib.txt"), "one\n");
});
afterEach(async () => {
  await t.cleanup();
  await rm(seed, { recursive: true, force: true });
  await rm(out, { recursive: true, force: true });
});

/** A workspace with changes, stopped. */
async function stopped(): Promise<string> {
  const w = await pyro.createWorkspace({ seedPath: seed });
  await pyro.writeWorkspaceFile(w.workspace_id, "mod.txt", "new\n");
  await pyro.execWorkspace(w.workspace_id, "rm src/lib.txt && ln -s /etc/passwd esc");
  await pyro.stopWorkspace(w.workspace_id);
  return w.workspace_id;
}

describe("disk tools (core/disk.ts) on the fake backend", () => {
  it("list, read and export a stopped workspace's changed tree and leave it stopped and untouched", async () => {
    const id = await stopped();
    const before = await pyro.getWorkspace(id);
    const list = await pyro.listWorkspaceDisk(id, "/workspace", { recursive: true });
    expect(list.entries.map((e) => [e.path, e.artifact_type])).toEqual([
      ["esc", "symlink"],
      ["keep.txt", "file"],
      ["mod.txt", "file"],
      ["src", "directory"],
    ]);
    expect((await pyro.readWorkspaceDisk(id, "mod.txt")).content).toBe("new\n");
    const r = await pyro.exportWorkspaceDisk(id, "keep.txt", join(out, "keep.txt"));
    expect(r).toMatchObject({ artifact_type: "file", output_path: join(out, "keep.txt") });
    expect(await readFile(join(out, "keep.txt"), "utf8")).toBe("kept\n");
    const after = await pyro.getWorkspace(id);
    expect([after.state, after.last_activity_at]).toEqual(["stopped", before.last_activity_at]);
    expect(t.backend.diskReads).toBe(3);
  });

  it("refuses paths out of /workspace with the file tools' code, and a running workspace with conflict", async () => {
    const id = await stopped();
    for (const p of ["esc", "../etc/passwd", "/etc/passwd"])
      expect(await codeOf(pyro.readWorkspaceDisk(id, p))).toBe("path_outside_workspace");
    expect(await codeOf(pyro.exportWorkspaceDisk(id, "esc", join(out, "x")))).toBe("path_outside_workspace");
    expect(await codeOf(pyro.readWorkspaceDisk(id, "nope.txt"))).toBe("not_found");

    await pyro.startWorkspace(id);
    const reads = t.backend.diskReads;
    const err = await pyro.listWorkspaceDisk(id).catch((e: PyroError) => e);
    expect(err).toMatchObject({ code: "conflict" });
    expect((err as PyroError).hint).toContain(`pyro workspace stop ${id}`);
    expect((err as PyroError).hintFor("tool")).toContain("workspace_stop");
    expect(await codeOf(pyro.exportWorkspaceDisk(id, "mod.txt", join(out, "m")))).toBe("conflict");
    expect(t.backend.diskReads).toBe(reads);
    expect((await pyro.getWorkspace(id)).state).toBe("running");
    // Its changes are still there once running.
    expect((await pyro.readWorkspaceFile(id, "mod.txt")).content).toBe("new\n");
  });

  it("answers workspace_not_found, invalid_argument and unsupported with nothing opened", async () => {
    expect(await codeOf(pyro.listWorkspaceDisk("nope"))).toBe("workspace_not_found");
    const id = await stopped();
    expect(await codeOf(pyro.readWorkspaceDisk(id, ""))).toBe("invalid_argument");
    expect(await codeOf(pyro.listWorkspaceDisk(id, "/workspace", { recursive: "yes" as never }))).toBe(
      "invalid_argument",
    );
    expect(t.backend.diskReads).toBe(0);
    (t.backend as { openDisk?: unknown }).openDisk = undefined;
    expect(await codeOf(pyro.listWorkspaceDisk(id))).toBe("unsupported");
    expect((await pyro.getWorkspace(id)).state).toBe("stopped");
  });

  it("an export refuses a non-empty output directory and writes nothing", async () => {
    const id = await stopped();
    await writeFile(join(out, "already"), "x");
    expect(await codeOf(pyro.exportWorkspaceDisk(id, "src", out))).toBe("conflict");
    expect(await readFile(join(out, "already"), "utf8")).toBe("x");
    expect((await pyro.getWorkspace(id)).state).toBe("stopped");
  });
});
