import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ensureImage, imageRef } from "../../../src/backends/docker/image.js";
import { pyro as cli } from "../../helpers/cli.js";
import {
  containerIdOf,
  containersLabelled,
  dockerSkipReason,
  pyroImages,
  TEST_DOCKER_HOST,
  type TestEngine,
  useTestEngine,
} from "../../helpers/docker.js";
import {
  entriesOf,
  errorOf,
  type Harness,
  mountsMentioning,
  openHarness,
  suiteTitle,
  writeTree,
} from "../../helpers/sandbox.js";

/**
 * One-shot runs, and one docker workspace across processes: created by a CLI process,
 * used by others, surviving a CLI killed mid-command and a container that died, and
 * finally deleted without leaving a container, volume, image, file or mount behind.
 */
const skip = dockerSkipReason();

describe.skipIf(skip !== "")(
  suiteTitle("one-shot runs and a docker workspace across processes", skip),
  () => {
    let engine: TestEngine;
    let h: Harness;
    let env: NodeJS.ProcessEnv;
    let id = "";
    let imagesBefore: string[] = [];

    beforeAll(async () => {
      engine = await useTestEngine();
      h = await openHarness("docker-life", { backend: "docker" }, { env: engine.env });
      env = h.cliEnv;
    });
    afterAll(async () => {
      await h?.cleanup();
      await engine?.release();
    });

    it("runs a one-shot command in a throwaway container and removes it", async () => {
      const r = await h.pyro.run("debian:12", "git --version; echo err >&2; exit 3", { backend: "docker" });
      expect(r).toMatchObject({
        backend: "docker",
        execution_mode: "guest_agent",
        exit_code: 3,
        stderr: "err\n",
      });
      expect(r.stdout).toMatch(/^git version \d+\.\d+/);
      imagesBefore = await pyroImages(engine.docker);
      expect(await containersLabelled(engine.docker, "dev.pyro.oneshot")).toEqual([]);
      const cmd = cli(
        [
          "run",
          "debian:12",
          "--backend",
          "docker",
          "--json",
          "--",
          "sh",
          "-c",
          "cat /proc/net/dev | grep -c :",
        ],
        env,
      );
      expect(cmd.code, cmd.stderr).toBe(0);
      expect(cmd.json()).toMatchObject({ backend: "docker", exit_code: 0, stdout: "1\n" });
    });

    // Docker-specific: the throwaway container of a one-shot killed at its timeout is removed
    // from the engine. A one-shot's results, stdin, cap and timeout are the parity suite's
    // (tests/parity/exec.ts, "one-shot run").
    it("removes the container of a one-shot killed at its timeout", async () => {
      const t = await h.pyro.run("debian:12", "sleep 1002", { backend: "docker", timeoutSeconds: 2 });
      expect(t).toMatchObject({ exit_code: 124, timed_out: true });
      expect(await containersLabelled(engine.docker, "dev.pyro.oneshot")).toEqual([]);
    });

    it("imports an environment once even when two callers ask for it at the same time", async () => {
      // A tiny environment of its own, so the test neither waits for nor disturbs debian:12's image.
      const entry = join(await h.tempDir("docker-tiny-env"), "cache", "tiny@1");
      await writeTree(join(entry, "rootfs"), { "etc/os-release": "ID=tiny\n", "hello.txt": "hi\n" });
      await writeFile(
        join(entry, "manifest.json"),
        JSON.stringify({ name: "tiny", built_at: String(Date.now()) }),
      );
      const since = Math.floor(Date.now() / 1000) - 1;
      const ref = await imageRef(join(entry, "rootfs"));
      try {
        const [a, b] = await Promise.all([
          ensureImage(engine.docker, TEST_DOCKER_HOST, join(entry, "rootfs")),
          ensureImage(engine.docker, TEST_DOCKER_HOST, join(entry, "rootfs")),
        ]);
        expect([a, b]).toEqual([ref, ref]);
        expect(await ensureImage(engine.docker, TEST_DOCKER_HOST, join(entry, "rootfs"))).toBe(ref);
        const until = Math.floor(Date.now() / 1000) + 1;
        const events = await new Promise<string>((resolve, reject) => {
          engine.docker.getEvents(
            { since, until, filters: { type: ["image"], event: ["import"] } },
            (err, stream) => {
              if (err || !stream) return reject(err);
              let text = "";
              stream.on("data", (c: Buffer) => {
                text += c.toString("utf8");
              });
              stream.on("end", () => resolve(text));
            },
          );
        });
        const imported = (await engine.docker.getImage(ref).inspect()).Id;
        expect(events.split("\n").filter((l) => l.includes(imported))).toHaveLength(1);
        // Only the final tag is left: the temporary import tag is gone.
        const tags = (await engine.docker.listImages({ filters: { reference: ["pyro-env"] } })).flatMap(
          (i) => i.RepoTags ?? [],
        );
        expect(tags.filter((t) => t.includes("importing-"))).toEqual([]);
      } finally {
        await engine.docker
          .getImage(ref)
          .remove()
          .catch(() => {});
      }
    });

    // Docker-specific: the container outlives its creator, and workspaces and resets reuse the
    // imported image (a killed creator, a command killed with its CLI: parity's "resume" and "exec").
    it("keeps running after the CLI process that created it exits, and serves other processes", async () => {
      const seed = join(await h.tempDir("docker-life-seed"), "seed");
      await writeTree(seed, { "keep.txt": "kept\n" });
      const created = cli(
        [
          "workspace",
          "create",
          "debian:12",
          "--backend",
          "docker",
          "--seed-path",
          seed,
          "--name",
          "dock",
          "--id-only",
        ],
        env,
      );
      expect(created.code, created.stderr).toBe(0);
      id = created.stdout.trim();
      const container = containerIdOf(h.pyro, id)!;
      expect((await engine.docker.getContainer(container).inspect()).State.Running).toBe(true);
      const ran = cli(
        ["workspace", "exec", "dock", "--", "sh", "-c", "echo from-b > b.txt; cat keep.txt"],
        env,
      );
      expect(ran.code, `workspace ${id}: ${ran.stderr}`).toBe(0);
      expect(ran.stdout).toBe("kept\n");
      expect((await h.pyro.readWorkspaceFile(id, "b.txt")).content).toBe("from-b\n");
      const reset = cli(["workspace", "reset", id, "--json"], env);
      expect(reset.code, reset.stderr).toBe(0);
      // Docker-specific: a reset is a new container on the image (what the reset discards of
      // the root filesystem is the parity suite's, tests/parity/snapshots.ts).
      expect(containerIdOf(h.pyro, id)).not.toBe(container);
      expect((await h.pyro.execWorkspace(id, "ls -A")).stdout).toBe("keep.txt\n");
      // The environment was imported once: workspaces and resets reuse the image.
      expect(await pyroImages(engine.docker)).toEqual(imagesBefore);
    });

    // Docker-specific: a stop stops the container and a start starts the same one again (that
    // the files and the root's writes are kept is the parity suite's, tests/parity/snapshots.ts).
    it("stops its container on stop and starts the same container again", async () => {
      const container = containerIdOf(h.pyro, id)!;
      expect(await h.pyro.stopWorkspace(id)).toMatchObject({ state: "stopped" });
      expect((await engine.docker.getContainer(container).inspect()).State.Running).toBe(false);
      expect(await h.pyro.startWorkspace(id)).toMatchObject({ state: "running" });
      expect(containerIdOf(h.pyro, id)).toBe(container);
    });

    it("starts a stopped workspace whose container a killed starter left running", async () => {
      // A start killed after the engine started the container leaves it running while the
      // workspace is recorded stopped; the next start removes and remakes its socket
      // directory, so that container's agent is unreachable: it must be restarted, not
      // waited for (it timed out after 20 s and only the start after that worked).
      const container = containerIdOf(h.pyro, id)!;
      expect(await h.pyro.stopWorkspace(id)).toMatchObject({ state: "stopped" });
      await engine.docker.getContainer(container).start();
      expect(await h.pyro.startWorkspace(id)).toMatchObject({ state: "running" });
      expect((await h.pyro.execWorkspace(id, "cat keep.txt")).stdout).toBe("kept\n");
    });

    it("restarts a container that died while no process was attached, on its kept files", async () => {
      await h.pyro.writeWorkspaceFile(id, "survivor.txt", "on the upper layer\n");
      await h.pyro.close();
      const container = containerIdOf(h.pyro, id)!;
      await engine.docker.getContainer(container).kill();
      await engine.docker.getContainer(container).wait({ condition: "not-running" });
      const next = cli(["workspace", "exec", id, "--", "cat", "survivor.txt", "keep.txt"], env);
      expect(next.stderr).toBe("");
      expect(next.stdout).toBe("on the upper layer\nkept\n");
      expect((await engine.docker.getContainer(container).inspect()).State.Running).toBe(true);
    });

    it("is deleted leaving no container, volume, image, directory or mount", async () => {
      expect(await h.pyro.deleteWorkspace("dock")).toMatchObject({ workspace_id: id, deleted: true });
      expect((await errorOf(h.pyro.getWorkspace(id))).code).toBe("workspace_not_found");
      expect(await containersLabelled(engine.docker, "dev.pyro.workspace", id)).toEqual([]);
      const volumes = (await engine.docker.listVolumes()).Volumes ?? [];
      expect(volumes.filter((v) => v.Name.includes(id))).toEqual([]);
      expect(await pyroImages(engine.docker)).toEqual(imagesBefore);
      expect(await entriesOf(join(h.home, "workspaces"))).toEqual([]);
      expect(mountsMentioning(h.home)).toEqual([]);
    });
  },
);
