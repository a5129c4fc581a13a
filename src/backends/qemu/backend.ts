import { mkdir, rm } from "node:fs/promises";
import { join } from "node:path";
import type { Duplex } from "node:stream";
import { setTimeout as sleep } from "node:timers/promises";
import { z } from "zod";
import { AgentClient } from "../../agent/client.js";
import { PyroError } from "../../errors.js";
import { exists, touch } from "../../util/fs.js";
import { removeTree } from "../../util/mounts.js";
import { firstLine, run, which } from "../../util/run.js";
import type { SandboxSpec, SandboxState, WorkspaceBackend } from "../backend.js";
import { connectUnix, killAndWait, logTail, sameProcessAlive, terminateAndWait } from "../common.js";
import { DEFAULT_DISK_MIB } from "../disk-image.js";
import { sandboxHostname } from "../guest.js";
import { type KvmCheck, kvmCheck } from "../kvm.js";
import { stateReader } from "../sandbox-state.js";
import { type PrepareOptions, prepareVmArtifacts, vmCacheDir } from "../vm/artifacts.js";
import { qcow2Overlay, seedImage, standaloneQcow2 } from "../vm/disks.js";
import { MicroVmBackend } from "../vm/snapshots.js";
import type { VmArtifacts } from "../vm/types.js";
import { consoleRead, killRecorded, spawnQemu, watchBoot } from "./boot.js";
import { type Accel, netSocket, qemuArgv, qmpSocket } from "./machine.js";
import { connectPort } from "./ports.js";
import { QmpClient, tailLines } from "./qmp.js";
import { guestReady } from "./setup-port.js";
import { blankStateDisk, ensureTemplate, freshStateDisk } from "./template.js";

/** Host paths of one workspace's VM, all under `spec.dir`. */
export function qemuLayout(dir: string) {
  return {
    stateDisk: join(dir, "state.qcow2"),
    /** Copy of the template's state disk the state disk is an overlay of. */
    baseDisk: join(dir, "base.qcow2"),
    /**
     * An empty overlay of baseDisk, never opened: a reset's new state disk is a copy of it
     * (a qemu-img process and a copy of the base cost 40-90 ms of each reset).
     */
    freshDisk: join(dir, "state-fresh.qcow2"),
    /** Which template build baseDisk was copied from (templateIdentity), written last. */
    baseId: join(dir, "base.id"),
    sockets: join(dir, "s"),
    log: join(dir, "qemu.log"),
    /** `<pid> <start time>` of the VM's QEMU, written as soon as it is spawned. */
    pidFile: join(dir, "qemu.pid"),
  };
}

export interface QemuRuntime {
  qemu: string;
  version: string;
  accel: Accel;
  /** Why KVM is not used, when it is not. */
  why: string | null;
}

export interface QemuBackendOptions {
  /** Never restore from a template: every start is a cold boot (benchmarks, debugging). */
  coldBoot?: boolean;
  /** Progress lines for slow first-time work (kernel download, disk images, template). */
  onProgress?: (line: string) => void;
  probeTimeoutMs?: number;
  /** The KVM verdict to use (the engine's); default: a check of its own in process.env. */
  kvm?: KvmCheck;
  /** Builds the vsock bridge put on the agent disk (shared with Firecracker guests). */
  vsockBridge?: PrepareOptions["vsockBridge"];
  /**
   * A restored VM's setup only after its agent answered, not beside it (benchmarks: the
   * restore-to-agent floor without the setup's guest work competing for the vCPU).
   */
  setupAfterHandshake?: boolean;
}

/** Timeline of the last start (from QEMU's spawn), for benchmarks. */
export interface StartTiming {
  mode: "restore" | "cold";
  /** The restored VM was running (restore) / QEMU was spawned (cold). */
  running_ms: number;
  /** The agent finished its handshake. */
  answered_ms: number;
  /** The setup (clock, entropy, hostname, /workspace): its port's round trip, or vm_setup in the guest. */
  setup_ms: number;
  /** The helper's port, in parallel with the agent's handshake (a restore), or the agent's vm_setup. */
  setup_via: "port" | "agent";
  /** The agent set the clock and entropy and mounted /workspace. */
  ready_ms: number;
  template_built_ms: number | null;
}

