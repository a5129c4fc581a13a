/**
 * A tag that moves at the registry (issue 15): `env pull` of a tag already pulled asks
 * the registry what the tag names now. Unchanged: a cache hit that downloads no blob.
 * Moved: the new image is a new version beside the old one; a workspace made before
 * keeps the old files, a new one gets the new files; `env prune` removes the old
 * version once no workspace uses it. A registry that cannot be reached: the cached
 * version with a warning (docs/environments.md). Images are made with umoci and pushed
 * with skopeo to Debian's docker-registry on loopback, through a proxy that logs requests.
 */
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { mkdir, mkdtemp, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Pyro } from "../../../src/sdk/pyro.js";
import {
  type Front,
  type Registry,
  registrySkipReason,
  startFront,
  startRegistry,
} from "../../helpers/registry.js";
import { parityTargets } from "../../parity/backends.js";

const skip =
  (await registrySkipReason()) ??
  (parityTargets().find((t) => t.backend === "bwrap" && t.real)?.skip || null);

describe.skipIf(skip !== null)(`an image tag that moves${skip ? ` (skipped: ${skip})` : ""}`, () => {
  let registry: Registry;
  let front: Front;
  let work: string;

  /** Makes an image whose /etc/version says `version` and pushes it to t/app:t. */
  async function pushVersion(version: string): Promise<void> {
    const run = (cmd: string, ...args: string[]) => execFileSync(cmd, args, { cwd: work, stdio: "pipe" });
    const bundle = `b-${version}`;
    run("umoci", "new", "--image", `L:${version}`);
    run("umoci", "unpack", "--rootless", "--image", `L:${version}`, bundle);
    const r = join(work, bundle, "rootfs");
    await mkdir(join(r, "bin"), { recursive: true });
    await writeFile(join(r, "bin", "busybox"), readFileSync("/bin/busybox"), { mode: 0o755 });
    await symlink("busybox", join(r, "bin", "sh"));
    await mkdir(join(r, "etc"));
    await writeFile(join(r, "etc", "version"), `${version}\n`);
    await writeFile(join(r, "etc", `only-${version}`), "");
    run("umoci", "repack", "--image", `L:${version}`, bundle);
    run("umoci", "config", "--image", `L:${version}`, "--config.env", "PATH=/bin");
    run("skopeo", "copy", "--dest-tls-verify=false", `oci:L:${version}`, `docker://${registry.host}/t/app:t`);
  }

  beforeAll(async () => {
    registry = await startRegistry();
    front = await startFront(registry.host);
    work = await mkdtemp(join(tmpdir(), "pyro-oci-tag-"));
    execFileSync("umoci", ["init", "--layout", "L"], { cwd: work, stdio: "pipe" });
  }, 60_000);

  afterAll(async () => {
    await front?.stop();
    await registry?.stop();
    if (work) await rm(work, { recursive: true, force: true });
  });

  it("re-resolves a pulled tag: unchanged is a cache hit, moved is a new version; old workspaces keep theirs; offline uses the cached one with a warning", async () => {
    const envs = join(work, "envs");
    await mkdir(envs);
    const pyro = new Pyro({ home: await mkdtemp(join(work, "home-")), environmentsDir: envs });
    const ref = `${front.host}/t/app:t`;
    const blobGets = () => front.requests.filter((q) => q.method === "GET" && q.path.includes("/blobs/"));
    const cat = async (id: string) => (await pyro.execWorkspace(id, "cat /etc/version")).stdout;
    try {
      await pushVersion("A");
      const a = await pyro.pullEnvironment(ref);
      expect(a.built).toBe(true);
      const wsA = await pyro.createWorkspace({ environment: ref, backend: "bwrap" });
      expect(await cat(wsA.workspace_id)).toBe("A\n");

      // Unchanged tag: a HEAD of the manifest, no blob downloaded, nothing built.
      front.requests.length = 0;
      const same = await pyro.pullEnvironment(ref);
      expect(same).toMatchObject({ built: false, digest: a.digest, path: a.path });
      expect(blobGets()).toEqual([]);
      expect(front.requests.some((q) => q.method === "HEAD" && q.path.endsWith("/manifests/t"))).toBe(true);

      // The tag moves to B: a new version with B's digest, beside A's.
      await pushVersion("B");
      const b = await pyro.pullEnvironment(ref);
      expect(b.built).toBe(true);
      expect(b.digest).not.toBe(a.digest);
      expect(b.path).not.toBe(a.path);
      expect(existsSync(join(b.rootfs, "etc/only-B"))).toBe(true);
      expect((await pyro.inspectEnvironment(ref)).digest).toBe(b.digest);
      expect((await pyro.listEnvironments()).environments.find((e) => e.name === b.name)?.digest).toBe(
        b.digest,
      );

      const wsB = await pyro.createWorkspace({ environment: ref, backend: "bwrap" });
      expect(await cat(wsB.workspace_id)).toBe("B\n");
      expect(await cat(wsA.workspace_id)).toBe("A\n");
      expect(readFileSync(join(a.rootfs, "etc/version"), "utf8")).toBe("A\n");

      // Prune keeps A's version while a workspace uses it, removes it once none does.
      const kept = await pyro.pruneEnvironments();
      expect(kept.removed.map((r) => r.path)).not.toContain(a.path);
      expect(kept.kept_in_use).toContain(a.name);
      await pyro.deleteWorkspace(wsA.workspace_id);
      const pruned = await pyro.pruneEnvironments();
      expect(pruned.removed).toContainEqual(expect.objectContaining({ path: a.path, reason: "stale" }));
      expect(pruned.removed.map((r) => r.path)).not.toContain(b.path);
      expect(existsSync(join(b.rootfs, "etc/version"))).toBe(true);

      // The registry gone: the cached version, with a warning naming it; workspaces still start.
      await front.stop();
      const offline = await pyro.pullEnvironment(ref);
      expect(offline).toMatchObject({ built: false, digest: b.digest, path: b.path });
      expect(offline.warning).toMatch(/cannot reach registry .*using the version pulled at/);
      const wsOff = await pyro.createWorkspace({ environment: ref, backend: "bwrap" });
      expect(await cat(wsOff.workspace_id)).toBe("B\n");
      // A tag never pulled, offline: a structured error.
      await expect(pyro.pullEnvironment(`${front.host}/t/other:t`)).rejects.toMatchObject({
        code: "build_failed",
        message: expect.stringMatching(/cannot reach registry/),
      });
      await pyro.deleteWorkspace(wsOff.workspace_id);
      await pyro.deleteWorkspace(wsB.workspace_id);
    } finally {
      await pyro.close();
    }
  }, 300_000);
});
