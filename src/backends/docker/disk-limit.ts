/**
 * The docker backend's disk limit (docs/workspaces.md "Disk limit"). A workspace
 * container writes in two places and each is held to the limit:
 *
 * - Its root filesystem's writable layer, by the engine's storage driver
 *   (`HostConfig.StorageOpt.size`): btrfs (a qgroup on the container's subvolume; it counts
 *   the image's own data too, so the size asked is the image's plus the limit), zfs (a
 *   quota on the container's dataset), overlay2 or vfs on an xfs mounted with project
 *   quotas. Docker refuses the option on every other driver (overlay2 on ext4, the usual
 *   case, among them): pyro asks `GET /info` first and says why.
 * - /workspace's overlay upper layer: a sparse ext4 image of the limit's size in the
 *   slot's directory (disk-image.ts, as bwrap's), loop-mounted by pyro on the engine's
 *   host, where the engine's overlay volume stacks on it. This needs root and an engine
 *   on a local socket (one that sees this host's mounts).
 *
 * An engine that can do neither leaves workspaces without a limit; core refuses an
 * explicit `--disk` there (core/workspace-spec.ts `resolveDisk`) and `doctor` says why.
 */
import { existsSync } from "node:fs";
import { mkdir, readFile, realpath, rm, stat, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import type Docker from "dockerode";
import { PyroError } from "../../errors.js";
import { ensureTmpfs, mountsUnder } from "../../util/mounts.js";
import { run } from "../../util/run.js";
import { LAUNCH_ENV } from "../common.js";
import { diskTemplates, ensureDiskImage } from "../disk-image.js";
import { SOCKET_FS_OPTIONS } from "../linux/layout.js";
import { CALL_MS, deadline, engineError, ignoreGone, withTimeout } from "./client.js";
import type { MountBody } from "./container.js";
import {
  type DiskSupport,
  type EngineInfo,
  hostSupport,
  readMountinfo,
  rootQuotaOf,
} from "./storage-quota.js";

const MiB = 1024 * 1024;

// What the engine can limit is decided in storage-quota.ts (doctor's probe reads it too).
export { type DiskSupport, type EngineInfo, rootQuotaOf } from "./storage-quota.js";

const infoByEndpoint = new Map<string, Promise<EngineInfo>>();

/**
 * Whether this process can give workspaces on `endpoint` a disk limit: root (it mounts
 * /workspace's image), an engine on a local socket, a storage driver that limits the
 * root layer. The engine's `/info` is asked once per endpoint and process; the data
 * root's quota state (sysfs, microseconds) is read again at each call, so a long-lived
 * server sees quotas turned off or gone inconsistent.
 */
export async function diskSupport(docker: Docker, endpoint: string): Promise<DiskSupport> {
  const local = hostSupport(endpoint);
  if (local) return local;
  let p = infoByEndpoint.get(endpoint);
  if (!p) {
    p = withTimeout(docker.info() as Promise<EngineInfo>, CALL_MS, () => {});
    infoByEndpoint.set(endpoint, p);
    // A failed question (the engine was down) is asked again next time.
    p.catch(() => infoByEndpoint.delete(endpoint));
  }
  let info: EngineInfo;
  try {
    info = await p;
  } catch (err) {
    throw engineError(err, "asking the engine about its storage driver", endpoint);
  }
  const s = rootQuotaOf(info, readMountinfo());
  // Full qgroups need the exclusive limit too (qgroup.ts), set with btrfs-progs.
  if (s.ok && s.countsImage && s.driver === "btrfs" && !onPath("btrfs"))
    return {
      ok: false,
      message: "btrfs-progs is not installed: under btrfs's full qgroups a limit needs it to hold",
      hint: "install btrfs-progs (npm run setup), or enable simple quotas on the engine's data root",
    };
  return s;
}

/** What a limited container is made with ({@link diskSupport}); where the limit cannot hold, the refusal. */
export async function requireDiskSupport(
  docker: Docker,
  endpoint: string,
): Promise<Extract<DiskSupport, { ok: true }>> {
  const support = await diskSupport(docker, endpoint);
  if (!support.ok)
    throw new PyroError(
      "backend_unavailable",
      `cannot apply the disk limit: ${support.message}`,
      support.hint,
    );
  return support;
}

function onPath(bin: string): boolean {
  return (LAUNCH_ENV.PATH ?? "").split(":").some((d) => d !== "" && existsSync(join(d, bin)));
}

const imageSizes = new Map<string, number>();

/**
 * `StorageOpt.size` for a container of `image` limited to `mib` MiB of writes: on btrfs
 * the image's own size is added (its qgroup counts what the layer shares with the image).
 * `baseImage`, when given and present, is measured instead (an adopted spare's committed
 * root layer already holds writes that count against the limit).
 */
export async function storageSize(
  docker: Docker,
  support: Extract<DiskSupport, { ok: true }>,
  image: string,
  mib: number,
  baseImage?: string,
): Promise<string> {
  if (!support.countsImage) return String(mib * MiB);
  let size: number | undefined;
  for (const ref of baseImage ? [baseImage, image] : [image]) {
    size = imageSizes.get(ref);
    if (size !== undefined) break;
    const i = await ignoreGone(docker.getImage(ref).inspect(deadline() as Docker.ImageInspectOptions));
    if (i && typeof i.Size === "number") {
      size = i.Size;
      imageSizes.set(ref, size);
      break;
    }
  }
  if (size === undefined)
    throw new PyroError(
      "backend_unavailable",
      `cannot size the disk limit: the image ${image} is missing`,
      "start the workspace again (the environment's image is imported again)",
    );
  return String(size + mib * MiB);
}

/** A slot's /workspace disk: its image and where it is mounted (docker/standby.ts slotPaths). */
export interface SlotDisk {
  image: string;
  mount: string;
}

/**
 * Makes the slot's /workspace image (a sparse copy of a blank one of `mib` MiB) unless it
 * exists, and mounts it unless it is mounted; returns the upper and work directories on
 * it. Fails closed: no image or no mount, no start.
 */
export async function mountSlotDisk(
  disk: SlotDisk,
  mib: number,
  spec: { runtimeCacheDir: string },
): Promise<{ upper: string; work: string }> {
  await mkdir(dirname(disk.image), { recursive: true, mode: 0o700 });
  await ensureDiskImage(disk.image, mib, diskTemplates(spec));
  await ensureMounted(disk);
  const upper = join(disk.mount, "upper");
  const work = join(disk.mount, "work");
  for (const d of [upper, work]) await mkdir(d, { recursive: true, mode: 0o700 });
  return { upper, work };
}

/** Mounts a slot's existing image again (after a reboot); false when it has none. */
export async function remountSlotDisk(disk: SlotDisk): Promise<boolean> {
  if (!(await stat(disk.image).catch(() => null))) return false;
  await ensureMounted(disk);
  return true;
}

async function ensureMounted(disk: SlotDisk): Promise<void> {
  await mkdir(disk.mount, { recursive: true, mode: 0o700 });
  // The canonical path, as mountinfo names it (a PYRO_HOME below a symlink).
  const point = await realpath(disk.mount);
  if ((await mountsUnder(point)).includes(point)) return;
  const r = await run(
    ["mount", "-t", "ext4", "-o", "loop,nodev,nosuid,noatime", disk.image, point],
    // LAUNCH_ENV's PATH has the sbin directories a user's PATH often lacks.
    { timeoutMs: 30_000, env: { ...LAUNCH_ENV } },
  ).catch((err: Error) => ({ exitCode: -1, stdout: "", stderr: err.message }));
  if (r.exitCode !== 0)
    throw new PyroError(
      "backend_unavailable",
      `cannot apply the disk limit: mounting /workspace's disk image failed (${r.stderr.trim().split("\n").slice(-1)[0] ?? ""})`,
      "pyro refuses to run without a disk limit; the docker backend needs root to mount it",
    );
}

/**
 * Empties a slot's socket directory (the container's /run/pyro/sock, bound writable), or
 * makes it. With a disk limit it is on a 1 MiB tmpfs of its own on the host, as bwrap's
 * (linux/layout.ts), with the host's link directory (common.ts hostLinkDir): a plain host
 * directory let a command write past the limit onto the host's disk (300 MiB with a
 * 128 MiB limit). Mounted once per slot, removed with the workspace's directory
 * (util/mounts.ts removeTree). Fails closed.
 */
export async function freshSocketDir(l: { sockFs: string; sock: string }, limited: boolean): Promise<void> {
  await mkdir(l.sockFs, { recursive: true, mode: 0o700 });
  if (limited)
    await ensureTmpfs(l.sockFs, SOCKET_FS_OPTIONS).catch((err: Error) => {
      throw new PyroError("backend_unavailable", `cannot apply the disk limit: ${err.message}`);
    });
  await rm(l.sock, { recursive: true, force: true });
  await mkdir(l.sock, { recursive: true, mode: 0o700 });
}

/** What the engine writes in a container's /etc/hosts with no network. */
const HOSTS = `127.0.0.1\tlocalhost
::1\tlocalhost ip6-localhost ip6-loopback
fe00::0\tip6-localnet
ff00::0\tip6-mcastprefix
ff02::1\tip6-allnodes
ff02::2\tip6-allrouters
`;

/**
 * The container's /etc/hosts, /etc/hostname and /etc/resolv.conf as binds of files in
 * `<dir>/etc`. The engine's own are files in its data root, bound writable and outside
 * the root layer's limit: a command wrote 300 MiB into /etc/hosts with a 128 MiB limit.
 * The engine takes a bind at these paths instead of its file and writes no other.
 * A workspace's are on /workspace's image (`dir` its mount point, beside the overlay's
 * directories, out of the container's reach otherwise), writable and kept over a stop and
 * a start as the root layer is; the hostname is written at every start (a pool's hand-out
 * renames it). A one-shot has no image: its are read-only, in its scratch directory.
 */
export async function etcBinds(dir: string, hostname: string, readOnly = false): Promise<MountBody[]> {
  return writeEtc(dir, hostname, readOnly).catch((err: Error) => {
    throw err instanceof PyroError
      ? err
      : new PyroError(
          "backend_unavailable",
          `cannot apply the disk limit: writing /etc's files failed (${err.message})`,
        );
  });
}

async function writeEtc(dir: string, hostname: string, readOnly: boolean): Promise<MountBody[]> {
  const etc = join(dir, "etc");
  await mkdir(etc, { recursive: true, mode: 0o755 });
  const keep = (err: NodeJS.ErrnoException) => {
    if (err.code !== "EEXIST") throw err;
  };
  await writeFile(join(etc, "hostname"), `${hostname}\n`, { mode: 0o644 });
  await writeFile(join(etc, "hosts"), HOSTS, { flag: "wx", mode: 0o644 }).catch(keep);
  await writeFile(join(etc, "resolv.conf"), await resolvConf(), { flag: "wx", mode: 0o644 }).catch(keep);
  return ["hosts", "hostname", "resolv.conf"].map((f) => ({
    Type: "bind" as const,
    Source: join(etc, f),
    Target: `/etc/${f}`,
    ReadOnly: readOnly,
  }));
}

/** The host's resolv.conf without loopback name servers (unreachable from the container), as the engine's. */
async function resolvConf(): Promise<string> {
  const text = await readFile("/etc/resolv.conf", "utf8").catch(() => "");
  return text
    .split("\n")
    .filter((l) => !/^\s*nameserver\s+(127\.|::1\s*$)/.test(l))
    .join("\n");
}
