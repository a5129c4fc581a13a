import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import type { SandboxSpec } from "../../../src/backends/backend.js";
import { idleCommand } from "../../../src/backends/docker/backend.js";
import { clientOptions, resolveEndpoint } from "../../../src/backends/docker/client.js";
import {
  type InspectedHostConfig,
  oneShotContainerBody,
  overlayVolumeBody,
  READONLY_PATHS,
  unappliedSettings,
  workspaceContainerBody,
  workspaceUser,
} from "../../../src/backends/docker/container.js";
import { imageRef } from "../../../src/backends/docker/image.js";
import { dockerSeccompProfile, seccompSecurityOpt } from "../../../src/backends/docker/seccomp.js";

const SPEC: SandboxSpec = {
  workspace_id: "ws_0123456789abcdef",
  dir: "/home/u/.pyro/workspaces/ws_0123456789abcdef/sandbox",
  rootfs: "/cache/debian_12@abc/rootfs",
  snapshotsDir: "/home/u/.pyro/workspaces/ws_0123456789abcdef/snapshots",
  snapshot: "baseline",
  limits: { vcpus: 2, memory_mib: 512, pids_max: 256 },
  appDir: "/opt/pyro",
  runtimeCacheDir: "/home/u/.pyro/runtime",
};

describe("docker container bodies", () => {
  it("pins a workspace container: image, idle command, no network, init, limits, no capabilities, read-only binds", () => {
    const body = workspaceContainerBody({
      spec: SPEC,
      image: "pyro-env:0123",
      runtimeDir: "/home/u/.pyro/runtime/node-aa",
      appDir: "/opt/pyro",
      mainCmd: ["/usr/bin/sleep", "2147483647"],
      user: "0:0",
    });
    expect(body).toEqual({
      name: "pyro-ws_0123456789abcdef",
      Image: "pyro-env:0123",
      Cmd: ["/usr/bin/sleep", "2147483647"],
      Env: [
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME=/root",
        "LANG=C.UTF-8",
        "HOSTNAME=pyro",
      ],
      WorkingDir: "/workspace",
      User: "0:0",
      Hostname: "pyro-0123456789ab",
      Labels: { "dev.pyro.workspace": "ws_0123456789abcdef", "dev.pyro.dir": SPEC.dir },
      AttachStdin: false,
      AttachStdout: false,
      AttachStderr: false,
      OpenStdin: false,
      Tty: false,
      HostConfig: {
        NetworkMode: "none",
        Init: true,
        Memory: 512 * 1024 * 1024,
        MemorySwap: 512 * 1024 * 1024,
        NanoCpus: 2_000_000_000,
        PidsLimit: 256,
        CapDrop: ["ALL"],
        SecurityOpt: ["no-new-privileges", seccompSecurityOpt()],
        ReadonlyPaths: READONLY_PATHS,
        Privileged: false,
        ReadonlyRootfs: false,
        IpcMode: "private",
        LogConfig: { Type: "none", Config: {} },
        RestartPolicy: { Name: "no" },
        Mounts: [
          {
            Type: "bind",
            Source: "/home/u/.pyro/runtime/node-aa",
            Target: "/run/pyro/runtime",
            ReadOnly: true,
          },
          { Type: "bind", Source: "/opt/pyro", Target: "/run/pyro/app", ReadOnly: true },
          { Type: "bind", Source: SPEC.snapshotsDir, Target: "/run/pyro/snapshots", ReadOnly: true },
          {
            Type: "volume",
            Source: "pyro-ws_0123456789abcdef-workspace",
            Target: "/workspace",
            VolumeOptions: { NoCopy: true },
          },
        ],
      },
    });
  });

  it("runs a workspace as the pyro process's own uid:gid (root here), so it can write the files pyro owns", () => {
    expect(workspaceUser({ uid: 0, gid: 0 })).toBe("0:0");
    expect(workspaceUser({ uid: 1000, gid: 998 })).toBe("1000:998");
    expect(workspaceUser(null)).toBe("0:0");
  });

  it("pins a one-shot container: the command under /bin/sh -c with its env, attached output, same isolation, no mounts", () => {
    const body = oneShotContainerBody({
      id: "run_abcdef012345",
      image: "pyro-env:0123",
      command: "git --version; echo $X",
      env: { X: "1", PATH: "/opt/bin:/usr/bin:/bin" },
      limits: { vcpus: 0.5, memory_mib: 1024, pids_max: 1024 },
    });
    expect(body.Cmd).toEqual(["/bin/sh", "-c", "git --version; echo $X"]);
    expect(body.Env).toEqual(["PATH=/opt/bin:/usr/bin:/bin", "HOME=/root", "LANG=C.UTF-8", "X=1"]);
    expect([body.AttachStdout, body.AttachStderr, body.AttachStdin, body.Tty]).toEqual([
      true,
      true,
      false,
      false,
    ]);
    expect(body.Labels).toEqual({ "dev.pyro.oneshot": "run_abcdef012345" });
    expect(body.HostConfig).toMatchObject({
      NetworkMode: "none",
      Init: true,
      Memory: 1024 * 1024 * 1024,
      MemorySwap: 1024 * 1024 * 1024,
      NanoCpus: 500_000_000,
      PidsLimit: 1024,
      CapDrop: ["ALL"],
      SecurityOpt: ["no-new-privileges", seccompSecurityOpt()],
      Mounts: [],
    });
  });

  it("makes /workspace an overlay volume of the snapshot with the workspace's upper and work directories", () => {
    expect(
      overlayVolumeBody({
        name: "pyro-ws_1-workspace",
        lower: "/p/snapshots/baseline",
        upper: "/p/sandbox/ws/upper",
        work: "/p/sandbox/ws/work",
        labels: { "dev.pyro.workspace": "ws_1" },
      }),
    ).toEqual({
      Name: "pyro-ws_1-workspace",
      Driver: "local",
      DriverOpts: {
        type: "overlay",
        device: "overlay",
        o: "lowerdir=/p/snapshots/baseline,upperdir=/p/sandbox/ws/upper,workdir=/p/sandbox/ws/work,index=off,xino=off,redirect_dir=off,metacopy=off",
      },
      Labels: { "dev.pyro.workspace": "ws_1" },
    });
  });

  it("refuses paths that would change the meaning of the overlay's mount options", () => {
    for (const bad of ["/p/a,upperdir=/etc", "/p/a:/b", "/p/a b", "/p/a\\b"]) {
      expect(() => overlayVolumeBody({ name: "v", lower: bad, upper: "/u", work: "/w", labels: {} })).toThrow(
        /cannot use a path/,
      );
    }
  });
});

