/**
 * The swap helper of bwrap's in-place reset (reset.ts): a small shell left running per
 * sandbox in the launch step's mount namespace and the sandbox's IPC and UTS namespaces, which
 * does the one privileged step of the layer swap (clear System V IPC objects, mount the
 * message queues once, unmount the previous overlay, mount the new one) when the host
 * asks through a FIFO. Without it every reset spawned `nsenter ... sh -c` from the host
 * (a fork of the host's Node process, nsenter, a shell: 9-15 ms of the ~50 ms reset);
 * a request to the helper is a FIFO round trip (~0.3 ms) plus its own mount commands.
 *
 * It is a root process beside a sandbox, so it is kept narrow:
 * - two fixed operations: `swap`, its only variable argument a snapshot name checked
 *   against the snapshot name rule (no `/`, no leading `.`) by the host and again by the
 *   helper, and `hostname` (a pool's spare taking its workspace's name, pool.ts), its
 *   argument `pyro-` and 1-12 of [A-Za-z0-9-], checked on both sides too; requests to one
 *   helper do not overlap (the host sends the next once the last is answered); every
 *   path it touches is fixed when it starts: relative to its working
 *   directory (the sandbox directory) and to descriptor 5 (the workspace's snapshots
 *   directory), never read from a request, never a script;
 * - unreachable from the sandbox: its FIFOs are in the sandbox directory on the host,
 *   which no bind puts inside, and it runs in the host's pid namespace (commands cannot
 *   see or signal it);
 * - it dies with the sandbox: it is in the sandbox's cgroup (a stop ends it with the
 *   rest), and leaves within a second of the launch step's end (its watcher looks);
 * - the host checks it before each use (its mount, IPC and UTS namespaces are the sandbox's,
 *   its working directory and descriptor 5 are this workspace's), and falls back to the
 *   spawn when it is missing; a refused or failed request means a restart.
 *
 * Working directory and descriptor follow renames (a pool's spare sandbox takes over a
 * workspace's directories by renaming them, pool.ts), so the checks hold by identity
 * (device and inode), not by path.
 */
