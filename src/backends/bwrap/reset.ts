/**
 * In-place reset of a bwrap sandbox: a reset that keeps the sandbox and its agent running
 * and replaces only what the reset discards, instead of stopping the sandbox and starting
 * a new one (issue 18: a restart costs an agent start, ~200 ms of CPU here).
 *
 * What a reset must discard, and how it is done in place:
 * - every process but the agent: killed from outside, through the sandbox's cgroup (the
 *   host does not trust the agent to do it);
 * - /workspace's writable layer: the launch step mounted /workspace's first overlay
 *   `shared` in its mount namespace, and the sandbox's bind of it is a slave of it, so an
 *   overlay mounted over it there (the new snapshot as the lower layer, fresh upper and
 *   work directories) appears at the sandbox's /workspace; the one before is lazily
 *   unmounted and its upper directory removed;
 * - System V IPC objects and POSIX message queues of the sandbox's IPC namespace;
 * - the root layer and /dev: these cannot be swapped under a running agent (the root is
 *   its `/`), so the reset is in place only when both are exactly as they were when the
 *   sandbox started (a signature of every entry's name, type, mode, owner, size and
 *   ctime, taken at start). A package installed, a file left in /tmp or /dev/shm, an
 *   `rm` in /etc: the reset restarts the sandbox instead, as before.
 *
 * Whatever fails or looks unexpected returns null, and the caller restarts the sandbox:
 * the restart ends every process through the cgroup and discards both layers, so a half
 * done in-place reset is never what a workspace is left with.
 *
 * The agent survives the reset, so a command must not be able to take it over: the
 * agent is started through an execute-only loader (runtime.ts), which makes it
 * non-dumpable, and a process without CAP_SYS_PTRACE (every process in the sandbox) can
 * then neither ptrace it nor open its /proc/PID/mem, fd or environ.
 */
import { createHash } from "node:crypto";
import { lstat, mkdir, open, readdir, readFile, readlink, rename, unlink } from "node:fs/promises";
import { join } from "node:path";
import type { AgentClient } from "../../agent/client.js";
import { run } from "../../util/run.js";
import type { SandboxSpec } from "../backend.js";
import { procStartTime, sameProcessAlive } from "../common.js";
import { CgroupLimits, detectCgroups } from "../linux/cgroups.js";
import { type LaunchTools, OVERLAY_OPTIONS } from "../linux/launch.js";
import type { SandboxLayout } from "../linux/layout.js";

/** What a bwrap sandbox records at start so that it can be reset in place. */
export interface ResetBase {
  agent_pid: number;
  agent_start_time: string;
  layers_sig: string;
}

/** The agent's spool directory inside the sandbox: emptied by the agent, not part of the signature. */
export const AGENT_TMP = "/run/pyro/tmp";

/** Past this many entries in the root layer and /dev, a sandbox is not reset in place. */
const MAX_SIGNED_ENTRIES = 20_000;
/**
 * Deadline of the agent's two reset requests. `begin` waits up to 2 s per shell that
 * ignores its hangup; a command can also stop the agent (SIGSTOP needs no more than its
 * uid), and the default 60 s would then be what every reset of the workspace took
 * before falling back to the restart.
 */
const RESET_REQUEST_MS = 10_000;
/** Rounds of killing before giving up (a fork bomb outrunning the kills): the caller restarts. */
const MAX_KILL_ROUNDS = 200;

interface ProcInfo {
  /** The pid in each pid namespace, the host's first. */
  nspid: number[];
  state: string;
  startTime: string;
}

async function procInfo(pid: number): Promise<ProcInfo | null> {
  try {
    const [status, stat] = await Promise.all([
      readFile(`/proc/${pid}/status`, "utf8"),
      readFile(`/proc/${pid}/stat`, "utf8"),
    ]);
    const line = /^NSpid:\s+(.*)$/m.exec(status);
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return {
      nspid: (line?.[1] ?? String(pid)).trim().split(/\s+/).map(Number),
      state: fields[0] ?? "?",
      startTime: fields[19] ?? "",
    };
  } catch {
    return null; // gone
  }
}

async function sandboxCgroup(cgroupId: string): Promise<CgroupLimits | null> {
  return CgroupLimits.attach(await detectCgroups(), cgroupId);
}

/**
 * The agent: the one process inside the sandbox's pid namespace that is not its init
 * (bwrap's pid 1), right after the agent listens, when nothing else runs there yet.
 */
