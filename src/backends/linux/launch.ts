/** One copy-on-write mount made in the sandbox's private mount namespace. */
export interface Overlay {
  lower: string;
  upper: string;
  work: string;
  target: string;
  /**
   * Made a shared mount once mounted: a sandbox's bind of it is then its slave, and an
   * overlay mounted over it later in the launch step's namespace appears in the sandbox
   * (bwrap's in-place reset). Nothing flows back: the sandbox's copy is a slave.
   */
  shared?: boolean;
}

/**
 * Overlay features pyro does not need, switched off: each makes the mount check the upper
 * and work directories (measured here: 14 ms per mount with them, 5 ms without). Without
 * redirect_dir, renaming a directory that came from the lower layer copies it up.
 */
export const OVERLAY_OPTIONS = "index=off,xino=off,redirect_dir=off,metacopy=off";

/**
 * A sandbox's disk (see disk-image.ts): the ext4 image, where to mount it, and the
 * directories to make in it (the overlays' upper and work directories live there).
 */
export interface Disk {
  image: string;
  mount: string;
  mkdirs: readonly string[];
  /**
   * The image is deleted when the sandbox ends (a one-shot's): mounted with barrier=0, so
   * its unmount, in the launch step's exit, does not flush the loop device to the host's
   * disk (measured here: 12-14 ms against 25-39 ms; a one-shot waits for that exit).
   * Nothing of such an image has to survive a crash.
   */
  throwaway?: boolean;
}

/**
 * The launch step's line, run where "$1" is bwrap, that makes read-only the two kinds of
 * host inode a bwrap sandbox reaches and whose owner its uid 0 would be when the host
 * runs as root (an owner needs no capability to chmod a file or set its times):
 * - the host's device nodes, which bwrap's `--dev` binds (null, zero, full, random,
 *   urandom, tty): this namespace's /dev is remounted read-only, and a bind keeps the
 *   flag, so they are read-only mounts that still open, read and write as devices;
 * - bwrap's own binary, the sandbox's pid 1, reachable as /proc/1/exe: bound read-only
 *   onto itself before it runs.
 * Remounts of this namespace's mounts only (`bind`), never the host's. A failure ends
 * the script (fail closed). `mount`: the mount command of the script's shell.
 */
export function readOnlyHostLine(mount: string): string {
  return [
    `${mount} -o remount,bind,ro /dev`,
    'b=$(command -v "$1")',
    `${mount} -o bind "$b" "$b"`,
    `${mount} -o remount,bind,ro "$b"`,
  ].join(" && ");
}

/**
 * The shell and mount commands of the launch step. Both must handle descriptors above 9.
 * `loopMount` mounts the disk image: always util-linux's, whose loop setup survives
 * concurrent launches (busybox 1.35's spins at full CPU when launches race for the same
 * free loop device: eight starts at once left four spinning until their timeout).
 */
export interface LaunchTools {
  shell: string[];
  mount: string;
  loopMount: string;
  umount: string;
  /** Sets the hostname of the UTS namespace it runs in (bwrap's reset helper, for the pool). */
  hostname: string;
}

/** Portable: bash and util-linux mount (dash cannot name descriptors above 9). */
export const BASH_TOOLS: LaunchTools = {
  shell: ["/bin/bash"],
  mount: "mount",
  loopMount: "mount",
  umount: "umount",
  hostname: "hostname",
};

/** Faster where busybox-static is installed (setup installs it): ~3 ms less per launch. */
export const BUSYBOX_TOOLS: LaunchTools = {
  shell: ["/bin/busybox", "sh"],
  mount: "/bin/busybox mount",
  // By path: busybox's shell runs its own applet for a bare `mount`.
  loopMount: "/usr/bin/mount",
  umount: "/bin/busybox umount",
  hostname: "/bin/busybox hostname",
};

export async function detectLaunchTools(): Promise<LaunchTools> {
  const { access, constants } = await import("node:fs/promises");
  const usable = (path: string) =>
    access(path, constants.X_OK).then(
      () => true,
      () => false,
    );
  if (!(await usable("/bin/busybox"))) return BASH_TOOLS;
  // util-linux's mount for the image, by path (merged /usr or not).
  if (await usable("/usr/bin/mount")) return BUSYBOX_TOOLS;
  if (await usable("/bin/mount")) return { ...BUSYBOX_TOOLS, loopMount: "/bin/mount" };
  return BASH_TOOLS;
}