/** What a QEMU sandbox records: its process, its socket directory and its workspace directory. */
const QEMU_STATE = stateReader("qemu", {
  pid: z.number().int().positive(),
  start_time: z.string(),
  sockets: z.string().min(1),
  dir: z.string().min(1),
});

/**
 * The qemu backend: each workspace is a microVM (`-M microvm`) running the Debian cloud
 * kernel, with the environment as a read-only disk under an overlay whose upper layer is
 * on the workspace's own qcow2 state disk, and the agent reached over virtio-serial.
 * Hardware virtualisation (KVM) when a probe guest actually runs on it, TCG otherwise
 * (opt-in only, contract §2).
 *
 * Starting: a workspace with a fresh state disk is restored from its shape's template
 * (a VM booted once and saved paused; see template.ts), then the agent gets the host's
 * clock and entropy and mounts /workspace over the seed disk. A workspace whose state
 * disk holds writes (stopped, or its QEMU died) cold-boots on that disk: restoring the
 * template's memory over a disk that has diverged would corrupt it.
 */
export class QemuBackend extends MicroVmBackend implements WorkspaceBackend {
  readonly name = "qemu" as const;
  readonly executionMode = "guest_agent" as const;

  private accel: Promise<QemuRuntime> | undefined;
  private readonly artifactCache = new Map<string, Promise<VmArtifacts>>();
  lastStart: StartTiming | null = null;

  private readonly kvm: KvmCheck;

  constructor(private readonly options: QemuBackendOptions = {}) {
    super();
    this.kvm = options.kvm ?? kvmCheck(process.env, options.probeTimeoutMs);
  }

  /** QEMU's path, version and the accelerator: KVM only when a probe guest actually ran on it. */
  runtime(): Promise<QemuRuntime> {
    this.accel ??= (async () => {
      const qemu = await which("qemu-system-x86_64");
      if (!qemu)
        throw new PyroError(
          "backend_unavailable",
          "qemu-system-x86_64 is not installed",
          "install the Debian package qemu-system-x86 (npm run setup)",
        );
      const version = firstLine((await run([qemu, "--version"], { timeoutMs: 10_000 })).stdout);
      const kvm = await this.kvm();
      return { qemu, version, accel: kvm.usable ? "kvm" : "tcg", why: kvm.reason };
    })();
    this.accel.catch(() => {
      this.accel = undefined;
    });
    return this.accel;
  }

  /** The VM's kernel and disks; checked once per environment per process (hashing the agent costs ~0.5 s). */
  private artifacts(spec: SandboxSpec, sig: { signal?: AbortSignal }): Promise<VmArtifacts> {
    const key = `${spec.rootfs}\0${spec.appDir}\0${spec.runtimeCacheDir}`;
    let p = this.artifactCache.get(key);
    if (!p) {
      p = prepareVmArtifacts(spec, {
        ...sig,
        ...(this.options.onProgress ? { onProgress: this.options.onProgress } : {}),
        ...(this.options.vsockBridge ? { vsockBridge: this.options.vsockBridge } : {}),
      });
      this.artifactCache.set(key, p);
      p.catch(() => this.artifactCache.delete(key));
    }
    return p;
  }

