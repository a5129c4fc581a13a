import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect } from "vitest";
import type { PyroError } from "../../src/errors.js";
import type { Scenario } from "./scenarios.js";

/**
 * Disk tools (core/disk.ts) on every backend: a stopped workspace's files, read without
 * starting it, with the file tools' results and refusals.
 */
async function code(p: Promise<unknown>): Promise<string> {
  return p.then(
    () => "ok",
    (e: PyroError) => e.code,
  );
}

export const DISK_SCENARIOS: Scenario[] = [
  {
    name: "disk: a stopped workspace's changed tree is listed, read and exported without starting it; refusals; conflict while running",
    async run(ctx) {
      const p = ctx.pyro;
      const out = await mkdtemp(join(tmpdir(), "pyro-disk-out-"));
      const w = await p.createWorkspace({ ...ctx.createOptions, seedPath: ctx.seed });
      const id = w.workspace_id;
      try {
        await p.execWorkspace(
          id,
          "echo changed > app.py && rm src/lib.txt && mkdir -p made/deep && echo hi > made/deep/f.txt && ln -s /etc/passwd escape",
        );
        // Running: conflict, and nothing changed.
        expect(await code(p.listWorkspaceDisk(id))).toBe("conflict");
        expect((await p.getWorkspace(id)).state).toBe("running");
        await p.stopWorkspace(id);

        const started = performance.now();
        const list = await p.listWorkspaceDisk(id, "/workspace", { recursive: true });
        const listMs = Math.round(performance.now() - started);
        const paths = list.entries.map((e) => e.path);
        expect(paths).toEqual(expect.arrayContaining(["app.py", "made/deep/f.txt", "escape", "src"]));
        expect(paths).not.toContain("src/lib.txt");
        expect(list.entries.find((e) => e.path === "escape")).toMatchObject({
          artifact_type: "symlink",
          link_target: "/etc/passwd",
        });
        expect((await p.readWorkspaceDisk(id, "app.py")).content).toBe("changed\n");
        expect(await code(p.readWorkspaceDisk(id, "src/lib.txt"))).toBe("not_found");
        for (const bad of ["escape", "../etc/passwd", "/etc/passwd", "made/../../x"])
          expect([bad, await code(p.readWorkspaceDisk(id, bad))]).toEqual([bad, "path_outside_workspace"]);
        expect(await code(p.exportWorkspaceDisk(id, "escape", join(out, "e")))).toBe(
          "path_outside_workspace",
        );

        const r = await p.exportWorkspaceDisk(id, "made", join(out, "made"));
        expect(r).toMatchObject({ artifact_type: "directory", output_path: join(out, "made") });
        expect(await readFile(join(out, "made", "deep", "f.txt"), "utf8")).toBe("hi\n");
        process.stderr.write(`[parity ${ctx.target.label}] disk list of a stopped workspace: ${listMs} ms\n`);

        // Still stopped, and it starts with its changes.
        expect((await p.getWorkspace(id)).state).toBe("stopped");
        await p.startWorkspace(id);
        expect((await p.execWorkspace(id, "cat app.py; test -e src/lib.txt || echo gone")).stdout).toBe(
          "changed\ngone\n",
        );
      } finally {
        await p.deleteWorkspace(id).catch(() => {});
        await rm(out, { recursive: true, force: true });
      }
    },
  },
];