import { randomBytes } from "node:crypto";
import { closeSync, constants, openSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { mkdir, rm } from "node:fs/promises";
import { Socket } from "node:net";
import { join } from "node:path";
import type { SandboxSpec } from "../backend.js";
import { spawnDetached } from "../common.js";
import type { CgroupLimits } from "../linux/cgroups.js";
import { type LaunchTools, OVERLAY_OPTIONS } from "../linux/launch.js";
import type { SandboxLayout } from "../linux/layout.js";

/** The helper's directory in the sandbox directory: its FIFOs and the pid the host recorded. */
export const HELPER_DIR = "reset-helper";
/** The paths the helper uses, relative to the sandbox directory (see sandboxLayout). */
const REL = { upper: "mnt/disk/ws/upper", work: "mnt/disk/ws/work", merged: "mnt/ws", mq: "mnt/mq" };
/** Deadline of one request: the mounts take milliseconds; past this the reset restarts. */
const REQUEST_MS = 10_000;

/** Snapshot names the helper accepts: the core's rule (core/snapshots.ts) and `baseline`. */
const SNAPSHOT_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;

/**
 * Shell (builtins but for the mount commands): `swap NAME UMOUNT MQ` with UMOUNT and MQ
 * 0 or 1 (unmount the overlay a previous reset stacked; mount the message queues),
 * answered `ID ok`, `ID fail` or `ID refused` on the reply FIFO. $1 is the launch step's
 * pid; the sandbox directory is the working directory, the snapshots directory fd 5
 * (both opened in the launch step's mount namespace).
 *
 * A request is read with a plain blocking `read`: both shells read a pipe a byte at a
 * time, and anything that ends a `read` inside a line loses the bytes read so far
 * (bash and busybox at a `-t` timeout; busybox also at any signal it catches, such as a
 * child's SIGCHLD). The rest of the line would then be taken as a request of its own,
 * and the host would wait its whole deadline for an answer that never comes. So the
 * loop has no timeout (the watcher below wakes it), a background umount is reaped
 * before the next read (its SIGCHLD cannot land in one), and an ID must be exactly the
 * host's 16 hex digits, so the tail of a cut line is never run as a request.
 */
function helperScript(tools: LaunchTools): string {
  const overlay = `nosuid,nodev,lowerdir=/proc/self/fd/5/$1,upperdir=${REL.upper},workdir=${REL.work},${OVERLAY_OPTIONS}`;
  return [
    "set -u",
    "read -r _gate",
    "launch=$1",
    `d=${HELPER_DIR}`,
    'rm -f "$d/req" "$d/rep" "$d/tick" && mkfifo -m 600 "$d/req" "$d/rep" "$d/tick" || exit 1',
    // stderr stays the log (mount's errors); stdin was the gate.
    "exec </dev/null >/dev/null",
    // Read-write: opening never blocks and the FIFO never reads end-of-file.
    'exec 3<>"$d/req" 4<>"$d/rep"',
    `${tools.shell.join(" ")} -c '${watcherScript()}' pyro-reset-watch "$launch" 3>&- 4>&- 5<&- &`,
    "bg=",
    "swap() {",
    "  for k in shm sem msg; do",
    '    if [ ! -r "/proc/sysvipc/$k" ] || { read -r _ && read -r _; } < "/proc/sysvipc/$k"; then ipcrm --all || return 1; break; fi',
    "  done",
    `  if [ "$3" = 1 ]; then ${tools.mount} -t mqueue pyro-mq ${REL.mq} || return 1; fi`,
    `  if [ "$2" = 1 ]; then ${unmountPrevious(tools)}; fi`,
    `  ${tools.mount} -t overlay pyro -o "${overlay}" ${REL.merged}`,
    "}",
    "while :; do",
    "  read -r id op name um mq rest <&3 || continue",
    // Leave once the launch step (the only other process of this mount namespace) is gone.
    '  [ "/proc/$launch/ns/mnt" -ef "/proc/$$/ns/mnt" ] || exit 0',
    '  case "$id" in ????????????????) ;; *) continue ;; esac',
    '  case "$id" in *[!0-9a-f]*) continue ;; esac',
    // Each field on its own: the verb, no extra words, flags 0 or 1, the name's rule.
    '  r=ok; [ -z "$rest" ] || r=refused',
    '  case "$um" in 0|1) ;; *) r=refused ;; esac',
    '  case "$mq" in 0|1) ;; *) r=refused ;; esac',
    '  case "$op" in',
    "    swap)",
    '      case "$name" in [A-Za-z0-9]*) ;; *) r=refused ;; esac',
    '      case "$name" in *[!A-Za-z0-9._-]*) r=refused ;; esac',
    '      if [ "$r" = ok ] && ! swap "$name" "$um" "$mq"; then r=fail; fi ;;',
    // A pool's spare taking its workspace's name (pool.ts): `pyro-` and 1-12 of [A-Za-z0-9-].
    "    hostname)",
    '      [ "$um$mq" = 00 ] || r=refused',
    '      case "$name" in pyro-?*) ;; *) r=refused ;; esac',
    '      case "$name" in *[!A-Za-z0-9-]*|pyro-?????????????*) r=refused ;; esac',
    `      if [ "$r" = ok ] && ! ${tools.hostname} "$name"; then r=fail; fi ;;`,
    "    *) r=refused ;;",
    "  esac",
    '  echo "$id $r" >&4',
    '  if [ -n "$bg" ]; then wait "$bg"; bg=; fi',
    "done",
  ].join("\n");
}

/**
 * Shell of the helper's watcher (`pyro-reset-watch`, $1 the launch step's pid), a second
 * small process in the same namespaces and cgroup: it looks once a second whether the
 * launch step is still in its mount namespace, waiting on a FIFO nobody writes, and once
 * it is gone wakes the helper with an empty line, on which the helper leaves. Without
 * it the helper would hold the mount namespace (and the disk image) after a sandbox
 * that died by itself. Single quotes only outside it: it is passed as one argument.
 */
function watcherScript(): string {
  return [
    `exec 7<>${HELPER_DIR}/tick`,
    'while [ "/proc/$1/ns/mnt" -ef "/proc/$$/ns/mnt" ]; do read -r -t 1 _ <&7; done',
    // Read-write: never blocks, also when the helper is gone.
    `echo 1<>${HELPER_DIR}/req`,
  ].join("; ");
}

/**
 * Shell: lazily unmounts the overlay at /workspace's mount point without waiting for
 * umount(2) to return. A lazy umount detaches the mount, releases the namespace lock and
 * only then waits for an RCU grace period (2.8 ms on a quiet machine, 15 ms and more
 * under load: most of the helper's time). So the umount runs in the background and the
 * helper goes on as soon as the mount point no longer shows the overlay it held open as
 * fd 6 (builtin `test -ef`, a few microseconds a round). The spin is bounded (it takes
 * CPU from the umount it waits for); past it, on a busy machine where the umount has not
 * run yet, the helper waits for the umount to end and looks once more, so only a umount
 * that failed fails the swap. The background umount is reaped after the answer.
 */
function unmountPrevious(tools: LaunchTools): string {
  const m = REL.merged;
  return [
    `exec 6<${m} || return 1`,
    `${tools.umount} -l ${m} & bg=$!`,
    "    n=0",
    `    while [ ${m} -ef /proc/self/fd/6 ] && [ $n -lt 20000 ]; do n=$((n + 1)); done`,
    `    if [ ${m} -ef /proc/self/fd/6 ]; then wait "$bg"; bg=; fi`,
    `    if [ ${m} -ef /proc/self/fd/6 ]; then exec 6<&-; return 1; fi`,
    "    exec 6<&-",
  ].join("\n");
}

/**
 * Starts the helper of a sandbox that has just started (`pids`: its launch step and
 * agent), in its cgroup. Best effort: without a helper, resets spawn their swap.
 */
export async function startResetHelper(
  spec: SandboxSpec,
  l: SandboxLayout,
  pids: { launch: number; agent: number },
  tools: LaunchTools,
  cg: CgroupLimits,
): Promise<void> {
  if (!layoutMatches(spec, l)) return;
  const dir = join(spec.dir, HELPER_DIR);
  await rm(dir, { recursive: true, force: true });
  await mkdir(dir, { mode: 0o700 });
  const script = helperScript(tools);
  const argv = [
    "nsenter",
    `--mount=/proc/${pids.launch}/ns/mnt`,
    `--ipc=/proc/${pids.agent}/ns/ipc`,
    // The sandbox's hostname is set there when a pool's spare takes a workspace (pool.ts).
    `--uts=/proc/${pids.agent}/ns/uts`,
    "--",
    ...tools.shell,
    "-c",
    // Both opened in the launch step's mount namespace (nsenter --wd opens it before entering,
    // and mounts at paths relative to a host-namespace directory fail).
    `cd "$2" && exec 5<"$3" || exit 1; ${script}`,
    "pyro-reset-helper",
    String(pids.launch),
    spec.dir,
    spec.snapshotsDir,
  ];
  const child = spawnDetached(argv, { logFile: join(l.logs, "reset-helper.log"), stdinPipe: true });
  try {
    // In the sandbox's cgroup before it runs anything: a stop ends it with the sandbox.
    await cg.addProcess(child.pid);
  } catch {
    process.kill(child.pid, "SIGKILL");
    return;
  }
  writeFileSync(join(dir, "pid"), String(child.pid), { mode: 0o600 });
  child.stdin?.end("go\n");
}

/** Whether `l` is the layout of `spec.dir` that the helper's relative paths name. */
function layoutMatches(spec: SandboxSpec, l: SandboxLayout): boolean {
  return (
    !l.legacy &&
    l.wsUpper === join(spec.dir, REL.upper) &&
    l.wsWork === join(spec.dir, REL.work) &&
    l.wsMerged === join(spec.dir, REL.merged)
  );
}

/** Same file (device and inode), following links; false when either cannot be read. */
function sameFile(a: string, b: string): boolean {
  try {
    const x = statSync(a, { bigint: true });
    const y = statSync(b, { bigint: true });
    return x.dev === y.dev && x.ino === y.ino;
  } catch {
    return false;
  }
}

/**
 * The helper of this sandbox when it is there and is this sandbox's (see the top of the
 * file), else null. Synchronous reads of /proc: a handful of stats.
 */
function findHelper(spec: SandboxSpec, l: SandboxLayout, pids: { launch: number; agent: number }) {
  if (!layoutMatches(spec, l)) return null;
  const dir = join(spec.dir, HELPER_DIR);
  let pid: number;
  try {
    pid = Number(readFileSync(join(dir, "pid"), "utf8"));
  } catch {
    return null;
  }
  if (!Number.isInteger(pid) || pid <= 0) return null;
  const p = `/proc/${pid}`;
  const ours =
    sameFile(`${p}/ns/mnt`, `/proc/${pids.launch}/ns/mnt`) &&
    sameFile(`${p}/ns/ipc`, `/proc/${pids.agent}/ns/ipc`) &&
    sameFile(`${p}/ns/uts`, `/proc/${pids.agent}/ns/uts`) &&
    sameFile(`${p}/cwd`, spec.dir) &&
    sameFile(`${p}/fd/5`, spec.snapshotsDir);
  return ours ? dir : null;
}

/**
 * Asks the sandbox's helper to swap /workspace's overlay onto `spec.snapshot` (the host
 * has moved the layer directories already). "absent" when there is no usable helper
 * (the caller spawns the swap itself), otherwise whether the helper did it.
 */
export async function helperSwap(
  spec: SandboxSpec,
  l: SandboxLayout,
  pids: { launch: number; agent: number },
  flags: { umount: boolean; mq: boolean },
): Promise<"absent" | "ok" | "fail"> {
  if (!SNAPSHOT_NAME.test(spec.snapshot)) return "absent";
  return helperRequest(spec, l, pids, `swap ${spec.snapshot} ${flags.umount ? 1 : 0} ${flags.mq ? 1 : 0}`);
}

/** A pool's spare's hostname (`pyro-` and up to 12 of [A-Za-z0-9-]): asks the helper to set it. */
export const HELPER_HOSTNAME = /^pyro-[A-Za-z0-9-]{1,12}$/;

/**
 * Asks the sandbox's helper to set the sandbox's hostname (a pool's spare taking its
 * workspace's, pool.ts). "absent" when there is no usable helper; requests to one helper
 * must not overlap (an answer read by another request's reader is dropped).
 */
export async function helperHostname(
  spec: SandboxSpec,
  l: SandboxLayout,
  pids: { launch: number; agent: number },
  name: string,
): Promise<"absent" | "ok" | "fail"> {
  if (!HELPER_HOSTNAME.test(name)) return "absent";
  return helperRequest(spec, l, pids, `hostname ${name} 0 0`);
}

/** Sends one request line (`OP NAME UMOUNT MQ`) to this sandbox's helper and reads its answer. */
async function helperRequest(
  spec: SandboxSpec,
  l: SandboxLayout,
  pids: { launch: number; agent: number },
  request: string,
): Promise<"absent" | "ok" | "fail"> {
  const dir = findHelper(spec, l, pids);
  if (!dir) return "absent";
  let req: number;
  try {
    // Non-blocking: fails (ENXIO) when no process has the FIFO open, i.e. the helper left.
    req = openSync(join(dir, "req"), constants.O_WRONLY | constants.O_NONBLOCK);
  } catch {
    return "absent";
  }
  const id = randomBytes(8).toString("hex");
  try {
    // One line under PIPE_BUF: written whole, never interleaved.
    writeFileSync(req, `${id} ${request}\n`);
  } catch {
    return "fail";
  } finally {
    closeSync(req);
  }
  // The answer waits in the FIFO (the helper holds it open): read after writing.
  let rep: Socket;
  try {
    const fd = openSync(join(dir, "rep"), constants.O_RDONLY | constants.O_NONBLOCK);
    rep = new Socket({ fd, readable: true, writable: false });
  } catch {
    return "fail";
  }
  return (await readAnswer(rep, id)) === "ok" ? "ok" : "fail";
}

/** The helper's answer to request `id` (earlier answers nobody read are skipped); "" on timeout. */
function readAnswer(rep: Socket, id: string): Promise<string> {
  return new Promise((resolve) => {
    let buf = "";
    const done = (a: string) => {
      clearTimeout(timer);
      rep.destroy();
      resolve(a);
    };
    const timer = setTimeout(() => done(""), REQUEST_MS);
    rep.on("error", () => done(""));
    rep.on("data", (chunk: Buffer) => {
      buf += chunk.toString("utf8");
      for (let nl = buf.indexOf("\n"); nl >= 0; nl = buf.indexOf("\n")) {
        const [rid, answer] = buf.slice(0, nl).split(" ");
        buf = buf.slice(nl + 1);
        if (rid === id) return done(answer ?? "");
      }
    });
  });
}
