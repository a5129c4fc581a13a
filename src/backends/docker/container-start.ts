/**
 * The parts of a docker workspace's container that need none of the backend's own state
 * (backend.ts keeps the lifecycle and the standbys): its recorded state and engine
 * record, the bodies of its container and /workspace volume, finding a kept container
 * or creating one with pyro's isolation checked, and killing one.
 */
import { mkdir, readFile, stat } from "node:fs/promises";
import { join } from "node:path";
import type { Duplex } from "node:stream";
import type Docker from "dockerode";
import { AgentClient } from "../../agent/client.js";
import { PyroError } from "../../errors.js";
import { agentApp } from "../agent-app.js";
import type { SandboxSpec, SandboxState } from "../backend.js";
import { AGENT_SOCKET, agentArgv, guestNet } from "../guest.js";
import { prepareNodeRuntime } from "../runtime.js";
import { deadline, engineError, ignoreGone, statusOf, withTimeout } from "./client.js";
import {
  type ContainerBody,
  hostnameFor,
  IN_CONTAINER,
  type InspectedHostConfig,
  LABELS,
  type MountBody,
  overlayVolumeBody,
  unappliedSettings,
  type VolumeBody,
  workspaceContainerBody,
  workspaceUser,
} from "./container.js";
import { etcBinds, freshSocketDir, mountSlotDisk, requireDiskSupport, storageSize } from "./disk-limit.js";
import { ensureImage, imageRef } from "./image.js";
import { limitExclusive } from "./qgroup.js";
import { type Slot, slotPaths, slotVolume } from "./standby.js";
import { ExecChannel } from "./stream.js";

/** The engine a workspace lives on, kept in its directory so any later process finds it. */
export const RECORD = "docker.json";
export const AGENT_READY_MS = 20_000;

export interface EngineRecord {
  endpoint: string;
  /** The slot of the workspace's container (standby.ts); absent: "a". */
  slot?: Slot;
  /** The pool's spare container this workspace was handed and still runs in (pool.ts). */
  adopted?: AdoptedSpare;
  /** Slot a's image: the adopted container's root layer, committed when it was replaced (pool.ts). */
  root_image?: string;
}

/** A handed-out spare, named by what the engine knows it by (its container and volume keep the spare's labels). */
export interface AdoptedSpare {
  container_id: string;
  volume: string;
  /** The spare's sandbox directory: its container's and volume's `dev.pyro.dir` label. */
  label_dir: string;
}

export interface DockerState extends SandboxState {
  backend: "docker";
  endpoint: string;
  container_id: string;
  container: string;
  /** The container's slot (standby.ts); absent: "a". */
  slot?: Slot;
  agent_argv: string[];
  /** Host directory of the agent's and the published-port sockets (absent: an exec per connection). */
  sock_dir?: string;
  /** The agent's socket in it. */
  socket?: string;
}

export function asDockerState(state: SandboxState): DockerState {
  const s = state as Partial<DockerState>;
  if (
    typeof s.endpoint !== "string" ||
    typeof s.container_id !== "string" ||
    !Array.isArray(s.agent_argv) ||
    !s.agent_argv.every((a) => typeof a === "string")
  ) {
    throw new PyroError("internal", "the recorded docker sandbox state is incomplete");
  }
  return s as DockerState;
}

export interface ContainerOptions {
  signal?: AbortSignal;
  /** Instead of the environment's image: an adopted spare's committed root layer (pool.ts). */
  image?: string;
}

/** The bodies of a container of `spec` in `slot`, its directories made and its sockets gone. */
export async function containerParts(
  docker: Docker,
  endpoint: string,
  spec: SandboxSpec,
  slot: Slot,
  name: string,
  options: ContainerOptions,
) {
  const l = slotPaths(spec.dir, slot, spec.limits.disk_mib !== undefined);
  const runtime = await prepareNodeRuntime(spec.runtimeCacheDir);
  const image = options.image ?? (await ensureImage(docker, endpoint, spec.rootfs, options));
  // The socket directory is the container's /run/pyro/sock: nothing a command left there
  // outlives the container's start (a reset's restart kept it before).
  await freshSocketDir(l, spec.limits.disk_mib !== undefined);
  const disk = await slotDisk(docker, endpoint, spec, l, image, options.image !== undefined);
  const argvOfAgent = agentArgv(
    runtime,
    IN_CONTAINER,
    IN_CONTAINER.workspace,
    { stdio: true },
    { idleCommands: true },
  );
  const volume = overlayVolumeBody({
    name: slotVolume(spec.workspace_id, slot),
    lower: join(spec.snapshotsDir, spec.snapshot),
    upper: disk.upper,
    work: disk.work,
    labels: { [LABELS.workspace]: spec.workspace_id, [LABELS.dir]: spec.dir },
  });
  const ids = process.getuid && process.getgid ? { uid: process.getuid(), gid: process.getgid() } : null;
  const body = workspaceContainerBody({
    spec,
    image,
    runtimeDir: runtime.dir,
    appDir: await agentApp(spec),
    // The agent is the container's main process where the container has a socket
    // directory (every workspace container now): one agent for the container's life,
    // reached through its socket like bwrap's (warm connections, and processes such as
    // the network's forwarders that outlive a connection). Without one, an idle command,
    // and an agent per connection over `docker exec`.
    mainCmd: spec.netDir
      ? agentArgv(
          runtime,
          IN_CONTAINER,
          IN_CONTAINER.workspace,
          { listen: `${IN_CONTAINER.sock}/${AGENT_SOCKET}` },
          { idleCommands: true, net: guestNet(IN_CONTAINER) },
        )
      : await idleCommand(
          spec.rootfs,
          runtime.argv(IN_CONTAINER.runtime, "-e", "setInterval(() => {}, 1 << 30)"),
        ),
    user: workspaceUser(ids),
    sockDir: l.sock,
    name,
    volume: volume.Name,
    ...(disk.storageSize ? { storageSize: disk.storageSize } : {}),
    ...(disk.exclusive ? { exclusive: true } : {}),
    ...(disk.binds ? { binds: disk.binds } : {}),
  });
  return { body, volume, image, slot, sock: l.sock, argvOfAgent };
}

