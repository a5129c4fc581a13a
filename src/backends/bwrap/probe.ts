import { firstLine, run, which } from "../../util/run.js";
import type { BackendProbe } from "../backend.js";

/** Proves bubblewrap by running `/bin/true` with every namespace unshared. */
export const bwrapProbe: BackendProbe = {
  name: "bwrap",
  isolation: "Linux namespaces + seccomp (bubblewrap)",
  async probe(ctx) {
    const bin = await which("bwrap", ctx.env.PATH);
    if (!bin) return missing("bwrap is not installed (Debian package bubblewrap)");
    const version = firstLine((await run([bin, "--version"], { timeoutMs: ctx.timeoutMs })).stdout) || null;
    const r = await run(
      [
        bin,
        "--unshare-all",
        "--die-with-parent",
        "--cap-drop",
        "ALL",
        "--ro-bind",
        "/",
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "/bin/true",
      ],
      { timeoutMs: ctx.timeoutMs },
    );
    if (r.exitCode !== 0) {
      return {
        available: false,
        version,
        reason: `bwrap could not start a sandbox: ${firstLine(r.stderr) || `exit ${r.exitCode}`}`,
        opt_in: false,
        details: { path: bin },
      };
    }
    return {
      available: true,
      version,
      reason: null,
      opt_in: false,
      details: { path: bin, sandbox_ms: Math.round(r.durationMs) },
    };
  },
};

function missing(reason: string) {
  return { available: false, version: null, reason, opt_in: false, details: {} };
}
