import { mkdir, readFile, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import type { Duplex } from "node:stream";
import type Docker from "dockerode";
import { AgentClient } from "../../agent/client.js";
import { PyroError } from "../../errors.js";
import { atomicWriteFile } from "../../util/fs.js";
import { removeTree } from "../../util/mounts.js";
import type { OneShotResult, OneShotSpec, SandboxSpec, SandboxState, WorkspaceBackend } from "../backend.js";
import { connectForwardIn, connectSandboxSocket, waitForSocket } from "../common.js";
import { AGENT_SOCKET, agentArgv, guestNet } from "../guest.js";
import { prepareNodeRuntime } from "../runtime.js";
import {
  CALL_MS,
  deadline,
  EngineClients,
  engineError,
  ignoreGone,
  statusOf,
  withTimeout,
} from "./client.js";
import {
  type ContainerBody,
  containerName,
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
import { openDockerDisk } from "./disk.js";
import { ensureImage, imageRef } from "./image.js";
import { dockerRunOnce } from "./oneshot.js";
import {
  baseName,
  otherSlot,
  removeVolume,
  retire,
  type Slot,
  StandbyTable,
  slotName,
  slotPaths,
  slotVolume,
  standbyKey,
} from "./standby.js";
import { ExecChannel } from "./stream.js";

/** The engine a workspace lives on, kept in its directory so any later process finds it. */
const RECORD = "docker.json";
const AGENT_READY_MS = 20_000;

interface EngineRecord {
  endpoint: string;
  /** The slot of the workspace's container (standby.ts); absent: "a". */
  slot?: Slot;
}

interface DockerState extends SandboxState {
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

function asDockerState(state: SandboxState): DockerState {
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

/**
 * The docker backend: one container per workspace on a Docker-compatible engine (the
 * Docker Engine API, also served by Podman). The environment is imported as an image
 * from the cached rootfs (no registry); the container has no network but loopback,
 * no capabilities, no_new_privs, memory/CPU/pids limits, and an init that reaps. The
 * root filesystem is the container's writable layer; /workspace is an overlay volume
 * (snapshot tree + per-workspace upper directory) that the engine mounts. The agent is
 * started per connection with `docker exec` and speaks over the exec's stdio.
 * Opt-in only (`--backend docker`).
 */
export class DockerBackend implements WorkspaceBackend {
  readonly name = "docker" as const;
  readonly executionMode = "guest_agent" as const;
  private readonly clients: EngineClients;
  /** Standbys this process makes or holds (standby.ts), by the workspace's container name. */
  private readonly standbys = new StandbyTable<DockerState>();
  /** Workspaces whose next start is followed by a standby: this process reset them. */
  private readonly wantStandby = new Set<string>();

  constructor(env: NodeJS.ProcessEnv = process.env) {
    this.clients = new EngineClients(env);
  }

  agentRoot(): string {
    return IN_CONTAINER.workspace;
  }

  agentSnapshotPath(_spec: SandboxSpec, name: string): string {
    return `${IN_CONTAINER.snapshots}/${name}`;
  }

  async runOnce(spec: OneShotSpec): Promise<OneShotResult> {
    const endpoint = this.clients.defaultEndpoint();
    return dockerRunOnce(await this.clients.get(endpoint), endpoint, spec);
  }

  async start(spec: SandboxSpec, options: { signal?: AbortSignal } = {}): Promise<SandboxState> {
    const record = await readRecord(spec.dir);
    const endpoint = record?.endpoint ?? this.clients.defaultEndpoint();
    const slot = record?.slot ?? "a";
    await mkdir(spec.dir, { recursive: true, mode: 0o700 });
    await atomicWriteFile(
      join(spec.dir, RECORD),
      JSON.stringify({ endpoint, slot } satisfies EngineRecord),
      0o600,
    );
    const docker = await this.clients.get(endpoint);
    const base = containerName(spec.workspace_id);
    // The other slot's container (a standby, or an old container a hand-out left paused in
    // a process that ended): not this start's to keep.
    if (record) await this.dropStandby(docker, base, otherSlot(slot)).catch(() => {});
    const parts = await this.containerParts(docker, endpoint, spec, slot, slotName(base, slot), options);
    // A workspace never started before (no record) has no container to keep: no lookups.
    const state = await this.launch(docker, endpoint, spec, parts, record !== null, options);
    if (this.wantStandby.delete(base))
      await this.scheduleStandby(spec, state, parts.image, slot).catch(() => {});
    return state;
  }

  /** The bodies of a container of `spec` in `slot`, its directories made and its sockets gone. */
  private async containerParts(
    docker: Docker,
    endpoint: string,
    spec: SandboxSpec,
    slot: Slot,
    name: string,
    options: { signal?: AbortSignal },
  ) {
    const l = slotPaths(spec.dir, slot);
    const runtime = await prepareNodeRuntime(spec.runtimeCacheDir);
    const image = await ensureImage(docker, endpoint, spec.rootfs, options);
    // The socket directory is the container's /run/pyro/sock: nothing a command left there
    // outlives the container's start (a reset's restart kept it before).
    await rm(l.sock, { recursive: true, force: true });
    for (const d of [l.upper, l.work, l.sock]) await mkdir(d, { recursive: true, mode: 0o700 });
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
      upper: l.upper,
      work: l.work,
      labels: { [LABELS.workspace]: spec.workspace_id, [LABELS.dir]: spec.dir },
    });
    const ids = process.getuid && process.getgid ? { uid: process.getuid(), gid: process.getgid() } : null;
    const body = workspaceContainerBody({
      spec,
      image,
      runtimeDir: runtime.dir,
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
    });
    return { body, volume, image, slot, sock: l.sock, argvOfAgent };
  }

  /**
   * Creates (or, with `reuse`, finds the kept) container, starts it and waits for its
   * agent. A start that fails stops the container again.
   */
  private async launch(
    docker: Docker,
    endpoint: string,
    spec: SandboxSpec,
    p: Awaited<ReturnType<DockerBackend["containerParts"]>>,
    reuse: boolean,
    options: { signal?: AbortSignal },
  ): Promise<DockerState> {
    let id: string;
    try {
      id =
        (reuse ? await this.reusable(docker, p.body, p.volume) : null) ??
        (await this.createContainer(docker, p.body, p.volume));
      await ignoreGone(docker.getContainer(id).start(deadline(CALL_MS, options.signal)), [304]);
    } catch (err) {
      throw engineError(err, `starting the container of ${spec.workspace_id}`, endpoint);
    }
    const state: DockerState = {
      backend: "docker",
      endpoint,
      container_id: id,
      container: p.body.name,
      slot: p.slot,
      agent_argv: p.argvOfAgent,
      ...(spec.netDir ? { sock_dir: p.sock, socket: join(p.sock, AGENT_SOCKET) } : {}),
    };
    try {
      if (state.sock_dir)
        await waitForSocket(join(state.sock_dir, AGENT_SOCKET), () => this.isRunning(state), {
          timeoutMs: AGENT_READY_MS,
          what: `the agent of container ${p.body.name}`,
          ...(options.signal ? { signal: options.signal } : {}),
        });
      await this.awaitAgent(state, options.signal);
    } catch (err) {
      await killContainer(docker, id).catch(() => {});
      throw err;
    }
    return state;
  }

  /**
   * The kept container of a stopped workspace, if it is ours and still what `body` asks
   * for (image, user, mounts, limits) with /workspace on the same snapshot. A container
   * that differs (pyro or node upgraded, a volume removed by hand) is removed, to be
   * recreated: its root layer is lost, /workspace's upper directory is kept.
   */
  private async reusable(docker: Docker, body: ContainerBody, volume: VolumeBody): Promise<string | null> {
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
    if (same) return c.Id;
    await ignoreGone(docker.getContainer(c.Id).remove({ force: true, ...deadline() }));
    return null;
  }

  private async createContainer(docker: Docker, body: ContainerBody, volume: VolumeBody): Promise<string> {
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

  connectPort(state: SandboxState, port: number, options: { timeoutMs?: number } = {}): Promise<Duplex> {
    const s = asDockerState(state);
    if (!s.sock_dir)
      throw new PyroError(
        "backend_unavailable",
        `container ${s.container} was started without a network helper`,
        "stop and start the workspace",
      );
    return connectForwardIn(s.sock_dir, port, options.timeoutMs ?? 5000);
  }

  /** Proves the agent runs in the container: one handshake over a fresh exec channel. */
  private async awaitAgent(state: DockerState, signal?: AbortSignal): Promise<void> {
    const channel = (await this.connect(state, { timeoutMs: AGENT_READY_MS })) as ExecChannel;
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
        `the guest agent did not start in container ${state.container}: ${stderr || (err as Error).message}`,
      );
    }
  }

  async connect(state: SandboxState, options: { timeoutMs?: number } = {}): Promise<Duplex> {
    const s = asDockerState(state);
    const timeoutMs = options.timeoutMs ?? 5000;
    // The container's own agent, on its socket (see start); an older container: an exec.
    if (s.socket) return connectSandboxSocket(s.socket, timeoutMs);
    const docker = await this.clients.get(s.endpoint);
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

  async isRunning(state: SandboxState): Promise<boolean> {
    const s = asDockerState(state);
    // Recorded by the core while a reset hands over (backend.ts): a process that died then
    // left a sandbox the next use starts again (from the record's slot).
    if (s.in_place_reset === true) return false;
    try {
      const c = await ignoreGone(
        (await this.clients.get(s.endpoint)).getContainer(s.container_id).inspect(deadline()),
      );
      return c?.State.Running === true && !c.State.Paused && !c.State.Restarting;
    } catch (err) {
      // Not knowing is not "dead": restarting would kill the workspace's processes.
      throw engineError(err, `inspecting container ${s.container}`, s.endpoint);
    }
  }

  /**
   * Kills every process of the container; the container (its root layer) and /workspace
   * stay. A standby of the workspace is removed (a stopped workspace keeps none).
   */
  async stop(state: SandboxState): Promise<void> {
    const s = asDockerState(state);
    const docker = await this.clients.get(s.endpoint);
    const slot = s.slot ?? "a";
    try {
      await Promise.all([
        killContainer(docker, s.container_id),
        this.dropStandby(docker, baseName(s.container, slot), otherSlot(slot)),
      ]);
    } catch (err) {
      throw engineError(err, `stopping container ${s.container}`, s.endpoint);
    }
  }

  /** A stopped workspace's files, read by a throwaway read-only container (disk.ts). */
  async openDisk(spec: SandboxSpec): Promise<Duplex> {
    const record = await readRecord(spec.dir);
    const endpoint = record?.endpoint ?? this.clients.defaultEndpoint();
    return openDockerDisk(
      await this.clients.get(endpoint),
      endpoint,
      spec,
      slotVolume(spec.workspace_id, record?.slot ?? "a"),
    );
  }

  /** Removes the containers (their root layers) and the /workspace volumes and upper layers. */
  async discardChanges(spec: SandboxSpec): Promise<void> {
    await this.removeEngineObjects(spec, null);
    for (const slot of ["a", "b"] as const) await removeTree(slotPaths(spec.dir, slot).ws);
  }

  async destroy(spec: SandboxSpec, state: SandboxState | null): Promise<void> {
    await this.removeEngineObjects(spec, state);
    await removeTree(spec.dir);
  }

  /** Removes both slots' containers and volumes, checking by label that they are ours. */
  private async removeEngineObjects(spec: SandboxSpec, state: SandboxState | null): Promise<void> {
    const recorded =
      typeof state?.endpoint === "string" ? state.endpoint : (await readRecord(spec.dir))?.endpoint;
    // Never started on an engine: nothing there to remove.
    if (!recorded) return;
    const docker = await this.clients.get(recorded);
    const base = containerName(spec.workspace_id);
    try {
      await this.standbys.drop(base);
      await this.standbys.cleanedUp(base);
      // The two slots side by side (each a chain of engine calls).
      await Promise.all(
        (["a", "b"] as const).map(async (slot) => {
          const c = await ignoreGone(docker.getContainer(slotName(base, slot)).inspect(deadline()));
          if (c && c.Config.Labels?.[LABELS.dir] === spec.dir)
            await ignoreGone(docker.getContainer(c.Id).remove({ force: true, ...deadline() }), [409]);
          await removeVolume(docker, slotVolume(spec.workspace_id, slot), spec.dir);
        }),
      );
    } catch (err) {
      throw engineError(err, `removing the container of ${spec.workspace_id}`, recorded);
    }
  }

  /** Ends this process's standby of the workspace and removes the container in `slot`. */
  private async dropStandby(docker: Docker, base: string, slot: Slot): Promise<void> {
    await this.standbys.drop(base);
    await ignoreGone(docker.getContainer(slotName(base, slot)).remove({ force: true, ...deadline() }), [409]);
  }

  /** After STANDBY_DELAY_MS (standby.ts), a standby for the next reset of `spec`'s workspace. */
  private async scheduleStandby(spec: SandboxSpec, current: DockerState, image: string, slot: Slot) {
    if (!spec.netDir) return;
    const next = otherSlot(slot);
    const key = await standbyKey(spec, image);
    this.standbys.schedule(containerName(spec.workspace_id), key, next, (entry) =>
      this.makeStandby(spec, current.endpoint, next, () => entry.cancelled),
    );
  }

  /**
   * Starts a standby in `slot`: what is left there removed first (the old container of the
   * last hand-out, its volume and directories), then a container as a restart would start
   * it. A cancel while it started removes it again.
   */
  private async makeStandby(
    spec: SandboxSpec,
    endpoint: string,
    slot: Slot,
    cancelled: () => boolean,
  ): Promise<DockerState | null> {
    const docker = await this.clients.get(endpoint);
    const base = containerName(spec.workspace_id);
    await this.standbys.cleanedUp(base);
    await ignoreGone(docker.getContainer(slotName(base, slot)).remove({ force: true, ...deadline() }), [409]);
    await removeVolume(docker, slotVolume(spec.workspace_id, slot), spec.dir);
    const l = slotPaths(spec.dir, slot);
    await removeTree(l.ws);
    if (cancelled()) return null;
    const parts = await this.containerParts(docker, endpoint, spec, slot, slotName(base, slot), {});
    const state = await this.launch(docker, endpoint, spec, parts, false, {});
    if (cancelled()) {
      await ignoreGone(docker.getContainer(state.container_id).remove({ force: true, ...deadline() }), [409]);
      return null;
    }
    return state;
  }

  /**
   * A reset that hands the workspace over to its standby (standby.ts): the old container
   * paused, then removed with its volume and layer after the answer. Null (the caller
   * restarts) without a standby made for exactly this reset; the restart is then followed
   * by one.
   */
  async resetInPlace(
    spec: SandboxSpec,
    state: SandboxState,
    agent: AgentClient,
  ): Promise<SandboxState | null> {
    const s = asDockerState(state);
    const base = containerName(spec.workspace_id);
    const entry = this.standbys.take(base);
    const record = await readRecord(spec.dir);
    const docker = await this.clients.get(s.endpoint);
    const fits =
      entry &&
      record &&
      record.endpoint === s.endpoint &&
      (s.slot ?? "a") === (record.slot ?? "a") &&
      entry.slot === otherSlot(record.slot ?? "a") &&
      entry.key === (await standbyKey(spec, await imageRef(spec.rootfs)));
    // A standby being started is waited for (it is ready sooner than a restart would be).
    const standby = fits ? await entry.start() : null;
    if (!fits || !standby || !record) {
      if (entry && !fits) {
        entry.cancelled = true;
        if (entry.timer) clearTimeout(entry.timer);
        const made = await entry.promise;
        if (made)
          await ignoreGone(
            docker.getContainer(made.container_id).remove({ force: true, ...deadline() }),
            [409],
          );
      }
      this.wantStandby.add(base);
      return null;
    }
    // The record first, on disk before the old container is touched: from here on a
    // restart, or a start after this process died, starts in the standby's slot and
    // removes the old slot's container (paused or not). Before it, the old container runs
    // on untouched and the reset simply did not happen.
    const [c] = await Promise.all([
      ignoreGone(docker.getContainer(standby.container_id).inspect(deadline())),
      atomicWriteFile(
        join(spec.dir, RECORD),
        JSON.stringify({ endpoint: s.endpoint, slot: entry.slot } satisfies EngineRecord),
        0o600,
      ),
    ]);
    if (!c?.State.Running || c.Name !== `/${standby.container}`) return null;
    await retire(docker, s.container_id);
    agent.close();
    // The old slot's container, volume and layer go after the answer; the next standby,
    // which takes that slot, waits for it (and removes whatever a process that died left).
    const old = s.slot ?? "a";
    this.standbys.cleanup(
      base,
      ignoreGone(docker.getContainer(s.container_id).remove({ force: true, ...deadline() }), [409])
        .then(() => removeVolume(docker, slotVolume(spec.workspace_id, old), spec.dir))
        .then(() => removeTree(slotPaths(spec.dir, old).ws)),
    );
    await this.scheduleStandby(spec, standby, c.Config.Image, entry.slot).catch(() => {});
    return standby;
  }
}

/** Kills every process of a container and waits until the engine has it stopped. */
async function killContainer(docker: Docker, id: string): Promise<void> {
  const c = docker.getContainer(id);
  await ignoreGone(c.kill({ signal: "SIGKILL", ...deadline() }), [409]);
  await ignoreGone(c.wait({ condition: "not-running", ...deadline() }));
}

async function readRecord(dir: string): Promise<EngineRecord | null> {
  try {
    const r = JSON.parse(await readFile(join(dir, RECORD), "utf8")) as Partial<EngineRecord>;
    if (typeof r.endpoint !== "string") return null;
    return { endpoint: r.endpoint, slot: r.slot === "b" ? "b" : "a" };
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
