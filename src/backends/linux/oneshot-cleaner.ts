import { spawn } from "node:child_process";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join, resolve, sep } from "node:path";
import { LAUNCH_ENV } from "../common.js";
import type { SpareRefill } from "../disk-image.js";

/**
 * The end of a one-shot for a caller that exits as soon as it has the answer (the CLI's
 * `pyro run`, issue 18's row of whole processes): what is left of the run after its
 * command (the cgroups, whose rmdir answers EBUSY until the sandbox's last processes are
 * reaped, 5-40 ms of polls, and the run's directory, whose disk image takes 5-50 ms to
 * unlink) is removed by a detached shell instead of before the process exits.
 *
 * What does not move off the path: every process the cgroups list is SIGKILLed here,
 * before the answer (so nothing of the sandbox runs once `pyro run` has returned; the
 * cleaner kills again what it still finds), and the hand-off is refused when anything is
 * mounted below the directory in this mount namespace (the in-process removal unmounts
 * first; `rm -rf` would descend into it). A cleaner killed before it finished leaves the
 * run's directory and cgroups as a killed owner does: any later run's sweep removes them
 * (oneshot-sweep.ts, once the directory is STALE_AFTER_MS old and its cgroups are empty).
 *
 * Returns false when the caller must clean up itself (a mount below the directory, or the
 * cleaner could not be started).
 */
export function cleanUpDetached(o: {
  dir: string;
  /** The run's cgroup directories (one per v1 controller, or the v2 group). */
  cgroupDirs: readonly string[];
  /** The launch tools' shell (busybox sh or bash). */
  shell: readonly string[];
  /** The next spare disk image to copy afterwards (disk-image.ts), off the run's path too. */
  refill?: SpareRefill;
}): boolean {
  for (const dir of o.cgroupDirs) killListed(dir);
  if (hasMountsUnder(o.dir)) return false;
  const r = o.refill;
  // GNU cp by path: busybox's shell would run its own applet, which has no --sparse.
  const cp = r ? findOnPath("cp") : undefined;
  const refillArgs = r && cp ? [r.template, r.dir, r.prefix, cp] : ["", "", "", ""];
  const argv = [...o.shell.slice(1), "-c", CLEANER, "pyro-clean", o.dir, ...refillArgs, ...o.cgroupDirs];
  try {
    const child = spawn(o.shell[0]!, argv, {
      detached: true,
      stdio: "ignore",
      env: { ...LAUNCH_ENV },
      cwd: "/",
    });
    // A failure to exec arrives as an event: the leftovers are then a later sweep's.
    child.on("error", () => {});
    child.unref();
    return child.pid !== undefined;
  } catch {
    return false;
  }
}

/**
 * The cleaner: for each cgroup directory, SIGKILL what it lists and rmdir until it is
 * gone (at most ~5 s, as CgroupLimits.destroy), then remove the run's directory, then,
 * when asked and no spare is there, copy the next spare disk image (a partial copy named
 * with this shell's pid, renamed when whole). Positional arguments: the directory, the
 * refill's template, spare directory, name prefix and cp (empty: none), then the cgroup
 * directories.
 */
const CLEANER = `dir=$1; tpl=$2; sdir=$3; prefix=$4; cp=$5; shift 5
for cg in "$@"; do
  n=0
  while [ -d "$cg" ] && ! rmdir "$cg" 2>/dev/null; do
    [ -e "$cg/cgroup.kill" ] && echo 1 > "$cg/cgroup.kill" 2>/dev/null
    for p in $(cat "$cg/cgroup.procs" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    n=$((n + 1))
    [ "$n" -ge 500 ] && break
    sleep 0.01
  done
done
rm -rf -- "$dir"
[ -n "$tpl" ] || exit 0
set -- "$sdir/$prefix"*.img
[ -e "$1" ] && exit 0
mkdir -p -m 700 -- "$sdir" || exit 0
part="$sdir/$prefix$$.0.img.partial"
if "$cp" --sparse=always -- "$tpl" "$part"; then mv -f -- "$part" "\${part%.partial}"; else rm -f -- "$part"; fi
`;

/** The first `name` on LAUNCH_ENV's PATH (what a spawn of `name` would run). */
function findOnPath(name: string): string | undefined {
  for (const dir of (LAUNCH_ENV.PATH ?? "").split(":"))
    if (dir && existsSync(join(dir, name))) return join(dir, name);
  return undefined;
}

/** SIGKILLs every process a cgroup directory lists now (cgroup.kill too where there is one). */
function killListed(dir: string): void {
  try {
    if (existsSync(`${dir}/cgroup.kill`)) writeFileSync(`${dir}/cgroup.kill`, "1");
  } catch {
    // Gone already, or v1: the listed processes below.
  }
  let procs = "";
  try {
    procs = readFileSync(`${dir}/cgroup.procs`, "utf8");
  } catch {
    return;
  }
  for (const pid of procs.split("\n").filter(Boolean)) {
    try {
      process.kill(Number(pid), "SIGKILL");
    } catch {
      // Exited meanwhile.
    }
  }
}

/** Whether anything is mounted at or below `path` in this process's mount namespace. */
function hasMountsUnder(path: string): boolean {
  const abs = resolve(path);
  let text: string;
  try {
    // Synchronous: procfs answers from memory, and this is on the answer's path.
    text = readFileSync("/proc/self/mountinfo", "utf8");
  } catch {
    return true;
  }
  return text
    .split("\n")
    .map((l) =>
      (l.split(" ")[4] ?? "").replace(/\\([0-7]{3})/g, (_, d: string) =>
        String.fromCharCode(Number.parseInt(d, 8)),
      ),
    )
    .some((p) => p === abs || p.startsWith(abs + sep));
}
