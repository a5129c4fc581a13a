import { constants } from "node:fs";
import { access, mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { firstLine, run, which } from "../util/run.js";
import type { KvmStatus } from "./backend.js";

/** Exit status QEMU reports when the probe guest writes 0x10 to isa-debug-exit: (0x10 << 1) | 1. */
export const PROBE_EXIT_CODE = 33;

/**
 * A 48-byte multiboot (a.out kludge) kernel that writes 0x10 to I/O port 0xf4 and halts.
 * With `-device isa-debug-exit` QEMU exits with status 33: proof that guest code actually
 * ran on the chosen accelerator. `/dev/kvm` existing proves nothing (see MACHINE.md).
 */
export function probeKernel(): Buffer {
  const base = 0x100000;
  const magic = 0x1badb002;
  const flags = 0x00010000; // bit 16: the header carries load addresses (flat binary)
  const header = Buffer.alloc(32);
  header.writeUInt32LE(magic, 0);
  header.writeUInt32LE(flags, 4);
  header.writeUInt32LE((0x100000000 - ((magic + flags) % 0x100000000)) % 0x100000000, 8);
  header.writeUInt32LE(base, 12); // header_addr
  header.writeUInt32LE(base, 16); // load_addr
  header.writeUInt32LE(0, 20); // load_end_addr: whole file
  header.writeUInt32LE(0, 24); // bss_end_addr: none
  header.writeUInt32LE(base + 32, 28); // entry_addr: right after the header
  // mov al,0x10 ; out 0xf4,al ; cli ; hlt ; jmp $-1  (padded to 16 bytes)
  const code = Buffer.from([0xb0, 0x10, 0xe6, 0xf4, 0xfa, 0xf4, 0xeb, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0]);
  return Buffer.concat([header, code]);
}

/** argv that boots the probe kernel on an accelerator; exits 33 when guest code ran. */
export function probeArgv(qemu: string, kernel: string, accel: "kvm" | "tcg"): string[] {
  return [
    qemu,
    "-accel",
    accel,
    ...(accel === "kvm" ? ["-cpu", "host"] : []),
    "-M",
    "pc",
    "-m",
    "32",
    "-nodefaults",
    "-no-user-config",
    "-display",
    "none",
    "-serial",
    "none",
    "-device",
    "isa-debug-exit,iobase=0xf4,iosize=0x04",
    "-kernel",
    kernel,
  ];
}

export interface QemuBootProbe {
  ok: boolean;
  reason: string | null;
  ms: number;
}

export async function bootProbe(
  qemu: string,
  scratchDir: string,
  accel: "kvm" | "tcg",
  timeoutMs: number,
): Promise<QemuBootProbe> {
  await mkdir(scratchDir, { recursive: true });
  const kernel = join(scratchDir, "probe-kernel.bin");
  await writeFile(kernel, probeKernel());
  const r = await run(probeArgv(qemu, kernel, accel), { timeoutMs });
  if (r.exitCode === PROBE_EXIT_CODE) return { ok: true, reason: null, ms: Math.round(r.durationMs) };
  const why = r.timedOut
    ? `the probe guest did not finish within ${timeoutMs} ms (guest hangs)`
    : firstLine(r.stderr.replace(/^qemu-system-x86_64:\s*/gm, "")) || `qemu exited ${r.exitCode}`;
  return { ok: false, reason: why, ms: Math.round(r.durationMs) };
}

/** The shared KVM verdict: probed on first ask, then the same answer for every asker. */
export type KvmCheck = () => Promise<KvmStatus>;

/**
 * The one KVM check every backend, probe and doctor asks: probeKvm in `env` (its PATH
 * finds QEMU), run at most once per check (a failure to run the probe at all is
 * forgotten, so a later ask tries again), its probe kernel in a temporary directory
 * removed afterwards. The engine makes one per engine and hands it to its backends.
 */
export function kvmCheck(env: NodeJS.ProcessEnv, timeoutMs = 10_000): KvmCheck {
  let verdict: Promise<KvmStatus> | undefined;
  return () => {
    if (!verdict) {
      verdict = (async () => {
        const scratch = await mkdtemp(join(tmpdir(), "pyro-kvm-"));
        try {
          return await probeKvm(env, scratch, timeoutMs);
        } finally {
          await rm(scratch, { recursive: true, force: true });
        }
      })();
      verdict.catch(() => {
        verdict = undefined;
      });
    }
    return verdict;
  };
}

/**
 * KVM is usable only if a guest actually runs on it: /dev/kvm must open read-write and
 * QEMU must boot the probe kernel with `-accel kvm`.
 */
export async function probeKvm(
  env: NodeJS.ProcessEnv,
  scratchDir: string,
  timeoutMs: number,
): Promise<KvmStatus> {
  try {
    await access("/dev/kvm", constants.F_OK);
  } catch {
    return {
      present: false,
      usable: false,
      reason: "/dev/kvm does not exist (no hardware virtualisation exposed)",
    };
  }
  try {
    await access("/dev/kvm", constants.R_OK | constants.W_OK);
  } catch {
    return {
      present: true,
      usable: false,
      reason: "/dev/kvm is not readable and writable by this user (join the kvm group)",
    };
  }
  const qemu = await which("qemu-system-x86_64", env.PATH);
  if (!qemu) {
    return {
      present: true,
      usable: false,
      reason: "/dev/kvm exists but cannot be proved usable without qemu-system-x86_64",
    };
  }
  const p = await bootProbe(qemu, scratchDir, "kvm", timeoutMs);
  return p.ok
    ? { present: true, usable: true, reason: null }
    : { present: true, usable: false, reason: `a probe guest does not run under KVM: ${p.reason}` };
}
