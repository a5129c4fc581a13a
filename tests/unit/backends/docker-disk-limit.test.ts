import { describe, expect, it } from "vitest";
import {
  hostConfig,
  type InspectedHostConfig,
  unappliedSettings,
} from "../../../src/backends/docker/container.js";
import { rootQuotaOf, storageSize } from "../../../src/backends/docker/disk-limit.js";

/** A mountinfo line: `id parent dev root point options - fstype source superoptions`. */
const mount = (point: string, fstype: string, superOpts: string) =>
  `36 25 8:1 / ${point} rw,relatime - ${fstype} /dev/sda1 ${superOpts}`;

describe("docker disk limit: what the engine's storage driver can limit", () => {
  it("limits the root layer on btrfs (counting the image's data) and zfs", () => {
    expect(rootQuotaOf({ Driver: "btrfs" }, "")).toEqual({ ok: true, driver: "btrfs", countsImage: true });
    expect(rootQuotaOf({ Driver: "zfs" }, "")).toEqual({ ok: true, driver: "zfs", countsImage: false });
  });

  it("limits overlay2 only on an xfs data root mounted with project quotas", () => {
    const info = {
      Driver: "overlay2",
      DriverStatus: [["Backing Filesystem", "xfs"]] as [string, string][],
      DockerRootDir: "/var/lib/docker",
    };
    const table = (opts: string) => [mount("/", "ext4", "rw"), mount("/var/lib", "xfs", opts)].join("\n");
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