/**
 * /workspace's upper and work directories, and the root layer's size limit: without a
 * disk limit, plain directories in the slot's directory; with one, on the slot's disk
 * image (docker/disk-limit.ts). `committed`: the image is an adopted spare's committed
 * root layer, whose writes count against the limit (the environment's image is measured).
 */
async function slotDisk(
  docker: Docker,
  endpoint: string,
  spec: SandboxSpec,
  l: ReturnType<typeof slotPaths>,
  image: string,
  committed: boolean,
): Promise<{ upper: string; work: string; storageSize?: string; binds?: MountBody[]; exclusive?: boolean }> {
  const mib = spec.limits.disk_mib;
  if (mib === undefined) {
    for (const d of [l.upper, l.work]) await mkdir(d, { recursive: true, mode: 0o700 });
    return { upper: l.upper, work: l.work };
  }
  const support = await requireDiskSupport(docker, endpoint);
  const dirs = await mountSlotDisk(l.disk, mib, spec);
  const base = committed ? await imageRef(spec.rootfs) : undefined;
  return {
    ...dirs,
    storageSize: await storageSize(docker, support, image, mib, base),
    binds: await etcBinds(l.disk.mount, hostnameFor(spec.workspace_id)),
    // Full qgroups count the image's files: the exclusive limit must hold too (qgroup.ts).
    exclusive: support.countsImage,
  };
}

/** What {@link containerParts} returns. */
export type ContainerParts = Awaited<ReturnType<typeof containerParts>>;

/**
 * The kept container of a stopped workspace, if it is ours and still what `body` asks
 * for (image, user, mounts, limits) with /workspace on the same snapshot, stopped. A container
 * that differs (pyro or node upgraded, a volume removed by hand) is removed, to be
 * recreated: its root layer is lost, /workspace's upper directory is kept.
 */
export async function reusable(
  docker: Docker,
  body: ContainerBody,
  volume: VolumeBody,
): Promise<string | null> {
  const c = await ignoreGone(docker.getContainer(body.name).inspect(deadline()));
  if (!c) return null;
  if (c.Config.Labels?.[LABELS.dir] !== body.Labels[LABELS.dir]) {
    throw new PyroError(
      "conflict",
      `a container named ${body.name} exists but does not belong to this workspace`,
      "remove it (docker rm -f) if it is a leftover",
    );
  }
  const v = await ignoreGone(docker.getVolume(volume.Name).inspect(deadline()));
  const mounts = (list: { Source?: string; Target?: string; Destination?: string }[] | undefined | null) =>
    JSON.stringify((list ?? []).map((m) => [m.Source, m.Target ?? m.Destination]));
  const same =
    (c.Config.Image === body.Image || c.Config.Image.endsWith(`/${body.Image}`)) &&
    c.Config.User === body.User &&
    JSON.stringify(c.Config.Cmd) === JSON.stringify(body.Cmd) &&
    v?.Options?.o === volume.DriverOpts.o &&
    mounts((c.HostConfig as { Mounts?: MountBody[] }).Mounts) === mounts(body.HostConfig.Mounts) &&
    unappliedSettings(body.HostConfig, c.HostConfig as InspectedHostConfig).length === 0;
  if (!same) {
    await ignoreGone(docker.getContainer(c.Id).remove({ force: true, ...deadline() }));
    return null;
  }
  // Running while its workspace is recorded stopped: a starter killed after the engine
  // started it. Its agent listens in the socket directory this start just remade, so it
  // is unreachable: stopped here, and started again with the new directory bound.
  if (c.State.Running || c.State.Paused) await killContainer(docker, c.Id);
  return c.Id;
}

