import { type LaunchTools, OVERLAY_OPTIONS, privateMountShell, readOnlyHostLine } from "../linux/launch.js";

/** The line a prepared launch prints on stdout once its mounts are done. */
export const READY_LINE = "pyro-ready";

/** What a prepared launch mounts, where its run's arguments arrive, and what it removes. */
export interface PreparedLaunchPaths {
  /** The run's disk image, its mount point and the overlay's directories on it. */
  image: string;
  diskMount: string;
  upper: string;
  work: string;
  /** The environment's root filesystem (the overlay's lower layer) and the merged root. */
  lower: string;
  merged: string;
  /** The file holding the run's arguments (see {@link preparedLaunchArgv}). */
  argsFile: string;
  /** The run's directory, removed by the launch step when it ends. */
  dir: string;
  /**
   * The cgroup directories the launch step sits in, each with the `cgroup.procs` of its
   * hierarchy's root: at its end the step moves itself there and removes the group. At
   * most three (cgroup v1: memory, cpu, pids; v2: one).
   */
  cgroups: readonly { dir: string; rootProcs: string }[];
}

/**
 * The one-shot launch of bwrap made ahead of its command (docs/backends.md "Prepared
 * one-shot launch"): `unshare --mount` with a shell that
 *
 * 1. waits for a first stdin line (the owner places it in its cgroup first), mounts the
 *    disk image and the overlay, prints {@link READY_LINE};
 * 2. waits for a second line. `run`: the owner wrote the run's limits to the cgroup and
 *    the run's arguments to `argsFile` (the command, a NUL, then bwrap options, each
 *    NUL-terminated: `--setenv K V`), so the shell reads the command into a variable
 *    and runs `bwrap PREFIX --args 4 -- /bin/sh -c "$cmd"` (a child: the step stays) with
 *    the rest of stdin as the command's. Values arrive as a file and positional
 *    arguments, never in script text. It writes bwrap's exit status to fd 5 before
 *    unmounting: the owner has its result without waiting for the disk's unmount (~5 ms).
 *    Anything else, EOF included (the owner exited or closed it): nothing runs;
 * 3. either way, it then unmounts, removes the run's directory and its cgroup, and exits.
 *
 * Descriptors: 0-2 pipes, 3 the seccomp program (bwrap's --seccomp 3), 5 the status pipe.
 */