describe("docker limits check (fail closed)", () => {
  const asked = workspaceContainerBody({
    spec: SPEC,
    image: "i",
    runtimeDir: "/r",
    appDir: "/opt/pyro",
    mainCmd: ["x"],
  }).HostConfig;
  const applied: InspectedHostConfig = {
    NetworkMode: "none",
    Init: true,
    Memory: asked.Memory,
    MemorySwap: asked.MemorySwap,
    NanoCpus: asked.NanoCpus,
    PidsLimit: asked.PidsLimit,
    CapDrop: ["ALL"],
    CapAdd: null,
    SecurityOpt: ["no-new-privileges", seccompSecurityOpt()],
    ReadonlyPaths: READONLY_PATHS,
    Privileged: false,
  };

  it("accepts what the engine applied as asked", () => {
    expect(unappliedSettings(asked, applied)).toEqual([]);
  });

  it("names every limit or protection the engine dropped", () => {
    // What Docker records when the kernel lacks memory, swap or pids support.
    const dropped = unappliedSettings(asked, {
      ...applied,
      Memory: 0,
      MemorySwap: -1,
      PidsLimit: null,
      NanoCpus: 0,
      CapDrop: null,
      CapAdd: ["SYS_ADMIN"],
      SecurityOpt: null,
      ReadonlyPaths: ["/proc/sys"],
      NetworkMode: "bridge",
      Init: null,
    });
    expect(dropped).toEqual([
      'network mode is "bridge", asked for "none"',
      "init is null, asked for true",
      `memory limit is 0, asked for ${asked.Memory}`,
      `memory+swap limit is -1, asked for ${asked.MemorySwap}`,
      `CPU limit (NanoCpus) is 0, asked for ${asked.NanoCpus}`,
      "pids limit is null, asked for 256",
      "capabilities were not dropped",
      "capabilities were added: SYS_ADMIN",
      "no-new-privileges is not set",
      "pyro's seccomp profile is not set",
      "not read-only: /proc/asound, /proc/bus, /proc/fs, /proc/irq, /proc/sysrq-trigger, /proc/pressure",
    ]);
  });

  it("refuses a container whose engine runs it unconfined", () => {
    expect(
      unappliedSettings(asked, { ...applied, SecurityOpt: ["no-new-privileges", "seccomp=unconfined"] }),
    ).toEqual(["pyro's seccomp profile is not set"]);
  });

  it("encodes the bwrap policy for the engine: the denied calls, namespace clones and AF_VSOCK", () => {
    const profile = dockerSeccompProfile();
    expect(profile.defaultAction).toBe("SCMP_ACT_ALLOW");
    expect(profile.architectures).toEqual(["SCMP_ARCH_X86_64"]);
    const eperm = profile.syscalls.find((r) => r.errnoRet === 1 && !r.args);
    expect(eperm?.names).toEqual(
      expect.arrayContaining(["mount", "unshare", "setns", "keyctl", "bpf", "init_module"]),
    );
    expect(profile.syscalls.find((r) => r.errnoRet === 38)?.names).toEqual(
      expect.arrayContaining(["clone3", "io_uring_setup"]),
    );
    const clone = profile.syscalls.filter((r) => r.names[0] === "clone");
    expect(clone.map((r) => r.args?.[0]?.value)).toEqual([
      0x0002_0000, 0x0200_0000, 0x0400_0000, 0x0800_0000, 0x1000_0000, 0x2000_0000, 0x4000_0000,
    ]);
    expect(profile.syscalls.find((r) => r.names[0] === "socket")).toEqual({
      names: ["socket"],
      action: "SCMP_ACT_ERRNO",
      errnoRet: 97,
      args: [{ index: 0, value: 40, op: "SCMP_CMP_EQ" }],
    });
  });

  it("refuses the btrfs ioctls that make a subvolume or snapshot, on the request's low 32 bits", () => {
    const ioctl = dockerSeccompProfile().syscalls.filter((r) => r.names[0] === "ioctl");
    // A subvolume is a qgroup of its own: the root layer's size limit would not count it.
    expect(ioctl.map((r) => r.args)).toEqual(
      [0x50009401, 0x5000940e, 0x50009417, 0x50009418].map((request) => [
        { index: 1, value: 0xffffffff, valueTwo: request, op: "SCMP_CMP_MASKED_EQ" },
      ]),
    );
    expect(ioctl.every((r) => r.errnoRet === 1)).toBe(true);
  });
});

