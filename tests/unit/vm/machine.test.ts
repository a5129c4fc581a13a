import { describe, expect, it } from "vitest";
import {
  type MachineSpec,
  netSocket,
  portSocket,
  qemuArgv,
  qemuOpt,
  qmpSocket,
  setupSocket,
} from "../../../src/backends/qemu/machine.js";
import { SERIAL_PORT_PREFIX, SETUP_PORT_NAME } from "../../../src/backends/vm/agent-disk.js";
import { DISK_SERIAL, SERIAL_PORTS } from "../../../src/backends/vm/types.js";

const SOCKETS = "/var/lib/pyro/ws/ws-1/vm/sock";

function spec(over: Partial<MachineSpec> = {}): MachineSpec {
  return {
    qemu: "/usr/bin/qemu-system-x86_64",
    accel: "tcg",
    vcpus: 2,
    memoryMib: 768,
    artifacts: {
      image: {
        key: "k1",
        kernelRelease: "6.1.0-99-cloud-amd64",
        kernel: "/cache/vmlinuz",
        vmlinux: "/cache/vmlinux",
        initrd: "/cache/initrd.cpio",
      },
      envDisk: "/cache/env.ext4",
      agentDisk: "/cache/agent.ext4",
      cmdline: ["console=ttyS0", "quiet"],
      tcgCmdline: ["tsc_early_khz=2000000", "tsc=reliable"],
    },
    stateDisk: "/var/lib/pyro/ws/ws-1/vm/state.qcow2",
    seedDisk: "/var/lib/pyro/ws/ws-1/seeds/baseline-12.ext4",
    socketDir: SOCKETS,
    ...over,
  };
}

/** Values of every occurrence of `flag`. */
function values(argv: string[], flag: string): string[] {
  const out: string[] = [];
  argv.forEach((a, i) => {
    if (a === flag && i + 1 < argv.length) out.push(argv[i + 1]!);
  });
  return out;
}

function one(argv: string[], flag: string): string {
  const v = values(argv, flag);
  expect(v, flag).toHaveLength(1);
  return v[0]!;
}

/** `k=v,k2=v2` (QEMU option syntax) as a map; a bare leading word maps to "". */
function opts(s: string): Map<string, string> {
  return new Map(
    s.split(",").map((kv) => {
      const at = kv.indexOf("=");
      return at < 0 ? [kv, ""] : [kv.slice(0, at), kv.slice(at + 1)];
    }),
  );
}

