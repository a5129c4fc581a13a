import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import {
  hostConfig,
  type InspectedHostConfig,
  unappliedSettings,
} from "../../../src/backends/docker/container.js";
import { rootQuotaOf, storageSize } from "../../../src/backends/docker/disk-limit.js";
import { type BtrfsQuota, readBtrfsQuota } from "../../../src/backends/docker/storage-quota.js";

/** A mountinfo line: `id parent dev root point options - fstype source superoptions`. */
const mount = (point: string, fstype: string, superOpts: string) =>
  `36 25 8:1 / ${point} rw,relatime - ${fstype} /dev/sda1 ${superOpts}`;

describe("docker disk limit: what the engine's storage driver can limit", () => {
  it("limits the root layer on btrfs (counting the image's data) and zfs", () => {
    // btrfs whose quota state cannot be read: whether a limit would hold cannot be told.
    expect(rootQuotaOf({ Driver: "btrfs" }, "")).toMatchObject({
      ok: false,
      message: expect.stringMatching(/cannot be read/),
    });
    expect(rootQuotaOf({ Driver: "zfs" }, "")).toEqual({ ok: true, driver: "zfs", countsImage: false });
  });

  it("limits btrfs by its quota accounting: simple quotas count only the layer's writes, full qgroups its image too, off or inconsistent is refused", () => {
    const info = { Driver: "btrfs", DockerRootDir: "/var/lib/docker" };
    const table = mount("/var/lib/docker", "btrfs", "rw,space_cache=v2");
    const seen: string[] = [];
    const quota = (q: BtrfsQuota | null) => (device: string) => {
      seen.push(device);
      return q;
    };
    expect(rootQuotaOf(info, table, quota({ mode: "squota", inconsistent: false }))).toEqual({
      ok: true,
      driver: "btrfs",
      countsImage: false,
    });
    expect(seen).toEqual(["/dev/sda1"]);
    expect(rootQuotaOf(info, table, quota({ mode: "qgroup", inconsistent: false }))).toMatchObject({
      ok: true,
      countsImage: true,
    });
    const stale = rootQuotaOf(info, table, quota({ mode: "qgroup", inconsistent: true }));
    expect(stale).toMatchObject({ ok: false, message: expect.stringMatching(/inconsistent/) });
    expect(stale.ok ? "" : stale.hint).toBe("run btrfs quota rescan -w /var/lib/docker");
    expect(rootQuotaOf(info, table, quota({ mode: "off", inconsistent: false }))).toMatchObject({
      ok: false,
      message: expect.stringMatching(/quotas are off/),
    });
  });

  it("reads a btrfs filesystem's quota accounting from sysfs by its device", async () => {
    const sys = await mkdtemp(join(tmpdir(), "pyro-sysfs-"));
    const fs = async (uuid: string, device: string, files: Record<string, string> | null) => {
      await mkdir(join(sys, uuid, "devices", device), { recursive: true });
      if (files) {
        await mkdir(join(sys, uuid, "qgroups"), { recursive: true });
        for (const [f, v] of Object.entries(files)) await writeFile(join(sys, uuid, "qgroups", f), `${v}\n`);
      }
    };
    await fs("aaaa", "loop3", { mode: "squota", inconsistent: "0" });
    await fs("bbbb", "loop4", { mode: "qgroup", inconsistent: "1" });
    await fs("cccc", "loop5", null);
    await mkdir(join(sys, "features"));
    expect(readBtrfsQuota("/dev/loop3", sys)).toEqual({ mode: "squota", inconsistent: false });
    expect(readBtrfsQuota("/dev/loop4", sys)).toEqual({ mode: "qgroup", inconsistent: true });
    expect(readBtrfsQuota("/dev/loop5", sys)).toEqual({ mode: "off", inconsistent: false });
    expect(readBtrfsQuota("/dev/loop9", sys)).toBeNull();
    await rm(sys, { recursive: true });
  });

  it("limits overlay2 only on an xfs data root mounted with project quotas", () => {
    const info = {
      Driver: "overlay2",
      DriverStatus: [["Backing Filesystem", "xfs"]] as [string, string][],
      DockerRootDir: "/var/lib/docker",
    };
    const table = (opts: string) => [mount("/", "ext4", "rw"), mount("/var/lib", "xfs", opts)].join("\n");
    // A data root whose path mountinfo escapes (a space is \040).
    const spaced = { ...info, DockerRootDir: "/srv/docker data/root" };
    expect(rootQuotaOf(spaced, mount("/srv/docker\\040data", "xfs", "rw,prjquota"))).toMatchObject({
      ok: true,
    });
    expect(rootQuotaOf(info, table("rw,attr2,inode64,prjquota"))).toMatchObject({
      ok: true,
      countsImage: false,
    });
    expect(rootQuotaOf(info, table("rw,attr2,inode64,noquota"))).toMatchObject({ ok: false });
  });

  it("says why not on the usual overlay2 over ext4, an unknown driver and a rootless engine", () => {
    const ext4 = rootQuotaOf({ Driver: "overlay2", DriverStatus: [["Backing Filesystem", "extfs"]] }, "");
    expect(ext4).toMatchObject({
      ok: false,
      message: expect.stringMatching(/\(overlay2 on extfs\) cannot limit/),
    });
    expect(ext4.ok ? "" : ext4.hint).toMatch(/btrfs/);
    expect(rootQuotaOf({}, "")).toMatchObject({ ok: false, message: expect.stringMatching(/unknown/) });
    expect(
      rootQuotaOf(
        { Driver: "btrfs", SecurityOptions: ["name=seccomp,profile=builtin", "name=rootless"] },
        "",
      ),
    ).toMatchObject({ ok: false, message: expect.stringMatching(/rootless/) });
  });

  it("sizes the root layer: the image's own size added where the quota counts it", async () => {
    const docker = {
      getImage: (ref: string) => ({
        inspect: async () => (ref === "pyro-env:a" ? { Size: 1000 } : undefined),
      }),
    } as never;
    const MiB = 1024 * 1024;
    expect(
      await storageSize(docker, { ok: true, driver: "btrfs", countsImage: true }, "pyro-env:a", 128),
    ).toBe(String(1000 + 128 * MiB));
    expect(
      await storageSize(docker, { ok: true, driver: "zfs", countsImage: false }, "pyro-env:a", 128),
    ).toBe(String(128 * MiB));
    // An adopted spare's committed root layer: the environment's image is measured instead.
    expect(
      await storageSize(
        docker,
        { ok: true, driver: "btrfs", countsImage: true },
        "pyro-root:x",
        64,
        "pyro-env:a",
      ),
    ).toBe(String(1000 + 64 * MiB));
  });

  it("asks the engine for the size and refuses a container it made without it (fail closed)", () => {
    const asked = hostConfig({ vcpus: 1, memory_mib: 256, pids_max: 64 }, [], "134217728");
    expect(asked.StorageOpt).toEqual({ size: "134217728" });
    expect(hostConfig({ vcpus: 1, memory_mib: 256, pids_max: 64 }, []).StorageOpt).toBeUndefined();
    const got = (storage: Record<string, string> | null): InspectedHostConfig => ({
      NetworkMode: asked.NetworkMode,
      Init: true,
      Memory: asked.Memory,
      MemorySwap: asked.MemorySwap,
      NanoCpus: asked.NanoCpus,
      PidsLimit: asked.PidsLimit,
      CapDrop: ["ALL"],
      SecurityOpt: asked.SecurityOpt,
      ReadonlyPaths: asked.ReadonlyPaths,
      StorageOpt: storage,
    });
    expect(unappliedSettings(asked, got({ size: "134217728" }))).toEqual([]);
    expect(unappliedSettings(asked, got(null)).join()).toMatch(/disk limit/);
    expect(unappliedSettings(asked, got({ size: "1" })).join()).toMatch(/disk limit/);
  });
});