describe("docker engine endpoint and images", () => {
  const dirs: string[] = [];
  afterAll(async () => {
    for (const d of dirs) await rm(d, { recursive: true, force: true });
  });

  it("uses DOCKER_HOST when set, and never lets this process's DOCKER_HOST override the chosen endpoint", () => {
    expect(resolveEndpoint({ DOCKER_HOST: "unix:///x/docker.sock" })).toBe("unix:///x/docker.sock");
    expect(clientOptions("unix:///x/docker.sock")).toMatchObject({
      socketPath: "/x/docker.sock",
      host: undefined,
      port: undefined,
    });
    expect(clientOptions("tcp://127.0.0.1:2375")).toMatchObject({
      socketPath: undefined,
      host: "127.0.0.1",
      port: "2375",
      protocol: "http",
    });
    expect(() => clientOptions("ssh://me@host")).toThrow(/not supported/);
  });

  it("names an environment's image after its path and manifest, so a rebuilt environment gets a new image", async () => {
    const dir = await mkdtemp(join(tmpdir(), "pyro-docker-unit-"));
    dirs.push(dir);
    await mkdir(join(dir, "rootfs"));
    await writeFile(join(dir, "manifest.json"), '{"recipe_key":"a","built_at":"1"}');
    const first = await imageRef(join(dir, "rootfs"));
    expect(first).toMatch(/^pyro-env:[0-9a-f]{20}$/);
    expect(await imageRef(join(dir, "rootfs"))).toBe(first);
    await writeFile(join(dir, "manifest.json"), '{"recipe_key":"a","built_at":"2"}');
    expect(await imageRef(join(dir, "rootfs"))).not.toBe(first);
  });

  it("idles on the environment's own sleep when it has one, else on the injected node", async () => {
    const dir = await mkdtemp(join(tmpdir(), "pyro-docker-unit-"));
    dirs.push(dir);
    const node = ["/run/pyro/runtime/bin/node", "-e", "setInterval(() => {}, 1 << 30)"];
    expect(await idleCommand(dir, node)).toEqual(node);
    await mkdir(join(dir, "usr", "bin"), { recursive: true });
    await writeFile(join(dir, "usr", "bin", "sleep"), "");
    expect(await idleCommand(dir, node)).toEqual(["/usr/bin/sleep", "2147483647"]);
  });
});
