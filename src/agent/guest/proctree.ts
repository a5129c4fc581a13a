/**
 * Finding and killing every process a command started. A process group alone is not
 * enough: children may call setsid() (new session and group) and may be orphaned to
 * init when their parent exits. So a command's tree is the union of
 *   - its process group,
 *   - the ppid closure of its first process (catches setsid while the parent lives),
 *   - every process whose initial environment carries the command's marker variable
 *     (catches orphans, unless they exec'd with a scrubbed environment).
 */
import { readdirSync, readFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { liveThreadsBehind, stateLetter, untilReaped } from "./reaping.js";

/** Environment variable that tags every process of one exec. */
export const TREE_MARKER_VAR = "PYRO_EXEC_TOKEN";

interface ProcInfo {
  ppid: number;
  pgid: number;
  sid: number;
  /** R running or runnable, S sleeping, D in uninterruptible wait, T stopped... */
  state: string;
  /** utime + stime in clock ticks. */
  cpuTicks: number;
}

/**
 * Up to this many processes, /proc is read synchronously: an async readFile is five
 * thread-pool round trips (~0.4 ms on the bench machine) where a sync read of a stat file
 * takes ~0.03 ms, and every exec scans once after its command (hangUpSession). A sandbox
 * at rest holds a handful of processes; above the bound (a build, a fork bomb) the scan
 * stays async so the agent keeps answering while it reads.
 */
export const SYNC_SCAN_MAX = 64;

/**
 * Parses /proc/`pid`/stat's text; null for a zombie or a dead process. A main thread that
 * exited alone shows as a zombie while its other threads run: that process is alive.
 */
function procInfo(pid: number | string, text: string): ProcInfo | null {
  // "pid (comm) state ppid pgrp ...": comm may contain spaces and parentheses,
  // so parse from the last ')'.
  const fields = text.slice(text.lastIndexOf(")") + 2).split(" ");
  const state = fields[0];
  if (state === "X" || (state === "Z" && !liveThreadsBehind(Number(pid)))) return null;
  return {
    ppid: Number(fields[1]),
    pgid: Number(fields[2]),
    sid: Number(fields[3]),
    state: state ?? "",
    cpuTicks: Number(fields[11]) + Number(fields[12]),
  };
}

function readStatSync(pid: string): string | null {
  try {
    return readFileSync(`/proc/${pid}/stat`, "utf8");
  } catch {
    return null;
  }
}

/** Live (non-zombie) processes from /proc. Processes that vanish mid-scan are skipped. */
async function scanProc(): Promise<Map<number, ProcInfo>> {
  const procs = new Map<number, ProcInfo>();
  let names: string[];
  try {
    names = readdirSync("/proc").filter((n) => /^\d+$/.test(n));
  } catch {
    return procs;
  }
  const add = (n: string, text: string | null) => {
    const info = text ? procInfo(n, text) : null;
    if (info) procs.set(Number(n), info);
  };
  if (names.length <= SYNC_SCAN_MAX) {
    for (const n of names) add(n, readStatSync(n));
    return procs;
  }
  await Promise.all(
    names.map(async (n) => add(n, await readFile(`/proc/${n}/stat`, "utf8").catch(() => null))),
  );
  return procs;
}

async function hasMarker(pid: number, needle: string): Promise<boolean> {
  const env = await readFile(`/proc/${pid}/environ`).catch(() => null);
  if (!env) return false;
  return (
    env.includes(Buffer.from(`\0${needle}\0`)) ||
    env.subarray(0, needle.length + 1).equals(Buffer.from(`${needle}\0`))
  );
}

/** Every live process that belongs to the tree started as `rootPid` (see the module comment). */
export async function findTree(rootPid: number, marker: string): Promise<number[]> {
  const procs = await scanProc();
  const members = new Set<number>();
  if (procs.has(rootPid)) members.add(rootPid);
  for (const [pid, info] of procs) if (info.pgid === rootPid) members.add(pid);
  // ppid closure: repeat until no new member appears (a process may be listed before its parent).
  let grew = true;
  while (grew) {
    grew = false;
    for (const [pid, info] of procs) {
      if (!members.has(pid) && (members.has(info.ppid) || info.ppid === rootPid)) {
        members.add(pid);
        grew = true;
      }
    }
  }
  const needle = `${TREE_MARKER_VAR}=${marker}`;
  await Promise.all(
    [...procs.keys()]
      .filter((pid) => !members.has(pid))
      .map(async (pid) => {
        if (await hasMarker(pid, needle)) members.add(pid);
      }),
  );
  members.delete(process.pid);
  members.delete(1);
  return [...members];
}

function groupSignal(pgid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pgid, signal);
  } catch {
    // The group is gone.
  }
}

function signalAll(pids: number[], signal: NodeJS.Signals): void {
  for (const pid of pids) {
    try {
      process.kill(pid, signal);
    } catch {
      // Exited in between.
    }
  }
}

