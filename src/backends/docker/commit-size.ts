/**
 * What `docker commit` of a stopped container writes for its root layer, measured on the
 * host before it runs (pool.ts settleAdopted commits an adopted spare's layer). The
 * engine packs every changed file whole into a tar and unpacks it into the new image
 * layer, outside any container's size limit: a sparse file holds no block in the layer
 * (the storage driver's limit counts blocks) but all of its size in the commit. A
 * command's `truncate -s 3G` under the limit wrote 2-3 GiB onto the engine's disk at the
 * next start, and a 16 TiB one would fill it. So the container's files are walked first
 * (root only: the layer's directory is the engine's) and a layer whose files add up to
 * more than the limit lets it hold is not committed.
 */
import { lstat, readdir, readFile } from "node:fs/promises";
import { join } from "node:path";
import type Docker from "dockerode";
import { PyroError } from "../../errors.js";
import { deadline } from "./client.js";

const MiB = 1024 * 1024;

/**
 * The host directory of a container's writable layer and whether it holds the image's
 * files too (btrfs: the container's subvolume is a snapshot of the image), or null where
 * the driver's layout is not known here (the commit is not measured there).
 */
export async function layerDir(
  docker: Docker,
  c: Docker.ContainerInspectInfo,
): Promise<{ dir: string; withImage: boolean } | null> {
  const driver = c.GraphDriver?.Name;
  const upper = (c.GraphDriver?.Data as { UpperDir?: string } | null | undefined)?.UpperDir;
  if (driver === "overlay2" && upper) return { dir: upper, withImage: false };
  if (driver !== "btrfs") return null;
  const root = ((await docker.info()) as { DockerRootDir?: string }).DockerRootDir;
  if (!root) return null;
  const mountId = (
    await readFile(join(root, "image", "btrfs", "layerdb", "mounts", c.Id, "mount-id"), "utf8").catch(
      () => "",
    )
  ).trim();
  if (!/^[0-9a-f]{64}$/.test(mountId)) return null;
  return { dir: join(root, "btrfs", "subvolumes", mountId), withImage: true };
}

/** Apparent bytes of the regular files below `dir` (each inode once; symlinks not followed). */
async function apparentBytes(dir: string): Promise<number> {
  const seen = new Set<string>();
  let bytes = 0;
  const stack = [dir];
  while (stack.length > 0) {
    const d = stack.pop() as string;
    for (const e of await readdir(d, { withFileTypes: true }).catch(() => [])) {
      const p = join(d, e.name);
      if (e.isDirectory()) stack.push(p);
      else if (e.isFile()) {
        const st = await lstat(p, { bigint: false }).catch(() => null);
        if (!st) continue;
        const key = `${st.dev}:${st.ino}`;
        if (seen.has(key)) continue;
        seen.add(key);
        bytes += st.size;
      }
    }
  }
  return bytes;
}

/**
 * Refuses to commit the stopped container `c` when its layer's files add up to more than
 * `mib` MiB of writes (over the image's own size where the layer holds the image).
 */
export async function checkCommitSize(
  docker: Docker,
  c: Docker.ContainerInspectInfo,
  mib: number,
): Promise<void> {
  const layer = await layerDir(docker, c);
  if (!layer) return;
  const image = layer.withImage
    ? ((await docker.getImage(c.Image).inspect(deadline() as Docker.ImageInspectOptions)).Size ?? 0)
    : 0;
  const bytes = await apparentBytes(layer.dir);
  if (bytes > image + mib * MiB)
    throw new PyroError(
      "conflict",
      `the workspace's root layer holds files of ${Math.ceil((bytes - image) / MiB)} MiB (sparse files count their full size), more than its disk limit of ${mib} MiB: keeping it over this start would write them in full onto the engine's disk`,
      "reset the workspace (its root layer is discarded; /workspace is reset too), or delete it",
    );
}
