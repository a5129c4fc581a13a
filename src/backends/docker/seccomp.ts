/**
 * The seccomp profile of pyro's Docker containers, in the engine's JSON format, generated
 * from the same policy lists as bwrap's BPF program (bwrap/seccomp.ts), so the two
 * backends refuse the same calls with the same errors.
 *
 * Why not the engine's default profile: Docker 20.10's default allows socket(AF_VSOCK),
 * and vsock is not network-namespaced (a container could reach the hypervisor of a host
 * that is itself a VM, or other guests). The default cannot be extended, only replaced,
 * and the engine does not publish it.
 *
 * Differences from the BPF program, both forced by the JSON format (one comparison per
 * argument, rules of one syscall OR'ed): `clone` gets one rule per namespace flag, and
 * `personality` is not restricted (the harmful personas only weaken the calling process
 * itself; mmap_min_addr still holds without CAP_SYS_RAWIO). Other ABIs (i386, x32) hit
 * the profile's bad-architecture action: the process is killed, as with bwrap.
 *
 * One addition of the docker profile's own: the btrfs ioctls that make a subvolume or a
 * snapshot (BTRFS_CREATE_IOCTLS).
 */
import { AF_VSOCK, CLONE_NEW_NAMESPACE_MASK, DENIED_SYSCALLS, ENOSYS_SYSCALLS } from "../bwrap/seccomp.js";

const EPERM = 1;
const ENOSYS = 38;
const EAFNOSUPPORT = 97;

interface SyscallRule {
  names: string[];
  action: "SCMP_ACT_ERRNO";
  errnoRet: number;
  args?: { index: number; value: number; valueTwo?: number; op: "SCMP_CMP_EQ" | "SCMP_CMP_MASKED_EQ" }[];
}

export interface DockerSeccompProfile {
  defaultAction: "SCMP_ACT_ALLOW";
  architectures: ["SCMP_ARCH_X86_64"];
  syscalls: SyscallRule[];
}

/**
 * BTRFS_IOC_SNAP_CREATE, _SUBVOL_CREATE, _SNAP_CREATE_V2, _SUBVOL_CREATE_V2 (_IOW(0x94, nr,
 * 4096-byte args)). Any process may make a subvolume in a directory it can write, without
 * a capability, and a new subvolume is a qgroup of its own: on the btrfs storage driver
 * what a command wrote below one was outside the root layer's size limit
 * (docker/disk-limit.ts), 400 MiB onto the engine's disk with a 128 MiB limit. Compared on
 * the low 32 bits only: the kernel reads the request as an unsigned int, so high bits set
 * by the caller would slip past an equality test.
 */
export const BTRFS_CREATE_IOCTLS = [0x50009401, 0x5000940e, 0x50009417, 0x50009418] as const;

/** Single bits of a mask, low to high. */
function bits(mask: number): number[] {
  const out: number[] = [];
  for (let b = 0; b < 32; b++) if ((mask >>> b) & 1) out.push(2 ** b);
  return out;
}

export function dockerSeccompProfile(): DockerSeccompProfile {
  return {
    defaultAction: "SCMP_ACT_ALLOW",
    architectures: ["SCMP_ARCH_X86_64"],
    syscalls: [
      { names: [...DENIED_SYSCALLS], action: "SCMP_ACT_ERRNO", errnoRet: EPERM },
      { names: [...ENOSYS_SYSCALLS], action: "SCMP_ACT_ERRNO", errnoRet: ENOSYS },
      ...bits(CLONE_NEW_NAMESPACE_MASK).map(
        (bit): SyscallRule => ({
          names: ["clone"],
          action: "SCMP_ACT_ERRNO",
          errnoRet: EPERM,
          args: [{ index: 0, value: bit, valueTwo: bit, op: "SCMP_CMP_MASKED_EQ" }],
        }),
      ),
      {
        names: ["socket"],
        action: "SCMP_ACT_ERRNO",
        errnoRet: EAFNOSUPPORT,
        args: [{ index: 0, value: AF_VSOCK, op: "SCMP_CMP_EQ" }],
      },
      ...BTRFS_CREATE_IOCTLS.map(
        (request): SyscallRule => ({
          names: ["ioctl"],
          action: "SCMP_ACT_ERRNO",
          errnoRet: EPERM,
          args: [{ index: 1, value: 0xffffffff, valueTwo: request, op: "SCMP_CMP_MASKED_EQ" }],
        }),
      ),
    ],
  };
}

/** The `SecurityOpt` entry that installs the profile (the engine takes the JSON inline). */
export function seccompSecurityOpt(): string {
  return `seccomp=${JSON.stringify(dockerSeccompProfile())}`;
}