async function findAgent(cgroupId: string): Promise<{ pid: number; startTime: string } | null> {
  const pids = await (await sandboxCgroup(cgroupId))?.pids();
  if (!pids) return null;
  const inside: { pid: number; startTime: string }[] = [];
  for (const pid of pids) {
    const p = await procInfo(pid);
    if (p && p.nspid.length > 1 && p.nspid.at(-1) !== 1) inside.push({ pid, startTime: p.startTime });
  }
  return inside.length === 1 ? inside[0]! : null;
}

/**
 * How the signature treats an entry (relative path): `skip` leaves it and what is below
 * it out; `owner` hashes only its type, mode and owner (a directory whose times and size
 * change in normal use, like the agent's spool), and still walks below it.
 */
type SignRule = (rel: string) => "skip" | "owner" | "full";

/**
 * A hash of every entry under `root` (name, type, mode, owner, size, ctime), without
 * following symlinks; null when `root` is missing or holds more than `budget.left` entries.
 */
async function treeSignature(root: string, rule: SignRule, budget: { left: number }): Promise<string | null> {
  const hash = createHash("sha256");
  const walk = async (rel: string): Promise<boolean> => {
    const names = (await readdir(join(root, rel))).sort();
    for (const name of names) {
      const r = rel ? `${rel}/${name}` : name;
      const how = rule(r);
      if (how === "skip") continue;
      if (--budget.left < 0) return false;
      const st = await lstat(join(root, r), { bigint: true });
      const times = how === "full" ? `${st.size}\0${st.ctimeNs}\0${st.rdev}` : "";
      hash.update(`${r}\0${st.mode}\0${st.uid}\0${st.gid}\0${times}\n`);
      if (st.isDirectory() && !(await walk(r))) return false;
    }
    return true;
  };
  try {
    const top = await lstat(root, { bigint: true });
    if (!top.isDirectory()) return null;
    hash.update(`.\0${top.mode}\0${top.uid}\0${top.gid}\0${top.ctimeNs}\n`);
    return (await walk("")) ? hash.digest("hex") : null;
  } catch {
    return null;
  }
}

/**
 * What a command can change about the agent without ptrace, as the same uid, and what
 * would outlive an in-place reset (and be inherited by every later command): its
 * resource limits (prlimit), its OOM score (raising needs no capability), and each
 * thread's nice value, scheduling policy, CPU affinity and I/O priority. Threads come
 * and go, so the distinct per-thread values are hashed, not one row per thread.
 */
async function agentControlSignature(agentPid: number): Promise<string | null> {
  try {
    const base = `/proc/${agentPid}`;
    const [limits, oom, tids] = await Promise.all([
      readFile(`${base}/limits`, "utf8"),
      readFile(`${base}/oom_score_adj`, "utf8"),
      readdir(`${base}/task`),
    ]);
    const thread = async (tid: string) => {
      const [stat, status] = await Promise.all([
        readFile(`${base}/task/${tid}/stat`, "utf8").catch(() => null),
        readFile(`${base}/task/${tid}/status`, "utf8").catch(() => null),
      ]);
      if (stat === null || status === null) return null; // the thread ended meanwhile
      const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      // nice (field 19), rt_priority (40), policy (41); fields here start at field 3.
      const cpus = /^Cpus_allowed_list:\s*(.*)$/m.exec(status)?.[1] ?? "?";
      return `${f[16]}/${f[37]}/${f[38]}/${cpus}`;
    };
    // Each thread's I/O priority (ioprio_set, like nice): not in /proc, so util-linux's
    // ionice reads it, one line per thread; a thread gone meanwhile fails it (restart).
    const [threads, io] = await Promise.all([
      Promise.all(tids.map(thread)),
      run(["ionice", "-p", ...tids], { timeoutMs: 5_000 }),
    ]);
    if (io.exitCode !== 0) return null;
    const rows = new Set(threads.filter((r) => r !== null));
    const ioRows = [...new Set(io.stdout.trim().split("\n"))].sort().join(",");
    return createHash("sha256")
      .update(`${limits}\0${oom}\0${[...rows].sort().join(",")}\0${ioRows}`)
      .digest("hex");
  } catch {
    return null;
  }
}

/**
 * The sandbox's pid 1 (bwrap's init): spared by the kill rounds like the agent, but not
 * protected like it. It runs as the commands' uid, holds no capability and is dumpable,
 * so a command can write its memory through /proc/1/mem (or ptrace it) and make it run
 * its own code, which then outlived the reset (tests/integration/bwrap/reset-escape.test.ts).
 * Its state is signed: the same executable, one thread, blocked in the same system call
 * at the same instruction, and every mapping it cannot write (code, read-only data)
 * byte for byte the same as at start (cheaply: see {@link readOnlyMappings}). Null (no
 * in-place reset) when it cannot be read.
 * What this does not see: a return address or data changed in its writable memory
 * (stack, heap); see docs/backends.md.
 */
