import { spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { mkdtemp, open, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  AUDIT_ARCH_X86_64,
  BPF,
  BPF_MAXINSNS,
  buildSeccompProgram,
  DENIED_SYSCALLS,
  ENOSYS_SYSCALLS,
  SECCOMP_RET_ALLOW,
  SECCOMP_RET_ERRNO,
  SECCOMP_RET_KILL_PROCESS,
  SOCK_FILTER_SIZE,
  seccompArgs,
  writeSeccompFile,
  X86_64_SYSCALLS,
} from "../../../src/backends/bwrap/seccomp.js";

interface Insn {
  code: number;
  jt: number;
  jf: number;
  k: number;
}

function decode(buf: Buffer): Insn[] {
  const out: Insn[] = [];
  for (let at = 0; at < buf.length; at += SOCK_FILTER_SIZE) {
    out.push({
      code: buf.readUInt16LE(at),
      jt: buf.readUInt8(at + 2),
      jf: buf.readUInt8(at + 3),
      k: buf.readUInt32LE(at + 4),
    });
  }
  return out;
}

/** A tiny interpreter for the opcodes the generator emits, over a fake seccomp_data. */
function evaluate(prog: Insn[], data: { nr: number; arch?: number; arg0?: bigint }): number {
  const mem = Buffer.alloc(64);
  mem.writeInt32LE(data.nr, 0);
  mem.writeUInt32LE(data.arch ?? AUDIT_ARCH_X86_64, 4);
  mem.writeBigUInt64LE(data.arg0 ?? 0n, 16);
  let acc = 0;
  for (let pc = 0; pc < prog.length; pc++) {
    const i = prog[pc]!;
    switch (i.code) {
      case BPF.LD_W_ABS:
        acc = mem.readUInt32LE(i.k);
        break;
      case BPF.JMP_JEQ_K:
        pc += acc === i.k ? i.jt : i.jf;
        break;
      case BPF.JMP_JSET_K:
        pc += (acc & i.k) >>> 0 !== 0 ? i.jt : i.jf;
        break;
      case BPF.JMP_JA:
        pc += i.k;
        break;
      case BPF.RET_K:
        return i.k;
      default:
        throw new Error(`unexpected opcode ${i.code}`);
    }
  }
  throw new Error("fell off the end of the program");
}

const EPERM = SECCOMP_RET_ERRNO | 1;
const ENOSYS = SECCOMP_RET_ERRNO | 38;
const nr = X86_64_SYSCALLS;

describe("seccomp program structure", () => {
  const buf = buildSeccompProgram();
  const prog = decode(buf);

  it("is a whole number of sock_filter entries and well under the kernel limit", () => {
    expect(buf.length % SOCK_FILTER_SIZE).toBe(0);
    expect(prog.length).toBeGreaterThan(10);
    expect(prog.length).toBeLessThan(BPF_MAXINSNS);
  });

  it("keeps every jump inside the program and ends with a return", () => {
    prog.forEach((insn, pc) => {
      if (insn.code === BPF.JMP_JEQ_K || insn.code === BPF.JMP_JSET_K) {
        expect(pc + 1 + insn.jt).toBeLessThan(prog.length);
        expect(pc + 1 + insn.jf).toBeLessThan(prog.length);
      }
      if (insn.code === BPF.JMP_JA) expect(pc + 1 + insn.k).toBeLessThan(prog.length);
    });
    expect(prog.at(-1)!.code).toBe(BPF.RET_K);
  });

  it("only loads 32-bit words inside struct seccomp_data", () => {
    for (const insn of prog.filter((i) => i.code === BPF.LD_W_ABS)) {
      expect(insn.k % 4).toBe(0);
      expect(insn.k).toBeLessThan(64);
    }
  });

  it("is deterministic", () => {
    expect(buildSeccompProgram().equals(buf)).toBe(true);
  });

  it("kills a process that uses another ABI (i386)", () => {
    expect(evaluate(prog, { nr: 1, arch: 0x4000_0003 })).toBe(SECCOMP_RET_KILL_PROCESS);
  });

  it("refuses the x32 syscall table", () => {
    expect(evaluate(prog, { nr: 0x4000_0000 | 1 })).toBe(EPERM);
  });

  it("answers every denied syscall with EPERM and clone3/io_uring with ENOSYS", () => {
    for (const name of DENIED_SYSCALLS) expect(evaluate(prog, { nr: nr[name] }), name).toBe(EPERM);
    for (const name of ENOSYS_SYSCALLS) expect(evaluate(prog, { nr: nr[name] }), name).toBe(ENOSYS);
  });

  it("allows ordinary syscalls, ptrace and chroot", () => {
    // -1 is what a tracer writes to skip a syscall; the kernel answers it with ENOSYS.
    for (const n of [0, 1, 2, 59, 57, 231, nr.ptrace, nr.chroot, 999, -1]) {
      expect(evaluate(prog, { nr: n }), String(n)).toBe(SECCOMP_RET_ALLOW);
    }
  });

  it("allows thread and fork clones but refuses clones that create namespaces", () => {
    const thread = 0x003d0f00n; // glibc pthread_create flags
    const fork = 0x01200011n; // CLONE_CHILD_SETTID|CLONE_CHILD_CLEARTID|SIGCHLD
    expect(evaluate(prog, { nr: nr.clone, arg0: thread })).toBe(SECCOMP_RET_ALLOW);
    expect(evaluate(prog, { nr: nr.clone, arg0: fork })).toBe(SECCOMP_RET_ALLOW);
    for (const flag of [
      0x20000n,
      0x2000000n,
      0x4000000n,
      0x8000000n,
      0x10000000n,
      0x20000000n,
      0x40000000n,
    ]) {
      expect(evaluate(prog, { nr: nr.clone, arg0: fork | flag }), flag.toString(16)).toBe(EPERM);
    }
    // High bits of flags are ignored by the kernel, so they must not confuse the check.
    expect(evaluate(prog, { nr: nr.clone, arg0: 0xffff_ffff_0000_0011n })).toBe(SECCOMP_RET_ALLOW);
  });

  it("allows harmless personalities only", () => {
    for (const p of [0n, 0xffff_ffffn, 0x0040000n, 0x0008n, 0x0020000n]) {
      expect(evaluate(prog, { nr: nr.personality, arg0: p }), p.toString(16)).toBe(SECCOMP_RET_ALLOW);
    }
    for (const p of [0x0400000n, 0x0100000n, 0x0200000n]) {
      expect(evaluate(prog, { nr: nr.personality, arg0: p }), p.toString(16)).toBe(EPERM);
    }
  });

  it("refuses AF_VSOCK sockets (vsock is not network-namespaced) and allows other families", () => {
    const EAFNOSUPPORT = SECCOMP_RET_ERRNO | 97;
    expect(evaluate(prog, { nr: nr.socket, arg0: 40n })).toBe(EAFNOSUPPORT);
    // High bits of an int argument are ignored by the kernel, so they must not hide the family.
    expect(evaluate(prog, { nr: nr.socket, arg0: 0xffff_ffff_0000_0028n })).toBe(EAFNOSUPPORT);
    for (const family of [1n, 2n, 10n, 16n, 17n]) {
      expect(evaluate(prog, { nr: nr.socket, arg0: family }), String(family)).toBe(SECCOMP_RET_ALLOW);
    }
  });

  const header = "/usr/include/x86_64-linux-gnu/asm/unistd_64.h";
  it.skipIf(!existsSync(header))(
    "uses the same syscall numbers as the installed kernel headers (skipped: no asm/unistd_64.h)",
    () => {
      const text = readFileSync(header, "utf8");
      let checked = 0;
      for (const [name, number] of Object.entries(X86_64_SYSCALLS)) {
        const m = new RegExp(`#define __NR_${name} (\\d+)\\b`).exec(text);
        if (!m) continue; // newer than the headers (open_tree_attr)
        expect(Number(m[1]), name).toBe(number);
        checked++;
      }
      expect(checked).toBeGreaterThan(40);
    },
  );

  it("passes the program on a child fd of at least 3", () => {
    expect(seccompArgs()).toEqual(["--seccomp", "3"]);
    expect(() => seccompArgs(1)).toThrow();
  });
});

// ---- real sandboxes ----

const bwrap = ["/usr/bin/bwrap", "/bin/bwrap"].find((p) => existsSync(p));
const isRoot = process.getuid?.() === 0;
const skipReal = !bwrap || !isRoot;
const why = !bwrap ? "skipped: bwrap is not installed" : !isRoot ? "skipped: needs root" : "";

interface Result {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  ms: number;
}

/**
 * Spawns bwrap with the program file on child fd 3. Uses spawn directly because
 * util/run.ts has no way to pass an extra inherited fd yet.
 */
async function sandboxed(
  program: string | null,
  cmd: string[],
  opts: { capDrop?: boolean } = {},
): Promise<Result> {
  const fh = program ? await open(program, "r") : null;
  const argv = [
    "--unshare-all",
    "--die-with-parent",
    ...(opts.capDrop === false ? [] : ["--cap-drop", "ALL"]),
    "--ro-bind",
    "/",
    "/",
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "--tmpfs",
    "/mnt",
    ...(fh ? seccompArgs(3) : []),
    "--",
    ...cmd,
  ];
  const started = performance.now();
  try {
    return await new Promise<Result>((resolve, reject) => {
      const child = spawn(bwrap!, argv, { stdio: ["ignore", "pipe", "pipe", fh ? fh.fd : "ignore"] });
      let stdout = "";
      let stderr = "";
      child.stdout!.on("data", (c: Buffer) => (stdout += c.toString()));
      child.stderr!.on("data", (c: Buffer) => (stderr += c.toString()));
      const timer = setTimeout(() => child.kill("SIGKILL"), 30_000);
      child.on("error", reject);
      child.on("close", (code, signal) => {
        clearTimeout(timer);
        resolve({ code, signal, stdout, stderr, ms: performance.now() - started });
      });
    });
  } finally {
    await fh?.close();
  }
}

describe("seccomp program inside bwrap (real)", () => {
  let dir = "";
  let file = "";
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "pyro-seccomp-"));
    file = join(dir, "filter.bpf");
    await writeSeccompFile(file);
  });
  afterAll(async () => {
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it.skipIf(skipReal)(`runs /bin/true under the filter ${why}`, async () => {
    const r = await sandboxed(file, ["/bin/true"]);
    expect(r.stderr).toBe("");
    expect(r.code).toBe(0);
  });

  it.skipIf(skipReal)(`does not leak the program's fd into the sandbox ${why}`, async () => {
    const r = await sandboxed(file, ["/bin/ls", "-l", "/proc/self/fd/"]);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/ 2 -> /);
    expect(r.stdout).not.toContain("filter.bpf");
  });

  it.skipIf(skipReal)(`refuses a new user namespace that --cap-drop alone would allow ${why}`, async () => {
    const control = await sandboxed(null, ["unshare", "-U", "true"]);
    expect(control.code).toBe(0);
    const r = await sandboxed(file, ["unshare", "-U", "true"]);
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/Operation not permitted/);
  });

  it.skipIf(skipReal)(
    `refuses mounts and new mount namespaces even with capabilities kept ${why}`,
    async () => {
      const control = await sandboxed(null, ["sh", "-c", "unshare -m true && mount -t tmpfs x /mnt"], {
        capDrop: false,
      });
      expect(control.code).toBe(0);
      const unshare = await sandboxed(file, ["unshare", "-m", "true"], { capDrop: false });
      expect(unshare.code).not.toBe(0);
      expect(unshare.stderr).toMatch(/Operation not permitted/);
      const mount = await sandboxed(file, ["mount", "-t", "tmpfs", "x", "/mnt"], { capDrop: false });
      expect(mount.code).not.toBe(0);
      expect(mount.stderr).toMatch(/permission denied|not permitted/i);
    },
  );

  it.skipIf(skipReal)(`refuses namespace flags passed to clone() directly ${why}`, async () => {
    // A raw clone(CLONE_NEWUSER|SIGCHLD) through ctypes, so no libc wrapper decides.
    const py = [
      "import ctypes, os",
      "libc = ctypes.CDLL(None, use_errno=True)",
      "r = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)",
      "if r == 0: os._exit(0)",
      "print(r, ctypes.get_errno())",
    ].join("\n");
    const r = await sandboxed(file, ["/usr/bin/python3", "-c", py]);
    expect(r.stdout.trim()).toBe("-1 1");
  });

  it.skipIf(skipReal)(
    `keeps ordinary work running: sh, ls, python3, node with threads and child processes ${why}`,
    async () => {
      const cases: string[][] = [
        ["sh", "-c", "echo hi | cat"],
        ["ls", "/"],
        [
          "/usr/bin/python3",
          "-c",
          "import subprocess, threading; t=threading.Thread(target=print); t.start(); t.join(); subprocess.run(['true'], check=True); print(1)",
        ],
        [process.execPath, "-e", 'require("child_process").execSync("true"); console.log("ok")'],
        [
          process.execPath,
          "-e",
          'const {Worker}=require("worker_threads"); new Worker("process.exit(0)",{eval:true}).on("exit",c=>console.log("worker",c))',
        ],
        [
          process.execPath,
          "-e",
          'require("fs").promises.readFile("/etc/hostname").then(()=>console.log("fs ok"))',
        ],
      ];
      for (const cmd of cases) {
        const r = await sandboxed(file, cmd);
        expect({ cmd: cmd.join(" "), code: r.code, stderr: r.stderr }).toEqual({
          cmd: cmd.join(" "),
          code: 0,
          stderr: "",
        });
      }
    },
  );

  const strace = ["/usr/bin/strace", "/bin/strace"].find((p) => existsSync(p));
  it.skipIf(skipReal || !strace)(
    `lets strace trace its children: ptrace is allowed ${why || (strace ? "" : "skipped: strace is not installed")}`,
    async () => {
      const r = await sandboxed(file, [strace!, "-f", "-e", "trace=execve", "sh", "-c", "true"]);
      expect(r.stderr).toMatch(/execve\("(\/usr)?\/bin\/sh"/);
      expect(r.code).toBe(0);
    },
  );

  it.skipIf(skipReal)(`adds little to a sandbox start (timings printed, not asserted) ${why}`, async () => {
    await sandboxed(file, ["/bin/true"]); // warm the page cache
    const a: number[] = [];
    const b: number[] = [];
    // Interleaved so drift on a shared machine hits both series alike.
    for (let i = 0; i < 9; i++) {
      a.push((await sandboxed(null, ["/bin/true"])).ms);
      b.push((await sandboxed(file, ["/bin/true"])).ms);
    }
    const median = (xs: number[]) => xs.sort((x, y) => x - y)[Math.floor(xs.length / 2)]!;
    const without = median(a);
    const withFilter = median(b);
    console.error(
      `bwrap /bin/true: ${without.toFixed(1)} ms without seccomp, ${withFilter.toFixed(1)} ms with`,
    );
    // Only a sanity bound: other test files share the 2 cores, so ratios are noisy here.
    expect(withFilter).toBeLessThan(1000);
  });
});
