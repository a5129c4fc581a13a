/**
 * A workspace on a pulled image, on every real backend: the image (busybox, made with
 * umoci, pushed with skopeo to a real registry on loopback) has no Node and no libc the
 * agent could use; the agent is injected as for every environment. The image's Env is
 * the workspace's base env, and its files are the root filesystem (host-compat runs on
 * the host's filesystem by definition: only the env is checked there).
 */
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { mkdir, mkdtemp, readdir, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { BackendName } from "../../../src/backends/backend.js";
import { Pyro } from "../../../src/sdk/pyro.js";
import { type Registry, registrySkipReason, startRegistry } from "../../helpers/registry.js";
import { ENV_CACHE } from "../../helpers/sandbox.js";
import { parityTargets } from "../../parity/backends.js";

const skip = await registrySkipReason();
const targets = parityTargets().filter((t) => t.real);

describe.skipIf(skip !== null)(`a workspace on a pulled image${skip ? ` (skipped: ${skip})` : ""}`, () => {
  let registry: Registry;
  let work: string;
  let envs: string;
  let ref: string;

  beforeAll(async () => {
    registry = await startRegistry();
    work = await mkdtemp(join(tmpdir(), "pyro-oci-ws-"));
    const run = (cmd: string, ...args: string[]) => execFileSync(cmd, args, { cwd: work, stdio: "pipe" });
    run("umoci", "init", "--layout", "L");
    run("umoci", "new", "--image", "L:img");
    run("umoci", "unpack", "--rootless", "--image", "L:img", "b");
    const r = join(work, "b", "rootfs");
    await mkdir(join(r, "bin"), { recursive: true });
    await writeFile(join(r, "bin", "busybox"), readFileSync("/bin/busybox"), { mode: 0o755 });
    await symlink("busybox", join(r, "bin", "sh"));
    await mkdir(join(r, "etc"));
    await writeFile(join(r, "etc", "image-marker"), "from the pulled image\n");
    run("umoci", "repack", "--image", "L:img", "b");
    run(
      "umoci",
      "config",
      "--image",
      "L:img",
      "--config.env",
      "PATH=/bin",
      "--config.env",
      "GREETING=hello-from-image",
    );
    run("skopeo", "copy", "--dest-tls-verify=false", "oci:L:img", `docker://${registry.host}/t/busybox:1`);
    ref = `${registry.host}/t/busybox:1`;
    // Its own environment cache (the registry's port is new every run), sharing the VM
    // artifacts (kernel, initramfs, agent disk) of the suite's cache.
    envs = join(work, "envs");
    await mkdir(envs);
    await symlink(join(ENV_CACHE, ".vm"), join(envs, ".vm"));
  }, 60_000);

  afterAll(async () => {
    await registry?.stop();
    // The disk image qemu made of this run's environment.
    for (const f of await readdir(join(ENV_CACHE, ".vm")).catch(() => [] as string[]))
      if (f.startsWith("env-127.0.0.1_")) await rm(join(ENV_CACHE, ".vm", f), { force: true });
    if (work) await rm(work, { recursive: true, force: true });
  });

  const bwrap = targets.find((t) => t.backend === "bwrap");
  it.skipIf(bwrap?.skip !== "")(
    "prune --all keeps an environment a workspace uses, removes it and its layers once no workspace does",
    async () => {
      // A cache of its own, so pruning it touches nothing shared.
      const own = join(work, "prune-envs");
      await mkdir(own);
      const pyro = new Pyro({ home: await mkdtemp(join(work, "home-prune-")), environmentsDir: own });
      try {
        const pulled = await pyro.pullEnvironment(ref);
        const ws = await pyro.createWorkspace({ environment: ref, backend: "bwrap" });
        const kept = await pyro.pruneEnvironments({ all: true });
        expect(kept.kept_in_use).toEqual([pulled.name]);
        expect(kept.removed.map((r) => r.path)).not.toContain(pulled.path);
        expect((await readdir(join(own, ".oci/blobs/sha256"))).length).toBeGreaterThan(0);
        expect(
          (await pyro.listEnvironments()).environments.find((e) => e.name === pulled.name),
        ).toMatchObject({
          kind: "pulled",
          status: "cached",
        });
        await pyro.deleteWorkspace(ws.workspace_id);
        const gone = await pyro.pruneEnvironments({ all: true });
        expect(gone.kept_in_use).toEqual([]);
        expect(gone.removed.map((r) => r.path)).toContain(pulled.path);
        expect(gone.removed.some((r) => r.reason === "unused_layer")).toBe(true);
        expect(await readdir(join(own, ".oci/blobs/sha256"))).toEqual([]);
      } finally {
        await pyro.close();
      }
    },
    120_000,
  );

  for (const t of targets) {
    it.skipIf(t.skip !== "")(
      `runs commands in the image on ${t.label}${t.skip ? ` (skipped: ${t.skip})` : ""}`,
      async () => {
        const home = await mkdtemp(join(work, `home-${t.backend}-`));
        const env = {
          ...process.env,
          ...(t.backend === "docker"
            ? { DOCKER_HOST: process.env.DOCKER_HOST ?? "unix:///var/cache/pyro-ci/docker/docker.sock" }
            : {}),
        };
        const pyro = new Pyro({ home, environmentsDir: envs, env });
        try {
          const ws = await pyro.createWorkspace({
            environment: ref,
            backend: t.backend as BackendName,
            ...(t.backend === "host" ? { allowHostCompat: true } : {}),
          });
          const r = await pyro.execWorkspace(
            ws.workspace_id,
            'echo "$GREETING"; cat /etc/image-marker; ls /usr/bin/apt 2>&1 | head -1',
          );
          expect(r.exit_code).toBe(0);
          const lines = r.stdout.split("\n");
          expect(lines[0]).toBe("hello-from-image");
          if (t.backend !== "host") {
            expect(lines[1]).toBe("from the pulled image");
            // Nothing of Debian's: the root is the image's.
            expect(lines[2]).toContain("No such file");
          }
          await pyro.deleteWorkspace(ws.workspace_id);
          // A one-shot run on the image gets its Env too (bwrap and gVisor run it as the
          // sandbox's only process; the others through a throwaway workspace).
          const one = await pyro.run(ref, 'echo "$GREETING"', {
            backend: t.backend as BackendName,
            ...(t.backend === "host" ? { allowHostCompat: true } : {}),
          });
          expect(one.stdout).toBe("hello-from-image\n");
        } finally {
          await pyro.close();
        }
      },
      300_000,
    );
  }
});