  async start(spec: SandboxSpec, options: { signal?: AbortSignal } = {}): Promise<SandboxState> {
    const { qemu, version, accel } = await this.runtime();
    const sig = options.signal ? { signal: options.signal } : {};
    const artifacts = await this.artifacts(spec, sig);
    const l = qemuLayout(spec.dir);
    await mkdir(spec.dir, { recursive: true, mode: 0o700 });
    // A QEMU left by a process that died in the middle of a start would hold the state
    // disk's write lock: end it first.
    await killRecorded(l.pidFile);
    await rm(l.sockets, { recursive: true, force: true });
    await mkdir(l.sockets, { mode: 0o700 });
    const seedDisk = await seedImage(spec, spec.snapshot, options.signal);
    const { incoming, templateBuilt } = await this.stateDisk(
      spec,
      l,
      { qemu, version, accel, artifacts },
      sig,
    );

    const argv = qemuArgv({
      qemu,
      accel,
      vcpus: spec.limits.vcpus,
      memoryMib: spec.limits.memory_mib,
      artifacts,
      stateDisk: l.stateDisk,
      seedDisk,
      socketDir: l.sockets,
      ...(incoming ? { incomingFd: 3 } : {}),
    });
    const started = performance.now();
    const { pid, startTime } = await spawnQemu(argv, l, incoming);
    const state: SandboxState = {
      backend: "qemu",
      pid,
      start_time: startTime ?? "",
      dir: spec.dir,
      sockets: l.sockets,
      accel,
      log: l.log,
      kernel: artifacts.image.kernelRelease,
      restored: Boolean(incoming),
    };
    // What the console printed while the boot was watched (reading the ring consumes it).
    const boot = { text: "" };
    try {
      if (!startTime)
        throw new PyroError("backend_unavailable", `QEMU exited at once: ${await logTail(l.log)}`);
      // QMP answering means QEMU has created every socket (cold boots too).
      await this.resume(l.sockets, pid, startTime, l.log, Boolean(incoming));
      const running = Math.round(performance.now() - started);
      // The shared disks this VM opened are in use: keep them from idle clean-up.
      await touch(artifacts.agentDisk);
      const setup = await watchBoot(
        guestReady(() => this.connectChecked(state, 10_000), {
          sockets: l.sockets,
          viaPort: Boolean(incoming) && artifacts.setupHelper === true,
          sequential: this.options.setupAfterHandshake === true,
          timeoutMs: incoming ? 60_000 : 300_000,
          hostname: sandboxHostname(spec.workspace_id),
          ...sig,
        }),
        { sockets: l.sockets, pid, startTime, log: l.log, console: boot },
      );
      this.lastStart = {
        mode: incoming ? "restore" : "cold",
        running_ms: running,
        answered_ms: running + setup.answered_ms,
        setup_ms: setup.setup_ms,
        setup_via: setup.via,
        ready_ms: Math.round(performance.now() - started),
        template_built_ms: templateBuilt,
      };
    } catch (err) {
      throw await this.failedStart(err, state, l, boot.text);
    }
    return state;
  }

  /** Ends a VM that did not start and says why, with the console's and QEMU's last words. */
  private async failedStart(
    err: unknown,
    state: SandboxState,
    l: ReturnType<typeof qemuLayout>,
    consoleSoFar: string,
  ): Promise<unknown> {
    const consoleText = tailLines(`${consoleSoFar}${await consoleRead(l.sockets)}`);
    await this.stop(state);
    // The cached artifacts may be what failed (a disk removed under us): check them again next time.
    this.artifactCache.clear();
    if (err instanceof PyroError && err.code !== "backend_unavailable" && err.code !== "timeout") return err;
    const why = err instanceof Error ? err.message : String(err);
    return new PyroError(
      "backend_unavailable",
      `the VM did not start: ${why} (console: ${consoleText}; qemu: ${await logTail(l.log)})`,
    );
  }

  /**
   * The workspace's state disk. A fresh one comes from the template of the VM's shape (a
   * private copy of its few-MB disk, and its saved state to restore: `incoming`), or is
   * blank with coldBoot; one that holds writes is kept as it is (a cold boot follows).
   */
  private async stateDisk(
    spec: SandboxSpec,
    l: ReturnType<typeof qemuLayout>,
    vm: { qemu: string; version: string; accel: Accel; artifacts: VmArtifacts },
    sig: { signal?: AbortSignal },
  ): Promise<{ incoming: string | undefined; templateBuilt: number | null }> {
    if (await exists(l.stateDisk)) return { incoming: undefined, templateBuilt: null };
    const diskMib = spec.limits.disk_mib ?? DEFAULT_DISK_MIB;
    if (this.options.coldBoot) {
      await rm(l.baseId, { force: true });
      await standaloneQcow2(await blankStateDisk(vmCacheDir(spec), diskMib), "raw", l.baseDisk);
      await qcow2Overlay(l.stateDisk, l.baseDisk, "qcow2");
      return { incoming: undefined, templateBuilt: null };
    }
    const template = await ensureTemplate({
      qemu: vm.qemu,
      qemuVersion: vm.version,
      accel: vm.accel,
      vcpus: spec.limits.vcpus,
      memoryMib: spec.limits.memory_mib,
      diskMib,
      artifacts: vm.artifacts,
      cacheDir: vmCacheDir(spec),
      ...sig,
      ...(this.options.onProgress ? { onProgress: this.options.onProgress } : {}),
    });
    await freshStateDisk(l, template.stateDisk);
    return { incoming: template.vmState, templateBuilt: template.built_ms };
  }

