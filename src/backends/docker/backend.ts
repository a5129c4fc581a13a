import { mkdir } from "node:fs/promises";
import { join } from "node:path";
import type { Duplex } from "node:stream";
import type Docker from "dockerode";
import type { AgentClient } from "../../agent/client.js";
import { PyroError } from "../../errors.js";
import { atomicWriteFile } from "../../util/fs.js";
import { removeTree } from "../../util/mounts.js";
import type { OneShotResult, OneShotSpec, SandboxSpec, SandboxState, WorkspaceBackend } from "../backend.js";
import { connectForwardIn, connectSandboxSocket, waitForSocket } from "../common.js";
import { AGENT_SOCKET } from "../guest.js";
import { CALL_MS, deadline, EngineClients, engineError, ignoreGone } from "./client.js";
import { containerName, IN_CONTAINER, LABELS } from "./container.js";
import {
  AGENT_READY_MS,
  asDockerState,
  awaitAgent,
  type ContainerParts,
  containerParts,
  createContainer,
  type DockerState,
  type EngineRecord,
  execAgent,
  killContainer,
  RECORD,
  readRecord,
  reusable,
} from "./container-start.js";
import { openDockerDisk } from "./disk.js";
import { diskSupport } from "./disk-limit.js";
import { imageRef } from "./image.js";
import { dockerRunOnce } from "./oneshot.js";
import { adoptDockerSpare, removeAdopted, removeRootImage, SPARE_LOWER, settleAdopted } from "./pool.js";
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
import type { ExecChannel } from "./stream.js";

