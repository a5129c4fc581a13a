/**
 * Against a real Firecracker: runs only where the probe says the backend works (a
 * firecracker binary and KVM that runs guests). Every test here is skipped with the
 * reason otherwise; none of them can pass without doing the real thing.
 */
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AgentClient } from "../../../src/agent/client.js";
import type { SandboxSpec } from "../../../src/backends/backend.js";
import { FirecrackerBackend } from "../../../src/backends/firecracker/backend.js";
import { firecrackerProbe } from "../../../src/backends/firecracker/probe.js";
import { killVm, launchVm, spawnFirecracker } from "../../../src/backends/firecracker/vm.js";
import { AGENT_ENTRY } from "../../../src/backends/guest.js";
import { kvmCheck } from "../../../src/backends/kvm.js";
import { loadConfig } from "../../../src/core/config.js";
import { REPO_ROOT } from "../../helpers/cli.js";
import { ENV_CACHE } from "../../helpers/sandbox.js";

const scratch = await mkdtemp(join(tmpdir(), "pyro-fc-real-probe-"));
const probe = await firecrackerProbe
  .probe({
    env: process.env,
    settings: { firecrackerBin: loadConfig().firecrackerBin },
    scratchDir: scratch,
    timeoutMs: 20_000,
    kvm: kvmCheck(process.env, 20_000),
  })
  .finally(() => rm(scratch, { recursive: true, force: true }));
const bin = typeof probe.details.path === "string" ? probe.details.path : null;
const noFirecracker = probe.available && bin ? "" : (probe.reason ?? "the firecracker probe failed");

/** A debian:12 environment from the shared cache, and the built agent: what a real workspace needs. */
async function workspaceSkip(): Promise<{ reason: string; rootfs: string }> {
  if (noFirecracker) return { reason: noFirecracker, rootfs: "" };
  const cache = ENV_CACHE;
  const entry = (await readdir(cache).catch(() => [] as string[])).find(
    (e) => e.startsWith("debian_12@") || e.startsWith("debian:12@"),
  );
  if (!entry) return { reason: `no debian:12 environment in ${cache}`, rootfs: "" };
  if (!existsSync(join(REPO_ROOT, AGENT_ENTRY)))
    return { reason: "the agent is not built (npm run build)", rootfs: "" };
  return { reason: "", rootfs: join(cache, entry, "rootfs") };
}
const ws = await workspaceSkip();

describe.skipIf(noFirecracker !== "")(
  `real Firecracker API${noFirecracker ? ` (skipped: ${noFirecracker})` : ""}`,
  () => {
    let dir: string;
    beforeAll(async () => {
      dir = await mkdtemp(join(tmpdir(), "pyro-fc-real-"));
    });
    afterAll(async () => {
      await rm(dir, { recursive: true, force: true });
    });

    it("accepts the pre-boot configuration with relative drive paths and reports faults in fault_message", async () => {
      await writeFile(join(dir, "env.img"), Buffer.alloc(1024 * 1024));
      const vm = await launchVm(bin!, dir, spawnFirecracker);
      try {
        await vm.api.putMachineConfig({ vcpu_count: 1, mem_size_mib: 128, smt: false });
        await vm.api.putDrive("pyro_env", {
          drive_id: "pyro_env",
          path_on_host: "env.img",
          is_root_device: false,
          is_read_only: true,
        });
        await vm.api.putVsock({ guest_cid: 3, uds_path: "vsock.sock" });
        await expect(
          vm.api.putDrive("pyro_missing", {
            drive_id: "pyro_missing",
            path_on_host: "missing.img",
            is_root_device: false,
            is_read_only: true,
          }),
        ).rejects.toMatchObject({
          code: "backend_unavailable",
          message: expect.stringMatching(/^firecracker API PUT \/drives\/pyro_missing: .+/),
        });
        // A hyphen is not allowed in ids, which is why drive ids are not the virtio serials.
        await expect(
          vm.api.putDrive("pyro-env", {
            drive_id: "pyro-env",
            path_on_host: "env.img",
            is_root_device: false,
            is_read_only: true,
          }),
        ).rejects.toMatchObject({ code: "backend_unavailable" });
      } finally {
        await killVm(vm.pid, vm.startTime);
      }
    });
  },
);

describe.skipIf(ws.reason !== "")(
  `real Firecracker workspace${ws.reason ? ` (skipped: ${ws.reason})` : ""}`,
  () => {
    let home: string;
    beforeAll(async () => {
      home = await mkdtemp(join(tmpdir(), "pyro-fc-real-ws-"));
    });
    afterAll(async () => {
      await rm(home, { recursive: true, force: true });
    });

    function spec(id: string): SandboxSpec {
      return {
        workspace_id: id,
        dir: join(home, id),
        rootfs: ws.rootfs,
        snapshotsDir: join(home, `${id}-snapshots`),
        snapshot: "initial",
        limits: { vcpus: 1, memory_mib: 512, pids_max: 512 },
        appDir: REPO_ROOT,
        runtimeCacheDir: join(home, "runtime"),
      };
    }

    async function run(
      b: FirecrackerBackend,
      st: Awaited<ReturnType<FirecrackerBackend["start"]>>,
      command: string,
    ) {
      const client = await AgentClient.connect(await b.connect(st), { timeoutMs: 10_000 });
      try {
        return await client.request("exec", { command, timeout_ms: 30_000, max_output_bytes: 65536 });
      } finally {
        client.close();
      }
    }

    it("boots from a template, serves /workspace from the seed, keeps writes across stop/start, and restores a second workspace", async () => {
      // The binary the probe found (PYRO_FIRECRACKER_BIN or PATH), as the engine passes it.
      const b = new FirecrackerBackend({ templatesDir: join(home, "templates"), ...(bin ? { bin } : {}) });
      const s1 = spec("ws_fcreal1");
      const s2 = spec("ws_fcreal2");
      for (const s of [s1, s2]) {
        await mkdir(join(s.snapshotsDir, "initial"), { recursive: true });
        await writeFile(join(s.snapshotsDir, "initial", "hello.txt"), `hello from ${s.workspace_id}\n`);
      }
      const st1 = await b.start(s1);
      try {
        expect(st1.boot, String(st1.fast_start_skipped)).toBe("snapshot");
        expect((await run(b, st1, "cat /workspace/hello.txt")).stdout).toBe("hello from ws_fcreal1\n");
        await run(b, st1, "echo kept > /workspace/new.txt");

        const st2 = await b.start(s2);
        expect(st2.boot).toBe("snapshot");
        expect((await run(b, st2, "cat /workspace/hello.txt; ls /workspace")).stdout).toBe(
          "hello from ws_fcreal2\nhello.txt\n",
        );
        await b.destroy(s2, st2);

        await b.stop(st1);
        const st1b = await b.start(s1);
        expect(st1b.boot).toBe("cold");
        expect((await run(b, st1b, "cat /workspace/new.txt")).stdout).toBe("kept\n");
        await b.destroy(s1, st1b);
      } finally {
        await b.destroy(s1, st1).catch(() => {});
      }
    }, 600_000);
  },
);
