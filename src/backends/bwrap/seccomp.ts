import { writeFile } from "node:fs/promises";

/**
 * The seccomp filter bwrap installs just before it execs the sandboxed command
 * (`bwrap --seccomp FD`). It is a classic-BPF program over `struct seccomp_data`,
 * generated here so there is no libseccomp dependency.
 *
 * Policy: a denylist on top of what namespaces and `--cap-drop ALL` already give.
 * Everything not listed is allowed, because a coding agent runs arbitrary toolchains
 * and an allowlist would break them in ways that are hard to diagnose. The listed
 * calls either reach kernel state that namespaces do not isolate (keyrings, clocks,
 * modules, kexec, swap, syslog), are large attack surfaces with no use for a build
 * (bpf, perf, userfaultfd, io_uring), or would let the sandbox rebuild its own view
 * of the system (mount family, new namespaces, setns).
 *
 * Decisions (user-facing backend docs should repeat them):
 * - `ptrace` is ALLOWED: gdb and strace are ordinary developer tools. Since Linux 4.8
 *   the kernel re-checks seccomp after a tracer rewrites a syscall, so tracing cannot
 *   bypass this filter, and the pid namespace limits tracees to the sandbox itself.
 *   `process_vm_readv/writev` follow the same reasoning. Except on the sandbox's pid 1
 *   (bwrap's init, which runs as the commands' uid and is dumpable): `ptrace(_, 1, ...)`
 *   and `process_vm_readv/writev(1, ...)` get EPERM, and /proc/1/mem is covered read-only
 *   (isolation.ts). pid 1 outlives a reset in place (reset.ts), so code a command put
 *   into it would survive the reset.
 * - `chroot` is ALLOWED: the sandbox root is already a pivoted mount namespace, so a
 *   chroot can only narrow the view, never escape it; whether it works at all is up to
 *   capabilities (CAP_SYS_CHROOT, dropped by `--cap-drop ALL`). Build tools that use
 *   it under a capability-keeping configuration keep working.
 * - `personality` is allowed only for the harmless personas (the default, the
 *   0xffffffff query, ADDR_NO_RANDOMIZE which gdb sets, UNAME26, PER_LINUX32);
 *   READ_IMPLIES_EXEC, MMAP_PAGE_ZERO and friends get EPERM.
 * - `clone3` returns ENOSYS rather than EPERM: its flags live in a struct in memory
 *   that BPF cannot read, and ENOSYS makes glibc (>= 2.34) fall back to `clone`,
 *   whose flags are in a register we can check.
 * - `io_uring_*` return ENOSYS so libuv and liburing users fall back to plain I/O.
 * - `socket(AF_VSOCK, ...)` gets EAFNOSUPPORT: vsock is not network-namespaced, so a
 *   sandbox could otherwise reach the hypervisor of the host (a host that is itself a
 *   VM, as these machines are) or other guests on it. `AF_VSOCK` needs no device node.
 */

/** x86_64 syscall numbers used by the filter (arch/x86/entry/syscalls/syscall_64.tbl). */
export const X86_64_SYSCALLS = {
  socket: 41,
  clone: 56,
  ptrace: 101,
  process_vm_readv: 310,
  process_vm_writev: 311,
  syslog: 103,
  uselib: 134,
  personality: 135,
  vhangup: 153,
  pivot_root: 155,
  _sysctl: 156,
  adjtimex: 159,
  chroot: 161,
  acct: 163,
  settimeofday: 164,
  mount: 165,
  umount2: 166,
  swapon: 167,
  swapoff: 168,
  reboot: 169,
  iopl: 172,
  ioperm: 173,
  create_module: 174,
  init_module: 175,
  delete_module: 176,
  get_kernel_syms: 177,
  query_module: 178,
  quotactl: 179,
  nfsservctl: 180,
  lookup_dcookie: 212,
  clock_settime: 227,
  kexec_load: 246,
  add_key: 248,
  request_key: 249,
  keyctl: 250,
  unshare: 272,
  perf_event_open: 298,
  name_to_handle_at: 303,
  open_by_handle_at: 304,
  clock_adjtime: 305,
  setns: 308,
  finit_module: 313,
  kexec_file_load: 320,
  bpf: 321,
  userfaultfd: 323,
  io_uring_setup: 425,
  io_uring_enter: 426,
  io_uring_register: 427,
  open_tree: 428,
  move_mount: 429,
  fsopen: 430,
  fsconfig: 431,
  fsmount: 432,
  fspick: 433,
  clone3: 435,
  mount_setattr: 442,
  quotactl_fd: 443,
  open_tree_attr: 467,
} as const;

/** A syscall the filter knows by name. */
export type SyscallName = keyof typeof X86_64_SYSCALLS;

