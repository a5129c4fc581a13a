import { existsSync } from "node:fs";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { gvisorLayout } from "../../../src/backends/gvisor/backend.js";
import { PROBE_SCRIPT } from "../../../src/backends/gvisor/platform.js";
import {
  cgroupsPath,
  containerId,
  deleteArgv,
  HOST_TASKS_BASE,
  HOST_TASKS_PER_GUEST_PROCESS,
  hostPidsMax,
  killArgv,
  runArgv,
  stateArgv,
  sweepCgroups,
} from "../../../src/backends/gvisor/runsc.js";
import { BUSYBOX_TOOLS, launchArgv } from "../../../src/backends/linux/launch.js";

const G = { bin: "/usr/bin/runsc", root: "/w/sandbox/runsc" };

describe("runsc argv", () => {
  it("starts a sandbox in the foreground with no network, host-backed unix sockets and the probed platform", () => {
    expect(runArgv(G, "ptrace", "/w/sandbox/bundle", "ws_abc")).toEqual([
      "/usr/bin/runsc",
      "--root",
      "/w/sandbox/runsc",
      "--network=none",
      "--platform=ptrace",
      "--host-uds=all",
      "--cpu-num-from-quota",
      "run",
      "--bundle",
      "/w/sandbox/bundle",
      "ws_abc",
    ]);
    expect(runArgv(G, "systrap", "/b", "x")).toContain("--platform=systrap");
  });

  it("is exec'd by the launch step after the overlays are mounted, so runsc inherits them", () => {
    const l = gvisorLayout("/w/sandbox");
    const argv = launchArgv(
      [{ lower: "/env/rootfs", upper: l.rootUpper, work: l.rootWork, target: l.rootMerged }],
      runArgv({ bin: "/usr/bin/runsc", root: l.runscRoot }, "ptrace", l.bundle, "ws_abc"),
      BUSYBOX_TOOLS,
    );
    expect(argv.slice(0, 5)).toEqual(["unshare", "--mount", "--propagation", "private", "--"]);
    expect(argv.slice(-11)).toEqual(
      runArgv({ bin: "/usr/bin/runsc", root: l.runscRoot }, "ptrace", l.bundle, "ws_abc"),
    );
    expect(argv).toContain("/w/sandbox/mnt/root");
  });

  it("has state, kill and delete command lines on the same --root", () => {
    expect(stateArgv(G, "c")).toEqual(["/usr/bin/runsc", "--root", "/w/sandbox/runsc", "state", "c"]);
    expect(killArgv(G, "c")).toEqual([
      "/usr/bin/runsc",
      "--root",
      "/w/sandbox/runsc",
      "kill",
      "--all",
      "c",
      "KILL",
    ]);
    expect(deleteArgv(G, "c")).toEqual([
      "/usr/bin/runsc",
      "--root",
      "/w/sandbox/runsc",
      "delete",
      "--force",
      "c",
    ]);
  });

  it("keeps every sandbox file under the workspace's directory, the layers in the disk image", () => {
    for (const legacy of [false, true]) {
      const l = gvisorLayout("/w/sandbox", legacy);
      for (const [k, p] of Object.entries(l))
        if (k !== "legacy") expect(String(p).startsWith("/w/sandbox/"), k).toBe(true);
      expect(l.rootUpper.startsWith(legacy ? "/w/sandbox/root/" : `${l.diskMount}/`)).toBe(true);
      expect(l.wsWork.startsWith(legacy ? "/w/sandbox/ws/" : `${l.diskMount}/`)).toBe(true);
    }
  });

  it("makes container ids runsc accepts", () => {
    expect(containerId("ws_0123abcd")).toBe("ws_0123abcd");
    expect(containerId("run_1f")).toBe("run_1f");
    expect(containerId("_x/y")).toBe("pyro-_x-y");
  });

  it("probes with a command that succeeds on any working platform and detects the statx incompatibility", () => {
    expect(PROBE_SCRIPT).toContain("|| exit 0");
    expect(PROBE_SCRIPT).toContain("stat /");
  });
});

describe("host cgroup of a gVisor sandbox", () => {
  it("is pyro's own group, and its pids backstop leaves room for gVisor's threads beyond the guest's limit", () => {
    expect(cgroupsPath("pyro", "ws_abc")).toBe("/pyro/ws_abc");
    expect(hostPidsMax(1024)).toBe(1024 * HOST_TASKS_PER_GUEST_PROCESS + HOST_TASKS_BASE);
    expect(hostPidsMax(1)).toBeGreaterThan(HOST_TASKS_BASE);
  });

  let root = "";
  afterEach(async () => {
    if (root) await rm(root, { recursive: true, force: true });
  });

  it("sweeps the groups runsc left in other hierarchies, and nothing else", async () => {
    root = await mkdtemp(join(tmpdir(), "pyro-cg-"));
    // A fake tree: empty cgroup.procs files mark groups (rmdir of a real group ignores them).
    for (const c of ["blkio", "devices"]) await mkdir(join(root, c, "pyro", "ws_a"), { recursive: true });
    await mkdir(join(root, "blkio", "pyro", "ws_other"), { recursive: true });
    await writeFile(join(root, "devices", "pyro", "ws_a", "cgroup.procs"), "");
    const left = await sweepCgroups(root, "pyro", "ws_a", 100);
    // blkio/pyro/ws_a has no cgroup.procs: not a group, left alone; devices' is removable
    // only once empty (a plain directory with a file refuses rmdir, reported as left).
    expect(left).toEqual([expect.stringContaining(join(root, "devices", "pyro", "ws_a"))]);
    expect(existsSync(join(root, "blkio", "pyro", "ws_other"))).toBe(true);
    expect(existsSync(join(root, "blkio", "pyro", "ws_a"))).toBe(true);
  });
});
