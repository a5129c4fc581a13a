import { randomBytes } from "node:crypto";
import { join } from "node:path";
import type { Duplex } from "node:stream";
import type Docker from "dockerode";
import { PyroError } from "../../errors.js";
import { agentApp } from "../agent-app.js";
import type { SandboxSpec } from "../backend.js";
import { agentArgv } from "../guest.js";
import { prepareNodeRuntime } from "../runtime.js";
import { CALL_MS, deadline, engineError, ignoreGone, withTimeout } from "./client.js";
import {
  type ContainerBody,
  containerEnv,
  type HostConfigBody,
  hostConfig,
  hostnameFor,
  IN_CONTAINER,
  type InspectedHostConfig,
  LABELS,
  type MountBody,
  unappliedSettings,
  workspaceUser,
} from "./container.js";
import { remountSlotDisk } from "./disk-limit.js";
import { ensureImage } from "./image.js";
import { type Slot, slotPaths, slotVolume } from "./standby.js";
import { ExecChannel } from "./stream.js";

/** Label of a disk reader's container: the workspace it reads. */
export const DISK_LABEL = "dev.pyro.disk";

/**
 * The disk reader of a stopped docker workspace (WorkspaceBackend.openDisk), through the
 * engine only (never its data directory, which may be elsewhere): a throwaway container
 * with the workspace's isolation and limits, a read-only root, no network, and the
 * workspace's /workspace volume mounted read-only (or, when its changes were discarded
 * and the volume is gone, the snapshot tree). Its only process is a read-only agent on
 * the attach's stdio. Closing the channel removes the container (AutoRemove too: an
 * agent whose stdin closes exits, so a caller that dies leaves nothing).
 */
export async function openDockerDisk(
  docker: Docker,
  endpoint: string,
  spec: SandboxSpec,
  slot: Slot = "a",
): Promise<Duplex> {
  // The /workspace volume of the workspace's current slot (standby.ts), and its disk
  // image (with a disk limit) mounted again after a reboot.
  const volume = slotVolume(spec.workspace_id, slot);
  await remountSlotDisk(slotPaths(spec.dir, slot).disk);
  const image = await ensureImage(docker, endpoint, spec.rootfs, {});
  const runtime = await prepareNodeRuntime(spec.runtimeCacheDir);
  let container: Docker.Container | undefined;
  try {
    const vol = await ignoreGone(docker.getVolume(volume).inspect(deadline()));
    const workspace: MountBody =
      vol && vol.Labels?.[LABELS.dir] === spec.dir
        ? {
            Type: "volume",
            Source: volume,
            Target: IN_CONTAINER.workspace,
            ReadOnly: true,
            VolumeOptions: { NoCopy: true },
          }
        : {
            Type: "bind",
            Source: join(spec.snapshotsDir, spec.snapshot),
            Target: IN_CONTAINER.workspace,
            ReadOnly: true,
          };
    const body = diskReaderBody(
      spec,
      image,
      { runtime: runtime.dir, app: await agentApp(spec) },
      workspace,
      agentArgv(runtime, IN_CONTAINER, IN_CONTAINER.workspace, { stdio: true }, { readOnly: true }),
    );
    container = await docker.createContainer({ ...body, ...deadline() } as Docker.ContainerCreateOptions);
    const inspected = await container.inspect(deadline());
    const problems = unappliedSettings(
      { ...body.HostConfig, ReadonlyRootfs: false },
      inspected.HostConfig as InspectedHostConfig,
    );
    if (problems.length > 0)
      throw new PyroError(
        "backend_unavailable",
        `the Docker engine did not apply pyro's isolation: ${problems.join("; ")}`,
        "pyro refuses to run without its limits",
      );
    const attached = container.attach({
      stream: true,
      stdin: true,
      stdout: true,
      stderr: true,
      hijack: true,
    });
    const conn = (await withTimeout(attached, CALL_MS, (late) => (late as Duplex).destroy())) as Duplex;
    await container.start(deadline());
    const channel = new ExecChannel(conn);
    const c = container;
    channel.once("close", () => {
      void ignoreGone(c.remove({ force: true, ...deadline() })).catch(() => {});
    });
    return channel;
  } catch (err) {
    if (container) await ignoreGone(container.remove({ force: true, ...deadline() })).catch(() => {});
    throw engineError(err, `reading the disk of ${spec.workspace_id}`, endpoint);
  }
}

/** A workspace container's body, but with a read-only root and removed when it exits. */
export type ReaderBody = Omit<ContainerBody, "HostConfig"> & {
  HostConfig: Omit<HostConfigBody, "ReadonlyRootfs"> & { ReadonlyRootfs: true; AutoRemove: true };
};

/** The reader container's body (pure, so a test can pin it). */
export function diskReaderBody(
  spec: SandboxSpec,
  image: string,
  dirs: { runtime: string; app: string },
  workspace: MountBody,
  cmd: string[],
): ReaderBody {
  const ids = process.getuid && process.getgid ? { uid: process.getuid(), gid: process.getgid() } : null;
  const host = hostConfig(spec.limits, [
    { Type: "bind", Source: dirs.runtime, Target: IN_CONTAINER.runtime, ReadOnly: true },
    { Type: "bind", Source: dirs.app, Target: IN_CONTAINER.app, ReadOnly: true },
    workspace,
  ]);
  return {
    name: `pyro-${spec.workspace_id}-disk-${randomBytes(4).toString("hex")}`,
    Image: image,
    Cmd: cmd,
    Env: containerEnv(),
    WorkingDir: IN_CONTAINER.workspace,
    User: workspaceUser(ids),
    Hostname: hostnameFor(spec.workspace_id),
    Labels: { [DISK_LABEL]: spec.workspace_id },
    AttachStdin: true,
    AttachStdout: true,
    AttachStderr: true,
    OpenStdin: true,
    StdinOnce: true,
    Tty: false,
    // A read-only root: the reader writes nothing anywhere.
    HostConfig: { ...host, ReadonlyRootfs: true, AutoRemove: true },
  };
}
