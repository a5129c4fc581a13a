import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { templateKey } from "../../../src/backends/qemu/template.js";
import { checkDiskMib } from "../../../src/core/workspace-spec.js";
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