async function initSignature(pid: number): Promise<string | null> {
  try {
    const base = `/proc/${pid}`;
    const [exe, tasks, smaps] = await Promise.all([
      readlink(`${base}/exe`),
      readdir(`${base}/task`),
      readFile(`${base}/smaps`, "utf8"),
    ]);
    // Right after the kill rounds it may still be reaping: give it a moment to block.
    let syscall = "";
    for (let i = 0; i < 50; i++) {
      syscall = (await readFile(`${base}/syscall`, "utf8")).trim();
      if (syscall !== "running") break;
      await new Promise((r) => setTimeout(r, 2));
    }
    const fields = syscall.split(" ");
    const hash = createHash("sha256").update(`${exe}\0${tasks.length}\0${fields[0]}\0${fields.at(-1)}\n`);
    const mem = await open(`${base}/mem`, "r");
    try {
      for (const m of readOnlyMappings(smaps)) {
        hash.update(`${m.range} ${m.perms} ${m.name} ${m.anonKb}\n`);
        // A page written (through /proc/PID/mem or ptrace) is a private copy: anonymous.
        // Pages that are still the file's are the file's bytes, which the sandbox cannot
        // change; only the copied ones (relocations, and any such write) are read.
        if (m.anonKb === 0) continue;
        const buf = Buffer.alloc(m.end - m.start);
        await mem.read(buf, 0, buf.length, m.start);
        hash.update(buf);
      }
    } finally {
      await mem.close();
    }
    return hash.digest("hex");
  } catch {
    return null;
  }
}

interface Mapping {
  range: string;
  perms: string;
  name: string;
  start: number;
  end: number;
  anonKb: number;
}

/**
 * The mappings of /proc/PID/smaps a process cannot write to itself (code, read-only data,
 * RELRO), with their anonymous (copied) kilobytes. Not the kernel's own pages (vvar,
 * vvar_vclock, vsyscall), which cannot be read.
 */
function readOnlyMappings(smaps: string): Mapping[] {
  const out: Mapping[] = [];
  let cur: Mapping | null = null;
  for (const line of smaps.split("\n")) {
    const head = /^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$/.exec(line);
    if (head) {
      const [, start, end, perms, name] = head;
      const own = perms![0] === "r" && perms![1] !== "w" && !/^\[(vvar|vsyscall)/.test(name!);
      cur = own
        ? {
            range: `${start}-${end}`,
            perms: perms!,
            name: name!,
            start: Number.parseInt(start!, 16),
            end: Number.parseInt(end!, 16),
            anonKb: 0,
          }
        : null;
      if (cur) out.push(cur);
      continue;
    }
    const anon = /^Anonymous:\s+(\d+) kB/.exec(line);
    if (anon && cur) cur.anonKb = Number(anon[1]);
  }
  return out;
}

/** The host pid of the sandbox's pid 1, from the cgroup's processes. */
async function findInit(cgroupId: string): Promise<number | null> {
  const pids = (await (await sandboxCgroup(cgroupId))?.pids()) ?? [];
  for (const pid of pids) {
    const p = await procInfo(pid);
    if (p && p.nspid.length > 1 && p.nspid.at(-1) === 1) return pid;
  }
  return null;
}

/**
 * The signature of what an in-place reset cannot replace: the root layer's upper
 * directory (seen in the launch step's mount namespace, through its process), the
 * sandbox's /dev (through the agent) and the agent's own limits and scheduling. What
 * is in the agent's spool directory (the agent empties it) and the PTYs in /dev/pts
 * (they come and go with shells) are left out; the spool directory itself, /dev/pts
 * and its ptmx are not: a mode changed there would outlive the reset.
 */
async function layersSignature(
  l: SandboxLayout,
  launchPid: number,
  agentPid: number,
  initPid: number | null,
): Promise<string | null> {
  if (initPid === null) return null;
  // The agent's and pid 1's parts read other files and run ionice: alongside the walk.
  const agentPart = agentControlSignature(agentPid);
  const initPart = initSignature(initPid);
  const budget = { left: MAX_SIGNED_ENTRIES };
  const tmp = AGENT_TMP.slice(1);
  const root = await treeSignature(
    `/proc/${launchPid}/root${l.rootUpper}`,
    (r) => (r === tmp ? "owner" : r.startsWith(`${tmp}/`) ? "skip" : "full"),
    budget,
  );
  const dev =
    root &&
    (await treeSignature(
      `/proc/${agentPid}/root/dev`,
      (r) => (r === "pts" ? "owner" : /^pts\/\d+$/.test(r) ? "skip" : "full"),
      budget,
    ));
  const [agent, init] = await Promise.all([agentPart, initPart]);
  return root && dev && agent && init ? `${root}:${dev}:${agent}:${init}` : null;
}

/** Taken when a sandbox has started: what an in-place reset later compares against. */
export async function resetBase(
  l: SandboxLayout,
  launchPid: number,
  cgroupId: string,
): Promise<ResetBase | null> {
  if (l.legacy) return null;
  const agent = await findAgent(cgroupId);
  if (!agent) return null;
  const sig = await layersSignature(l, launchPid, agent.pid, await findInit(cgroupId));
  await removeOldLayers(l, launchPid);
  return sig ? { agent_pid: agent.pid, agent_start_time: agent.startTime, layers_sig: sig } : null;
}

/**
 * Whether any thread of `pid` is still running. A process whose main thread called
 * exit(2) alone (not exit_group) shows as a zombie in /proc/PID/stat while its other
 * threads go on: a command could otherwise outlive a reset that way.
 */
async function liveThreads(pid: number): Promise<boolean> {
  const tids = await readdir(`/proc/${pid}/task`).catch(() => []);
  for (const tid of tids) {
    const stat = await readFile(`/proc/${pid}/task/${tid}/stat`, "utf8").catch(() => "");
    const state = stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3);
    if (state !== "" && state !== "Z" && state !== "X") return true;
  }
  return false;
}