/**
 * Bytes of a sandbox's own stdout and stderr kept in its host log file. Whatever runs in
 * the sandbox can write to the descriptors it inherited (through /proc/1/fd/1 if nothing
 * else), so the log is fed through a pipe by a reader outside the sandbox that keeps the
 * first LOG_CAP_BYTES (start-up errors land there) and discards the rest: a sandbox
 * cannot grow a host file.
 */
export const LOG_CAP_BYTES = 64 * 1024;

/**
 * argv that runs `command` in a private mount namespace after mounting `overlays`:
 * `unshare --mount --propagation private -- bash -c SCRIPT ...`. The script waits for
 * one line on stdin (the parent places it in its cgroup first), closes every inherited
 * descriptor but stdio and fd 3 (the seccomp program), mounts, then becomes `command`, or
 * with `cappedLog` (detached sandboxes) runs it with its stdout and stderr in a pipe to a
 * capped log reader (see {@link LOG_CAP_BYTES}).
 * Values arrive as positional arguments, never spliced into the script text.
 */
export function launchArgv(
  overlays: readonly Overlay[],
  command: readonly string[],
  tools: LaunchTools = BASH_TOOLS,
  options: { cappedLog?: boolean; disk?: Disk; readOnlyHost?: boolean } = {},
): string[] {
  const disk = options.disk;
  const script = [
    "set -eu",
    "read -r _gate",
    'for p in /proc/$$/fd/*; do n=${p##*/}; if [ "$n" -gt 3 ]; then eval "exec $n>&-" 2>/dev/null || true; fi; done',
    // The disk: mount the image, then make the layer directories in it (a count, then paths;
    // the script is made for that count).
    ...(disk
      ? [
          // A loop device still backed by the image (a disk reader's read-only one, which
          // the kernel detaches a moment after the reader exits, or the previous sandbox's)
          // would be reused by mount -o loop: util-linux reuses a device already backed by
          // the same file, and the disk came up read-only when that was the reader's. Wait
          // for it to go (at most 2 s; shell builtins only, no process per start).
          'i=0; while :; do busy=; for f in /sys/block/loop*/loop/backing_file; do [ -r "$f" ] && read -r b < "$f" && [ "$b" = "$1" ] && busy=1 && break; done; { [ -z "$busy" ] || [ "$i" -ge 200 ]; } && break; i=$((i + 1)); sleep 0.01; done',
          // The type given: util-linux mount would probe it with libblkid first (~4 ms here).
          `${tools.loopMount} -t ext4 -o loop,nosuid,nodev${disk.throwaway ? ",barrier=0" : ""} "$1" "$2"; shift 2`,
          // One mkdir for all (busybox's shell forks per mkdir: ~5-10 ms each under load).
          `shift${disk.mkdirs.length > 0 ? `; mkdir -p -- ${disk.mkdirs.map((_, i) => `"\${${i + 1}}"`).join(" ")}; shift ${disk.mkdirs.length}` : ""}`,
        ]
      : []),
    ...overlays.map(
      (o) =>
        `${tools.mount} -t overlay pyro -o "lowerdir=$1,upperdir=$2,workdir=$3,${OVERLAY_OPTIONS}" "$4"; ${o.shared ? `${tools.mount} --make-shared "$4"; ` : ""}shift 4`,
    ),
    ...(options.readOnlyHost ? [readOnlyHostLine(tools.mount)] : []),
    // The reader is outside the sandbox (this shell's mount namespace, not bwrap's or
    // runsc's) and holds no descriptor but the pipe and the log. One-shots keep their
    // stdio: the caller reads it through pipes with its own cap.
    // dd with one-byte blocks writes each byte as it comes (head -c buffers until exit).
    options.cappedLog
      ? `"$@" 2>&1 | { dd bs=1 count=${LOG_CAP_BYTES} 2>/dev/null; cat >/dev/null; } 3<&-`
      : 'exec "$@"',
  ].join("\n");
  return [
    ...privateMountShell(tools.shell, script, "pyro-launch"),
    ...(disk ? [disk.image, disk.mount, String(disk.mkdirs.length), ...disk.mkdirs] : []),
    ...overlays.flatMap((o) => [o.lower, o.upper, o.work, o.target]),
    ...command,
  ];
}

/**
 * argv of `script` run by the launch shell in a private mount namespace of its own
 * (`unshare --mount --propagation private`): what it mounts is seen by nothing outside
 * and goes with it. `name` is the script's $0; its positional arguments follow.
 */
export function privateMountShell(shell: readonly string[], script: string, name: string): string[] {
  return ["unshare", "--mount", "--propagation", "private", "--", ...shell, "-c", script, name];
}

export const SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
