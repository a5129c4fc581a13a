/**
 * What the microVM backends (qemu, firecracker) share: one guest image (the Debian cloud
 * kernel plus a small initramfs), read-only disks for the environment and the agent, and
 * per-workspace disks. The guest side of this contract lives in the initramfs init
 * (src/backends/vm/initramfs.ts): it finds disks by their virtio serial, never by order.
 */

export { DISK_SERIAL, GUEST, SETUP_HELPER } from "../../agent/vm-layout.js";

/** Guest vsock port the agent bridge listens on (firecracker). */
export const AGENT_VSOCK_PORT = 1024;

/** Guest vsock port of the network mux (firecracker; agent/netmux.ts). */
export const NET_VSOCK_PORT = 1025;

/** Number of virtio-serial ports: concurrent host connections to one VM's agent (qemu). */
export const SERIAL_PORTS = 8;

/** How the host reaches the guest agent. */
export type AgentChannel = "serial" | "vsock";

/** The kernel and initramfs, built from Debian packages and cached. */
export interface GuestImage {
  /** Cache key (kernel package version + initramfs recipe). */
  key: string;
  /** `uname -r` inside the guest. */
  kernelRelease: string;
  /** Compressed kernel (bzImage), what QEMU boots. */
  kernel: string;
  /** Uncompressed ELF kernel, what Firecracker boots. */
  vmlinux: string;
  /** newc cpio initramfs. */
  initrd: string;
}

/** Files one VM boots from; every path is a host path. */
export interface VmArtifacts {
  image: GuestImage;
  /** Raw ext4 image of the environment (read-only). */
  envDisk: string;
  /** Raw ext4 image of the agent disk (read-only). */
  agentDisk: string;
  /** Kernel command line (without the channel switch, which the backend adds). */
  cmdline: string[];
  /** Added under emulation (TCG) only: the host's TSC rate, so the kernel skips calibration. */
  tcgCmdline: string[];
  /** The agent disk has the setup helper (setup-helper.ts); absent: it has not (no C compiler here). */
  setupHelper?: boolean;
}