export function preparedLaunchArgv(
  p: PreparedLaunchPaths,
  bwrapPrefix: readonly string[],
  tools: LaunchTools,
): string[] {
  if (p.cgroups.length > 3) throw new Error("a prepared launch takes at most three cgroup directories");
  const cg = [0, 1, 2].flatMap((i) => [p.cgroups[i]?.dir ?? "", p.cgroups[i]?.rootProcs ?? ""]);
  const script = [
    "set -eu",
    "img=$1 mnt=$2 upper=$3 work=$4 lower=$5 target=$6 args=$7 dir=$8; shift 8",
    "cg1=$1 r1=$2 cg2=$3 r2=$4 cg3=$5 r3=$6; shift 6",
    "read -r _gate",
    'for p in /proc/$$/fd/*; do n=${p##*/}; if [ "$n" -gt 3 ] && [ "$n" != 5 ]; then eval "exec $n>&-" 2>/dev/null || true; fi; done',
    `${tools.loopMount} -t ext4 -o loop,nosuid,nodev "$img" "$mnt"`,
    'mkdir -p "$upper" "$work"',
    `${tools.mount} -t overlay pyro -o "lowerdir=$lower,upperdir=$upper,workdir=$work,${OVERLAY_OPTIONS}" "$target"`,
    readOnlyHostLine(tools.mount),
    // SIGPIPE is ignored only around the shell's own writes to the owner (it may be gone
    // and the clean-up must still run): an ignored signal is inherited by what it starts.
    `trap '' PIPE; echo ${READY_LINE}; trap - PIPE`,
    "set +e",
    // (A failed redirection of `exec` would end the shell before its clean-up: checked first.)
    // The gate line: `run SECONDS`, the run's deadline (digits only, checked here too).
    'if IFS=" " read -r go secs && [ "$go" = run ] && case "$secs" in "" | *[!0-9]*) false ;; esac &&',
    '  [ -f "$args" ] && exec 4<"$args" && IFS= read -r -d "" cmd <&4; then',
    // A foreground child, not `&`: an asynchronous list would start with SIGINT and
    // SIGQUIT ignored (busybox), which the command would inherit. Under `timeout`: the
    // owner's own timer ends a run at its deadline, but an owner killed mid-run cannot,
    // and the step outlives its owner; this ends it a little later (bwrap's
    // --die-with-parent takes the sandbox along).
    // The shell's own report of a killed child ("Killed") must not go to the owner's pipe:
    // with the owner gone, that write would end the shell by SIGPIPE before its clean-up.
    // The command gets the pipe itself (fd 2 again, fd 6 closed for it), set in a
    // subshell: busybox applies a command's redirections in the shell while it waits.
    "  exec 6>&2 2>/dev/null",
    '  (exec timeout -s KILL "$secs" "$@" --args 4 -- /bin/sh -c "$cmd" 2>&6 5>&- 6>&-)',
    "  rc=$?",
    "  trap '' PIPE",
    "  exec 0</dev/null 1>/dev/null 2>/dev/null 4<&- 6>&-",
    '  echo "$rc" >&5',
    "fi",
    "trap '' PIPE",
    "exec 5>&- 1>/dev/null 2>/dev/null",
    // The sandbox's processes may still be dying (its deadline killed bwrap, and the pid
    // namespace goes after it) and keep the mounts busy for a moment: retried for up to
    // ~1 s, then detached lazily (this namespace is the step's own; the loop device is
    // released with the last user).
    "unm() { i=0; until " + tools.umount + ' "$1" 2>/dev/null; do i=$((i + 1))',
    "  if [ $i -ge 50 ]; then " + tools.umount + ' -l "$1" 2>/dev/null; return 0; fi; sleep 0.02; done; }',
    'unm "$target"; unm "$mnt"; rm -rf "$dir"',
    // Out of its cgroup, then the group removed. Right after a run the kernel may still
    // count the sandbox's exited tasks in it for a moment (EBUSY, seen here after the
    // owner was killed mid-run): retried for up to ~1 s.
    'rmcg() { [ -n "$1" ] || return 0; echo $$ >"$2"; i=0',
    '  until rmdir "$1" 2>/dev/null || [ $i -ge 50 ]; do i=$((i + 1)); sleep 0.02; done; }',
    'rmcg "$cg1" "$r1"; rmcg "$cg2" "$r2"; rmcg "$cg3" "$r3"',
    "exit 0",
  ].join("\n");
  return [
    ...privateMountShell(tools.shell, script, "pyro-prepared-launch"),
    p.image,
    p.diskMount,
    p.upper,
    p.work,
    p.lower,
    p.merged,
    p.argsFile,
    p.dir,
    ...cg,
    ...bwrapPrefix,
  ];
}

/**
 * The arguments file of a prepared run: the command, then bwrap's `--setenv` options for
 * `env`, each NUL-terminated. A NUL inside a value would split it and start a bwrap option
 * of the command's author (`--ro-bind / /hostroot`): refused by the caller, and here again.
 */
export function preparedRunArgs(command: string, env: Record<string, string>): Buffer {
  const parts = [command, ...Object.entries(env).flatMap(([k, v]) => ["--setenv", k, v])];
  if (parts.some((s) => s.includes("\0")))
    throw new Error("a prepared run's arguments cannot contain NUL bytes");
  return Buffer.from(parts.map((s) => `${s}\0`).join(""), "utf8");
}
