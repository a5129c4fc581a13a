/**
 * A bwrap sandbox for one host program run on untrusted data (e2fsck on a guest's disk,
 * GNU tar extracting a workspace's export): every namespace unshared, no capabilities,
 * no environment but PATH, the host's programs read-only, a private /proc, and nothing
 * else (no /dev: the host's device nodes would be the sandbox's to chmod, see
 * {@link withReadOnlyDev}); the caller binds the one tree the program works on. It dies
 * with its parent.
 */

import { privateMountShell } from "./launch.js";

/**
 * The isolation every such sandbox has: every namespace its own, no capabilities, no
 * environment, gone with its parent (bwrap/tree-tar.ts adds no host files at all).
 */
export const ISOLATED = [
  "--unshare-all",
  "--die-with-parent",
  "--new-session",
  "--cap-drop",
  "ALL",
  "--clearenv",
];

/** The host's programs (and their libraries), bound read-only where they exist. */
const HOST_PROGRAMS = ["/usr", "/bin", "/sbin", "/lib", "/lib64"];

/**
 * bwrap's options before the caller's binds. `etc`: the host's /etc too (e2fsck reads
 * it). `unprivileged`: the program runs as uid 1000 of its own user namespace, so one
 * that acts otherwise as root gets the ordinary behaviour (GNU tar, as root, makes a
 * read-only directory read-only before it extracts into it, which fails without
 * capabilities); what it makes still belongs to the caller, whom that uid maps to.
 */
export function toolSandboxArgs(options: { etc?: boolean; unprivileged?: boolean } = {}): string[] {
  const ro = options.etc ? [...HOST_PROGRAMS, "/etc"] : HOST_PROGRAMS;
  return [
    ...(options.unprivileged ? ["--unshare-user", "--uid", "1000", "--gid", "1000"] : []),
    ...ISOLATED,
    "--setenv",
    "PATH",
    "/usr/sbin:/usr/bin:/sbin:/bin",
    ...ro.flatMap((d) => ["--ro-bind-try", d, d]),
    "--proc",
    "/proc",
  ];
}

/**
 * `bwrapArgv` (a tool sandbox with `--dev /dev`: e2fsck opens /dev/null) run from a
 * private mount namespace whose /dev is read-only, so the host's device nodes it binds
 * stay read-only (launch.ts readOnlyDevLine has why).
 */
export function withReadOnlyDev(bwrapArgv: string[]): string[] {
  const script = 'mount -o remount,bind,ro /dev && exec "$@"';
  return [...privateMountShell(["/bin/sh"], script, "pyro-tool"), ...bwrapArgv];
}
