import { existsSync } from "node:fs";
import { chmod, readdir, readFile, symlink } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { containerIdOf, dockerSkipReason, type TestEngine, useTestEngine } from "../../helpers/docker.js";
import { errorOf, type Harness, openHarness, suiteTitle, writeTree } from "../../helpers/sandbox.js";

/**
 * File tools, patches, diff, snapshots, reset, export, sync push and stop/start on one
 * real docker workspace. The tests follow one editing session in order.
 */
const skip = dockerSkipReason();
const SEED = {
  "keep.txt": "keep\n",
  "edit.txt": "before\n",
  "gone.txt": "precious\n",
  "bin/run.sh": "#!/bin/sh\necho run\n",
  "src/main.py": "print('hi')\n",
};

describe.skipIf(skip !== "")(
  suiteTitle("files, diff, snapshots, reset and stop/start on docker", skip),
  () => {
    let engine: TestEngine;
    let h: Harness;
    let id: string;
    let host: string;
    const sh = async (command: string) => {
      const r = await h.pyro.execWorkspace(id, command);
      expect(r.exit_code, `workspace ${id}: \`${command}\` failed: ${r.stderr}`).toBe(0);
      return r.stdout;
    };

    beforeAll(async () => {
      engine = await useTestEngine();
      h = await openHarness("docker-files", { backend: "docker" }, { env: engine.env });
      host = await h.tempDir("docker-files-host");
      const seed = join(host, "seed");
      await writeTree(seed, SEED);
      await chmod(join(seed, "bin/run.sh"), 0o755);
      await symlink("keep.txt", join(seed, "link"));
      id = (await h.create({ seedPath: seed })).workspace_id;
    });
    afterAll(async () => {
      await h?.cleanup();
      await engine?.release();
    });

    it("reads, lists and writes files, and refuses paths that lead out of /workspace, changing nothing", async () => {
      expect((await h.pyro.readWorkspaceFile(id, "link")).content).toBe("keep\n");
      expect(await h.pyro.writeWorkspaceFile(id, "docs/deep/new.md", "# new\n")).toMatchObject({
        created: true,
      });
      const listed = await h.pyro.listWorkspaceFiles(id, "/workspace", { recursive: true });
      expect(listed.entries.map((e) => e.path)).toContain("docs/deep/new.md");
      await sh("ln -s /etc etc-link && rm -r docs");
      const before = (await h.pyro.diffWorkspace(id)).entries;
      for (const [what, call] of [
        ["write ../x", () => h.pyro.writeWorkspaceFile(id, "../x", "escaped")],
        ["read /etc/passwd", () => h.pyro.readWorkspaceFile(id, "/etc/passwd")],
        ["write etc-link/pyro-evil", () => h.pyro.writeWorkspaceFile(id, "etc-link/pyro-evil", "x")],
        ["list etc-link", () => h.pyro.listWorkspaceFiles(id, "etc-link")],
      ] as const) {
        expect((await errorOf(call())).code, `${what} in workspace ${id}`).toBe("path_outside_workspace");
      }
      expect((await h.pyro.diffWorkspace(id)).entries).toEqual(before);
      expect(await sh("test ! -e /x && test ! -e /etc/pyro-evil && echo clean")).toBe("clean\n");
      // /workspace is its own mount: no hard link to a file outside it.
      const cross = await h.pyro.execWorkspace(id, "ln /etc/hostname /workspace/host-twin");
      expect(cross.exit_code).not.toBe(0);
      await sh("rm etc-link");
    });

    it("applies a patch, rejects one that does not apply without changing anything, and diffs against the seed", async () => {
      const ok = await h.pyro.applyWorkspacePatch(
        id,
        ["--- a/edit.txt", "+++ b/edit.txt", "@@ -1 +1 @@", "-before", "+after", ""].join("\n"),
      );
      expect(ok).toMatchObject({ changed: true, files: [{ path: "edit.txt", status: "modified" }] });
      const bad = await errorOf(
        h.pyro.applyWorkspacePatch(
          id,
          ["--- a/keep.txt", "+++ b/keep.txt", "@@ -1 +1 @@", "-nope", "+x", ""].join("\n"),
        ),
      );
      expect(bad.code).toBe("patch_rejected");
      await sh("rm gone.txt bin/run.sh && echo fresh > added.txt");
      const d = await h.pyro.diffWorkspace(id);
      expect(d.entries).toEqual([
        { path: "added.txt", status: "added" },
        { path: "bin/run.sh", status: "deleted" },
        { path: "edit.txt", status: "modified" },
        { path: "gone.txt", status: "deleted" },
      ]);
      expect(d.patch).toContain("-before\n+after\n");
    });

    it("snapshots, diffs against the snapshot, and resets to it and to the baseline exactly", async () => {
      expect(await h.pyro.createSnapshot(id, "cp1")).toMatchObject({ snapshot_name: "cp1", kind: "named" });
      await sh(
        "echo later > later.txt && echo again >> edit.txt && apt-get --version >/dev/null && touch /root/in-rootfs",
      );
      expect((await h.pyro.diffWorkspace(id, { snapshot: "cp1" })).entries).toEqual([
        { path: "edit.txt", status: "modified" },
        { path: "later.txt", status: "added" },
      ]);
      const container = containerIdOf(h.pyro, id);
      expect(await h.pyro.resetWorkspace(id, { snapshot: "cp1" })).toMatchObject({
        reset_count: 1,
        current_snapshot: "cp1",
        state: "running",
      });
      // A reset discards the root filesystem's changes too: a new container on the image.
      expect(containerIdOf(h.pyro, id)).not.toBe(container);
      expect(await sh("ls -A | sort; cat edit.txt; test ! -e /root/in-rootfs && echo root-clean")).toBe(
        "added.txt\nbin\nedit.txt\nkeep.txt\nlink\nsrc\nafter\nroot-clean\n",
      );
      await h.pyro.resetWorkspace(id);
      expect(await sh("cat gone.txt edit.txt; stat -c %a bin/run.sh; ./bin/run.sh")).toBe(
        "precious\nbefore\n755\nrun\n",
      );
      expect(await h.pyro.diffWorkspace(id)).toMatchObject({ changed: false });
      // The snapshot trees are host directories that resets never write.
      expect(
        await readFile(join(h.home, "workspaces", id, "snapshots", "baseline", "edit.txt"), "utf8"),
      ).toBe("before\n");
    });

    it("exports files and directories to the host, and pushes a host directory in", async () => {
      expect((await h.pyro.exportWorkspace(id, "keep.txt", join(host, "keep.out"))).artifact_type).toBe(
        "file",
      );
      expect(await readFile(join(host, "keep.out"), "utf8")).toBe("keep\n");
      await h.pyro.exportWorkspace(id, "/workspace/src", join(host, "src-out"));
      expect(await readFile(join(host, "src-out", "main.py"), "utf8")).toBe("print('hi')\n");
      const src = join(host, "push-src");
      await writeTree(src, { "a.txt": "pushed a\n", "nested/b.txt": "pushed b\n" });
      expect(await h.pyro.syncPushWorkspace(id, src, { dest: "/workspace/sub" })).toMatchObject({ files: 2 });
      expect(await sh("cat sub/a.txt sub/nested/b.txt")).toBe("pushed a\npushed b\n");
      await sh("mkdir -p leak && ln -s /etc leak/etc");
      const parent = await h.tempDir("docker-export");
      expect((await errorOf(h.pyro.exportWorkspace(id, "leak", join(parent, "out")))).code).toBe(
        "path_outside_workspace",
      );
      expect(existsSync(join(parent, "out"))).toBe(false);
      expect(await readdir(parent)).toEqual([]);
    });

    it("keeps /workspace and the root filesystem across stop and start, and refuses commands while stopped", async () => {
      await h.pyro.writeWorkspaceFile(id, "survives.txt", "still here\n");
      await sh("echo root-layer > /root/kept");
      const container = containerIdOf(h.pyro, id)!;
      expect(await h.pyro.stopWorkspace(id)).toMatchObject({ state: "stopped" });
      expect((await engine.docker.getContainer(container).inspect()).State.Running).toBe(false);
      expect((await errorOf(h.pyro.execWorkspace(id, "true"))).code).toBe("workspace_stopped");
      expect(await h.pyro.startWorkspace(id)).toMatchObject({ state: "running" });
      expect(containerIdOf(h.pyro, id)).toBe(container);
      expect(await sh("cat survives.txt /root/kept")).toBe("still here\nroot-layer\n");
    });
  },
);