describe("qemuArgv", () => {
  it("builds a microvm with the spec's memory and CPUs and no network", () => {
    const argv = qemuArgv(spec());
    expect(argv[0]).toBe("/usr/bin/qemu-system-x86_64");
    expect(one(argv, "-M").split(",")[0]).toBe("microvm");
    expect(one(argv, "-m")).toBe("768");
    expect(one(argv, "-smp")).toBe("2");
    expect(one(argv, "-nic")).toBe("none");
    expect(argv).toContain("-nodefaults");
    expect(argv).toContain("-no-reboot");
    expect(one(argv, "-kernel")).toBe("/cache/vmlinuz");
    expect(one(argv, "-initrd")).toBe("/cache/initrd.cpio");
    expect(one(argv, "-append")).toBe(
      "console=ttyS0 quiet tsc_early_khz=2000000 tsc=reliable pyro.channel=serial",
    );
    // No network device of any kind.
    expect(argv.some((a) => /netdev|virtio-net/.test(a))).toBe(false);
  });

  it("uses -cpu host only with kvm", () => {
    const tcg = qemuArgv(spec({ accel: "tcg" }));
    expect(one(tcg, "-accel")).toBe("tcg");
    expect(tcg).not.toContain("-cpu");
    const kvm = qemuArgv(spec({ accel: "kvm" }));
    expect(one(kvm, "-accel")).toBe("kvm");
    expect(one(kvm, "-cpu")).toBe("host");
  });

  it("attaches four disks with serials, read-only exactly for env, agent and seed", () => {
    const argv = qemuArgv(spec());
    const drives = values(argv, "-drive").map(opts);
    const devices = values(argv, "-device")
      .filter((d) => d.startsWith("virtio-blk-device,"))
      .map(opts);
    expect(drives).toHaveLength(4);
    expect(devices).toHaveLength(4);
    const expected = {
      env: { file: "/cache/env.ext4", format: "raw", ro: true, serial: DISK_SERIAL.env },
      agent: { file: "/cache/agent.ext4", format: "raw", ro: true, serial: DISK_SERIAL.agent },
      state: { file: spec().stateDisk, format: "qcow2", ro: false, serial: DISK_SERIAL.state },
      seed: { file: spec().seedDisk, format: "raw", ro: true, serial: DISK_SERIAL.seed },
    };
    for (const [id, want] of Object.entries(expected)) {
      const d = drives.find((x) => x.get("id") === id);
      expect(d, `drive ${id}`).toBeDefined();
      expect(d!.get("file")).toBe(want.file);
      expect(d!.get("format")).toBe(want.format);
      expect(d!.get("if")).toBe("none");
      expect(d!.get("readonly")).toBe(want.ro ? "on" : undefined);
      const dev = devices.find((x) => x.get("drive") === id);
      expect(dev?.get("serial"), `serial of ${id}`).toBe(want.serial);
    }
  });

  it(`gives ${SERIAL_PORTS} named virtio-serial ports on the port sockets, the network port, and QMP on its socket`, () => {
    const argv = qemuArgv(spec());
    const bus = values(argv, "-device").find((d) => d.startsWith("virtio-serial-device"));
    // Port 0 is reserved; the agent ports and the network port fit.
    expect(Number(opts(bus!).get("max_ports"))).toBeGreaterThan(SERIAL_PORTS + 1);
    const net = values(argv, "-device")
      .filter((d) => d.startsWith("virtserialport,"))
      .map(opts)
      .find((d) => d.get("chardev") === "net");
    expect(net?.get("name")).toBe("pyro.net");
    const netChar = values(argv, "-chardev")
      .map(opts)
      .find((c) => c.get("id") === "net");
    expect(netChar?.get("path")).toBe("net");
    expect(netSocket(SOCKETS)).toBe(`${SOCKETS}/net`);
    const chardevs = values(argv, "-chardev")
      .map(opts)
      .filter((c) => c.get("id")?.startsWith("p"));
    // The setup helper's own port (qemu/setup-port.ts), on its socket.
    const setup = values(argv, "-device")
      .filter((d) => d.startsWith("virtserialport,"))
      .map(opts)
      .find((d) => d.get("chardev") === "setup");
    expect(setup?.get("name")).toBe(SETUP_PORT_NAME);
    const setupChar = values(argv, "-chardev")
      .map(opts)
      .find((c) => c.get("id") === "setup");
    expect(setupChar?.get("path")).toBe("setup");
    expect(setupSocket(SOCKETS)).toBe(`${SOCKETS}/setup`);
    expect(Number(opts(bus!).get("max_ports"))).toBeGreaterThan(SERIAL_PORTS + 2);
    const ports = values(argv, "-device")
      .filter((d) => d.startsWith("virtserialport,"))
      .map(opts)
      .filter((d) => d.get("chardev") !== "net" && d.get("chardev") !== "setup");
    expect(chardevs).toHaveLength(SERIAL_PORTS);
    expect(ports).toHaveLength(SERIAL_PORTS);
    for (let i = 0; i < SERIAL_PORTS; i++) {
      const c = chardevs.find((x) => x.get("id") === `p${i}`);
      expect(c?.has("socket")).toBe(true);
      // Relative to QEMU's working directory, the socket directory (addresses hold 107 bytes).
      expect(c?.get("path")).toBe(`p${i}`);
      expect(c?.get("server")).toBe("on");
      expect(c?.get("wait")).toBe("off");
      const p = ports.find((x) => x.get("chardev") === `p${i}`);
      expect(p?.get("name")).toBe(`${SERIAL_PORT_PREFIX}${i}`);
    }
    expect(portSocket(SOCKETS, 3)).toBe(`${SOCKETS}/p3`);
    expect(one(argv, "-qmp")).toBe("unix:qmp,server=on,wait=off");
    expect(qmpSocket(SOCKETS)).toBe(`${SOCKETS}/qmp`);
  });

  it("restores from a state file passed as an fd only when asked, and denies spawning unless allowed", () => {
    const plain = qemuArgv(spec());
    expect(plain).not.toContain("-incoming");
    expect(one(plain, "-sandbox")).toBe(
      "on,obsolete=deny,elevateprivileges=deny,resourcecontrol=deny,spawn=deny",
    );
    const argv = qemuArgv(spec({ incomingFd: 3 }));
    expect(one(argv, "-incoming")).toBe("fd:3");
    expect(argv.at(-2)).toBe("-incoming");
    expect(one(qemuArgv(spec({ allowSpawn: true })), "-sandbox")).toContain("spawn=allow");
  });

  it("adds the TSC rate only under TCG", () => {
    expect(one(qemuArgv(spec()), "-append")).toContain("tsc_early_khz=2000000 tsc=reliable");
    expect(one(qemuArgv(spec({ accel: "kvm" })), "-append")).not.toContain("tsc_early_khz");
  });

  it("keeps the guest's console in a bounded ring buffer, not a host file", () => {
    const argv = qemuArgv(spec());
    expect(one(argv, "-serial")).toBe("chardev:console");
    expect(values(argv, "-chardev")).toContain("ringbuf,id=console,size=65536");
  });

  it("differs between machines only in host paths, never in guest hardware", () => {
    const a = qemuArgv(spec());
    const b = qemuArgv(
      spec({
        stateDisk: "/other/state.qcow2",
        seedDisk: "/other/seed.ext4",
        socketDir: "/other/sock",
        incomingFd: 3,
      }),
    );
    const strip = (argv: string[]) =>
      argv.map((x) => x.replace(/\/var\/lib\/pyro\/ws\/ws-1\/[^,]*|\/other\/[^,']*/g, "PATH"));
    expect(strip(b).slice(0, strip(a).length)).toEqual(strip(a));
  });
});

describe("qemuOpt", () => {
  it("doubles commas, which QEMU's option lists read as separators", () => {
    expect(qemuOpt("/home/a,b/ws")).toBe("/home/a,,b/ws");
    const argv = qemuArgv(spec({ stateDisk: "/x,y/state.qcow2" }));
    expect(argv.some((a) => a.includes("file=/x,,y/state.qcow2,format=qcow2"))).toBe(true);
  });
});
