/**
 * Handing a started spare docker container to a new workspace (core/pool.ts keeps the
 * spares; docs/backends.md "Pool of started sandboxes"): a create then costs no engine
 * start (~260-360 ms here) and no agent start (~100-130 ms), ~90% of it. The bwrap
 * hand-out (bwrap/pool.ts) is the model; what differs is what Docker fixes at create:
 *
 * - /workspace is an overlay volume the engine mounted at the spare's start, on the
 *   spare's empty snapshot: only a workspace whose baseline is empty (no seed) can take
 *   one (as for gVisor). That snapshot stays the overlay's lower layer, moved into the
 *   sandbox directory (SPARE_LOWER), never removed while the container lives.
 * - The limits (memory, memory+swap, CPU, pids) are changed on the running container by
 *   the engine's update when they differ, and every isolation setting is read back as a
 *   create's are (fail closed).
 * - The hostname: `hostname` of the host run by nsenter in the container's UTS namespace
 *   only (no program runs in the container, none gets a capability; the Engine API's exec
 *   has no per-exec capability, only `Privileged`, which grants them all), and the
 *   engine's /etc/hostname file rewritten in place. Needs root on the engine's host (a
 *   spare declines otherwise).
 * - The container keeps the spare's labels and volume (the engine changes neither), so
 *   the workspace's engine record names them (`adopted`), its record written in the
 *   spare's directory before anything changes: whoever finds the directory (the
 *   workspace, or the pool's reaper before the directory moved) removes them. Then the
 *   container is renamed `pyro-<id>`, the snapshots and net directories take the
 *   workspace's places (the inodes bound into the container become the workspace's
 *   directories) and the sandbox directory is renamed onto the workspace's (its socket
 *   and /workspace's upper directory are below it).
 *
 * The adopted container's binds and volume name the spare's paths, which are gone after
 * the hand-out: it can never be started again. Its next start (or a disk read while it
 * is stopped) first replaces it (`settleAdopted`): its root layer committed to an image,
 * the workspace's own container made on it (so what commands wrote outside /workspace is
 * kept, as a stop/start keeps it), the spare's container and volume removed.
 */
