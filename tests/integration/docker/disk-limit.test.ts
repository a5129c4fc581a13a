import { spawnSync } from "node:child_process";
import { statSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { renderDoctor } from "../../../src/cli/commands/doctor.js";
import { mountsUnder } from "../../../src/util/mounts.js";
import { dockerSkipReason, type TestEngine, useTestEngine } from "../../helpers/docker.js";
import { type Harness, openHarness, suiteTitle } from "../../helpers/sandbox.js";

/**
 * The disk limit on docker (backends/docker/disk-limit.ts; docs/workspaces.md "Disk
 * limit"): the root layer limited by the engine's storage driver (the tests' engine is on
 * btrfs, scripts/dockerd-test), /workspace on an ext4 image pyro mounts on the host. A
 * command that fills either gets an error, the host keeps its space, the workspace stays
 * usable, and nothing of the image outlives the workspace.
 */
const skip = dockerSkipReason();
const FULL = /No space left on device|Disk quota exceeded/;

describe.skipIf(skip !== "")(suiteTitle("disk limit on docker", skip), () => {
  let engine: TestEngine;
  let h: Harness;
  let id: string;
  const dir = (ws: string) => join(h.home, "workspaces", ws);
  const sh = async (ws: string, command: string) => h.pyro.execWorkspace(ws, command, { timeoutSeconds: 60 });
  /** /workspace's size in KiB as the workspace's `df` says it. */
  const workspaceKib = async (ws: string) =>
    Number((await sh(ws, "df -k --output=size /workspace | tail -1")).stdout.trim());

  beforeAll(async () => {
    engine = await useTestEngine();
    h = await openHarness("docker-disk", { backend: "docker" }, { env: engine.env });
    id = (await h.create({ diskMib: 128 })).workspace_id;
  }, 180_000);
  afterAll(async () => {
    await h?.cleanup();
    await engine?.release();
  });

  it("fills /workspace and the root layer only to the limit: an error inside, the host's space kept, the workspace usable", {
    timeout: 120_000,
  }, async () => {
    expect((await h.pyro.getWorkspace(id)).limits).toMatchObject({ disk_mib: 128 });
    // What the host's disk holds of /workspace: its image's allocated blocks (the files
    // below the image's mount point are inside it).
    const image = join(dir(id), "sandbox", "ws", "disk.img");
    const allocated = () => statSync(image).blocks * 512;
    const before = allocated();
    const ws = await sh(id, "dd if=/dev/zero of=/workspace/big bs=1M count=400; echo dd=$?");
    expect(ws.stderr).toMatch(/No space left on device/);
    expect(ws.stdout).toContain("dd=1");
    // /workspace's image grew by at most its size.
    expect(allocated() - before).toBeGreaterThan(64 * 1024 * 1024);
    expect(allocated() - before).toBeLessThan(130 * 1024 * 1024);
    // The root layer (the engine's btrfs qgroup): outside /workspace, the same limit.
    const root = await sh(id, "dd if=/dev/zero of=/root/big bs=1M count=400; echo dd=$?");
    expect(root.stderr).toMatch(FULL);
    expect(root.stdout).toContain("dd=1");
    const written = Number((await sh(id, "stat -c %s /root/big")).stdout.trim());
    expect(written).toBeGreaterThan(32 * 1024 * 1024);
    expect(written).toBeLessThanOrEqual(128 * 1024 * 1024);
    const after = await sh(
      id,
      "rm /workspace/big /root/big && echo fine > /workspace/ok.txt && cat /workspace/ok.txt",
    );
    expect(after.stdout).toBe("fine\n");
  });

  it("is reported by doctor: the engine's driver, and the limit of every other available backend", {
    timeout: 120_000,
  }, async () => {
    const r = await h.pyro.doctor();
    expect(r.disk_limit.docker).toBe("yes (storage driver btrfs, /workspace on an image)");
    expect(r.disk_limit.bwrap).toMatch(/^yes/);
    expect(renderDoctor(r)).toMatch(/disk limit:\n(.*\n)*\s+docker\s+yes \(storage driver btrfs/);
  });

  it("mounts /workspace's image on the host nosuid and nodev, and only below the workspace's directory", async () => {
    const points = await mountsUnder(dir(id));
    // The socket directory's tmpfs is the other (disk-escape.test.ts).
    expect(points).toEqual([join(dir(id), "sandbox", "ws", "disk"), join(dir(id), "sandbox", "sockfs")]);
    const line = spawnSync("findmnt", ["-n", "-o", "FSTYPE,OPTIONS", "--mountpoint", points[0]!], {
      encoding: "utf8",
    }).stdout;
    expect(line).toMatch(/^ext4\s/);
    expect(line).toMatch(/(^|[\s,])nosuid(,|$)/);
    expect(line).toMatch(/(^|[\s,])nodev(,|$)/);
    // A set-uid file a command makes in /workspace lands on the host with its bit: the
    // nosuid mount above is what keeps it inert there.
    await sh(id, "cp /bin/true /workspace/suid && chmod u+s /workspace/suid");
    expect(statSync(join(points[0]!, "upper", "suid")).mode & 0o4000).toBe(0o4000);
  });

  it("keeps the files and the limit over a stop and a start, remounting the image if it was unmounted", {
    timeout: 120_000,
  }, async () => {
    await sh(id, "echo kept > /workspace/kept.txt && echo root > /etc/kept");
    await h.pyro.stopWorkspace(id);
    // As after a reboot: the image no longer mounted. A disk read and a start mount it again.
    const [point] = await mountsUnder(dir(id));
    expect(spawnSync("umount", [point!]).status).toBe(0);
    expect((await h.pyro.readWorkspaceDisk(id, "kept.txt")).content).toBe("kept\n");
    await h.pyro.startWorkspace(id);
    expect((await sh(id, "cat /workspace/kept.txt /etc/kept")).stdout).toBe("kept\nroot\n");
    expect(await workspaceKib(id)).toBeLessThanOrEqual(128 * 1024);
  });

  it("starts a reset from a fresh image with the same limit, and a delete leaves no mount or loop device", {
    timeout: 120_000,
  }, async () => {
    await sh(id, "dd if=/dev/zero of=/workspace/fill bs=1M count=64");
    await h.pyro.resetWorkspace(id);
    expect((await sh(id, "ls /workspace; df -k --output=used /workspace | tail -1")).stdout).not.toContain(
      "fill",
    );
    expect(await workspaceKib(id)).toBeLessThanOrEqual(128 * 1024);
    const images = spawnSync("losetup", ["-j", join(dir(id), "sandbox", "ws", "disk.img")], {
      encoding: "utf8",
    });
    expect(images.stdout).toContain("disk.img");
    await h.pyro.deleteWorkspace(id);
    expect(await mountsUnder(dir(id))).toEqual([]);
    expect(spawnSync("losetup", ["-a"], { encoding: "utf8" }).stdout).not.toContain(dir(id));
  });

  it("gives one-shots the root layer's limit", { timeout: 120_000 }, async () => {
    const r = await h.pyro.run("debian:12", "dd if=/dev/zero of=/tmp/big bs=1M count=400; echo dd=$?", {
      backend: "docker",
      diskMib: 128,
    });
    expect(r.stderr).toMatch(FULL);
    expect(r.stdout).toContain("dd=1");
  });
});
