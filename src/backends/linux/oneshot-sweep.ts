import { lstatSync, readdirSync, rmdirSync } from "node:fs";
import { join } from "node:path";
import { removeTree } from "../../util/mounts.js";
import { type CgroupLayout, CgroupLimits } from "./cgroups.js";

/** A one-shot's directory name (bwrap and gVisor, cold and prepared): `run_` and 12 hex digits. */
const RUN_DIR = /^run_[0-9a-f]{12}$/;

/**
 * How old a run directory must be before it can count as left behind: a run makes its
 * directory, then its cgroup, then places its launch step in it, all within
 * milliseconds; until then its cgroup is empty although the run is alive.
 */
export const STALE_AFTER_MS = 60_000;

/**
 * Removes the one-shot run directories under `scratchDir` (and their cgroups) that no
 * process of theirs is left in: what an owner killed during a run leaves (its launch
 * step and command die with it, see the one-shot runners; its directory, disk image and
 * cgroups stay). A directory counts as left behind when it is older than
 * {@link STALE_AFTER_MS} and its cgroup is gone or empty: a live run, or a launch
 * prepared and waiting, always has a process in its cgroup. Removal is idempotent, so an
 * owner finishing its own cleanup at the same moment does no harm. Returns the names it
 * removed; never throws (what it cannot remove now, a later sweep tries again).
 */
export async function sweepOneShots(
  scratchDir: string,
  layout: CgroupLayout,
  now = Date.now(),
): Promise<string[]> {
  let names: string[];
  try {
    names = readdirSync(scratchDir).filter((n) => RUN_DIR.test(n));
  } catch {
    return [];
  }
  const removed: string[] = [];
  for (const name of names) {
    const dir = join(scratchDir, name);
    try {
      const st = lstatSync(dir);
      if (!st.isDirectory() || now - st.mtimeMs < STALE_AFTER_MS) continue;
      const cg = await CgroupLimits.attach(layout, name);
      if (cg && (await cg.pids()).length > 0) continue;
      await cg?.destroy();
      removeOtherGroups(layout, name);
      await removeTree(dir);
      removed.push(name);
    } catch {
      // Busy or already gone: the next sweep looks again.
    }
  }
  return removed;
}

/**
 * The groups of `name` in the hierarchies pyro does not limit with (runsc makes its
 * container's group in every controller: blkio, devices, freezer, ...; a runsc killed
 * with its owner leaves them). Only empty ones can go (rmdir refuses the others).
 */
function removeOtherGroups(layout: CgroupLayout, name: string): void {
  let hierarchies: string[];
  try {
    hierarchies = readdirSync(layout.root);
  } catch {
    return;
  }
  for (const h of hierarchies) {
    try {
      rmdirSync(join(layout.root, h, layout.base, name));
    } catch {
      // Not there, already removed, or not empty.
    }
  }
}
