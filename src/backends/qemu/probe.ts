import { firstLine, run, which } from "../../util/run.js";
import type { BackendProbe } from "../backend.js";
import { bootProbe } from "../kvm.js";

/**
 * QEMU works whenever its binary can boot a guest; with usable KVM it is a default
 * candidate, under TCG (software emulation) it is opt-in only.
 */
export const qemuProbe: BackendProbe = {
  name: "qemu",
  isolation: "virtual machine (QEMU microvm)",
  async probe(ctx) {
    const bin = await which("qemu-system-x86_64", ctx.env.PATH);
    if (!bin)
      return {
        available: false,
        version: null,
        reason: "qemu-system-x86_64 is not installed (Debian package qemu-system-x86)",
        opt_in: false,
        details: {},
      };
    const version =
      firstLine((await run([bin, "--version"], { timeoutMs: ctx.timeoutMs })).stdout).replace(
        /^QEMU emulator version\s*/,
        "",
      ) || null;
    const kvm = await ctx.kvm();
    if (kvm.usable)
      return { available: true, version, reason: null, opt_in: false, details: { path: bin, accel: "kvm" } };
    const tcg = await bootProbe(bin, ctx.scratchDir, "tcg", ctx.timeoutMs);
    if (!tcg.ok)
      return {
        available: false,
        version,
        reason: `qemu cannot boot a guest: ${tcg.reason}`,
        opt_in: false,
        details: { path: bin },
      };
    return {
      available: true,
      version,
      reason: `KVM not usable (${kvm.reason}); TCG software emulation works but is slow, so qemu is used only when asked for`,
      opt_in: true,
      details: { path: bin, accel: "tcg", tcg_probe_ms: tcg.ms },
    };
  },
};
