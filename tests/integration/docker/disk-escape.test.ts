import { spawnSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mountsUnder } from "../../../src/util/mounts.js";
import { dockerSkipReason, type TestEngine, useTestEngine } from "../../helpers/docker.js";
import { type Harness, openHarness, suiteTitle } from "../../helpers/sandbox.js";

/**
 * Ways around the docker backend's disk limit (backends/docker/disk-limit.ts) that a
 * command inside a workspace tried, each of which once wrote past a 128 MiB limit onto
 * the engine's or the host's disk: a btrfs subvolume of its own (a qgroup the root
 * layer's limit does not count), the socket directory bound writable from the host, the
 * engine's /etc/hosts, /etc/hostname and /etc/resolv.conf (files in its data root), a
 * sparse file a snapshot or an export wrote in full on the host.
 */
const skip = dockerSkipReason();
const FULL = /No space left on device|Disk quota exceeded/;

describe.skipIf(skip !== "")(suiteTitle("disk limit escapes on docker", skip), () => {
  let engine: TestEngine;
  let h: Harness;
  let id: string;
  const dir = (ws: string) => join(h.home, "workspaces", ws);
  const sh = async (command: string) => h.pyro.execWorkspace(id, command, { timeoutSeconds: 60 });

  beforeAll(async () => {
    engine = await useTestEngine();
    h = await openHarness("docker-disk-escape", { backend: "docker" }, { env: engine.env });
    id = (await h.create({ diskMib: 128 })).workspace_id;
  }, 180_000);
  afterAll(async () => {
    await h?.cleanup();
    await engine?.release();
  });

  it("refuses the btrfs ioctls that make a subvolume, whose qgroup the root layer's limit would not count", {
    timeout: 120_000,
  }, async () => {
    // BTRFS_IOC_SUBVOL_CREATE on /root, as is and with high bits the kernel drops (its
    // request is an unsigned int): a subvolume took 400 MiB with a 128 MiB limit.
    const make = (request: string) =>
      `perl -e 'open(my $d, "<", "/root") or die; my $a = pack("q a4088", 0, "sub"); print ioctl($d, ${request}, $a) ? "made\\n" : "refused: $!\\n"'`;
    const r = await sh(`${make("0x5000940E")}; ${make("0xFFFFFFFF5000940E")}`);
    expect(r.stdout).toBe("refused: Operation not permitted\nrefused: Operation not permitted\n");
    const fill = await sh(
      "mkdir -p /root/sub && dd if=/dev/zero of=/root/sub/big bs=1M count=400; echo dd=$?",
    );
    expect(fill.stderr).toMatch(FULL);
    expect(fill.stdout).toContain("dd=1");
    await sh("rm -rf /root/sub");
  });

  it("keeps the socket directory, bound writable from the host, on a 1 MiB tmpfs", {
    timeout: 120_000,
  }, async () => {
    const r = await sh("dd if=/dev/zero of=/run/pyro/sock/big bs=1M count=200; echo dd=$?");
    expect(r.stderr).toMatch(/No space left on device/);
    expect(r.stdout).toContain("dd=1");
    expect(
      Number((await sh("stat -c %s /run/pyro/sock/big; rm /run/pyro/sock/big")).stdout),
    ).toBeLessThanOrEqual(1024 * 1024);
    // The agent still answers through it, and a restart empties it.
    await sh("head -c 1000 /dev/zero > /run/pyro/sock/left");
    await h.pyro.stopWorkspace(id);
    await h.pyro.startWorkspace(id);
    expect((await sh("ls /run/pyro/sock")).stdout.split("\n")).not.toContain("left");
  });

  it("keeps /etc/hosts, /etc/hostname and /etc/resolv.conf, bound writable, on /workspace's image", {
    timeout: 120_000,
  }, async () => {
    const before = await sh("getent hosts localhost; cat /etc/hostname; hostname");
    expect(before.stdout).toMatch(/^(127\.0\.0\.1|::1)\s+localhost/);
    const [, name, host] = before.stdout.trim().split("\n").slice(-3);
    expect(name).toBe(host);
    // The engine's own files were in its data root, outside the root layer's qgroup.
    for (const f of ["/etc/hosts", "/etc/resolv.conf", "/etc/hostname"]) {
      const r = await sh(`cp ${f} /root/keep && dd if=/dev/zero of=${f} bs=1M count=300; echo dd=$?`);
      expect(r.stderr, f).toMatch(FULL);
      expect(r.stdout, f).toContain("dd=1");
      await sh(`cat /root/keep > ${f}`);
    }
    // An edit is kept over a stop and a start, as the root layer's files are.
    await sh("echo '127.0.0.2 pinned.test' >> /etc/hosts");
    await h.pyro.stopWorkspace(id);
    await h.pyro.startWorkspace(id);
    expect((await sh("getent hosts pinned.test")).stdout).toMatch(/^127\.0\.0\.2\s+pinned\.test/);
  });

  it("gives a one-shot /etc/hosts, /etc/hostname and /etc/resolv.conf read-only, and leaves nothing of them", {
    timeout: 120_000,
  }, async () => {
    const r = await h.pyro.run(
      "debian:12",
      "getent hosts localhost; hostname; cat /etc/hostname; dd if=/dev/zero of=/etc/hosts bs=1M count=300; echo dd=$?",
      { backend: "docker", diskMib: 128 },
    );
    const [hosts, name, file, dd] = r.stdout.trim().split("\n");
    expect(hosts).toMatch(/^(127\.0\.0\.1|::1)\s+localhost/);
    expect(file).toBe(name);
    expect(dd).toBe("dd=1");
    expect(r.stderr).toMatch(/Read-only file system/);
    expect(readdirSync(join(h.home, "oneshot")).filter((n) => n.startsWith("run_"))).toEqual([]);
  });

  it("refuses a snapshot or an export whose sparse file the host would write past the disk limit", {
    timeout: 180_000,
  }, async () => {
    // No block in /workspace, 1 GiB on the host: a snapshot wrote it in full.
    await sh("truncate -s 1G /workspace/sparse && echo small > /workspace/ok.txt");
    const refused = { code: "conflict", message: expect.stringContaining("bytes of file data") };
    await expect(h.pyro.createSnapshot(id, "big")).rejects.toMatchObject(refused);
    expect((await h.pyro.listSnapshots(id)).snapshots.map((s) => s.snapshot_name)).toEqual(["baseline"]);
    expect(readdirSync(join(dir(id), "snapshots"))).toEqual(["baseline"]);
    const out = join(h.home, "exported");
    await expect(h.pyro.exportWorkspace(id, "/workspace", out)).rejects.toMatchObject(refused);
    // The refusal cancelled the agent's stream; the agent still serves.
    expect((await sh("cat /workspace/ok.txt")).stdout).toBe("small\n");
    await h.pyro.stopWorkspace(id);
    await expect(h.pyro.exportWorkspaceDisk(id, "/workspace", out)).rejects.toMatchObject(refused);
    expect(readdirSync(h.home).filter((n) => n === "exported" || n.startsWith(".pyro-export-"))).toEqual([]);
    // What fits is still copied.
    await h.pyro.exportWorkspaceDisk(id, "/workspace/ok.txt", out);
    expect(readFileSync(out, "utf8")).toBe("small\n");
    await h.pyro.startWorkspace(id);
    await sh("rm /workspace/sparse");
    expect((await h.pyro.createSnapshot(id, "fits")).snapshot_name).toBe("fits");
  });

  it("holds the root layer to the limit after the image's own files are deleted", {
    timeout: 120_000,
  }, async () => {
    // btrfs's referenced limit counts the image's files: deleting 176 MiB of them let
    // 279 MiB in with a 128 MiB limit. The exclusive limit counts what is written.
    const r = await sh(
      "rm -rf /usr/share /var/lib/apt /var/cache /usr/lib/x86_64-linux-gnu/perl* && sync && dd if=/dev/zero of=/root/more bs=1M count=400; echo dd=$?; stat -c %s /root/more",
    );
    expect(r.stderr).toMatch(FULL);
    const [dd, size] = r.stdout.trim().split("\n");
    expect(dd).toBe("dd=1");
    expect(Number(size)).toBeLessThanOrEqual(128 * 1024 * 1024);
    await sh("rm -f /root/more");
  });

  it("holds a one-shot's root layer to the limit after the image's own files are deleted", {
    timeout: 120_000,
  }, async () => {
    const r = await h.pyro.run(
      "debian:12",
      "rm -rf /usr/share /var/lib/apt /var/cache && sync && dd if=/dev/zero of=/root/more bs=1M count=400; echo dd=$?; stat -c %s /root/more",
      { backend: "docker", diskMib: 128 },
    );
    expect(r.stderr).toMatch(FULL);
    const [dd, size] = r.stdout.trim().split("\n");
    expect(dd).toBe("dd=1");
    expect(Number(size)).toBeLessThanOrEqual(128 * 1024 * 1024);
  });

  it("mounts only /workspace's image and the socket tmpfs below the workspace, both nosuid and nodev; a delete leaves none", {
    timeout: 120_000,
  }, async () => {
    const sandbox = join(dir(id), "sandbox");
    const points = await mountsUnder(dir(id));
    expect(points.sort()).toEqual([join(sandbox, "sockfs"), join(sandbox, "ws", "disk")]);
    for (const point of points) {
      const line = spawnSync("findmnt", ["-n", "-o", "OPTIONS", "--mountpoint", point], { encoding: "utf8" });
      expect(line.stdout).toMatch(/(^|,)nosuid(,|$)/m);
      expect(line.stdout).toMatch(/(^|,)nodev(,|$)/m);
    }
    await h.pyro.deleteWorkspace(id);
    expect(await mountsUnder(dir(id))).toEqual([]);
  });
});