export { idleCommand } from "./container-start.js";

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

  /** Null when workspaces here get a disk limit; otherwise why not (docker/disk-limit.ts). */
  async diskLimitSupport(): Promise<{ message: string; hint: string } | null> {
    const endpoint = this.clients.defaultEndpoint();
    const s = await diskSupport(await this.clients.get(endpoint), endpoint);
    return s.ok ? null : s;
  }

  async runOnce(spec: OneShotSpec): Promise<OneShotResult> {
    const endpoint = this.clients.defaultEndpoint();
    return dockerRunOnce(await this.clients.get(endpoint), endpoint, spec);
  }

  async start(spec: SandboxSpec, options: { signal?: AbortSignal } = {}): Promise<SandboxState> {
    let record = await readRecord(spec.dir);
    const endpoint = record?.endpoint ?? this.clients.defaultEndpoint();
    const slot = record?.slot ?? "a";
    await mkdir(spec.dir, { recursive: true, mode: 0o700 });
    await atomicWriteFile(
      join(spec.dir, RECORD),
      JSON.stringify({ ...record, endpoint, slot } satisfies EngineRecord),
      0o600,
    );
    const docker = await this.clients.get(endpoint);
    const base = containerName(spec.workspace_id);
    // A pool's spare container cannot start again: replaced first (pool.ts).
    if (record?.adopted) record = await settleAdopted(docker, spec, record);
    // The other slot's container (a standby, or an old container a hand-out left paused in
    // a process that ended): not this start's to keep.
    if (record) await this.dropStandby(docker, base, otherSlot(slot)).catch(() => {});
    const image = slot === "a" ? record?.root_image : undefined;
    const parts = await containerParts(docker, endpoint, spec, slot, slotName(base, slot), {
      ...options,
      ...(image ? { image } : {}),
    });
    // A workspace never started before (no record) has no container to keep: no lookups.
    const state = await this.launch(docker, endpoint, spec, parts, record !== null, options);
    if (this.wantStandby.delete(base))
      await this.scheduleStandby(spec, state, parts.image, slot).catch(() => {});
    return state;
  }

  /**
   * Creates (or, with `reuse`, finds the kept) container, starts it and waits for its
   * agent. A start that fails stops the container again.
   */
  private async launch(
    docker: Docker,
    endpoint: string,
    spec: SandboxSpec,
    p: ContainerParts,
    reuse: boolean,
    options: { signal?: AbortSignal },
  ): Promise<DockerState> {
    let id: string;
    try {
      id =
        (reuse ? await reusable(docker, p.body, p.volume) : null) ??
        (await createContainer(docker, p.body, p.volume));
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
      const channel = (await this.connect(state, { timeoutMs: AGENT_READY_MS })) as ExecChannel;
      await awaitAgent(channel, state.container, options.signal);
    } catch (err) {
      await killContainer(docker, id).catch(() => {});
      throw err;
    }
    return state;
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

  async connect(state: SandboxState, options: { timeoutMs?: number } = {}): Promise<Duplex> {
    const s = asDockerState(state);
    const timeoutMs = options.timeoutMs ?? 5000;
    // The container's own agent, on its socket (see start); an older container: an exec.
    if (s.socket) return connectSandboxSocket(s.socket, timeoutMs);
    return execAgent(await this.clients.get(s.endpoint), s, timeoutMs);
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
    let record = await readRecord(spec.dir);
    const endpoint = record?.endpoint ?? this.clients.defaultEndpoint();
    // A pool's spare container's volume names the spare's paths: replaced first (pool.ts).
    if (record?.adopted) record = await settleAdopted(await this.clients.get(endpoint), spec, record);
    return openDockerDisk(await this.clients.get(endpoint), endpoint, spec, record?.slot);
  }

  /** Removes the containers (their root layers) and the /workspace volumes and upper layers. */
  async discardChanges(spec: SandboxSpec): Promise<void> {
    await this.removeEngineObjects(spec, null);
    for (const slot of ["a", "b"] as const) await removeTree(slotPaths(spec.dir, slot).ws);
    // An adopted spare's root layer and lower layer (pool.ts) are discarded with the rest.
    await removeTree(join(spec.dir, SPARE_LOWER));
    const r = await readRecord(spec.dir);
    if (r?.adopted || r?.root_image)
      await atomicWriteFile(
        join(spec.dir, RECORD),
        JSON.stringify({ endpoint: r.endpoint, slot: r.slot }),
        0o600,
      );
  }

  async destroy(spec: SandboxSpec, state: SandboxState | null): Promise<void> {
    await this.removeEngineObjects(spec, state);
    await removeTree(spec.dir);
  }

  /** Removes both slots' containers and volumes, checking by label that they are ours. */
  private async removeEngineObjects(spec: SandboxSpec, state: SandboxState | null): Promise<void> {
    const record = await readRecord(spec.dir);
    const recorded = typeof state?.endpoint === "string" ? state.endpoint : record?.endpoint;
    // Never started on an engine: nothing there to remove.
    if (!recorded) return;
    const docker = await this.clients.get(recorded);
    const base = containerName(spec.workspace_id);
    try {
      await this.standbys.drop(base);
      await this.standbys.cleanedUp(base);
      // A pool's spare this workspace was handed (pool.ts) first: it may hold a slot's volume.
      if (record?.adopted) await removeAdopted(docker, record.adopted);
      // The two slots side by side (each a chain of engine calls).
      await Promise.all(
        (["a", "b"] as const).map(async (slot) => {
          const c = await ignoreGone(docker.getContainer(slotName(base, slot)).inspect(deadline()));
          if (c && c.Config.Labels?.[LABELS.dir] === spec.dir)
            await ignoreGone(docker.getContainer(c.Id).remove({ force: true, ...deadline() }), [409]);
          await removeVolume(docker, slotVolume(spec.workspace_id, slot), spec.dir);
        }),
      );
      await removeRootImage(docker, spec);
    } catch (err) {
      throw engineError(err, `removing the container of ${spec.workspace_id}`, recorded);
    }
  }

  /** Hands a started spare container to `spec`'s workspace (pool.ts). */
  async adoptSpare(spare: SandboxSpec, state: SandboxState, spec: SandboxSpec) {
    const s = asDockerState(state);
    return adoptDockerSpare(await this.clients.get(s.endpoint), spare, s, spec);
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
    const parts = await containerParts(docker, endpoint, spec, slot, slotName(base, slot), {});
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
