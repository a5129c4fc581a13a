import { firstLine, run, which } from "../../util/run.js";
import type { BackendProbe } from "../backend.js";

/**
 * Firecracker needs its binary (PYRO_FIRECRACKER_BIN or PATH), KVM that runs guests, and
 * a C compiler to build the guest's vsock bridge once (see bridge.ts).
 */
export const firecrackerProbe: BackendProbe = {
  name: "firecracker",
  isolation: "microVM (Firecracker, KVM)",
  async probe(ctx) {
    const bin = ctx.settings.firecrackerBin
      ? await which(ctx.settings.firecrackerBin)
      : await which("firecracker", ctx.env.PATH);
    const kvm = await ctx.kvm();
    const version = bin
      ? firstLine((await run([bin, "--version"], { timeoutMs: ctx.timeoutMs })).stdout) || null
      : null;
    const reasons: string[] = [];
    if (!bin) reasons.push("no firecracker binary (set PYRO_FIRECRACKER_BIN or put firecracker on PATH)");
    if (!kvm.usable) reasons.push(`KVM not usable: ${kvm.reason}`);
    if (!(await which("cc", ctx.env.PATH)))
      reasons.push("no C compiler (cc) to build the guest vsock bridge (Debian: gcc, libc6-dev)");
    return {
      available: reasons.length === 0,
      version,
      reason: reasons.length > 0 ? reasons.join("; ") : null,
      opt_in: false,
      details: bin ? { path: bin } : {},
    };
  },
};