/** Syscalls answered with EPERM whatever their arguments. */
export const DENIED_SYSCALLS: readonly SyscallName[] = [
  // mount table and root changes
  "mount",
  "umount2",
  "pivot_root",
  "open_tree",
  "open_tree_attr",
  "move_mount",
  "fsopen",
  "fsconfig",
  "fsmount",
  "fspick",
  "mount_setattr",
  // namespaces: new ones via unshare, joining others via setns (clone is checked by flags)
  "unshare",
  "setns",
  // kernel code, kernel state and host-global settings
  "init_module",
  "finit_module",
  "delete_module",
  "create_module",
  "query_module",
  "get_kernel_syms",
  "kexec_load",
  "kexec_file_load",
  "reboot",
  "swapon",
  "swapoff",
  "acct",
  "quotactl",
  "quotactl_fd",
  "syslog",
  "vhangup",
  "uselib",
  "_sysctl",
  "nfsservctl",
  // clocks are not namespaced (time namespaces only offset monotonic/boottime)
  "settimeofday",
  "clock_settime",
  "clock_adjtime",
  "adjtimex",
  // hardware I/O ports
  "iopl",
  "ioperm",
  // kernel keyrings are shared with the host
  "keyctl",
  "add_key",
  "request_key",
  // large attack surfaces, unneeded for builds
  "bpf",
  "perf_event_open",
  "userfaultfd",
  "lookup_dcookie",
  // file handles bypass path-based confinement ("shocker")
  "open_by_handle_at",
  "name_to_handle_at",
];

/** Syscalls answered with ENOSYS so callers fall back to an older interface. */
export const ENOSYS_SYSCALLS: readonly SyscallName[] = [
  "clone3",
  "io_uring_setup",
  "io_uring_enter",
  "io_uring_register",
];

/** CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET (clone's low word). */
export const CLONE_NEW_NAMESPACE_MASK =
  0x0002_0000 | 0x0200_0000 | 0x0400_0000 | 0x0800_0000 | 0x1000_0000 | 0x2000_0000 | 0x4000_0000;

/** `AF_VSOCK` (linux/socket.h): socket families the filter refuses. */
export const AF_VSOCK = 40;

/** personality() bits that are harmless: PER_LINUX32, UNAME26, ADDR_NO_RANDOMIZE. */
export const PERSONALITY_ALLOWED_BITS = 0x0008 | 0x0002_0000 | 0x0004_0000;

/** `seccomp_data.arch` for the native x86_64 ABI (x32 shares it). */
export const AUDIT_ARCH_X86_64 = 0xc000_003e;
const X32_SYSCALL_BIT = 0x4000_0000;

/** Filter return values (linux/seccomp.h); ERRNO carries the errno in its low 16 bits. */
export const SECCOMP_RET_KILL_PROCESS = 0x8000_0000;
export const SECCOMP_RET_ERRNO = 0x0005_0000;
export const SECCOMP_RET_ALLOW = 0x7fff_0000;
const EPERM = 1;
const ENOSYS = 38;
const EAFNOSUPPORT = 97;

/** Classic BPF opcodes (linux/filter.h) this generator emits. */
export const BPF = {
  LD_W_ABS: 0x20,
  JMP_JA: 0x05,
  JMP_JEQ_K: 0x15,
  JMP_JSET_K: 0x45,
  RET_K: 0x06,
} as const;

// struct seccomp_data offsets; args are u64, little-endian, so the low word comes first.
const OFF_NR = 0;
const OFF_ARCH = 4;
const OFF_ARG0_LO = 16;
const OFF_ARG1_LO = 24;

/** Size of one `struct sock_filter`. */
export const SOCK_FILTER_SIZE = 8;
/** Kernel limit on a filter's length (BPF_MAXINSNS). */
export const BPF_MAXINSNS = 4096;

type Label =
  | "allow"
  | "eperm"
  | "enosys"
  | "eafnosupport"
  | "kill"
  | "clone"
  | "personality"
  | "socket"
  | "pid1"
  | "vm"
  | "next";
interface Insn {
  code: number;
  k: number;
  jt?: Label;
  jf?: Label;
  label?: Label;
}

const ld = (off: number): Insn => ({ code: BPF.LD_W_ABS, k: off });
const ret = (k: number, label?: Label): Insn =>
  label ? { code: BPF.RET_K, k, label } : { code: BPF.RET_K, k };
const jeq = (k: number, jt: Label, jf: Label = "next"): Insn => ({ code: BPF.JMP_JEQ_K, k: k >>> 0, jt, jf });
const jset = (k: number, jt: Label, jf: Label = "next"): Insn => ({
  code: BPF.JMP_JSET_K,
  k: k >>> 0,
  jt,
  jf,
});

/**
 * Builds the filter as a Buffer of `struct sock_filter {u16 code; u8 jt; u8 jf; u32 k}`
 * in little-endian order, ready for `bwrap --seccomp FD`.
 */
