/**
 * Handing a started spare bwrap sandbox to a new workspace (core/pool.ts keeps the
 * spares; docs/backends.md "Pool of started sandboxes"). A create then costs no sandbox
 * start and no agent start: the spare takes the workspace's identity in place.
 *
 * A spare was started like any workspace's sandbox (same argv, limits, seccomp, agent),
 * on directories of its own: an empty snapshot as /workspace's lower layer, an empty
 * snapshots directory and an empty net directory, each bound into the sandbox. Nothing
 * has run in it but its agent. The hand-out:
 *
 * 1. its cgroup is renamed to the workspace's and the workspace's limits written (read
 *    back: fail closed);
 * 2. what the workspace's snapshots and net directories hold (the seed's baseline; the
 *    egress proxy's socket when the policy is not `off`) is moved into the spare's, and
 *    the spare's directories are renamed to the workspace's: the inodes bound into the
 *    sandbox become the workspace's directories, so later snapshots and proxy sockets
 *    appear inside as they do for a sandbox started on them;
 * 3. the spare's sandbox directory is renamed to the workspace's (the mounts below it,
 *    in the host's and the launch step's namespaces, follow the rename);
 * 4. /workspace: the workspace's overlay is stacked over the spare's empty one exactly as
 *    an in-place reset does (reset.ts swapWorkspaceLayer), and the hostname is set in the
 *    sandbox's UTS namespace;
 * 5. the agent enters the new /workspace (`reset` finish).
 *
 * Steps 1 and 3-5 fail back to a normal start (returns `declined` with why, after ending
 * the sandbox and emptying the workspace's sandbox directory). Step 2 moves the workspace's own
 * snapshot: a failure in the middle of it throws, and the create is rolled back.
 */
import { chmod, lstat, mkdir, readdir, rename, rm, rmdir, stat } from "node:fs/promises";
import { join } from "node:path";
import type { AgentClient } from "../../agent/client.js";
import { removeTree } from "../../util/mounts.js";
import { run } from "../../util/run.js";
import type { SandboxSpec, SandboxState } from "../backend.js";
import { sandboxHostname } from "../guest.js";
import { CgroupLimits, detectCgroups } from "../linux/cgroups.js";
import type { LaunchTools } from "../linux/launch.js";
import { type SandboxLayout, sandboxLayout } from "../linux/layout.js";
import { keptSandboxAlive, swapWorkspaceLayer } from "./reset.js";
import { helperHostname } from "./reset-helper.js";

/** What the hand-out needs of the spare's recorded state (a bwrap state with its reset base). */
export interface SpareState {
  pid: number;
  start_time: string;
  cgroup: string;
  agent_pid: number;
  agent_start_time: string;
  layers_sig: string;
}

/** Moves what `from` holds into `into`, then puts `into` in `from`'s place. */
export async function takeOverDir(into: string, from: string): Promise<void> {
  const entries = await readdir(from).catch(() => null);
  if (entries === null) throw new Error(`${from} is missing`);
  await chmod(into, (await stat(from)).mode & 0o7777);
  for (const name of entries) await rename(join(from, name), join(into, name));
  await rmdir(from);
  await rename(into, from);
}

/**
 * Sets the hostname in the sandbox's UTS namespace: through the sandbox's reset helper
 * (a FIFO round trip, reset-helper.ts), else a spawned `nsenter --uts ... hostname`.
 */
async function setHostname(
  l: SandboxLayout,
  spec: SandboxSpec,
  pids: { launch: number; agent: number },
  name: string,
): Promise<boolean> {
  const byHelper = await helperHostname(spec, l, pids, name);
  if (byHelper !== "absent") return byHelper === "ok";
  const r = await run(["nsenter", `--uts=/proc/${pids.agent}/ns/uts`, "--", "hostname", name], {
    timeoutMs: 10_000,
  });
  return r.exitCode === 0;
}

/**
 * Hands the spare to `spec`'s workspace (see the top of this file). The caller has
 * checked that the spare fits (core/pool.ts spareFits: same environment, disk size,
 * package and runtime). Returns the state to record, or `declined` with why when the
 * workspace should start a sandbox of its own.
 */
export async function adoptSpare(
  spare: SandboxSpec,
  s: SpareState,
  spec: SandboxSpec,
  agent: AgentClient,
  tools: LaunchTools,
): Promise<SandboxState | { declined: string }> {
  const alive = () => keptSandboxAlive(s, s);
  if (!(await alive())) return { declined: "the spare's sandbox or agent is gone" };
  // The workspace's directory is new and empty (the rename below needs it so).
  if ((await readdir(spec.dir).catch(() => ["?"])).length > 0)
    return { declined: "the workspace's sandbox directory is not empty" };
  const layout = await detectCgroups();
  const cg = await CgroupLimits.attach(layout, s.cgroup);
  if (!cg) return { declined: "the spare's cgroup is gone" };
  const end = async () => {
    await (await CgroupLimits.attach(layout, spec.workspace_id))?.destroy().catch(() => {});
    await cg.destroy().catch(() => {});
  };
  try {
    await (await CgroupLimits.attach(layout, spec.workspace_id))?.destroy();
    await cg.renameTo(spec.workspace_id, {
      vcpus: spec.limits.vcpus,
      memoryMib: spec.limits.memory_mib,
      pidsMax: spec.limits.pids_max,
    });
  } catch (err) {
    await end();
    return {
      declined: `the spare could not take the workspace's cgroup and limits: ${(err as Error).message}`,
    };
  }
  // The workspace's own files move from here on: a failure is the create's (rollback).
  await rmdir(join(spare.snapshotsDir, spare.snapshot));
  await takeOverDir(spare.snapshotsDir, spec.snapshotsDir);
  if (spare.netDir && spec.netDir) await takeOverDir(spare.netDir, spec.netDir);
  try {
    await rename(spare.dir, spec.dir);
    const l = sandboxLayout(spec.dir);
    const pids = { launch: s.pid, agent: s.agent_pid };
    // One after the other: both may go to the sandbox's helper, which answers in turn.
    const old = await swapWorkspaceLayer(l, spec, pids, tools);
    const named = old !== null && (await setHostname(l, spec, pids, sandboxHostname(spec.workspace_id)));
    if (!old) throw new Error("the layer swap failed");
    if (!named) throw new Error("the hostname could not be set");
    if (!(await alive())) throw new Error("the spare's sandbox or agent died during the hand-out");
    // The spare's /workspace layer: nothing ran there, so it holds next to nothing.
    void rm(old, { recursive: true, force: true }).catch(() => {});
    await agent.request("reset", { phase: "finish" }, { timeoutMs: 10_000 });
    return {
      backend: "bwrap",
      pid: s.pid,
      start_time: s.start_time,
      socket: l.socket,
      log: join(l.logs, "sandbox.log"),
      cgroup: spec.workspace_id,
      agent_pid: s.agent_pid,
      agent_start_time: s.agent_start_time,
      layers_sig: s.layers_sig,
    };
  } catch (err) {
    await end();
    // Back to an empty sandbox directory for the workspace's own start.
    if (await lstat(spec.dir).catch(() => null)) await removeTree(spec.dir).catch(() => {});
    await mkdir(spec.dir, { recursive: true, mode: 0o700 });
    return { declined: (err as Error).message };
  }
}
