import { firstLine, run, which } from "../../util/run.js";
import type { BackendProbe } from "../backend.js";

/**
 * Proves gVisor by running a trivial sandbox with `runsc do`. Platforms are tried from
 * fastest to most portable; the first that works is reported (and used later).
 */
export const gvisorProbe: BackendProbe = {
  name: "gvisor",
  isolation: "user-space kernel (gVisor runsc)",
  strength: 20,
  async probe(ctx) {
    const bin = await which("runsc", ctx.env.PATH);
    if (!bin)
      return {
        available: false,
        version: null,
        reason: "runsc is not installed (Debian package runsc)",
        opt_in: false,
        details: {},
      };
    const version =
      firstLine((await run([bin, "--version"], { timeoutMs: ctx.timeoutMs })).stdout).replace(
        /^runsc version\s*/,
        "",
      ) || null;
    if (process.getuid?.() !== 0) {
      return {
        available: false,
        version,
        reason: "runsc needs root here (rootless runsc is not supported by this build)",
        opt_in: false,
        details: { path: bin },
      };
    }
    const kvm = await ctx.kvm();
    const platforms = kvm.usable ? ["systrap", "kvm", "ptrace"] : ["systrap", "ptrace"];
    const failures: string[] = [];
    for (const platform of platforms) {
      const r = await run(
        [
          bin,
          `--root=${ctx.scratchDir}/runsc-root`,
          "--network=none",
          `--platform=${platform}`,
          "do",
          "/bin/true",
        ],
        { timeoutMs: ctx.timeoutMs },
      );
      if (r.exitCode === 0) {
        return {
          available: true,
          version,
          reason: null,
          opt_in: false,
          details: { path: bin, platform, sandbox_ms: Math.round(r.durationMs) },
        };
      }
      failures.push(
        `${platform}: ${r.timedOut ? "timed out" : firstLine(r.stderr.split("\n").reverse().join("\n")) || `exit ${r.exitCode}`}`,
      );
    }
    return {
      available: false,
      version,
      reason: `runsc could not start a sandbox (${failures.join("; ")})`,
      opt_in: false,
      details: { path: bin },
    };
  },
};
