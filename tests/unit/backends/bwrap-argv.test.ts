import { describe, expect, it } from "vitest";
import { isolationArgs } from "../../../src/backends/bwrap/isolation.js";
import {
  BASH_TOOLS,
  BUSYBOX_TOOLS,
  launchArgv,
  OVERLAY_OPTIONS,
} from "../../../src/backends/linux/launch.js";

describe("bwrap launch argv", () => {
  it("wraps the command in a private mount namespace that mounts each overlay, values as arguments", () => {
    const argv = launchArgv(
      [{ lower: "/env/rootfs", upper: "/w/u", work: "/w/w", target: "/w/m" }],
      ["bwrap", "--", "true"],
      BASH_TOOLS,
    );
    expect(argv.slice(0, 7)).toEqual([
      "unshare",
      "--mount",
      "--propagation",
      "private",
      "--",
      "/bin/bash",
      "-c",
    ]);
    const script = argv[7]!;
    expect(script).toContain("read -r _gate");
    expect(script).toContain(
      `mount -t overlay pyro -o "lowerdir=$1,upperdir=$2,workdir=$3,${OVERLAY_OPTIONS}" "$4"; shift 4`,
    );
    expect(script).not.toContain("/env/rootfs"); // paths never spliced into the script
    expect(argv.slice(8)).toEqual([
      "pyro-launch",
      "/env/rootfs",
      "/w/u",
      "/w/w",
      "/w/m",
      "bwrap",
      "--",
      "true",
    ]);
  });

  it("closes inherited descriptors above 3 before exec, and uses busybox when asked", () => {
    const argv = launchArgv([], ["x"], BUSYBOX_TOOLS);
    expect(argv.slice(5, 8)).toEqual(["/bin/busybox", "sh", "-c"]);
    expect(argv[8]).toMatch(/if \[ "\$n" -gt 3 \]; then eval "exec \$n>&-"/);
    expect(argv[8]).not.toContain("mount");
  });

  it("isolates every namespace but the user one, drops all capabilities and loads seccomp from fd 3", () => {
    const args = isolationArgs("pyro-abc", { FOO: "bar" });
    for (const flag of [
      "--unshare-pid",
      "--unshare-ipc",
      "--unshare-uts",
      "--unshare-net",
      "--unshare-cgroup-try",
      "--new-session",
      "--clearenv",
    ]) {
      expect(args).toContain(flag);
    }
    expect(args.join(" ")).toContain("--cap-drop ALL");
    expect(args.join(" ")).toContain("--seccomp 3");
    expect(args.join(" ")).toContain("--hostname pyro-abc");
    expect(args.join(" ")).toContain("--setenv FOO bar");
    expect(args.join(" ")).toContain(
      "--setenv PATH /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    );
    expect(args).not.toContain("--share-net");
  });

  it("binds the host-global parts of /proc read-only over the sandbox's own /proc, /proc/sys strictly", () => {
    const args = isolationArgs("pyro-abc").join(" ");
    expect(args).toContain("--proc /proc --ro-bind /proc/sys /proc/sys");
    expect(args).toContain("--ro-bind-try /proc/sysrq-trigger /proc/sysrq-trigger");
    expect(args).toContain("--ro-bind-try /proc/pressure /proc/pressure");
  });

  it("feeds a detached sandbox's stdout and stderr to a capped log reader outside it; one-shots keep their stdio", () => {
    const detached = launchArgv([], ["x"], BUSYBOX_TOOLS, { cappedLog: true });
    expect(detached[8]).toMatch(
      /"\$@" 2>&1 \| \{ dd bs=1 count=65536 2>\/dev\/null; cat >\/dev\/null; \} 3<&-$/,
    );
    expect(launchArgv([], ["x"], BUSYBOX_TOOLS)[8]).toMatch(/exec "\$@"$/);
  });
});

describe("the disk step of the launch script", () => {
  it("mounts the image with loop,nosuid,nodev and makes the layer directories in it, values as arguments", () => {
    const argv = launchArgv(
      [{ lower: "/env", upper: "/d/mnt/u", work: "/d/mnt/w", target: "/d/root" }],
      ["bwrap"],
      BUSYBOX_TOOLS,
      { disk: { image: "/d/disk.img", mount: "/d/mnt", mkdirs: ["/d/mnt/u", "/d/mnt/w"] } },
    );
    // util-linux's mount by path: busybox's loop setup spins when launches race.
    expect(argv[8]).toContain('/usr/bin/mount -t ext4 -o loop,nosuid,nodev "$1" "$2"; shift 2');
    expect(argv[8]).not.toContain("busybox mount -o loop");
    // One mkdir for all the layer directories (a fork each in busybox's shell).
    expect(argv[8]).toMatch(/shift; mkdir -p -- "\$\{1\}" "\$\{2\}"; shift 2/);
    expect(argv[8]!.match(/mkdir/g)).toHaveLength(1);
    // The disk step comes before the overlay mounts, which use its directories.
    expect(argv[8]!.indexOf("loop")).toBeLessThan(argv[8]!.indexOf("-t overlay"));
    expect(argv.slice(9, 15)).toEqual(["pyro-launch", "/d/disk.img", "/d/mnt", "2", "/d/mnt/u", "/d/mnt/w"]);
    expect(argv.slice(15, 19)).toEqual(["/env", "/d/mnt/u", "/d/mnt/w", "/d/root"]);
  });

  it("mounts a one-shot's throwaway image with barrier=0 (its unmount is on the run's path), a workspace's without", () => {
    const disk = { image: "/d/disk.img", mount: "/d/mnt", mkdirs: [] };
    const oneShot = launchArgv([], ["bwrap"], BUSYBOX_TOOLS, { disk: { ...disk, throwaway: true } });
    expect(oneShot[8]).toContain('-t ext4 -o loop,nosuid,nodev,barrier=0 "$1" "$2"');
    expect(launchArgv([], ["bwrap"], BUSYBOX_TOOLS, { disk })[8]).not.toContain("barrier");
  });
});

describe("the overlay step of the launch script", () => {
  it("makes a shared overlay a shared mount right after mounting it (bwrap's in-place reset stacks over it)", () => {
    const argv = launchArgv(
      [
        { lower: "/env", upper: "/u", work: "/w", target: "/root" },
        { lower: "/snap", upper: "/u2", work: "/w2", target: "/ws", shared: true },
      ],
      ["bwrap"],
      BUSYBOX_TOOLS,
    );
    const lines = argv[8]!.split("\n").filter((l) => l.includes("-t overlay"));
    expect(lines[0]).not.toContain("--make-shared");
    expect(lines[1]).toMatch(/-t overlay .*"\$4"; \/bin\/busybox mount --make-shared "\$4"; shift 4$/);
  });
});

describe("a workspace's bwrap argv (pinned)", () => {
  it("binds the merged root and /workspace, the runtime, app, snapshots and socket, then runs the agent", async () => {
    const { BwrapBackend } = await import("../../../src/backends/bwrap/backend.js");
    const { sandboxLayout } = await import("../../../src/backends/linux/layout.js");
    const spec = {
      workspace_id: "ws_0123456789ab",
      appDir: "/app",
      snapshotsDir: "/w/snapshots",
    } as Parameters<InstanceType<typeof BwrapBackend>["bwrapArgv"]>[0];
    const argv = new BwrapBackend().bwrapArgv(
      spec,
      sandboxLayout("/w/sandbox"),
      { runtime: "/rt", app: "/app" },
      ["node", "agent"],
    );
    expect(argv).toEqual([
      "bwrap",
      "--bind",
      "/w/sandbox/mnt/root",
      "/",
      "--bind",
      "/w/sandbox/mnt/ws",
      "/workspace",
      ...isolationArgs("pyro-0123456789ab"),
      "--ro-bind",
      "/rt",
      "/run/pyro/runtime",
      "--ro-bind",
      "/app",
      "/run/pyro/app",
      "--ro-bind",
      "/w/snapshots",
      "/run/pyro/snapshots",
      "--bind",
      "/w/sandbox/sockfs/sock",
      "/run/pyro/sock",
      "--chdir",
      "/workspace",
      "--",
      "node",
      "agent",
    ]);
    // The isolation flags themselves, pinned too: any change to them shows here.
    expect(isolationArgs("pyro-0123456789ab").join(" ")).toBe(
      [
        "--unshare-pid --unshare-ipc --unshare-uts --unshare-net --unshare-cgroup-try --new-session",
        "--cap-drop ALL --seccomp 3 --hostname pyro-0123456789ab --proc /proc",
        "--ro-bind /proc/sys /proc/sys --ro-bind-try /proc/sysrq-trigger /proc/sysrq-trigger",
        "--ro-bind-try /proc/pressure /proc/pressure",
        "--ro-bind /dev/null /proc/1/mem --ro-bind /dev/null /proc/1/task/1/mem --dev /dev --clearenv",
        "--setenv PATH /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --setenv HOME /root --setenv LANG C.UTF-8",
      ].join(" "),
    );
  });
});
