/**
 * Handing a started spare gVisor sandbox to a new workspace (core/pool.ts keeps the spares;
 * docs/backends.md "Pool of started sandboxes"): a create then costs no runsc boot and no
 * agent start, which are ~90% of it here. The bwrap hand-out (bwrap/pool.ts) is the model;
 * what differs is what gVisor fixes at start:
 *
 * - /workspace cannot be swapped under runsc's gofer (it serves the directories it opened
 *   at start), so only a workspace whose baseline snapshot is empty (a create without a
 *   seed) can take a spare, whose /workspace is an empty layer on an empty snapshot;
 * - the guest's MemTotal, `nproc` (from the CPU quota) and RLIMIT_NPROC are read from the
 *   OCI config at start, so only a workspace with the spare's limits (the defaults) can;
 * - the hostname is set by a `runsc exec` with CAP_SYS_ADMIN of a static helper of ours
 *   (hostname-helper.ts; never an environment's program), before anything is renamed
 *   (runsc finds the sandbox through its root), while nothing but the agent runs there.
 *
 * Then, as for bwrap: the cgroups are renamed to the workspace's (runsc's own groups too)
 * with its limits written and read back, the workspace's snapshots and net directories'
 * contents move into the spare's, which take their places (the inodes bound into the
 * sandbox become the workspace's directories), and the sandbox directory is renamed.
 * Any failure declines (the spare is ended, the create starts its own sandbox), but one
 * while the workspace's snapshots and net directories move, which fails the create (it is
 * rolled back), as bwrap's does.
 */
import { mkdir, readdir, rename } from "node:fs/promises";
import { join } from "node:path";
import { removeTree } from "../../util/mounts.js";
import { run } from "../../util/run.js";
import type { SandboxSpec } from "../backend.js";
import { takeOverDir } from "../bwrap/pool.js";
import { sandboxHostname } from "../guest.js";
import { type CgroupLayout, CgroupLimits, detectCgroups } from "../linux/cgroups.js";
import { HOSTNAME_HELPER_IN_SANDBOX, prepareHostnameHelper } from "./hostname-helper.js";
import { hostPidsMax } from "./runsc.js";
import { endCgroup } from "./standby.js";

/** Where a handed-out spare's empty /workspace lower layer is kept (in its sandbox directory). */
export const SPARE_LOWER = "spare-lower";

/** What the hand-out needs of the spare's recorded state. */
export interface GvisorSpareState {
  cgroup: string;
  runsc_root: string;
  container_id: string;
}

const sameLimits = (a: SandboxSpec["limits"], b: SandboxSpec["limits"]) =>
  a.vcpus === b.vcpus && a.memory_mib === b.memory_mib && a.pids_max === b.pids_max;

/** Why the spare cannot take `spec`'s workspace before anything is touched, or null. */
async function unfit(spare: SandboxSpec, spec: SandboxSpec): Promise<string | null> {
  if (!sameLimits(spare.limits, spec.limits))
    return "the workspace's limits differ from the spare's (gVisor reads them at start)";
  if ((await readdir(join(spec.snapshotsDir, spec.snapshot)).catch(() => ["?"])).length > 0)
    return "the workspace has a seed (runsc's gofer serves the spare's empty /workspace)";
  if ((await readdir(spec.dir).catch(() => ["?"])).length > 0)
    return "the workspace's sandbox directory is not empty";
  return null;
}

/**
 * Sets the sandbox's hostname: our static helper (hostname-helper.ts, bound read-only into
 * the sandbox), the only program run with CAP_SYS_ADMIN, by runsc, while nothing but the
 * spare's agent runs there. Why it failed, or null.
 */
async function setHostname(
  bin: string,
  s: GvisorSpareState,
  spare: SandboxSpec,
  name: string,
): Promise<string | null> {
  if (!/^pyro-[A-Za-z0-9-]{1,12}$/.test(name)) return `bad hostname ${name}`;
  if (!(await prepareHostnameHelper(spare.runtimeCacheDir))) return "no hostname helper (no C compiler)";
  const argv = [bin, "--root", s.runsc_root, "exec", "--cap", "CAP_SYS_ADMIN", s.container_id];
  const r = await run([...argv, HOSTNAME_HELPER_IN_SANDBOX, name], { timeoutMs: 10_000 });
  return r.exitCode === 0 ? null : `setting the hostname failed: ${r.stderr.trim().slice(0, 200)}`;
}

/**
 * Renames every group of the spare (pyro's, with the workspace's limits written and read
 * back, and runsc's in the other hierarchies) to `id`.
 */
async function renameCgroups(layout: CgroupLayout, from: string, id: string, spec: SandboxSpec) {
  const cg = await CgroupLimits.attach(layout, from);
  if (!cg) throw new Error("the spare's cgroup is gone");
  await endCgroup(layout, id);
  await cg.renameTo(id, {
    vcpus: spec.limits.vcpus,
    memoryMib: spec.limits.memory_mib,
    pidsMax: hostPidsMax(spec.limits.pids_max),
  });
  for (const h of await readdir(layout.root).catch(() => [] as string[])) {
    const dir = join(layout.root, h, layout.base, from);
    await rename(dir, join(layout.root, h, layout.base, id)).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== "ENOENT" && err.code !== "ENOTDIR") throw err;
    });
  }
}

/**
 * Hands the spare to `spec`'s workspace (see the top of this file). Returns the paths
 * and cgroup to record, or `declined` with why. `alive`: whether the spare still runs.
 */
export async function adoptGvisorSpare(
  spare: SandboxSpec,
  s: GvisorSpareState,
  spec: SandboxSpec,
  runsc: string,
  alive: () => Promise<boolean>,
): Promise<{ cgroup: string } | { declined: string }> {
  const why = await unfit(spare, spec);
  if (why) return { declined: why };
  if (!(await alive())) return { declined: "the spare's sandbox or agent is gone" };
  const named = await setHostname(runsc, s, spare, sandboxHostname(spec.workspace_id));
  if (named) return { declined: named };
  const layout = await detectCgroups();
  try {
    await renameCgroups(layout, s.cgroup, spec.workspace_id, spec);
  } catch (err) {
    // Under whichever names it reached: both ended (the pool then ends what is left).
    await endCgroup(layout, spec.workspace_id).catch(() => {});
    return { declined: `the spare could not take the workspace's cgroup: ${(err as Error).message}` };
  }
  // The workspace's own files move from here on: a failure is the create's (rollback).
  // The spare's empty snapshot is its /workspace overlay's lower layer, which must stay a
  // live directory (an overlay on a removed lower lists nothing, not even its upper): it
  // moves into the sandbox directory, whose next start removes it.
  await rename(join(spare.snapshotsDir, spare.snapshot), join(spare.dir, SPARE_LOWER));
  await takeOverDir(spare.snapshotsDir, spec.snapshotsDir);
  if (spare.netDir && spec.netDir) await takeOverDir(spare.netDir, spec.netDir);
  try {
    await rename(spare.dir, spec.dir);
    if (!(await alive())) throw new Error("the spare died during the hand-out");
  } catch (err) {
    await endCgroup(layout, spec.workspace_id).catch(() => {});
    // Back to an empty sandbox directory for the workspace's own start (its snapshots and
    // net directories are in place: the spare's inodes hold their contents).
    await removeTree(spec.dir).catch(() => {});
    await mkdir(spec.dir, { recursive: true, mode: 0o700 });
    return { declined: (err as Error).message };
  }
  return { cgroup: spec.workspace_id };
}
