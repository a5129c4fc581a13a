import { SANDBOX_PATH } from "../linux/launch.js";
import { seccompArgs } from "./seccomp.js";

/**
 * Host files under /proc that are not per-namespace and that uid 0 could write even
 * with every capability dropped (their permission check is the file mode): sysctls
 * (core_pattern alone is host root), the SysRq trigger, PSI triggers. bwrap 0.8 covers
 * /proc/irq and /proc/bus itself but skips /proc/sys (its write probe on the directory
 * fails). Bound read-only over the sandbox's /proc; the net sysctls below /proc/sys
 * still show the reader's own network namespace.
 */
export const PROC_READ_ONLY = ["/proc/sys", "/proc/sysrq-trigger", "/proc/pressure"] as const;

/** The files through which pid 1's memory could be written without ptrace. */
export const PID1_MEMORY = ["/proc/1/mem", "/proc/1/task/1/mem"] as const;

/**
 * The isolation flags every bwrap sandbox of pyro gets: its own pid, ipc, uts, net and
 * cgroup namespaces (network: loopback only), a new session (no TIOCSTI into the
 * caller's terminal), no capabilities, the seccomp filter on fd 3, a fresh /proc and
 * /dev, and a clean environment.
 */
export function isolationArgs(hostname: string, env: Record<string, string> = {}): string[] {
  const base: Record<string, string> = { PATH: SANDBOX_PATH, HOME: "/root", LANG: "C.UTF-8", ...env };
  return [
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-net",
    "--unshare-cgroup-try",
    "--new-session",
    "--cap-drop",
    "ALL",
    ...seccompArgs(3),
    "--hostname",
    hostname,
    "--proc",
    "/proc",
    // /proc/sys exists on every kernel: a missing one is a failed start, not a skipped bind.
    ...PROC_READ_ONLY.flatMap((p) => [p === "/proc/sys" ? "--ro-bind" : "--ro-bind-try", p, p]),
    // The sandbox's pid 1 (bwrap's init) runs as the commands' uid, dumpable: its memory
    // is not theirs to write (it outlives a reset in place; seccomp.ts refuses ptrace too).
    ...PID1_MEMORY.flatMap((p) => ["--ro-bind", "/dev/null", p]),
    "--dev",
    "/dev",
    "--clearenv",
    ...Object.entries(base).flatMap(([k, v]) => ["--setenv", k, v]),
  ];
}