/**
 * Kills every process inside the sandbox's pid namespace but its init and the agent,
 * in rounds until none is left. False when they outran the rounds.
 */
async function killAllButAgent(cg: CgroupLimits, agent: number): Promise<boolean> {
  for (let round = 0; round < MAX_KILL_ROUNDS; round++) {
    const pids = await cg.pids();
    let left = 0;
    for (const pid of pids) {
      if (pid === agent) continue;
      const p = await procInfo(pid);
      // Outside the pid namespace: the launch step (shell, log reader, bwrap's parent).
      if (!p || p.nspid.length < 2 || p.nspid.at(-1) === 1) continue;
      // A zombie whose threads still run (its main thread ended alone) is not gone.
      if ((p.state === "Z" || p.state === "X") && !(await liveThreads(pid))) continue;
      left++;
      try {
        process.kill(pid, "SIGKILL");
      } catch {}
    }
    if (left === 0) return true;
    await new Promise((r) => setTimeout(r, round < 10 ? 1 : 5));
  }
  return false;
}

/** How many mounts sit at `path` in the mount namespace of `pid`. */
async function mountsAt(pid: number, path: string): Promise<number> {
  const info = await readFile(`/proc/${pid}/mountinfo`, "utf8");
  return info.split("\n").filter((line) => line.split(" ")[4] === path).length;
}

/**
 * Shell (in the sandbox's IPC namespace, where /proc/sysvipc lists its objects): runs
 * `ipcrm --all` when any table has a row under its header or cannot be read, and
 * otherwise costs no process. Builtins only.
 */
const IPC_CLEAR = [
  "for k in shm sem msg; do",
  '  if [ ! -r "/proc/sysvipc/$k" ] || { read -r _ && read -r _; } < "/proc/sysvipc/$k"; then ipcrm --all; break; fi',
  "done",
].join("\n");

/**
 * Replaces /workspace's layer. File operations go through the launch step's root
 * (`/proc/PID/root`, where the disk image is mounted; every path component up to the
 * layer directories is the host's): the current layer's directories are moved aside
 * and new ones made. One process in the launch step's mount namespace (and the
 * sandbox's IPC namespace) then clears the System V IPC objects when there are any
 * (counted there, after the kill: a count taken before it missed what a dying command
 * made in between, see {@link IPC_CLEAR}),
 * mounts the sandbox's POSIX message queues where the host can empty them (once),
 * unmounts the overlay stacked by the previous reset and mounts the new one. Returns where the old
 * directories are (for the caller to remove once the reset is done), null on failure.
 */
