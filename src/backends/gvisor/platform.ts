import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { firstLine, run } from "../../util/run.js";
import type { KvmStatus } from "../backend.js";

/** gVisor platforms pyro knows, fastest first. `systrap` exists from runsc 2023 on. */
export const GVISOR_PLATFORMS = ["systrap", "kvm", "ptrace"] as const;
export type GvisorPlatform = (typeof GVISOR_PLATFORMS)[number];

/** What trying the platforms found: the first one that ran a sandbox, or why none did. */
export interface PlatformVerdict {
  platform: GvisorPlatform | null;
  /** Wall time of the successful `runsc do`. */
  sandbox_ms: number | null;
  /** One line per platform that failed (or was skipped), in the order tried. */
  failures: string[];
  /** Known incompatibilities of this runsc seen in the probe sandbox (it still works). */
  caveats: string[];
}

/**
 * The probe sandbox's command: succeeds on any platform that runs, and also tries GNU
 * `stat` (on the host's root, which `runsc do` uses): runsc releases before 2023 reject
 * statx(AT_NO_AUTOMOUNT), which coreutils >= 9 (`ls`, `stat`) always pass.
 */
export const PROBE_SCRIPT =
  "command -v stat >/dev/null 2>&1 || exit 0; stat / >/dev/null 2>&1 || echo pyro-statx-einval";

export const STATX_CAVEAT =
  "this runsc rejects statx with AT_NO_AUTOMOUNT: `ls` and `stat` from coreutils 9 (Debian 12 environments) fail with 'Invalid argument' inside gVisor; a newer runsc fixes it";

export interface PlatformProbeOptions {
  /** Scratch directory for runsc's state; a temp directory (removed after) when omitted. */
  scratchDir?: string;
  timeoutMs: number;
  /** KVM verdict: the kvm platform is only tried where KVM actually runs guests. */
  kvm: () => Promise<KvmStatus>;
}

/**
 * Which platform to run sandboxes on, found by starting a trivial sandbox on each in turn
 * (`runsc do`). A runsc without systrap rejects the flag at once; kvm is tried
 * only where KVM runs guests (where it does not, it hangs rather than failing).
 */
export async function probePlatforms(bin: string, options: PlatformProbeOptions): Promise<PlatformVerdict> {
  const scratch = options.scratchDir ?? (await mkdtemp(join(tmpdir(), "pyro-gvisor-probe-")));
  try {
    const failures: string[] = [];
    for (const platform of GVISOR_PLATFORMS) {
      if (platform === "kvm") {
        // Asked only here: where systrap works, KVM is never probed.
        const kvm = await options.kvm();
        if (!kvm.usable) {
          failures.push(`kvm: skipped (${kvm.reason ?? "KVM is not usable"})`);
          continue;
        }
      }
      const r = await run(
        [
          bin,
          `--root=${scratch}/runsc-root`,
          "--network=none",
          `--platform=${platform}`,
          "do",
          "/bin/sh",
          "-c",
          PROBE_SCRIPT,
        ],
        // (run() gives it a pipe for stdin: runsc gives its stdio to the sandbox's user.)
        { timeoutMs: options.timeoutMs },
      );
      if (r.exitCode === 0) {
        const caveats = r.stdout.includes("pyro-statx-einval") ? [STATX_CAVEAT] : [];
        return { platform, sandbox_ms: Math.round(r.durationMs), failures, caveats };
      }
      const why = r.timedOut
        ? "timed out"
        : firstLine(r.stderr.split("\n").reverse().join("\n")) || `exit ${r.exitCode}`;
      failures.push(`${platform}: ${why}`);
    }
    return { platform: null, sandbox_ms: null, failures, caveats: [] };
  } finally {
    if (!options.scratchDir) await rm(scratch, { recursive: true, force: true });
  }
}

/**
 * Platform verdicts per runsc binary, shared by the doctor probe and the backend so one
 * process pays for the probe once. A cache of a host fact, not a manager: entries are
 * never changed, and a failed probe is forgotten so the next caller tries again.
 */
const verdicts = new Map<string, Promise<PlatformVerdict>>();

export function platformFor(bin: string, options: PlatformProbeOptions): Promise<PlatformVerdict> {
  let v = verdicts.get(bin);
  if (!v) {
    v = probePlatforms(bin, options);
    verdicts.set(bin, v);
    v.then(
      (r) => {
        if (r.platform === null) verdicts.delete(bin);
      },
      () => verdicts.delete(bin),
    );
  }
  return v;
}
