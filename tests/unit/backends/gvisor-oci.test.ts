import { describe, expect, it } from "vitest";
import {
  GVISOR_IN_SANDBOX,
  HOSTNAME_HELPER_IN_SANDBOX,
  INIT_SCRIPT,
  oneShotConfig,
  workspaceConfig,
} from "../../../src/backends/gvisor/oci.js";

const LIMITS = { vcpus: 1.5, memory_mib: 512, pids_max: 256 };
const AGENT = [
  "/run/pyro/runtime/bin/node",
  "/run/pyro/app/dist/agent/bundle/main.js",
  "--listen",
  "/run/pyro/sock/agent.sock",
];

function configInput() {
  return {
    rootfs: "/w/mnt/root",
    workspace: "/w/mnt/ws",
    runtimeDir: "/cache/runtime/node-1",
    appDir: "/opt/pyro",
    snapshotsDir: "/w/snapshots",
    sockDir: "/w/sandbox/sock",
    netDir: "/w/net/sandbox",
    hostname: "pyro-abc",
    agentArgv: AGENT,
    cgroupsPath: "/pyro/ws_abc",
    limits: LIMITS,
  };
}

function config() {
  return workspaceConfig(configInput());
}

describe("gVisor OCI config of a workspace", () => {
  it("runs the agent under an init shell that reaps orphans, in /workspace, with a clean environment", () => {
    const p = config().process;
    expect(p.args).toEqual(["/bin/sh", "-c", INIT_SCRIPT, "pyro-init", ...AGENT]);
    expect(INIT_SCRIPT).toBe('"$@" & wait $!');
    expect(p.cwd).toBe("/workspace");
    expect(p.env).toEqual([
      "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
      "HOME=/root",
      "LANG=C.UTF-8",
    ]);
    expect(p.user).toEqual({ uid: 0, gid: 0 });
  });

  it("grants no capability at all and sets no_new_privs", () => {
    const p = config().process;
    expect(p.capabilities).toEqual({
      bounding: [],
      effective: [],
      inheritable: [],
      permitted: [],
      ambient: [],
    });
    expect(p.noNewPrivileges).toBe(true);
  });

  it("uses the merged root overlay writable and mounts the workspace, runtime, app, snapshots, socket dir and the proxy's directory read-only", () => {
    const c = config();
    expect(c.root).toEqual({ path: "/w/mnt/root", readonly: false });
    const binds = c.mounts.filter((m) => m.type === "bind");
    expect(binds).toEqual([
      { destination: "/workspace", type: "bind", source: "/w/mnt/ws", options: ["rbind", "rw"] },
      {
        destination: "/run/pyro/runtime",
        type: "bind",
        source: "/cache/runtime/node-1",
        options: ["rbind", "ro"],
      },
      { destination: "/run/pyro/app", type: "bind", source: "/opt/pyro", options: ["rbind", "ro"] },
      { destination: "/run/pyro/snapshots", type: "bind", source: "/w/snapshots", options: ["rbind", "ro"] },
      { destination: "/run/pyro/sock", type: "bind", source: "/w/sandbox/sock", options: ["rbind", "rw"] },
      { destination: "/run/pyro/net", type: "bind", source: "/w/net/sandbox", options: ["rbind", "ro"] },
    ]);
    expect(c.mounts.map((m) => m.destination).slice(0, 4)).toEqual(["/proc", "/dev", "/dev/shm", "/sys"]);
    expect(c.mounts.find((m) => m.destination === "/sys")?.options).toContain("ro");
    expect(Object.values(GVISOR_IN_SANDBOX)).toEqual(binds.map((m) => m.destination));
  });

  it("binds the hostname helper read-only when there is one, and nothing for it otherwise", () => {
    const withHelper = workspaceConfig({ ...configInput(), hostnameHelper: "/cache/pyro-gvisor-hostname-x" });
    expect(withHelper.mounts.find((m) => m.destination === HOSTNAME_HELPER_IN_SANDBOX)).toEqual({
      destination: "/run/pyro/set-hostname",
      type: "bind",
      source: "/cache/pyro-gvisor-hostname-x",
      options: ["rbind", "ro"],
    });
    expect(config().mounts.some((m) => m.destination === HOSTNAME_HELPER_IN_SANDBOX)).toBe(false);
  });

  it("isolates namespaces and never names a network namespace path (runsc --network=none)", () => {
    const { linux, hostname } = config();
    expect(hostname).toBe("pyro-abc");
    expect(linux.namespaces).toEqual([
      { type: "pid" },
      { type: "ipc" },
      { type: "uts" },
      { type: "mount" },
      { type: "network" },
    ]);
    expect(linux.namespaces.every((n) => !("path" in n))).toBe(true);
  });

  it("states the limits: memory in bytes, CPU quota per 100 ms period, processes via RLIMIT_NPROC", () => {
    const c = config();
    expect(c.linux.cgroupsPath).toBe("/pyro/ws_abc");
    expect(c.linux.resources).toEqual({
      memory: { limit: 512 * 1024 * 1024 },
      cpu: { quota: 150_000, period: 100_000 },
      pids: { limit: 256 },
    });
    expect(c.process.rlimits).toEqual([{ type: "RLIMIT_NPROC", soft: 256, hard: 256 }]);
  });
});

describe("gVisor OCI config of a one-shot", () => {
  it("runs the command itself with the call's env on top of the base env, and no pyro mounts", () => {
    const c = oneShotConfig({
      rootfs: "/s/merged",
      hostname: "pyro-1234",
      command: "git --version",
      env: { FOO: "bar", HOME: "/home/x" },
      cgroupsPath: "/pyro/run_1234",
      limits: LIMITS,
    });
    expect(c.process.args).toEqual(["/bin/sh", "-c", "git --version"]);
    expect(c.process.env).toContain("FOO=bar");
    expect(c.process.env).toContain("HOME=/home/x");
    expect(c.process.cwd).toBe("/workspace");
    expect(c.mounts.filter((m) => m.type === "bind")).toEqual([]);
    expect(c.process.capabilities.effective).toEqual([]);
    expect(c.linux.resources.memory.limit).toBe(512 * 1024 * 1024);
  });
});