async function swapWorkspaceLayer(
  l: SandboxLayout,
  spec: SandboxSpec,
  pids: { launch: number; agent: number },
  tools: LaunchTools,
): Promise<string | null> {
  const inLaunch = (p: string) => `/proc/${pids.launch}/root${p}`;
  const mq = join(spec.dir, "mnt", "mq");
  const [stacked, mqMounted] = await Promise.all([
    mountsAt(pids.launch, l.wsMerged),
    mountsAt(pids.launch, mq).then((n) => n > 0),
  ]);
  const old = join(l.diskMount, "ws", `old-${Date.now()}-${process.pid}`);
  await mkdir(inLaunch(old));
  await rename(inLaunch(l.wsUpper), inLaunch(join(old, "upper")));
  await rename(inLaunch(l.wsWork), inLaunch(join(old, "work")));
  await mkdir(inLaunch(l.wsUpper), { mode: 0o755 });
  await mkdir(inLaunch(l.wsWork), { mode: 0o755 });
  if (!mqMounted) await mkdir(mq, { recursive: true, mode: 0o700 });
  const options = `nosuid,nodev,lowerdir=$1,upperdir=$2,workdir=$3,${OVERLAY_OPTIONS}`;
  const script = [
    "set -eu",
    IPC_CLEAR,
    ...(mqMounted ? [] : [`${tools.mount} -t mqueue pyro-mq "$5"`]),
    ...(stacked > 1 ? [`${tools.umount} -l "$4"`] : []),
    `${tools.mount} -t overlay pyro -o "${options}" "$4"`,
  ].join("\n");
  const lower = join(spec.snapshotsDir, spec.snapshot);
  const r = await run(
    [
      "nsenter",
      `--mount=/proc/${pids.launch}/ns/mnt`,
      `--ipc=/proc/${pids.agent}/ns/ipc`,
      "--",
      ...tools.shell,
      "-c",
      script,
      "pyro-reset",
      lower,
      l.wsUpper,
      l.wsWork,
      l.wsMerged,
      mq,
    ],
    { timeoutMs: 30_000 },
  );
  if (r.exitCode !== 0) return null;
  for (const name of await readdir(inLaunch(mq))) await unlink(inLaunch(join(mq, name)));
  return inLaunch(old);
}

/**
 * Removes the layers earlier resets moved aside and did not finish removing (the sandbox
 * stopped first): they sit in the workspace's disk image.
 */
async function removeOldLayers(l: SandboxLayout, launchPid: number): Promise<void> {
  const ws = `/proc/${launchPid}/root${join(l.diskMount, "ws")}`;
  for (const name of await readdir(ws).catch(() => [])) {
    if (name.startsWith("old-")) removeLayer(join(ws, name));
  }
}

/** Past this, a removal is left to the next start (a layer can hold millions of files). */
const REMOVE_LAYER_TIMEOUT_MS = 10 * 60_000;

/**
 * Removes a layer moved aside, in the background. The sandbox made what is in it: with
 * `rm -rf`, which walks with openat and so goes as deep as the tree does (node's
 * recursive rm builds whole paths and gave up past PATH_MAX, ENAMETOOLONG: a command's
 * deep enough tree kept its bytes in the disk image through every reset). Symlinks are
 * removed, not followed, and the walk stays on the disk image.
 */
function removeLayer(path: string): void {
  void run(["rm", "-rf", "--one-file-system", "--", path], { timeoutMs: REMOVE_LAYER_TIMEOUT_MS }).catch(
    () => {},
  );
}

/**
 * Resets the sandbox in place onto `spec.snapshot` (see the top of this file). Returns
 * false, with the sandbox in an unknown state, when it could not: the caller must then
 * restart it.
 */
export async function resetInPlace(
  l: SandboxLayout,
  spec: SandboxSpec,
  launch: { pid: number; start_time: string; cgroup: string },
  base: ResetBase,
  agent: AgentClient,
  tools: LaunchTools,
): Promise<boolean> {
  if (l.legacy) return false;
  const agentPid = base.agent_pid;
  const alive = async () =>
    (await sameProcessAlive(launch.pid, launch.start_time)) &&
    (await procStartTime(agentPid)) === base.agent_start_time;
  if (!(await alive())) return false;
  const cg = await sandboxCgroup(launch.cgroup);
  if (!cg) return false;
  await agent.request("reset", { phase: "begin" }, { timeoutMs: RESET_REQUEST_MS });
  if (!(await killAllButAgent(cg, agentPid))) return false;
  if (!(await alive())) return false;
  const init = await findInit(launch.cgroup);
  if ((await layersSignature(l, launch.pid, agentPid, init)) !== base.layers_sig) return false;
  const pids = { launch: launch.pid, agent: agentPid };
  const old = await swapWorkspaceLayer(l, spec, pids, tools);
  if (!old) return false;
  // Nothing may have started in between (the agent refused new processes meanwhile).
  if (!(await killAllButAgent(cg, agentPid)) || !(await alive())) return false;
  await agent.request("reset", { phase: "finish" }, { timeoutMs: RESET_REQUEST_MS });
  // The old layer goes after the reset: its removal does not hold up the caller.
  removeLayer(old);
  return true;
}
