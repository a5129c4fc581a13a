/**
 * On the btrfs storage driver, the engine's size option limits what a container's
 * subvolume references (`max_rfer`), the image's files included (disk-limit.ts
 * storageSize adds the image's size). A command that deleted the image's files freed
 * "referenced" space and then wrote more than the limit: 279 MiB with a 128 MiB limit
 * after removing 176 MiB of debian's files (the engine's disk still held at most the
 * image's size plus the limit). An exclusive limit (`max_excl`) on the same qgroup counts
 * only blocks no other subvolume shares, which is what a command writes: the limit itself.
 * Set with btrfs-progs when it is installed; without it the referenced limit stays.
 */
import type Docker from "dockerode";
import { run } from "../../util/run.js";
import { LAUNCH_ENV } from "../common.js";
import { layerDir } from "./commit-size.js";

const MiB = 1024 * 1024;

/** Limits the exclusive space of container `c`'s btrfs subvolume to `mib` MiB; false when it could not. */
export async function limitExclusive(
  docker: Docker,
  c: Docker.ContainerInspectInfo,
  mib: number,
): Promise<boolean> {
  const layer = await layerDir(docker, c).catch(() => null);
  if (!layer?.withImage) return false; // not btrfs: the driver's limit counts only the layer
  const r = await run(["btrfs", "qgroup", "limit", "-e", String(mib * MiB), layer.dir], {
    timeoutMs: 30_000,
    env: { ...LAUNCH_ENV },
  }).catch(() => null);
  return r?.exitCode === 0;
}
