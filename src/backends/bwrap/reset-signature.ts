/**
 * What bwrap's in-place reset (reset.ts) compares against what it saw at start: the
 * processes it spares (the agent, the sandbox's pid 1) and the signature of what it
 * cannot replace (the root layer, /dev, the agent's and pid 1's state). Any difference
 * means a restart instead.
 */
import { createHash } from "node:crypto";
import { lstatSync, readdirSync, readFileSync, readlinkSync } from "node:fs";
import { join } from "node:path";
import { setImmediate as yieldToLoop } from "node:timers/promises";
import { run } from "../../util/run.js";
import { statFields } from "../common.js";
import { CgroupLimits, hostCgroups } from "../linux/cgroups.js";
import type { SandboxLayout } from "../linux/layout.js";

/** The agent's spool directory inside the sandbox: emptied by the agent, its contents signed (none). */
export const AGENT_TMP = "/run/pyro/tmp";

/** Past this many entries in the root layer and /dev, a sandbox is not reset in place. */
const MAX_SIGNED_ENTRIES = 20_000;
/**
 * The reads here are synchronous: procfs and the sandbox's small layers answer from
 * memory in microseconds, where each async call costs a thread-pool round trip (a
 * 14-entry root layer took 12 ms to walk async on this 2-core machine, under 1 ms
 * sync). A long walk yields to the event loop every this many entries.
 */
const YIELD_EVERY = 500;

interface ProcInfo {
  /** The pid in each pid namespace, the host's first. */
  nspid: number[];
  state: string;
  startTime: string;
}

export async function procInfo(pid: number): Promise<ProcInfo | null> {
  try {
    const status = readFileSync(`/proc/${pid}/status`, "utf8");
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const line = /^NSpid:\s+(.*)$/m.exec(status);
    const fields = statFields(stat);
    return {
      nspid: (line?.[1] ?? String(pid)).trim().split(/\s+/).map(Number),
      state: fields[0] ?? "?",
      startTime: fields[19] ?? "",
    };
  } catch {
    return null; // gone
  }
}

export async function sandboxCgroup(cgroupId: string): Promise<CgroupLimits | null> {
  return CgroupLimits.attach(await hostCgroups(), cgroupId);
}

/**
 * The sandbox's processes, from its cgroup: its pid 1 (bwrap's init) and the others
 * inside its pid namespace (the launch step's processes are outside it). Right after
 * the agent listens, the agent is the one other.
 */
export async function sandboxProcesses(
  cg: CgroupLimits,
): Promise<{ init: number | null; inside: { pid: number; startTime: string }[] }> {
  let init: number | null = null;
  const inside: { pid: number; startTime: string }[] = [];
  for (const pid of await cg.pids()) {
    const p = await procInfo(pid);
    if (!p || p.nspid.length < 2) continue;
    if (p.nspid.at(-1) === 1) init = pid;
    else inside.push({ pid, startTime: p.startTime });
  }
  return { init, inside };
}

/**
 * How the signature treats an entry (relative path): `skip` leaves it and what is below
 * it out; `owner` hashes only its type, mode and owner (a directory whose times and size
 * change in normal use, like the agent's spool), and still walks below it; `node` hashes
 * only which node it is (type, device number, and the device and inode it lives on).
 */
type SignRule = (rel: string) => "skip" | "owner" | "node" | "full";

/**
 * The device nodes bwrap's `--dev` binds from the host's /dev (bwrap.c's `devnodes`):
 * the host's own inodes, not the sandbox's. Their owner, mode and ctime are the host's to
 * change, and the host does: gVisor's runsc chowns its stdio (/dev/null when it is
 * started detached) to nobody at every sandbox start, which moved /dev/null's ctime (and,
 * the first time, its owner) under every running bwrap sandbox and turned their next
 * reset into a restart. A restart binds the same inodes again, so it would undo nothing:
 * only that each is still the same node is signed.
 */
const HOST_DEVICE_NODES = new Set(["null", "zero", "full", "random", "urandom", "tty"]);

/** The rule of the sandbox's /dev (see {@link layersSignature}). */
const devRule: SignRule = (r) => {
  if (r === "pts") return "owner";
  if (/^pts\/\d+$/.test(r)) return "skip";
  return HOST_DEVICE_NODES.has(r) ? "node" : "full";
};

/**
 * A hash of every entry under `root` (name, type, mode, owner, size, ctime), without
 * following symlinks; null when `root` is missing or holds more than `budget.left` entries.
 */
