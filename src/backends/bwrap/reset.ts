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
 * then neither ptrace it nor open its /proc/PID/mem, fd or environ. The sandbox's pid 1
 * (bwrap's init) survives too; it is dumpable, so seccomp refuses ptrace and
 * process_vm_* on it and /proc/1/mem is covered read-only (seccomp.ts, isolation.ts).
 *
 * What is compared lives in reset-signature.ts.
 */
import { mkdirSync, readdirSync, readFileSync, renameSync, unlinkSync } from "node:fs";
import { readdir } from "node:fs/promises";
import { join } from "node:path";
import type { AgentClient } from "../../agent/client.js";
import { mountsStackedAt } from "../../util/mounts.js";
import { run } from "../../util/run.js";
import type { SandboxSpec } from "../backend.js";
import { procStartTime, sameProcessAlive, statFields } from "../common.js";
import type { CgroupLimits } from "../linux/cgroups.js";
import { type LaunchTools, OVERLAY_OPTIONS } from "../linux/launch.js";
import type { SandboxLayout } from "../linux/layout.js";
import { helperSwap, startResetHelper } from "./reset-helper.js";
import { layersSignature, procInfo, sandboxCgroup, sandboxProcesses } from "./reset-signature.js";

/** What a bwrap sandbox records at start so that it can be reset in place. */
export interface ResetBase {
  agent_pid: number;
  agent_start_time: string;
  layers_sig: string;
}

export { AGENT_TMP } from "./reset-signature.js";

/**
 * Deadline of the agent's two reset requests. `begin` waits up to 2 s per shell that
 * ignores its hangup; a command can also stop the agent (SIGSTOP needs no more than its
 * uid), and the default 60 s would then be what every reset of the workspace took
 * before falling back to the restart.
 */
const RESET_REQUEST_MS = 10_000;
/** Rounds of killing before giving up (a fork bomb outrunning the kills): the caller restarts. */
const MAX_KILL_ROUNDS = 200;

/** Taken when a sandbox has started: what an in-place reset later compares against. */
export async function resetBase(
  l: SandboxLayout,
  launchPid: number,
  cgroupId: string,
  helper?: { spec: SandboxSpec; tools: LaunchTools },
): Promise<ResetBase | null> {
  if (l.legacy) return null;
  const cg = await sandboxCgroup(cgroupId);
  if (!cg) return null;
  const { init, inside } = await sandboxProcesses(cg);
  // Right after the agent listens, nothing else runs inside: the one process is the agent.
  const agent = inside.length === 1 ? inside[0]! : null;
  if (!agent) return null;
  const pids = { launch: launchPid, agent: agent.pid };
  // The helper is not in the sandbox's pid namespace: not among what is signed.
  const [sig] = await Promise.all([
    layersSignature(l, launchPid, agent.pid, init),
    helper ? startResetHelper(helper.spec, l, pids, helper.tools, cg).catch(() => {}) : null,
  ]);
  await removeOldLayers(l, launchPid);
  return sig ? { agent_pid: agent.pid, agent_start_time: agent.startTime, layers_sig: sig } : null;
}

/**
 * Whether any thread of `pid` is still running. A process whose main thread called
 * exit(2) alone (not exit_group) shows as a zombie in /proc/PID/stat while its other
 * threads go on: a command could otherwise outlive a reset that way.
 */
function liveThreads(pid: number): boolean {
  let tids: string[] = [];
  try {
    tids = readdirSync(`/proc/${pid}/task`);
  } catch {}
  for (const tid of tids) {
    let stat: string | null = null;
    try {
      stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, "utf8");
    } catch {}
    const state = stat === null ? null : statFields(stat)[0];
    if (state && state !== "Z" && state !== "X") return true;
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
      if ((p.state === "Z" || p.state === "X") && !liveThreads(pid)) continue;
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
 * and new ones made. A process in the launch step's mount namespace and the sandbox's
 * IPC namespace then clears the System V IPC objects when there are any (counted there,
 * after the kill: a count taken before it missed what a dying command made in between,
 * see {@link IPC_CLEAR}), mounts the sandbox's POSIX message queues where the host can
 * empty them (once), unmounts the overlay stacked by the previous reset and mounts the
 * new one: the sandbox's swap helper (reset-helper.ts) when it has one, else a spawned
 * `nsenter ... sh -c`. Returns where the old directories are (for the caller to remove
 * once the reset is done), null on failure.
 */
export async function swapWorkspaceLayer(
  l: SandboxLayout,
  spec: SandboxSpec,
  pids: { launch: number; agent: number },
  tools: LaunchTools,
): Promise<string | null> {
  const inLaunch = (p: string) => `/proc/${pids.launch}/root${p}`;
  const mq = join(spec.dir, "mnt", "mq");
  const [stacked = 0, mqs = 0] = mountsStackedAt(pids.launch, [l.wsMerged, mq]);
  const mqMounted = mqs > 0;
  const old = join(l.diskMount, "ws", `old-${Date.now()}-${process.pid}`);
  // Synchronous: a few metadata operations on the disk image, each a thread-pool round
  // trip when async (milliseconds together on a busy machine).
  mkdirSync(inLaunch(old));
  renameSync(inLaunch(l.wsUpper), inLaunch(join(old, "upper")));
  renameSync(inLaunch(l.wsWork), inLaunch(join(old, "work")));
  mkdirSync(inLaunch(l.wsUpper), { mode: 0o755 });
  mkdirSync(inLaunch(l.wsWork), { mode: 0o755 });
  if (!mqMounted) mkdirSync(mq, { recursive: true, mode: 0o700 });
  const flags = { umount: stacked > 1, mq: !mqMounted };
  const byHelper = await helperSwap(spec, l, pids, flags);
  if (byHelper === "fail") return null;
  if (byHelper === "absent" && !(await spawnSwap(l, spec, pids, tools, flags))) return null;
  for (const name of readdirSync(inLaunch(mq))) unlinkSync(inLaunch(join(mq, name)));
  return inLaunch(old);
}

/** The mount step of {@link swapWorkspaceLayer} in a spawned `nsenter ... sh -c` (no helper). */
async function spawnSwap(
  l: SandboxLayout,
  spec: SandboxSpec,
  pids: { launch: number; agent: number },
  tools: LaunchTools,
  flags: { umount: boolean; mq: boolean },
): Promise<boolean> {
  const options = `nosuid,nodev,lowerdir=$1,upperdir=$2,workdir=$3,${OVERLAY_OPTIONS}`;
  const script = [
    "set -eu",
    IPC_CLEAR,
    ...(flags.mq ? [`${tools.mount} -t mqueue pyro-mq "$5"`] : []),
    ...(flags.umount ? [`${tools.umount} -l "$4"`] : []),
    `${tools.mount} -t overlay pyro -o "${options}" "$4"`,
  ].join("\n");
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
      join(spec.snapshotsDir, spec.snapshot),
      l.wsUpper,
      l.wsWork,
      l.wsMerged,
      join(spec.dir, "mnt", "mq"),
    ],
    { timeoutMs: 30_000 },
  );
  return r.exitCode === 0;
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
 * `rm -rf` (after {@link REMOVE_LAYER} empties its files), which walks with openat and so goes as deep as the tree does (node's
 * recursive rm builds whole paths and gave up past PATH_MAX, ENAMETOOLONG: a command's
 * deep enough tree kept its bytes in the disk image through every reset). Symlinks are
 * removed, not followed, and the walk stays on the disk image.
 */
function removeLayer(path: string): void {
  void run(["sh", "-c", REMOVE_LAYER, "pyro-remove-layer", path], {
    timeoutMs: REMOVE_LAYER_TIMEOUT_MS,
  }).catch(() => {});
}

/**
 * Files are emptied before the tree is removed: after the first in-place reset the old
 * layer is the upper directory of /workspace's first overlay, which stays mounted
 * (hidden) for the sandbox's life and keeps the inodes it has looked up, so unlinking
 * alone left their blocks in use in the disk image. find's -execdir goes as deep as the
 * tree does, like rm's walk; -xdev keeps both on the disk image.
 */
const REMOVE_LAYER =
  'find "$1" -xdev -type f -execdir truncate -s 0 -- {} +; rm -rf --one-file-system -- "$1"';

/**
 * Whether a sandbox that is kept across an operation (an in-place reset, a pool's
 * hand-out) still runs with the agent it started: its launch step and its agent, each by
 * pid and start time.
 */
export async function keptSandboxAlive(
  launch: { pid: number; start_time: string },
  base: Pick<ResetBase, "agent_pid" | "agent_start_time">,
): Promise<boolean> {
  return (
    (await sameProcessAlive(launch.pid, launch.start_time)) &&
    (await procStartTime(base.agent_pid)) === base.agent_start_time
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
  const alive = () => keptSandboxAlive(launch, base);
  if (!(await alive())) return false;
  const cg = await sandboxCgroup(launch.cgroup);
  if (!cg) return false;
  await agent.request("reset", { phase: "begin" }, { timeoutMs: RESET_REQUEST_MS });
  if (!(await killAllButAgent(cg, agentPid))) return false;
  if (!(await alive())) return false;
  // The signature and the swap at once: a swap whose signature then differs is undone
  // by the restart that follows, which discards both layers anyway.
  const pids = { launch: launch.pid, agent: agentPid };
  const signed = sandboxProcesses(cg).then((p) => layersSignature(l, launch.pid, agentPid, p.init));
  const [sig, old] = await Promise.all([signed, swapWorkspaceLayer(l, spec, pids, tools)]);
  try {
    if (sig !== base.layers_sig || !old) return false;
    // Nothing may have started in between (the agent refused new processes meanwhile).
    if (!(await killAllButAgent(cg, agentPid)) || !(await alive())) return false;
    await agent.request("reset", { phase: "finish" }, { timeoutMs: RESET_REQUEST_MS });
    return true;
  } finally {
    // The old layer goes after the reset: its removal does not hold up the caller.
    if (old) removeLayer(old);
  }
}