/**
 * How long killTree keeps at a tree that will not die: a safety net, not a pace (SIGKILL
 * cannot be caught, so every member ends, however long a busy machine takes to schedule
 * it; what is left is a process outside the tree that keeps starting ones with the
 * call's marker). With REAP_WAIT_MS it stays well inside the host's slack for an exec
 * past its timeout (EXEC_SLACK_MS, 30 s): the call answers `timed_out`, not a hung agent.
 */
export const KILL_GIVE_UP_MS = 10_000;

/**
 * SIGKILLs the whole tree. The tree is found before anything is killed (a dead parent
 * breaks the ppid chain to its setsid'd children), and frozen with SIGSTOP first so
 * nothing forks between the scan and the kill. Repeats until a scan finds nothing
 * alive (a killed process that has not been scheduled yet still looks alive: on a busy
 * machine, at nice 19, a fork bomb's hundreds take many rounds), then waits until
 * `reaper` has collected the dead (reaping.ts).
 */
export async function killTree(rootPid: number, marker: string, reaper?: number): Promise<void> {
  // Freeze the leader's group atomically before scanning (see hangUpSession).
  groupSignal(rootPid, "SIGSTOP");
  const giveUp = performance.now() + KILL_GIVE_UP_MS;
  for (;;) {
    const found = await findTree(rootPid, marker);
    if (found.length === 0) break;
    signalAll(found, "SIGSTOP");
    // Frozen now: a second scan also sees children forked during the first one.
    const frozen = await findTree(rootPid, marker);
    groupSignal(rootPid, "SIGKILL");
    signalAll([...new Set([...found, ...frozen])], "SIGKILL");
    if (performance.now() > giveUp) break;
    await new Promise((r) => setTimeout(r, 10));
  }
  // Once whatever a scan found: the group (a pgid is not reused while the group lives).
  groupSignal(rootPid, "SIGKILL");
  await untilReaped(reaper);
}

/** How long a hangup waits for forked children to exec what they were forked for. */
export const SETTLE_MS = 500;
/**
 * How long it keeps waiting for a forking child that is runnable but has hardly run
 * (commands run at nice 19: on a busy machine a fork can wait seconds for the CPU).
 */
export const SETTLE_STARVED_MS = 5000;
/** CPU time (clock ticks, 10 ms each) after which a forking child is not starved but busy. */
const STARVED_TICKS = 10;
/** Above this many leftover processes the hangup does not wait for them (see settleForks). */
export const SETTLE_MAX_MEMBERS = 32;

async function cmdline(pid: number): Promise<string | null> {
  return readFile(`/proc/${pid}/cmdline`, "latin1").catch(() => null);
}

/**
 * Whether a process left in a command's session may still be on its way to what it was
 * forked for, so a hangup now could kill it before it protects itself. `own` is its
 * /proc/PID/cmdline, `leader` the session leader's (the leader itself has exited by now),
 * `parent` its parent's (null when unreadable); all NUL-separated.
 *   - "" is a process inside execve(): the kernel has switched it to the new program's
 *     memory but not yet written its arguments there. Measured: every exec passes through
 *     this window, and a loaded machine can park a low-priority command in it.
 *   - a copy of the leader's or its parent's command line: forked, not yet exec'd.
 *   - nohup or setsid themselves: between their exec and the signal or setsid call that
 *     protects what they start (they exec it right after).
 */
export function stillForking(own: string, leader: string | null, parent: string | null): boolean {
  if (own === "") return true;
  if (leader !== null && own === leader) return true;
  if (parent !== null && own === parent) return true;
  const argv0 = own
    .slice(0, own.indexOf("\0") >>> 0)
    .split("/")
    .pop();
  return argv0 === "nohup" || argv0 === "setsid";
}

/**
 * `nohup server &` as a command's last words: the shell forks a child that will exec
 * nohup, which will ignore SIGHUP, and the shell exits. A hangup between the fork and the
 * exec would kill the server (a closing terminal has the same race). So before hanging
 * up, wait while a member of the session is still forking (see stillForking): at most
 * SETTLE_MS, or SETTLE_STARVED_MS while such a member is runnable but has hardly had the
 * CPU yet. A fork bomb of shell functions stays such copies and is hung up after the
 * wait (at once when it has grown past SETTLE_MAX_MEMBERS).
 */
