import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { bootProbe, kvmCheck, probeArgv, probeKernel } from "../../../src/backends/kvm.js";
import { which } from "../../../src/util/run.js";

const qemu = await which("qemu-system-x86_64");

describe("KVM / QEMU boot probe", () => {
  it("builds a valid multiboot header whose checksum cancels magic and flags", () => {
    const k = probeKernel();
    const magic = k.readUInt32LE(0);
    const flags = k.readUInt32LE(4);
    const sum = k.readUInt32LE(8);
    expect(magic).toBe(0x1badb002);
    expect((magic + flags + sum) % 2 ** 32).toBe(0);
    expect(k.readUInt32LE(28)).toBe(0x100020); // entry right after the 32-byte header
    expect(k.subarray(32, 36)).toEqual(Buffer.from([0xb0, 0x10, 0xe6, 0xf4])); // mov al,0x10; out 0xf4,al
  });

  it("asks for the host CPU only under KVM", () => {
    expect(probeArgv("q", "/k", "kvm")).toContain("host");
    expect(probeArgv("q", "/k", "tcg")).not.toContain("host");
    expect(probeArgv("q", "/k", "tcg")).toContain("isa-debug-exit,iobase=0xf4,iosize=0x04");
  });

  it.skipIf(!qemu)(
    "proves guest code runs: the probe kernel boots under TCG and exits 33 (skipped: no qemu-system-x86_64)",
    async () => {
      const dir = await mkdtemp(join(tmpdir(), "pyro-kvm-"));
      try {
        const r = await bootProbe(qemu!, dir, "tcg", 20_000);
        expect(r).toMatchObject({ ok: true, reason: null });
      } finally {
        await rm(dir, { recursive: true, force: true });
      }
    },
  );
});

describe("kvmCheck (the shared KVM verdict)", () => {
  it("probes in the environment it is given, once, and gives every asker the same verdict", async () => {
    // No QEMU on this PATH: KVM cannot be proved usable, whatever process.env has.
    const check = kvmCheck({ PATH: "/nonexistent" }, 5_000);
    const first = check();
    expect(check()).toBe(first);
    const v = await first;
    expect(v.usable).toBe(false);
    expect(v.reason).toMatch(/\/dev\/kvm/);
  });
});
