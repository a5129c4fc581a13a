import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { templateKey } from "../../../src/backends/qemu/template.js";
import { workspaceView } from "../../../src/core/views.js";
import { checkDiskMib, resolveDisk, sandboxDiskMib } from "../../../src/core/workspace-spec.js";
import type { WorkspaceRow } from "../../../src/state/types.js";
import { codeOf, fakePyro } from "../../helpers/engine.js";

let t: Awaited<ReturnType<typeof fakePyro>>;
beforeEach(async () => {
  t = await fakePyro();
});
afterEach(async () => {
  await t.cleanup();
});

describe("disk limits", () => {
  it("refuses a disk limit out of range, or on a backend that cannot enforce it, before anything is made", async () => {
    expect(await codeOf(t.pyro.createWorkspace({ diskMib: 10 }))).toBe("invalid_argument");
    expect(await codeOf(t.pyro.createWorkspace({ diskMib: 1.5 }))).toBe("invalid_argument");
    expect(await codeOf(t.pyro.createWorkspace({ diskMib: 2 ** 40 }))).toBe("invalid_argument");
    expect((await t.pyro.listWorkspaces()).count).toBe(0);
    expect(checkDiskMib(256, "bwrap")).toBe(256);
    expect(checkDiskMib(256, "qemu")).toBe(256);
    expect(checkDiskMib(undefined, "docker")).toBe(10 * 1024);
    expect(() => checkDiskMib(256, "docker")).toThrow(/cannot limit disk use/);
    expect(() => checkDiskMib(256, "host")).toThrow(/cannot limit disk use/);
  });

  it("asks a backend whose limit depends on the host (docker): the default where it can, none where it cannot, an explicit limit refused there", async () => {
    const docker = (why: { message: string; hint: string } | null) => ({
      name: "docker" as const,
      diskLimitSupport: async () => why,
    });
    const cannot = docker({
      message: "the engine's storage driver (overlay2 on extfs) cannot",
      hint: "use btrfs",
    });
    expect(await resolveDisk(undefined, docker(null))).toEqual({ disk_mib: 10 * 1024, enforced: true });
    expect(await resolveDisk(256, docker(null))).toEqual({ disk_mib: 256, enforced: true });
    expect(await resolveDisk(undefined, cannot)).toEqual({});
    const refused = await resolveDisk(256, cannot).catch(
      (e: unknown) => e as { code: string; message: string },
    );
    expect(refused).toMatchObject({
      code: "backend_unavailable",
      message: expect.stringMatching(/overlay2 on extfs/),
    });
    // A bad value is refused as such, whatever the engine can do.
    expect(await codeOf(resolveDisk(10, docker(null)))).toBe("invalid_argument");
    // Backends that always limit, or never do, are not asked.
    expect(await resolveDisk(undefined, { name: "bwrap" })).toEqual({ disk_mib: 10 * 1024 });
    expect(await codeOf(resolveDisk(256, { name: "host" }))).toBe("backend_unavailable");
  });

  it("starts and shows a docker workspace with the limit only when it was applied at create", () => {
    const row = (spec: Partial<WorkspaceRow["spec"]>, backend: WorkspaceRow["backend"] = "docker") =>
      ({
        backend,
        spec: { vcpus: 1, memory_mib: 256, env: {}, timeout_seconds: 300, ...spec },
      }) as WorkspaceRow;
    expect(sandboxDiskMib(row({ disk_mib: 256, disk_enforced: true }))).toBe(256);
    // Made before docker had a limit (its default recorded, never applied), or on an engine that cannot.
    expect(sandboxDiskMib(row({ disk_mib: 10240 }))).toBeUndefined();
    expect(sandboxDiskMib(row({}))).toBeUndefined();
    expect(sandboxDiskMib(row({}, "bwrap"))).toBe(10 * 1024);
    const view = (w: WorkspaceRow) =>
      workspaceView({ ...w, labels: {}, secret_refs: [], runtime: {} } as WorkspaceRow, "guest_agent").limits
        .disk_mib;
    expect(view(row({ disk_mib: 256, disk_enforced: true }))).toBe(256);
    expect(view(row({ disk_mib: 10240 }))).toBeNull();
  });

  it("qemu: each disk size has its own VM template (the saved state has that filesystem mounted)", () => {
    const shape = {
      qemu: "/usr/bin/qemu-system-x86_64",
      qemuVersion: "7.2",
      accel: "tcg" as const,
      vcpus: 1,
      memoryMib: 1024,
      artifacts: { image: "k", envDisk: "e", agentDisk: "a", cmdline: "c" } as never,
    };
    expect(templateKey({ ...shape, diskMib: 128 })).not.toBe(templateKey({ ...shape, diskMib: 10240 }));
    expect(templateKey({ ...shape, diskMib: 128 })).toBe(templateKey({ ...shape, diskMib: 128 }));
  });
});