import { spawn } from "node:child_process";
import { mkdir, open, readdir, readFile, rename, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type Docker from "dockerode";
import { atomicWriteFile } from "../../util/fs.js";
import { removeTree } from "../../util/mounts.js";
import type { SandboxSpec } from "../backend.js";
import { takeOverDir } from "../bwrap/pool.js";
import { AGENT_SOCKET, sandboxHostname } from "../guest.js";
import { deadline, ignoreGone } from "./client.js";
import { checkCommitSize } from "./commit-size.js";
import {
  containerName,
  hostConfig,
  type InspectedHostConfig,
  LABELS,
  unappliedSettings,
} from "./container.js";
import {
  containerParts,
  createContainer,
  type DockerState,
  type EngineRecord,
  killContainer,
  RECORD,
} from "./container-start.js";
import { removeVolume, slotPaths, slotVolume } from "./standby.js";

/** How long a root layer's commit may take (settleAdopted): a copy of up to the disk limit. */
const COMMIT_MS = 30 * 60_000;

/** Where a handed-out spare's empty /workspace lower layer is kept (in its sandbox directory). */
export const SPARE_LOWER = "spare-lower";
/** The repository of adopted containers' committed root layers: `pyro-root:<workspace id>`. */
export const ROOT_IMAGE_REPO = "pyro-root";

const sameLimits = (a: SandboxSpec["limits"], b: SandboxSpec["limits"]) =>
  a.vcpus === b.vcpus && a.memory_mib === b.memory_mib && a.pids_max === b.pids_max;

/** The image tag of a workspace's committed root layer (image references are lower case). */
export function rootImageOf(workspaceId: string): string {
  return `${ROOT_IMAGE_REPO}:${workspaceId.toLowerCase().replace(/[^a-z0-9_.-]/g, "-")}`;
}

/** Why the spare cannot take `spec`'s workspace before anything is touched, or null. */
async function unfit(spec: SandboxSpec): Promise<string | null> {
  if ((await readdir(join(spec.snapshotsDir, spec.snapshot)).catch(() => ["?"])).length > 0)
    return "the workspace has a seed (the engine mounted the spare's empty /workspace at its start)";
  if ((await readdir(spec.dir).catch(() => ["?"])).length > 0)
    return "the workspace's sandbox directory is not empty";
  if (!/^pyro-[A-Za-z0-9-]{1,12}$/.test(sandboxHostname(spec.workspace_id)))
    return `bad hostname ${sandboxHostname(spec.workspace_id)}`;
  return null;
}

/**
 * The workspace's limits on the running container (the engine's update, only when they
 * differ), then every isolation setting read back. The container's inspection, or why not.
 */
async function applyLimits(
  c: Docker.Container,
  spare: SandboxSpec,
  spec: SandboxSpec,
): Promise<Docker.ContainerInspectInfo | string> {
  const want = hostConfig(spec.limits, []);
  if (!sameLimits(spare.limits, spec.limits))
    await c.update({
      Memory: want.Memory,
      MemorySwap: want.MemorySwap,
      NanoCpus: want.NanoCpus,
      PidsLimit: want.PidsLimit,
      ...deadline(),
    });
  const got = await c.inspect(deadline());
  const problems = unappliedSettings(want, got.HostConfig as InspectedHostConfig);
  return problems.length > 0
    ? `the engine did not apply the workspace's limits: ${problems.join("; ")}`
    : got;
}

/**
 * Runs the host's `hostname` in the UTS namespace of the container's init, and nothing
 * else of it (not its mount namespace: no file of the container is used). The namespace
 * is opened first and the pid checked to be in the container's cgroup after: a pid the
 * container's init no longer holds (the container died, the pid was reused) is refused,
 * and the opened namespace cannot change under us (nsenter enters it through fd 3).
 */
async function enterUtsHostname(pid: number, containerId: string, name: string): Promise<string | null> {
  const ns = await open(`/proc/${pid}/ns/uts`, "r").catch(() => null);
  if (!ns) return "the container's namespace cannot be opened here (needs root on the engine's host)";
  try {
    const cgroups = await readFile(`/proc/${pid}/cgroup`, "utf8").catch(() => "");
    if (!cgroups.includes(containerId)) return "the container's process is not where the engine said";
    const child = spawn("nsenter", ["--uts=/proc/self/fd/3", "--", "hostname", name], {
      stdio: ["ignore", "ignore", "pipe", ns.fd],
    });
    let err = "";
    child.stderr?.on("data", (d: Buffer) => {
      err += d.toString();
    });
    const code = await new Promise<number | null>((resolve) => {
      child.once("error", (e) => {
        err += e.message;
        resolve(null);
      });
      child.once("close", resolve);
    });
    return code === 0 ? null : `setting the hostname failed: ${err.trim().slice(0, 200)}`;
  } finally {
    await ns.close();
  }
}

/**
 * Sets the hostname in the container's UTS namespace (enterUtsHostname) and in the
 * engine's /etc/hostname file of the container. Why it failed, or null.
 */
async function setHostname(
  c: Docker.ContainerInspectInfo,
  name: string,
  spare: SandboxSpec,
): Promise<string | null> {
  const pid = c.State.Pid;
  if (!Number.isInteger(pid) || pid <= 0) return "the spare's container has no process";
  const entered = await enterUtsHostname(pid, c.Id, name);
  if (entered) return entered;
  const file = (c as { HostnamePath?: string }).HostnamePath;
  if (!file) return "the engine names no /etc/hostname file";
  // In place (the file is bound into the container by its inode). With a disk limit the
  // container's /etc/hostname is its own, on /workspace's image (disk-limit.ts etcBinds).
  const own = join(slotPaths(spare.dir, "a").disk.mount, "etc", "hostname");
  const files = spare.limits.disk_mib !== undefined ? [file, own] : [file];
  for (const f of files) {
    const failed = await writeFile(f, `${name}\n`).then(
      () => null,
      (err: Error) => `writing the container's /etc/hostname failed: ${err.message}`,
    );
    if (failed) return failed;
  }
  return null;
}

/** The spare's container given the workspace's limits and hostname: its inspection, or why not. */
async function identify(
  c: Docker.Container,
  spare: SandboxSpec,
  spec: SandboxSpec,
): Promise<Docker.ContainerInspectInfo | string> {
  const seen = await ignoreGone(c.inspect(deadline()));
  if (!seen?.State.Running || seen.State.Paused || seen.Config.Labels?.[LABELS.dir] !== spare.dir)
    return "the spare's container is gone";
  const got = await applyLimits(c, spare, spec);
  if (typeof got === "string") return got;
  return (await setHostname(got, sandboxHostname(spec.workspace_id), spare)) ?? got;
}

/**
 * Hands the spare to `spec`'s workspace (see the top of this file). Returns the state to
 * record, or `declined` with why (the pool then ends the spare, whose record names its
 * container either way). A failure while the workspace's files move throws (the create is
 * rolled back), as bwrap's does.
 */
export async function adoptDockerSpare(
  docker: Docker,
  spare: SandboxSpec,
  state: DockerState,
  spec: SandboxSpec,
): Promise<DockerState | { declined: string }> {
  const why = await unfit(spec);
  if (why) return { declined: why };
  const c = docker.getContainer(state.container_id);
  // Its root layer is committed at its next start, measured first against the disk limit
  // (commit-size.ts), which knows the btrfs and overlay2 layouts only.
  const inspected = spec.limits.disk_mib !== undefined ? await ignoreGone(c.inspect(deadline())) : undefined;
  if (inspected && inspected.Driver !== "btrfs" && inspected.Driver !== "overlay2")
    return {
      declined: `the commit of a ${inspected.Driver} layer cannot be measured against the disk limit`,
    };
  const got = await identify(c, spare, spec).catch((err: Error) => `the engine failed: ${err.message}`);
  if (typeof got === "string") return { declined: got };
  // From here on the spare's record names the container and volume by what they keep.
  const adopted = { container_id: got.Id, volume: slotVolume(spare.workspace_id, "a"), label_dir: spare.dir };
  const record: EngineRecord = { endpoint: state.endpoint, slot: "a", adopted };
  const name = containerName(spec.workspace_id);
  try {
    await atomicWriteFile(join(spare.dir, RECORD), JSON.stringify(record), 0o600);
    await c.rename({ name, ...deadline() });
  } catch (err) {
    return {
      declined: `the spare's container could not take the workspace's name: ${(err as Error).message}`,
    };
  }
  // The workspace's own files move from here on: a failure is the create's (rollback).
  await rename(join(spare.snapshotsDir, spare.snapshot), join(spare.dir, SPARE_LOWER));
  await takeOverDir(spare.snapshotsDir, spec.snapshotsDir);
  if (spare.netDir && spec.netDir) await takeOverDir(spare.netDir, spec.netDir);
  try {
    await rename(spare.dir, spec.dir);
    const after = await ignoreGone(c.inspect(deadline()));
    if (!after?.State.Running || after.State.Pid !== got.State.Pid)
      throw new Error("the spare's container stopped during the hand-out");
  } catch (err) {
    await ignoreGone(c.remove({ force: true, ...deadline() }), [409]).catch(() => {});
    await removeVolume(docker, adopted.volume, adopted.label_dir).catch(() => {});
    // Back to an empty sandbox directory for the workspace's own start (its snapshots and
    // net directories are in place: the spare's inodes hold their contents).
    await removeTree(spec.dir).catch(() => {});
    await mkdir(spec.dir, { recursive: true, mode: 0o700 });
    return { declined: (err as Error).message };
  }
  const sock = slotPaths(spec.dir, "a", spec.limits.disk_mib !== undefined).sock;
  return { ...state, container: name, slot: "a", sock_dir: sock, socket: join(sock, AGENT_SOCKET) };
}

/**
 * Replaces an adopted container that is not running (see the top of this file): its root
 * layer committed (when it is still there), the workspace's own slot-a container and
 * volume created on that image (not started), the spare's container, volume and lower
 * layer removed. Each step is recorded before the next, so a process that dies on the way
 * leaves a record the next call finishes from. Returns the record to go on with.
 */
export async function settleAdopted(
  docker: Docker,
  spec: SandboxSpec,
  record: EngineRecord,
): Promise<EngineRecord> {
  const a = record.adopted;
  if (!a) return record;
  const write = (r: EngineRecord) => atomicWriteFile(join(spec.dir, RECORD), JSON.stringify(r), 0o600);
  const c = await ignoreGone(docker.getContainer(a.container_id).inspect(deadline()));
  let next: EngineRecord = { ...record, slot: "a" };
  if (c && c.Config.Labels?.[LABELS.dir] === a.label_dir) {
    await killContainer(docker, c.Id);
    const image = rootImageOf(spec.workspace_id);
    // An image the engine committed for a call that gave up waiting (or a process that
    // died) is this stopped container's layer: taken, not committed again (the first
    // would be left untagged, its size on the engine's disk until a prune).
    const committed = await ignoreGone(
      docker.getImage(image).inspect(deadline() as Docker.ImageInspectOptions),
    );
    if (committed?.Config?.Labels?.[LABELS.dir] !== spec.dir) {
      // The commit writes changed files whole: a sparse one past the limit is refused first.
      if (spec.limits.disk_mib !== undefined) await checkCommitSize(docker, c, spec.limits.disk_mib);
      const [repo, tag] = image.split(":") as [string, string];
      await docker.getContainer(c.Id).commit({
        repo,
        tag,
        changes: [`LABEL ${LABELS.dir}=${JSON.stringify(spec.dir)}`],
        // Copies the whole layer (up to the disk limit): 3 GiB took over 30 s here.
        ...deadline(COMMIT_MS),
      });
    }
    next = { ...next, root_image: image };
    await write(next);
    await ignoreGone(docker.getContainer(c.Id).remove({ force: true, ...deadline() }), [409]);
  }
  await removeVolume(docker, a.volume, a.label_dir);
  const { adopted: _, ...settled } = next;
  await write(settled);
  await removeTree(join(spec.dir, SPARE_LOWER)).catch(() => {});
  const parts = await containerParts(docker, settled.endpoint, spec, "a", containerName(spec.workspace_id), {
    ...(settled.root_image ? { image: settled.root_image } : {}),
  });
  await createContainer(docker, parts.body, parts.volume);
  return settled;
}

/** Removes what an adopted spare left (its container, by id, and volume), checking their label. */
export async function removeAdopted(docker: Docker, a: NonNullable<EngineRecord["adopted"]>): Promise<void> {
  const c = await ignoreGone(docker.getContainer(a.container_id).inspect(deadline()));
  if (c && c.Config.Labels?.[LABELS.dir] === a.label_dir)
    await ignoreGone(docker.getContainer(c.Id).remove({ force: true, ...deadline() }), [409]);
  await removeVolume(docker, a.volume, a.label_dir);
}

/** Removes a workspace's committed root layer, if it is the workspace's (by its label). */
export async function removeRootImage(docker: Docker, spec: SandboxSpec): Promise<void> {
  const ref = rootImageOf(spec.workspace_id);
  const i = await ignoreGone(docker.getImage(ref).inspect(deadline() as Docker.ImageInspectOptions));
  if (i && i.Config?.Labels?.[LABELS.dir] === spec.dir)
    await ignoreGone(docker.getImage(ref).remove({ ...deadline() }), [409]);
}