export function buildSeccompProgram(): Buffer {
  const insns: Insn[] = [
    // Any other ABI (i386 via int 0x80) has different numbers: our checks would be wrong.
    ld(OFF_ARCH),
    jeq(AUDIT_ARCH_X86_64, "next", "kill"),
    ld(OFF_NR),
    // -1 is how a tracer skips a syscall; it would otherwise match the x32 bit below.
    jeq(0xffff_ffff, "allow"),
    // x32 shares AUDIT_ARCH_X86_64 but sets bit 30 in the number: a second syscall table.
    jset(X32_SYSCALL_BIT, "eperm"),
    jeq(X86_64_SYSCALLS.clone, "clone"),
    jeq(X86_64_SYSCALLS.personality, "personality"),
    jeq(X86_64_SYSCALLS.socket, "socket"),
    jeq(X86_64_SYSCALLS.ptrace, "next", "vm"),
    { ...ld(OFF_ARG1_LO) },
    jeq(1, "eperm", "allow"),
    { ...ld(OFF_NR), label: "vm" },
    jeq(X86_64_SYSCALLS.process_vm_readv, "pid1"),
    jeq(X86_64_SYSCALLS.process_vm_writev, "pid1"),
    ...ENOSYS_SYSCALLS.map((name) => jeq(X86_64_SYSCALLS[name], "enosys")),
    ...DENIED_SYSCALLS.map((name) => jeq(X86_64_SYSCALLS[name], "eperm")),
    ret(SECCOMP_RET_ALLOW),
    // clone(flags, ...): the kernel only looks at the low 32 bits of flags.
    { ...ld(OFF_ARG0_LO), label: "clone" },
    jset(CLONE_NEW_NAMESPACE_MASK, "eperm", "allow"),
    // personality(persona): an unsigned int, so the low word is the whole argument.
    { ...ld(OFF_ARG0_LO), label: "personality" },
    jeq(0xffff_ffff, "allow"),
    jset(~PERSONALITY_ALLOWED_BITS, "eperm", "allow"),
    // process_vm_*(pid, ...): pid_t is an int, so the low word is the whole argument.
    { ...ld(OFF_ARG0_LO), label: "pid1" },
    jeq(1, "eperm", "allow"),
    // socket(domain, ...): domain is an int, so the low word is the whole argument.
    { ...ld(OFF_ARG0_LO), label: "socket" },
    jeq(AF_VSOCK, "eafnosupport", "allow"),
    ret(SECCOMP_RET_ALLOW, "allow"),
    ret(SECCOMP_RET_ERRNO | EPERM, "eperm"),
    ret(SECCOMP_RET_ERRNO | ENOSYS, "enosys"),
    ret(SECCOMP_RET_ERRNO | EAFNOSUPPORT, "eafnosupport"),
    ret(SECCOMP_RET_KILL_PROCESS, "kill"),
  ];
  return assemble(insns);
}

/** Resolves labels to relative jump offsets and encodes the program. */
function assemble(insns: readonly Insn[]): Buffer {
  if (insns.length > BPF_MAXINSNS) throw new Error(`seccomp: program too long (${insns.length})`);
  const where = new Map<Label, number>();
  insns.forEach((insn, i) => {
    if (insn.label) where.set(insn.label, i);
  });
  const offset = (from: number, label: Label | undefined): number => {
    if (label === undefined || label === "next") return 0;
    const to = where.get(label);
    if (to === undefined) throw new Error(`seccomp: undefined label ${label}`);
    const off = to - from - 1;
    // Conditional jumps only go forward, by at most 255 instructions.
    if (off < 0 || off > 255) throw new Error(`seccomp: jump to ${label} out of range (${off})`);
    return off;
  };
  const buf = Buffer.alloc(insns.length * SOCK_FILTER_SIZE);
  insns.forEach((insn, i) => {
    const at = i * SOCK_FILTER_SIZE;
    buf.writeUInt16LE(insn.code, at);
    buf.writeUInt8(offset(i, insn.jt), at + 2);
    buf.writeUInt8(offset(i, insn.jf), at + 3);
    buf.writeUInt32LE(insn.k >>> 0, at + 4);
  });
  return buf;
}

/**
 * Writes the program to `path` (mode 0600) for bwrap. bwrap reads the program from an
 * inherited file descriptor, so the caller opens this file and hands it to the spawned
 * bwrap as an extra stdio entry; see {@link seccompArgs}.
 */
export async function writeSeccompFile(path: string): Promise<void> {
  // On another architecture every syscall would hit the KILL_PROCESS arch check.
  if (process.arch !== "x64")
    throw new Error(`the seccomp filter is x86_64-only; this host is ${process.arch}`);
  await writeFile(path, buildSeccompProgram(), { mode: 0o600 });
}

/** The stdio index the backend uses for the program: `stdio: [in, out, err, fd]`. */
export const SECCOMP_CHILD_FD = 3;

/**
 * bwrap arguments that load the program from the child's file descriptor `childFd`.
 * The fd number is the index in the spawned process's stdio array, not the parent's fd:
 * `spawn("bwrap", [...seccompArgs(3), ...], {stdio: ["pipe", "pipe", "pipe", fileFd]})`.
 * bwrap reads the fd to EOF and closes it, so the sandboxed command never inherits it.
 */
export function seccompArgs(childFd: number = SECCOMP_CHILD_FD): string[] {
  if (!Number.isInteger(childFd) || childFd < 3) throw new Error(`seccomp: fd must be >= 3, got ${childFd}`);
  return ["--seccomp", String(childFd)];
}
