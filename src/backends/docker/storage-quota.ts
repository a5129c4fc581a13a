/**
 * What a Docker engine's storage driver can limit (docker/disk-limit.ts applies it; the
 * probe reads it for doctor without loading the backend): the driver from `GET /info`,
 * and from this host's mount table and sysfs what its data root's filesystem enforces.
 */
import { readdirSync, readFileSync, realpathSync } from "node:fs";
import { basename, join } from "node:path";

/** The parts of `GET /info` that say what the storage driver can limit. */
export interface EngineInfo {
  Driver?: string;
  DriverStatus?: [string, string][] | null;
  DockerRootDir?: string;
  SecurityOptions?: string[] | null;
}

/** Whether workspaces on an engine get a disk limit, and if not, why. */
export type DiskSupport =
  | { ok: true; driver: string; countsImage: boolean }
  | { ok: false; message: string; hint: string };

/** A btrfs filesystem's quota accounting (sysfs `qgroups/`): off, full qgroups or simple quotas. */
export interface BtrfsQuota {
  mode: "off" | "qgroup" | "squota";
  inconsistent: boolean;
}

const HINT =
  "run the engine with the btrfs or zfs storage driver, or overlay2 on xfs mounted with pquota (scripts/dockerd-test starts one on btrfs); or use --backend bwrap";

/**
 * What the engine's storage driver can do, from its `/info`, this host's mount table
 * (an xfs data root's project quotas show only in its mount options) and, for btrfs, its
 * quota accounting (`btrfsQuota`: sysfs by default).
 *
 * btrfs limits a container's subvolume by a qgroup, enforced only while the accounting is
 * on and consistent: quotas off (the engine would turn full qgroups on over existing
 * data, inconsistent until a rescan) or inconsistent are refused. Full qgroups count the
 * extents a layer shares with its image (the size asked is the image's plus the limit);
 * simple quotas (Linux 6.7+) count only what the container's subvolume wrote.
 */
export function rootQuotaOf(
  info: EngineInfo,
  mountinfo: string,
  btrfsQuota: (device: string) => BtrfsQuota | null = readBtrfsQuota,
): DiskSupport {
  const driver = info.Driver ?? "unknown";
  if ((info.SecurityOptions ?? []).some((o) => o.includes("name=rootless")))
    return { ok: false, message: "a rootless engine does not see this host's mounts", hint: HINT };
  const root = info.DockerRootDir ? mountOf(mountinfo, info.DockerRootDir) : null;
  if (driver === "btrfs") return btrfsSupport(info.DockerRootDir ?? "the data root", root, btrfsQuota);
  if (driver === "zfs") return { ok: true, driver, countsImage: false };
  const backing = (info.DriverStatus ?? []).find(([k]) => k === "Backing Filesystem")?.[1] ?? "unknown";
  if (
    (driver === "overlay2" || driver === "vfs") &&
    backing === "xfs" &&
    root?.fstype === "xfs" &&
    /(^|,)(prjquota|pquota|pqnoenforce)(,|$)/.test(root.options)
  )
    return { ok: true, driver, countsImage: false };
  return {
    ok: false,
    message: `the engine's storage driver (${driver} on ${backing}) cannot limit a container's writable layer`,
    hint: HINT,
  };
}

function btrfsSupport(
  rootDir: string,
  root: Mount | null,
  btrfsQuota: (device: string) => BtrfsQuota | null,
): DiskSupport {
  const driver = "btrfs";
  const q = root?.fstype === "btrfs" ? btrfsQuota(root.source) : null;
  // Unknown (no sysfs, a device not found): whether a limit would hold cannot be told.
  if (!q)
    return {
      ok: false,
      message: "the quota state of the engine's btrfs data root cannot be read (/sys/fs/btrfs)",
      hint: "run pyro on the engine's host with /sys mounted, or use --backend bwrap",
    };
  if (q.mode === "off")
    return {
      ok: false,
      message: "quotas are off on the engine's btrfs data root, so a size limit would not hold",
      hint: `enable them before the engine holds data (btrfs quota enable ${rootDir}), or run btrfs quota rescan -w ${rootDir} after`,
    };
  if (q.inconsistent)
    return {
      ok: false,
      message:
        "the quota accounting of the engine's btrfs data root is inconsistent, so a size limit would not hold",
      hint: `run btrfs quota rescan -w ${rootDir}`,
    };
  return { ok: true, driver, countsImage: q.mode === "qgroup" };
}

interface Mount {
  fstype: string;
  source: string;
  options: string;
}

/** The mount a path lives on (the longest mount point that contains it), from mountinfo text. */
function mountOf(mountinfo: string, path: string): Mount | null {
  let best: (Mount & { point: string }) | null = null;
  for (const line of mountinfo.split("\n")) {
    const [left, right] = line.split(" - ");
    const point = unescapeMountPath(left?.split(" ")[4]);
    const [fstype, source, superOpts] = right?.split(" ") ?? [];
    if (!point || !fstype) continue;
    const inside = path === point || path.startsWith(point.endsWith("/") ? point : `${point}/`);
    if (inside && (!best || point.length >= best.point.length))
      best = {
        point,
        fstype,
        source: source ?? "",
        options: `${left?.split(" ")[5] ?? ""},${superOpts ?? ""}`,
      };
  }
  return best;
}

/** mountinfo writes a space, tab, newline or backslash in a path as an octal escape. */
function unescapeMountPath(p: string | undefined): string | undefined {
  return p?.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(Number.parseInt(o, 8)));
}

/** The quota accounting of the btrfs filesystem on `device` (e.g. /dev/loop0), from /sys/fs/btrfs. */
export function readBtrfsQuota(device: string, sysfs = "/sys/fs/btrfs"): BtrfsQuota | null {
  let name: string;
  try {
    name = basename(realpathSync(device));
  } catch {
    name = basename(device);
  }
  let filesystems: string[];
  try {
    filesystems = readdirSync(sysfs);
  } catch {
    return null;
  }
  for (const fs of filesystems) {
    let devices: string[];
    try {
      devices = readdirSync(join(sysfs, fs, "devices"));
    } catch {
      continue;
    }
    if (!devices.includes(name)) continue;
    const read = (f: string) => {
      try {
        return readFileSync(join(sysfs, fs, "qgroups", f), "utf8").trim();
      } catch {
        return null;
      }
    };
    const mode = read("mode");
    // No qgroups directory: quotas are off. A kernel without the mode file has only qgroups.
    if (mode === null && read("inconsistent") === null) return { mode: "off", inconsistent: false };
    return { mode: mode === "squota" ? "squota" : "qgroup", inconsistent: read("inconsistent") === "1" };
  }
  return null;
}

/** What this process and the endpoint allow, before the engine is asked (null: both fine). */
export function hostSupport(endpoint: string): DiskSupport | null {
  if (process.getuid?.() !== 0)
    return { ok: false, message: "mounting /workspace's disk image needs root", hint: HINT };
  if (!endpoint.startsWith("unix://"))
    return { ok: false, message: `the engine at ${endpoint} is not on this host's filesystem`, hint: HINT };
  return null;
}

export function readMountinfo(): string {
  try {
    return readFileSync("/proc/self/mountinfo", "utf8");
  } catch {
    return ""; // no mount table: only btrfs and zfs are recognised
  }
}