async function treeSignature(root: string, rule: SignRule, budget: { left: number }): Promise<string | null> {
  const hash = createHash("sha256");
  let sinceYield = 0;
  const walk = async (rel: string): Promise<boolean> => {
    const names = readdirSync(join(root, rel)).sort();
    for (const name of names) {
      const r = rel ? `${rel}/${name}` : name;
      const how = rule(r);
      if (how === "skip") continue;
      if (--budget.left < 0) return false;
      if (++sinceYield >= YIELD_EVERY) {
        sinceYield = 0;
        await yieldToLoop();
      }
      const st = lstatSync(join(root, r), { bigint: true });
      if (how === "node") {
        // The file type bits of the mode, not its permissions.
        hash.update(`${r}\0${st.mode & 0o170000n}\0${st.rdev}\0${st.dev}\0${st.ino}\n`);
        continue;
      }
      const times = how === "full" ? `${st.size}\0${st.ctimeNs}\0${st.rdev}` : "";
      hash.update(`${r}\0${st.mode}\0${st.uid}\0${st.gid}\0${times}\n`);
      if (st.isDirectory() && !(await walk(r))) return false;
    }
    return true;
  };
  try {
    const top = lstatSync(root, { bigint: true });
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
    const tids = readdirSync(`${base}/task`);
    // Each thread's I/O priority (ioprio_set, like nice): not in /proc, so util-linux's
    // ionice reads it, one line per thread; a thread gone meanwhile fails it (restart).
    // Started first: it runs while the rest is read.
    const ionice = run(["ionice", "-p", ...tids], { timeoutMs: 5_000 });
    const limits = readFileSync(`${base}/limits`, "utf8");
    const oom = readFileSync(`${base}/oom_score_adj`, "utf8");
    const thread = (tid: string) => {
      let stat: string;
      let status: string;
      try {
        stat = readFileSync(`${base}/task/${tid}/stat`, "utf8");
        status = readFileSync(`${base}/task/${tid}/status`, "utf8");
      } catch {
        return null; // the thread ended meanwhile
      }
      const f = statFields(stat);
      // nice (field 19), rt_priority (40), policy (41); fields here start at field 3.
      const cpus = /^Cpus_allowed_list:\s*(.*)$/m.exec(status)?.[1] ?? "?";
      return `${f[16]}/${f[37]}/${f[38]}/${cpus}`;
    };
    const threads = tids.map(thread);
    const io = await ionice;
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
 * The sandbox's pid 1 (bwrap's init): spared by the kill rounds like the agent. It runs as
 * the commands' uid and is dumpable, so the sandbox keeps commands out of its memory:
 * seccomp refuses ptrace and process_vm_* on pid 1, and /proc/1/mem is covered read-only
 * (seccomp.ts, isolation.ts; tests/integration/bwrap/reset-escape.test.ts). Signed here
 * as a second line: the same executable and one thread. Null when it cannot be read.
 */
async function initSignature(pid: number): Promise<string | null> {
  try {
    const exe = readlinkSync(`/proc/${pid}/exe`);
    const tasks = readdirSync(`/proc/${pid}/task`);
    return createHash("sha256").update(`${exe}\0${tasks.length}\n`).digest("hex");
  } catch {
    return null;
  }
}

/**
 * The signature of what an in-place reset cannot replace: the root layer's upper
 * directory (seen in the launch step's mount namespace, through its process), the
 * sandbox's /dev (through the agent) and the agent's own limits and scheduling. The
 * PTYs in /dev/pts (they come and go with shells) are left out, and the times of the
 * agent's spool directory (the agent empties it at `begin`, so what is left in it is
 * signed: a tree it could not remove means a restart); /dev/pts, its ptmx and the
 * spool's mode are not: a mode changed there would outlive the reset. Of the host's
 * device nodes bound into /dev, only which node each is ({@link HOST_DEVICE_NODES}).
 */
export async function layersSignature(
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
    // The spool's times change with use; what is in it must be nothing, as at start.
    (r) => (r === tmp ? "owner" : "full"),
    budget,
  );
  const dev = root && (await treeSignature(`/proc/${agentPid}/root/dev`, devRule, budget));
  const [agent, init] = await Promise.all([agentPart, initPart]);
  return root && dev && agent && init ? `${root}:${dev}:${agent}:${init}` : null;
}
