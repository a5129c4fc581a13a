import { mkdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { PyroError } from "../../errors.js";
import { exists } from "../../util/fs.js";
import { ensureTmpfs, removeTree } from "../../util/mounts.js";
import type { SandboxSpec } from "../backend.js";
import { DEFAULT_DISK_MIB, diskTemplates, ensureDiskImage } from "../disk-image.js";
import type { Disk, Overlay } from "./launch.js";

/**
 * Where a Linux sandbox (bwrap, gVisor) keeps a workspace's files on the host, all under
 * the workspace's sandbox directory. The writable layers (root and /workspace overlays'
 * upper and work directories) live in the disk image (disk-image.ts), mounted at
 * `mnt/disk` inside the launch step's mount namespace only. A workspace made before disk
 * limits (`legacy`) keeps its layers in host directories (`root/`, `ws/`) until its next
 * reset.
 */
export interface SandboxLayout {
  legacy: boolean;
  disk: string;
  diskMount: string;
  rootUpper: string;
  rootWork: string;
  rootMerged: string;
  wsUpper: string;
  wsWork: string;
  wsMerged: string;
  /**
   * A small tmpfs on the host holding the agent's socket directory (`sock`, bound into
   * the sandbox) and the host's link directory beside it (common.ts hostLinkDir), so
   * that the one host directory a sandbox can write is bounded (see SOCKET_FS_OPTIONS).
   */
  sockFs: string;
  /** The agent's socket directory (bound into the sandbox) and the socket in it. */
  sock: string;
  socket: string;
  logs: string;
}

/**
 * The sandbox's socket directory is writable from inside (the agent binds its sockets
 * there), and a host directory would let a command write past the workspace's disk
 * limit onto the host's disk: 1 MiB and 1024 inodes, no devices, set-uid or executables.
 * Mounted once per sandbox directory, on the host; removed with the directory.
 */
export const SOCKET_FS_OPTIONS = "size=1m,nr_inodes=1024,mode=0700,nosuid,nodev,noexec";

export function sandboxLayout(dir: string, legacy = false): SandboxLayout {
  const layers = legacy ? dir : join(dir, "mnt", "disk");
  return {
    legacy,
    disk: join(dir, "disk.img"),
    diskMount: join(dir, "mnt", "disk"),
    rootUpper: join(layers, "root", "upper"),
    rootWork: join(layers, "root", "work"),
    rootMerged: join(dir, "mnt", "root"),
    wsUpper: join(layers, "ws", "upper"),
    wsWork: join(layers, "ws", "work"),
    wsMerged: join(dir, "mnt", "ws"),
    sockFs: join(dir, "sockfs"),
    sock: join(dir, "sockfs", "sock"),
    socket: join(dir, "sockfs", "sock", "agent.sock"),
    logs: join(dir, "logs"),
  };
}

/** Whether `dir` keeps its layers in host directories (made before disk limits) rather than an image. */
export async function isLegacyLayout(dir: string): Promise<boolean> {
  return (await exists(join(dir, "root", "upper"))) && !(await exists(join(dir, "disk.img")));
}

/** The layout of `dir` as it is on disk. */
export async function detectLayout(dir: string): Promise<SandboxLayout> {
  return sandboxLayout(dir, await isLegacyLayout(dir));
}

function layerDirs(l: SandboxLayout): string[] {
  return [l.rootUpper, l.rootWork, l.wsUpper, l.wsWork];
}

/**
 * Makes the layout's directories (and `extra`), the disk image of the workspace's limit
 * (fail closed: no image, no start) and removes a stale agent socket.
 */
export async function prepareLayout(
  l: SandboxLayout,
  spec: SandboxSpec,
  extra: string[] = [],
): Promise<void> {
  // The socket directory's filesystem first: the directories below are made in it.
  await mkdir(l.sockFs, { recursive: true, mode: 0o700 });
  await ensureTmpfs(l.sockFs, SOCKET_FS_OPTIONS).catch((err: Error) => {
    throw new PyroError(
      "backend_unavailable",
      err.message,
      "the sandbox's socket directory needs a tmpfs: run as root",
    );
  });
  const dirs = [
    ...(l.legacy ? layerDirs(l) : [l.diskMount]),
    l.rootMerged,
    l.wsMerged,
    ...extra,
    l.sock,
    l.logs,
  ];
  for (const d of dirs) await mkdir(d, { recursive: true, mode: 0o700 });
  if (!l.legacy) await ensureDiskImage(l.disk, spec.limits.disk_mib ?? DEFAULT_DISK_MIB, diskTemplates(spec));
  await rm(l.socket, { force: true });
}

/** The two overlays the launch step mounts: the root over the environment, /workspace over its snapshot. */
export function layoutOverlays(l: SandboxLayout, spec: SandboxSpec): Overlay[] {
  return [
    { lower: spec.rootfs, upper: l.rootUpper, work: l.rootWork, target: l.rootMerged },
    { lower: join(spec.snapshotsDir, spec.snapshot), upper: l.wsUpper, work: l.wsWork, target: l.wsMerged },
  ];
}

/** The launch step's disk option: the image to mount and the layer directories to make in it. */
export function layoutDisk(l: SandboxLayout): { disk?: Disk } {
  return l.legacy ? {} : { disk: { image: l.disk, mount: l.diskMount, mkdirs: layerDirs(l) } };
}

/** Drops the writable layers (a reset): the host directories of a legacy layout and the image. */
export async function discardLayers(dir: string): Promise<void> {
  for (const d of ["root", "ws"]) await removeTree(join(dir, d));
  await rm(join(dir, "disk.img"), { force: true });
}