export async function createContainer(
  docker: Docker,
  body: ContainerBody,
  volume: VolumeBody,
): Promise<string> {
  const existing = await ignoreGone(docker.getVolume(volume.Name).inspect(deadline()));
  if (existing && existing.Options?.o !== volume.DriverOpts.o) {
    await docker.getVolume(volume.Name).remove(deadline());
  }
  if (!existing || existing.Options?.o !== volume.DriverOpts.o) {
    await docker.createVolume({ ...volume, ...deadline() } as Docker.VolumeCreateOptions);
  }
  const created = await docker.createContainer({ ...body, ...deadline() } as Docker.ContainerCreateOptions);
  const inspected = await created.inspect(deadline());
  const problems = unappliedSettings(body.HostConfig, inspected.HostConfig as InspectedHostConfig);
  // On btrfs the limit also on what a command writes, not only on what the layer references (qgroup.ts).
  const mib = Number(body.Labels[LABELS.diskMib]);
  if (problems.length === 0 && mib > 0 && !(await limitExclusive(docker, inspected, mib)))
    problems.push("the disk limit's exclusive qgroup limit could not be set (btrfs qgroup limit -e)");
  if (problems.length > 0) {
    await ignoreGone(created.remove({ force: true, ...deadline() }));
    throw new PyroError(
      "backend_unavailable",
      `the Docker engine did not apply pyro's isolation: ${problems.join("; ")}`,
      "pyro refuses to run without its limits; check the engine's cgroup support (docker info)",
    );
  }
  return created.id;
}

/** Kills every process of a container and waits until the engine has it stopped. */
export async function killContainer(docker: Docker, id: string): Promise<void> {
  const c = docker.getContainer(id);
  await ignoreGone(c.kill({ signal: "SIGKILL", ...deadline() }), [409]);
  await ignoreGone(c.wait({ condition: "not-running", ...deadline() }));
}

export async function readRecord(dir: string): Promise<EngineRecord | null> {
  try {
    const r = JSON.parse(await readFile(join(dir, RECORD), "utf8")) as Partial<EngineRecord>;
    if (typeof r.endpoint !== "string") return null;
    const a = r.adopted;
    const adopted =
      a && [a.container_id, a.volume, a.label_dir].every((x) => typeof x === "string") ? a : undefined;
    return {
      endpoint: r.endpoint,
      slot: r.slot === "b" ? "b" : "a",
      ...(adopted ? { adopted } : {}),
      ...(typeof r.root_image === "string" ? { root_image: r.root_image } : {}),
    };
  } catch {
    return null;
  }
}

/**
 * What the container's main process runs: it only has to wait (Docker's init is pid 1
 * and reaps). The environment's own `sleep` when it has one (about 1 MB); otherwise the
 * injected node, idle (tens of MB, but needs nothing from the environment).
 */
export async function idleCommand(rootfs: string, nodeIdle: string[]): Promise<string[]> {
  for (const p of ["usr/bin/sleep", "bin/sleep"]) {
    const st = await stat(join(rootfs, p)).catch(() => null);
    if (st?.isFile()) return [`/${p}`, "2147483647"];
  }
  return nodeIdle;
}

/** A new channel to an agent started by `docker exec` (a container without an agent socket). */
export async function execAgent(docker: Docker, s: DockerState, timeoutMs: number): Promise<Duplex> {
  try {
    const exec = await docker.getContainer(s.container_id).exec({
      Cmd: s.agent_argv,
      AttachStdin: true,
      AttachStdout: true,
      AttachStderr: true,
      Tty: false,
      WorkingDir: IN_CONTAINER.workspace,
      ...deadline(timeoutMs),
    } as Docker.ExecCreateOptions);
    // No abortSignal here: it would stay tied to the upgraded connection and cut it later.
    const started = exec.start({ hijack: true, stdin: true, Detach: false, Tty: false });
    const conn = await withTimeout(started, timeoutMs, (late) => (late as Duplex).destroy());
    return new ExecChannel(conn as Duplex);
  } catch (err) {
    if (statusOf(err) === 409 || statusOf(err) === 404)
      throw new PyroError("backend_unavailable", `container ${s.container} is not running`);
    throw engineError(err, `connecting to the agent in ${s.container}`, s.endpoint);
  }
}

/** Proves the agent runs in the container: one handshake over a fresh exec channel. */
export async function awaitAgent(
  channel: ExecChannel,
  container: string,
  signal?: AbortSignal,
): Promise<void> {
  try {
    const client = await AgentClient.connect(channel, {
      timeoutMs: AGENT_READY_MS,
      ...(signal ? { signal } : {}),
    });
    client.close();
  } catch (err) {
    const stderr = channel.stderrText().trim().split("\n").slice(-5).join(" | ");
    throw new PyroError(
      "backend_unavailable",
      `the guest agent did not start in container ${container}: ${stderr || (err as Error).message}`,
    );
  }
}
