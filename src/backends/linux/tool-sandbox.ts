/**
 * A bwrap sandbox for one host program run on untrusted data (e2fsck on a guest's disk,
 * GNU tar extracting a workspace's export): every namespace unshared, no capabilities,
 * no environment but PATH, the host's programs read-only, and nothing else: no /dev (the
 * host's device nodes) and no /proc (bwrap's binary as /proc/1/exe), whose owner the
 * sandbox may be (see {@link withReadOnlyHost}); the caller binds the one tree the
 * program works on. It dies with its parent.
 */

import { privateMountShell, readOnlyHostLine } from "./launch.js";

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
  ];
}

/**
 * `bwrapArgv` (a tool sandbox with `--dev /dev` and `--proc /proc`: e2fsck opens
 * /dev/null and reads /proc's mounts) run from a private mount namespace where /dev and
 * bwrap's binary are read-only (launch.ts readOnlyHostLine has why).
 */
export function withReadOnlyHost(bwrapArgv: string[]): string[] {
  const script = `${readOnlyHostLine("mount")} && exec "$@"`;
  return [...privateMountShell(["/bin/sh"], script, "pyro-tool"), ...bwrapArgv];
}
