import { firstLine, run, which } from "../../util/run.js";
import type { BackendProbe } from "../backend.js";
import { platformFor, STATX_CAVEAT } from "./platform.js";

/**
 * Proves gVisor by running a trivial sandbox with `runsc do`. Platforms are tried from
 * fastest to most portable; the first that works is reported (and used by the backend,
 * which shares the verdict within a process).
 */
export const gvisorProbe: BackendProbe = {
  name: "gvisor",
  isolation: "user-space kernel (gVisor runsc)",
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
    const verdict = await platformFor(bin, { timeoutMs: ctx.timeoutMs, kvm: ctx.kvm });
    if (verdict.platform) {
      // The statx bug is worked around by a preloaded shim when a C compiler can build it.
      const cc = (await which("cc", ctx.env.PATH)) ?? (await which("gcc", ctx.env.PATH));
      const caveats = verdict.caveats.map((c) =>
        c === STATX_CAVEAT && cc
          ? "this runsc rejects statx(AT_NO_AUTOMOUNT); pyro preloads a shim into guests that clears the flag"
          : c,
      );
      return {
        available: true,
        version,
        // A caveat, not a refusal: the sandbox works, some guest tools misbehave.
        reason: caveats.length > 0 ? caveats.join("; ") : null,
        opt_in: false,
        details: {
          path: bin,
          platform: verdict.platform,
          sandbox_ms: verdict.sandbox_ms,
          ...(caveats.length > 0 ? { caveats } : {}),
        },
      };
    }
    return {
      available: false,
      version,
      reason: `runsc could not start a sandbox (${verdict.failures.join("; ")})`,
      opt_in: false,
      details: { path: bin },
    };
  },
};