async function settleForks(sid: number, leader: string | null): Promise<void> {
  const start = Date.now();
  const firstTicks = new Map<number, number>();
  for (;;) {
    const procs = await scanProc();
    const members = [...procs].filter(([pid, info]) => info.sid === sid && pid !== sid);
    // Many processes left behind is a bomb or a build's workers, not a `nohup` to wait for:
    // hang up at once (a wait would only let a bomb grow and take the agent's CPU).
    if (members.length > SETTLE_MAX_MEMBERS) return;
    let forking = false;
    let starved = false;
    for (const [pid, info] of members) {
      const own = await cmdline(pid);
      // Gone (or a zombie's empty read racing its exit: the scan skipped zombies).
      if (own === null || (own === "" && !alive(pid))) continue;
      if (!stillForking(own, leader, own === "" ? null : await cmdline(info.ppid))) continue;
      forking = true;
      const first = firstTicks.get(pid) ?? info.cpuTicks;
      firstTicks.set(pid, first);
      if ((info.state === "R" || info.state === "D") && info.cpuTicks - first < STARVED_TICKS) starved = true;
    }
    const waited = Date.now() - start;
    if (!forking || waited >= SETTLE_STARVED_MS || (waited >= SETTLE_MS && !starved)) return;
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Whether `pid` is a live, non-zombie process. */
function alive(pid: number): boolean {
  const state = stateLetter(pid);
  return state !== null && state !== "Z" && state !== "X";
}

/** Live processes of session `sid`, but never the agent or pid 1. */
async function sessionMembers(sid: number): Promise<number[]> {
  const procs = await scanProc();
  return [...procs]
    .filter(([pid, info]) => info.sid === sid && pid !== process.pid && pid !== 1)
    .map(([pid]) => pid);
}

/**
 * What a terminal does when it hangs up, for the session a command led: every process
 * still in it gets SIGHUP. Background jobs (and fork bombs) end with the command;
 * processes that asked to outlive it survive: `nohup` ignores SIGHUP, `setsid` left the
 * session. The session is frozen with SIGSTOP before the signal, so nothing forks past
 * it, then continued (survivors resume). Repeats until a round finds only survivors it
 * has already seen, at most 20 rounds, then waits until `reaper` has collected the dead
 * (reaping.ts). Returns how many processes were hung up.
 */
export async function hangUpSession(
  sid: number,
  leaderArgv: readonly string[] = [],
  reaper?: number,
): Promise<number> {
  const survivors = new Set<number>();
  let hung = 0;
  if ((await sessionMembers(sid)).length === 0) return 0;
  await settleForks(sid, leaderArgv.length > 0 ? `${leaderArgv.join("\0")}\0` : null);
  // The session leader's group first, in three atomic group signals: a fork racing a
  // group signal fails and restarts in the kernel, so nothing slips past, however fast
  // it forks (a /proc scan would lose that race against a fork bomb).
  groupSignal(sid, "SIGSTOP");
  groupSignal(sid, "SIGHUP");
  groupSignal(sid, "SIGCONT");
  for (let round = 0; round < 20; round++) {
    const found = (await sessionMembers(sid)).filter((p) => !survivors.has(p));
    if (found.length === 0) break;
    signalAll(found, "SIGSTOP");
    const frozen = (await sessionMembers(sid)).filter((p) => !survivors.has(p));
    const all = [...new Set([...found, ...frozen])];
    signalAll(all, "SIGHUP");
    signalAll(all, "SIGCONT");
    hung += all.length;
    await untilEnded(all);
    // Whoever is still there and ignores or handles SIGHUP (nohup) is left be. One that
    // does neither is dying but was not scheduled yet (a busy machine): it is signalled
    // again next round, not taken for a survivor (a fork bomb's member was, and forked on).
    for (const p of await sessionMembers(sid))
      if (all.includes(p) && (await keepsSighup(p))) survivors.add(p);
  }
  await untilReaped(reaper);
  return hung;
}

/** How long a hangup round gives the processes it signalled to end. */
const ROUND_WAIT_MS = 10;

/**
 * Waits until every one of `pids` has ended (a zombie has), or ROUND_WAIT_MS. A
 * background job usually dies within the first millisecond: a fixed wait made every exec
 * that left one 10 ms slower. Whoever is still there at the end is judged as before.
 */
async function untilEnded(pids: readonly number[]): Promise<void> {
  const deadline = performance.now() + ROUND_WAIT_MS;
  // Many (a fork bomb): the fixed wait, rather than reading them all every millisecond.
  if (pids.length > SYNC_SCAN_MAX) {
    await new Promise((r) => setTimeout(r, ROUND_WAIT_MS));
    return;
  }
  const aliveNow = (pid: number) => {
    const text = readStatSync(String(pid));
    return text !== null && procInfo(pid, text) !== null;
  };
  while (pids.some(aliveNow)) {
    const left = deadline - performance.now();
    if (left <= 0) return;
    await new Promise((r) => setTimeout(r, Math.min(1, left)));
  }
}

/** Whether `pid` ignores or catches SIGHUP (SigIgn/SigCgt bit 0 in /proc/PID/status). */
async function keepsSighup(pid: number): Promise<boolean> {
  const status = await readFile(`/proc/${pid}/status`, "utf8").catch(() => null);
  if (status === null) return false;
  const mask = (name: string) =>
    BigInt(`0x${new RegExp(`^${name}:\\s*([0-9a-f]+)$`, "m").exec(status)?.[1] ?? "0"}`);
  return ((mask("SigIgn") | mask("SigCgt")) & 1n) === 1n;
}