  /** Waits until QEMU answers on QMP; a restored VM: until its state is loaded, then lets it run. */
  private async resume(
    sockets: string,
    pid: number,
    startTime: string,
    log: string,
    incoming: boolean,
  ): Promise<void> {
    const qmp = await QmpClient.connect(qmpSocket(sockets), 30_000);
    try {
      if (!incoming) return;
      const deadline = Date.now() + 120_000;
      for (;;) {
        if (!(await sameProcessAlive(pid, startTime)))
          throw new PyroError("backend_unavailable", `QEMU exited while restoring: ${await logTail(log)}`);
        const status = await qmp.status();
        if (status === "running") return;
        if (status !== "inmigrate") break;
        if (Date.now() > deadline) throw new PyroError("timeout", "restoring the VM state took over 120 s");
        await sleep(5);
      }
      await qmp.execute("cont");
    } finally {
      qmp.close();
    }
  }

  connect(state: SandboxState, options: { timeoutMs?: number } = {}): Promise<Duplex> {
    return this.connectChecked(state, options.timeoutMs ?? 5000);
  }

  private async connectChecked(state: SandboxState, timeoutMs: number): Promise<Duplex> {
    const s = QEMU_STATE.read(state);
    if (!(await sameProcessAlive(s.pid, s.start_time)))
      throw new PyroError(
        "workspace_stopped",
        "the workspace's VM is not running",
        "start the workspace again",
      );
    return connectPort(s.sockets, timeoutMs);
  }

  /** The network mux's channel (agent/netmux.ts): QEMU's socket for the VM's network port. */
  async connectNet(state: SandboxState, options: { timeoutMs?: number } = {}): Promise<Duplex> {
    const s = QEMU_STATE.read(state);
    if (!(await sameProcessAlive(s.pid, s.start_time)))
      throw new PyroError("workspace_stopped", "the VM is not running");
    return connectUnix(netSocket(s.sockets), options.timeoutMs ?? 5000);
  }

  async isRunning(state: SandboxState): Promise<boolean> {
    const s = QEMU_STATE.readPartial(state);
    return sameProcessAlive(s.pid, s.start_time);
  }

  /**
   * Flushes the guest's filesystems (best effort: the agent may be the thing that hung),
   * then ends QEMU: SIGTERM first (it closes its disks cleanly), SIGKILL if it lingers.
   * The state disk stays. `discarding` (a reset or a delete: the state disk goes next):
   * SIGKILL at once, nothing flushed; a reset spent 0.2-0.5 s on the sync and the SIGTERM.
   */
  async stop(state: SandboxState, options: { discarding?: boolean } = {}): Promise<void> {
    const { pid, start_time: startTime, sockets, dir } = QEMU_STATE.readPartial(state);
    if (pid !== undefined && startTime !== undefined && (await sameProcessAlive(pid, startTime))) {
      if (options.discarding) {
        await killAndWait(pid, startTime);
      } else {
        if (sockets) await this.syncGuest(sockets).catch(() => {});
        await terminateAndWait(pid, startTime, 5000);
      }
    }
    // Retried: once ENOTEMPTY right after a discarding stop (cause not found).
    if (sockets) await rm(sockets, { recursive: true, force: true, maxRetries: 5 });
    if (dir) await rm(qemuLayout(dir).pidFile, { force: true });
  }

  private async syncGuest(sockets: string): Promise<void> {
    const client = await AgentClient.connect(await connectPort(sockets, 2000), {
      timeoutMs: 5000,
    });
    try {
      await client.request("vm_sync", {}, { timeoutMs: 10_000 });
    } finally {
      await client.close();
    }
  }

  protected stateDiskFile(spec: SandboxSpec) {
    return { path: qemuLayout(spec.dir).stateDisk, format: "qcow2" as const };
  }

  /**
   * Removes the state disk. Its base and the fresh overlay stay: QEMU opens a backing file
   * read-only and never opens the fresh overlay, so both are as the template made them,
   * and the next start copies the overlay when the template is still the same build.
   */
  async discardChanges(spec: SandboxSpec): Promise<void> {
    await rm(qemuLayout(spec.dir).stateDisk, { force: true });
  }

  async destroy(spec: SandboxSpec, state: SandboxState | null): Promise<void> {
    if (state) await this.stop(state, { discarding: true });
    await killRecorded(qemuLayout(spec.dir).pidFile);
    await removeTree(spec.dir);
  }
}
