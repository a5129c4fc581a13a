import { statSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { checkCommitSize } from "../../../src/backends/docker/commit-size.js";
import { LABELS } from "../../../src/backends/docker/container.js";
import { rootImageOf } from "../../../src/backends/docker/pool.js";
import { dockerSkipReason, TEST_DOCKER_DIR, type TestEngine, useTestEngine } from "../../helpers/docker.js";
import { poolProbe } from "../../helpers/pool.js";
import { type Harness, openHarness, suiteTitle } from "../../helpers/sandbox.js";

/**
 * An adopted spare's root layer is committed to an image at its next start
 * (backends/docker/pool.ts settleAdopted). What a command wrote there is held to the disk
 * limit by the storage driver, which counts blocks; the commit writes every changed file
 * whole, so a sparse file past the limit is refused before the engine writes it
 * (docker/commit-size.ts). A 3 GiB sparse file grew the engine's disk by ~2 GiB at the
 * start; one past the limit would have filled it.
 */
const skip = dockerSkipReason();
const POOL_ENV = { PYRO_POOL: "1", PYRO_BACKEND: "docker" };
const GiB = 1024 ** 3;

describe.skipIf(skip !== "")(suiteTitle("disk limit over an adopted spare's commit on docker", skip), () => {
  let engine: TestEngine;
  let h: Harness;
  const { createEvent, declined, watchDeclines } = poolProbe(() => h);
  const sh = async (id: string, command: string) =>
    (await h.pyro.execWorkspace(id, command, { timeoutSeconds: 60 })).stdout;
  const dataRoot = () => statSync(join(TEST_DOCKER_DIR, "data.btrfs")).blocks * 512;

  beforeAll(async () => {
    engine = await useTestEngine();
    h = await openHarness(
      "docker-disk-commit",
      { backend: "docker" },
      { env: { ...engine.env, ...POOL_ENV } },
    );
    watchDeclines();
    await h.pyro.engine.warmPool();
    await h.pyro.engine.pool.ready();
  }, 120_000);
  afterAll(async () => {
    await h?.cleanup();
    await engine?.release();
  });

  it("measures a stopped container's layer with sparse files at their full size", {
    timeout: 120_000,
  }, async () => {
    await h.pyro.engine.pool.ready();
    const id = (await h.create()).workspace_id;
    expect(createEvent(id)?.sandbox, declined.join("; ")).toBe("pool");
    expect(await sh(id, "truncate -s 3G /root/sparse && du -k /root/sparse")).toMatch(/^0\s/);
    const container = engine.docker.getContainer(`pyro-${id}`);
    await container.kill().catch(() => {});
    const c = await container.inspect();
    await expect(checkCommitSize(engine.docker, c, 2048)).rejects.toMatchObject({ code: "conflict" });
    await expect(checkCommitSize(engine.docker, c, 4096)).resolves.toBeUndefined();
    await h.pyro.deleteWorkspace(id);
  });

  it("refuses to start a workspace whose commit would write a sparse file past the limit; a reset recovers it", {
    timeout: 300_000,
  }, async () => {
    await h.pyro.engine.pool.ready();
    const id = (await h.create()).workspace_id;
    expect(createEvent(id)?.sandbox, declined.join("; ")).toBe("pool");
    // Past the default 10 GiB limit, no block in the layer.
    await sh(id, "truncate -s 12G /root/sparse && echo kept > /workspace/kept.txt");
    await h.pyro.stopWorkspace(id);
    const before = dataRoot();
    await expect(h.pyro.startWorkspace(id)).rejects.toMatchObject({
      code: "conflict",
      message: expect.stringMatching(/root layer holds files of \d+ MiB/),
    });
    expect(dataRoot() - before).toBeLessThan(1 * GiB);
    await h.pyro.resetWorkspace(id);
    expect(await sh(id, "ls /root; echo ok")).toBe("ok\n");
  });

  it("takes the root image a start that gave up waiting had the engine commit, instead of committing again", {
    timeout: 180_000,
  }, async () => {
    await h.pyro.engine.pool.ready();
    const id = (await h.create()).workspace_id;
    expect(createEvent(id)?.sandbox, declined.join("; ")).toBe("pool");
    await sh(id, "echo layer > /root/kept");
    await h.pyro.stopWorkspace(id);
    // What the engine finishes after a commit call's deadline: the image, tagged and labelled.
    const [repo, tag] = rootImageOf(id).split(":") as [string, string];
    const sandbox = join(h.home, "workspaces", id, "sandbox");
    const made = (await engine.docker
      .getContainer(`pyro-${id}`)
      .commit({ repo, tag, changes: [`LABEL ${LABELS.dir}=${JSON.stringify(sandbox)}`] })) as { Id: string };
    await h.pyro.startWorkspace(id);
    expect(await sh(id, "cat /root/kept")).toBe("layer\n");
    // A second commit would have taken the tag and left this one untagged on the engine's disk.
    expect((await engine.docker.getImage(rootImageOf(id)).inspect()).Id).toBe(made.Id);
    await h.pyro.deleteWorkspace(id);
    await expect(engine.docker.getImage(made.Id).inspect()).rejects.toMatchObject({ statusCode: 404 });
  });
});
