import { join, relative } from "node:path";
import { NET_PORT_NAME, SERIAL_PORT_PREFIX, SETUP_PORT_NAME } from "../vm/agent-disk.js";
import { DISK_SERIAL, SERIAL_PORTS, type VmArtifacts } from "../vm/types.js";

export type Accel = "kvm" | "tcg";

/** Everything that defines one QEMU VM. */
export interface MachineSpec {
  qemu: string;
  accel: Accel;
  vcpus: number;
  memoryMib: number;
  artifacts: VmArtifacts;
  /** The VM's only writable disk (qcow2). */
  stateDisk: string;
  /** Read-only seed disk (raw, SEED_DISK_BYTES long). */
  seedDisk: string;
  /**
   * Directory for the VM's sockets (QMP and one per serial port). QEMU must run with it
   * as its working directory: the command line names the sockets relative to it, since a
   * socket address holds only 107 bytes and a deep PYRO_HOME makes longer paths.
   */
  socketDir: string;
  /** Restore the saved VM state readable on this fd of QEMU's (passed as an extra fd). */
  incomingFd?: number;
  /**
   * Let QEMU start programs (only the template VM, whose state is saved with
   * `migrate exec:`); workspace VMs run with spawning denied by QEMU's seccomp sandbox.
   */
  allowSpawn?: boolean;
}

export function qmpSocket(socketDir: string): string {
  return join(socketDir, "qmp");
}

export function portSocket(socketDir: string, i: number): string {
  return join(socketDir, `p${i}`);
}

/** The socket of the network mux's port (agent/netmux.ts): one host session, the network helper's. */
export function netSocket(socketDir: string): string {
  return join(socketDir, "net");
}

/** The socket of the setup helper's port (qemu/setup-port.ts): the backend's, once per start. */
export function setupSocket(socketDir: string): string {
  return join(socketDir, "setup");
}

/**
 * The QEMU command line. `-M microvm` (virtio-mmio, no PCI, no firmware), ACPI and the RTC
 * kept (this kernel's virtio_mmio finds devices through ACPI; no RTC costs seconds at boot),
 * no network device at all, disks found by serial in the guest, and SERIAL_PORTS
 * virtio-serial ports on host unix sockets for agent connections. Everything that shapes
 * the guest's hardware must be identical between a template and the VMs restored from it:
 * only host-side paths (files, sockets) differ.
 */
/** A value inside a QEMU option list: commas are separators there, so they are doubled. */
export function qemuOpt(value: string): string {
  return value.replace(/,/g, ",,");
}

export function qemuArgv(m: MachineSpec): string[] {
  const drive = (id: string, file: string, format: string, ro: boolean, serial: string) => [
    "-drive",
    `id=${id},file=${qemuOpt(file)},format=${format},if=none,cache=writeback${ro ? ",readonly=on" : ""}`,
    "-device",
    `virtio-blk-device,drive=${id},serial=${serial}`,
  ];
  const argv = [
    m.qemu,
    "-M",
    "microvm,acpi=on,rtc=on",
    "-accel",
    m.accel,
    ...(m.accel === "kvm" ? ["-cpu", "host"] : []),
    "-m",
    String(m.memoryMib),
    "-smp",
    String(m.vcpus),
    "-nodefaults",
    "-no-user-config",
    "-display",
    "none",
    "-no-reboot",
    "-nic",
    "none",
    "-kernel",
    m.artifacts.image.kernel,
    "-initrd",
    m.artifacts.image.initrd,
    "-append",
    [
      ...m.artifacts.cmdline,
      ...(m.accel === "tcg" ? m.artifacts.tcgCmdline : []),
      "pyro.channel=serial",
    ].join(" "),
    // The guest's console in a 64 KiB ring in QEMU (read over QMP when a start fails):
    // a file would let the guest fill the host's disk.
    "-chardev",
    "ringbuf,id=console,size=65536",
    "-serial",
    "chardev:console",
    // QEMU's own seccomp filter: no obsolete syscalls, no privilege changes, no
    // resource-control calls, and no spawning programs unless this VM must.
    "-sandbox",
    `on,obsolete=deny,elevateprivileges=deny,resourcecontrol=deny,spawn=${m.allowSpawn ? "allow" : "deny"}`,
    ...drive("env", m.artifacts.envDisk, "raw", true, DISK_SERIAL.env),
    ...drive("agent", m.artifacts.agentDisk, "raw", true, DISK_SERIAL.agent),
    ...drive("state", m.stateDisk, "qcow2", false, DISK_SERIAL.state),
    ...drive("seed", m.seedDisk, "raw", true, DISK_SERIAL.seed),
    "-device",
    // Port 0 is reserved (console); then SERIAL_PORTS agent ports, the network port and the setup port.
    `virtio-serial-device,max_ports=${SERIAL_PORTS + 3}`,
    "-chardev",
    `socket,id=net,path=${qemuOpt(relative(m.socketDir, netSocket(m.socketDir)))},server=on,wait=off`,
    "-device",
    `virtserialport,chardev=net,name=${NET_PORT_NAME}`,
    "-chardev",
    `socket,id=setup,path=${qemuOpt(relative(m.socketDir, setupSocket(m.socketDir)))},server=on,wait=off`,
    "-device",
    `virtserialport,chardev=setup,name=${SETUP_PORT_NAME}`,
    "-qmp",
    `unix:${qemuOpt(relative(m.socketDir, qmpSocket(m.socketDir)))},server=on,wait=off`,
  ];
  for (let i = 0; i < SERIAL_PORTS; i++) {
    argv.push(
      "-chardev",
      `socket,id=p${i},path=${qemuOpt(relative(m.socketDir, portSocket(m.socketDir, i)))},server=on,wait=off`,
      "-device",
      `virtserialport,chardev=p${i},name=${SERIAL_PORT_PREFIX}${i}`,
    );
  }
  if (m.incomingFd !== undefined) argv.push("-incoming", `fd:${m.incomingFd}`);
  return argv;
}
