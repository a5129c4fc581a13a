import { chmod, mkdir, rm } from "node:fs/promises";
import { join } from "node:path";
import type { Duplex } from "node:stream";
import { z } from "zod";
import { PyroError } from "../../errors.js";
import { exists } from "../../util/fs.js";
import { removeTree } from "../../util/mounts.js";
import { firstLine, run, which } from "../../util/run.js";
import type { SandboxSpec, SandboxState, WorkspaceBackend } from "../backend.js";
import { sameProcessAlive } from "../common.js";
import { DEFAULT_DISK_MIB } from "../disk-image.js";
import { sandboxHostname } from "../guest.js";
import { processShape, stateReader } from "../sandbox-state.js";
import { type PrepareOptions, prepareVmArtifacts, vmCacheDir } from "../vm/artifacts.js";
import { blankExt4, seedImage } from "../vm/disks.js";
import { setupGuest } from "../vm/setup.js";
import { MicroVmBackend } from "../vm/snapshots.js";
import { AGENT_VSOCK_PORT, NET_VSOCK_PORT, type VmArtifacts } from "../vm/types.js";
import { prepareVsockBridge } from "./bridge.js";
import { ensureTemplate, markTemplateFailed, type TemplateFiles, templateKey } from "./template.js";
import {
  type AgentProbe,
  coldBoot,
  DRIVE_FILES,
  driveId,
  type FirecrackerSpawner,
  type GuestSync,
  helloAgent,
  killVm,
  launchVm,
  linkDrive,
  type RunningVm,
  spawnFirecracker,
  syncViaAgent,
  vmPaths,
  waitForAgent,
} from "./vm.js";
import { connectVsock } from "./vsock.js";

/** What the backend calls outside itself; tests substitute fakes. */
export interface FirecrackerDeps {
  prepareVmArtifacts: (spec: SandboxSpec, options: PrepareOptions) => Promise<VmArtifacts>;
  seedImage: (spec: SandboxSpec, name: string, signal?: AbortSignal) => Promise<string>;
  blankExt4: (path: string, sizeMib: number) => Promise<void>;
  setupGuest: (
    connect: () => Promise<Duplex>,
    options: { timeoutMs: number; hostname?: string; signal?: AbortSignal },
  ) => Promise<unknown>;
  spawn: FirecrackerSpawner;
  /** Proves the agent serves (a protocol handshake) on a fresh vsock stream. */
  probeAgent: AgentProbe;
  /** Copies a (sparse) disk image. */
  copyDisk: (from: string, to: string) => Promise<void>;
  /** Flushes the guest's page cache to its disks before a stop. */
  syncGuest: GuestSync;
}

export interface FirecrackerOptions extends Partial<FirecrackerDeps> {
  /** The firecracker binary's exact path (tests); skips the lookup. */
  bin?: string;
  /** The configured binary (PYRO_FIRECRACKER_BIN), looked up on `env`'s PATH; default `firecracker`. */
  binName?: string;
  env?: NodeJS.ProcessEnv;
  /** Start fresh workspaces from a template snapshot (default true). */
  fastStart?: boolean;
  /** Where template snapshots live; default `firecracker-templates/` in the VM artifact cache. */
  templatesDir?: string;
  /** Cold boot until the agent answers. */
  bootTimeoutMs?: number;
  /** Snapshot restore until the agent answers. */
  restoreTimeoutMs?: number;
  setupTimeoutMs?: number;
}

const BOOT_TIMEOUT_MS = 60_000;
const RESTORE_TIMEOUT_MS = 15_000;
const SETUP_TIMEOUT_MS = 30_000;
const COPY_TIMEOUT_MS = 120_000;

/** The bridge is the guest end of the vsock channel: without it the agent is unreachable. */
async function requireVsockBridge(cacheDir: string): Promise<string> {
  const r = await prepareVsockBridge(cacheDir);
  if (r.path === null)
    throw new PyroError(
      "backend_unavailable",
      `firecracker needs the guest vsock bridge: ${r.reason}`,
      "install a C compiler and a static libc (Debian: gcc, libc6-dev)",
    );
  return r.path;
}

/** `cp` keeps the holes of a sparse image (and shares blocks where the filesystem can). */
export async function copySparse(from: string, to: string): Promise<void> {
  const r = await run(["cp", "--sparse=always", "--reflink=auto", from, to], { timeoutMs: COPY_TIMEOUT_MS });
  if (r.exitCode !== 0)
    throw new PyroError(
      "internal",
      `cannot copy ${from}: ${firstLine(r.stderr) || `cp exited ${r.exitCode}`}`,
    );
  await chmod(to, 0o600);
}

/** What a Firecracker sandbox records: its process and its API and vsock sockets. */
const FIRECRACKER_STATE = stateReader("firecracker", {
  ...processShape,
  api_socket: z.string().min(1),
  vsock_socket: z.string().min(1),
});

/**
 * The Firecracker backend: each workspace is a Firecracker microVM booting the shared
 * guest image (kernel + initramfs) with four virtio disks: the environment (read-only),
 * the agent (read-only), the workspace's writable state disk (raw ext4, kept across
 * stop/start) and the seed snapshot (read-only, mounted at /workspace by the agent).
 * The host reaches the agent over vsock: Firecracker's `CONNECT <port>` handshake on its
 * unix socket, then a guest bridge forwards to the agent's unix socket.
 *
 * A fresh workspace starts from a per-environment template snapshot when it can (see
 * template.ts); a restart, or anything the template path cannot do, cold-boots.
 * Firecracker runs without the jailer, as the invoking user, with the VM directory as
 * its working directory.
 */
export class FirecrackerBackend extends MicroVmBackend implements WorkspaceBackend {
  readonly name = "firecracker" as const;
  readonly executionMode = "guest_agent" as const;

  private readonly deps: FirecrackerDeps;

  constructor(private readonly options: FirecrackerOptions = {}) {
    super();
    this.deps = {
      prepareVmArtifacts: options.prepareVmArtifacts ?? prepareVmArtifacts,
      seedImage: options.seedImage ?? seedImage,
      blankExt4: options.blankExt4 ?? blankExt4,
      setupGuest: options.setupGuest ?? setupGuest,
      spawn: options.spawn ?? spawnFirecracker,
      probeAgent: options.probeAgent ?? helloAgent,
      copyDisk: options.copyDisk ?? copySparse,
      syncGuest: options.syncGuest ?? syncViaAgent,
    };
  }

  /** The firecracker binary, or `backend_unavailable`. */
  async binary(): Promise<string> {
    if (this.options.bin) return this.options.bin;
    const env = this.options.env ?? process.env;
    const bin = await which(this.options.binName || "firecracker", env.PATH);
    if (!bin)
      throw new PyroError(
        "backend_unavailable",
        "no firecracker binary",
        "set PYRO_FIRECRACKER_BIN or put firecracker on PATH (and run `pyro doctor`)",
      );
    return bin;
  }

  async start(spec: SandboxSpec, options: { signal?: AbortSignal } = {}): Promise<SandboxState> {
    const signal = options.signal;
    const bin = await this.binary();
    const artifacts = await this.deps.prepareVmArtifacts(spec, {
      ...(signal ? { signal } : {}),
      vsockBridge: requireVsockBridge,
    });
    if (!artifacts.image.vmlinux)
      throw new PyroError(
        "backend_unavailable",
        "the guest image has no uncompressed kernel (vmlinux), which is what Firecracker boots",
        "the kernel could not be decompressed on this host (install lz4), or use the qemu backend",
      );
    await mkdir(spec.dir, { recursive: true, mode: 0o700 });
    const paths = vmPaths(spec.dir);
    await linkDrive(spec.dir, "env", artifacts.envDisk);
    await linkDrive(spec.dir, "agent", artifacts.agentDisk);
    await linkDrive(spec.dir, "seed", await this.deps.seedImage(spec, spec.snapshot, signal));

    let skipped: string | null = null;
    if (this.options.fastStart === false) skipped = "fast start disabled";
    else if (await exists(paths.state)) skipped = "the workspace has its own state disk (restart): cold boot";
    else {
      const restored = await this.startFromTemplate(spec, bin, artifacts, signal);
      if ("state" in restored) return restored.state;
      skipped = restored.reason;
    }

    if (!(await exists(paths.state)))
      await this.deps.blankExt4(paths.state, spec.limits.disk_mib ?? DEFAULT_DISK_MIB);
    const vm = await launchVm(bin, spec.dir, this.deps.spawn, signal);
    const state = this.stateOf(vm, "cold", null, skipped);
    try {
      await coldBoot(vm, artifacts, spec.limits);
      await waitForAgent(vm, this.deps.probeAgent, {
        timeoutMs: this.options.bootTimeoutMs ?? BOOT_TIMEOUT_MS,
        ...(signal ? { signal } : {}),
      });
      await this.setup(spec, state, signal);
    } catch (err) {
      await this.halt(state, false);
      throw err;
    }
    return state;
  }

  /**
   * Restores a fresh workspace from its template (building the template on first use).
   * Any failure other than cancellation leaves no process and no state disk behind and
   * returns the reason, so the caller cold-boots; a template that Firecracker refused or
   * whose restored guest did not come up is recorded as failed, so later starts skip it.
   */
  private async startFromTemplate(
    spec: SandboxSpec,
    bin: string,
    artifacts: VmArtifacts,
    signal: AbortSignal | undefined,
  ): Promise<{ state: SandboxState } | { reason: string }> {
    const root = this.options.templatesDir ?? join(vmCacheDir(spec), "firecracker-templates");
    let tpl: TemplateFiles;
    try {
      const key = await templateKey(bin, artifacts, spec.limits);
      tpl = await ensureTemplate(root, key, artifacts, spec.limits, {
        bin,
        spawn: this.deps.spawn,
        probe: this.deps.probeAgent,
        blankExt4: this.deps.blankExt4,
        bootTimeoutMs: this.options.bootTimeoutMs ?? BOOT_TIMEOUT_MS,
        ...(signal ? { signal } : {}),
      });
    } catch (err) {
      if (signal?.aborted || (err as { code?: unknown }).code === "cancelled") throw err;
      return { reason: `no template snapshot: ${(err as Error).message}` };
    }

    const paths = vmPaths(spec.dir);
    let vm: RunningVm | null = null;
    // Only what the template decides (Firecracker refusing it, a restored guest that does
    // not come up) disables the template; a full disk or a failed spawn would fail a cold
    // boot just the same.
    let blameTemplate = false;
    try {
      await this.deps.copyDisk(tpl.state, paths.state);
      vm = await launchVm(bin, spec.dir, this.deps.spawn, signal);
      blameTemplate = true;
      await vm.api.loadSnapshot({
        snapshot_path: tpl.snapshot,
        mem_backend: { backend_type: "File", backend_path: tpl.memory },
        resume_vm: false,
      });
      // Firecracker reopened seed.img (now the workspace's seed) during the load; patching
      // the drive makes it re-read the size and notify the guest, which rescans the disk
      // (a no-op for seed images padded to the placeholder's size, as they are).
      const seed = driveId("seed");
      await vm.api.patchDrive(seed, { drive_id: seed, path_on_host: DRIVE_FILES.seed });
      await vm.api.resume();
      const state = this.stateOf(vm, "snapshot", tpl.key, null);
      await waitForAgent(vm, this.deps.probeAgent, {
        timeoutMs: this.options.restoreTimeoutMs ?? RESTORE_TIMEOUT_MS,
        ...(signal ? { signal } : {}),
      });
      await this.setup(spec, state, signal);
      return { state };
    } catch (err) {
      if (vm) await this.halt(this.stateOf(vm, "snapshot", tpl.key, null), false);
      // The clone may have written to its copy; a cold boot starts from a blank disk.
      await rm(paths.state, { force: true });
      if (signal?.aborted || (err as { code?: unknown }).code === "cancelled") throw err;
      const reason = `restoring template ${tpl.key} failed: ${(err as Error).message}`;
      if (blameTemplate) await markTemplateFailed(root, tpl.key, reason);
      return { reason };
    }
  }

  private async setup(
    spec: SandboxSpec,
    state: SandboxState,
    signal: AbortSignal | undefined,
  ): Promise<void> {
    await this.deps.setupGuest(() => this.connect(state), {
      timeoutMs: this.options.setupTimeoutMs ?? SETUP_TIMEOUT_MS,
      hostname: sandboxHostname(spec.workspace_id),
      ...(signal ? { signal } : {}),
    });
  }

  private stateOf(vm: RunningVm, boot: "cold" | "snapshot", template: string | null, skipped: string | null) {
    const state: SandboxState = {
      backend: "firecracker",
      pid: vm.pid,
      start_time: vm.startTime,
      api_socket: vm.paths.apiSocket,
      vsock_socket: vm.paths.vsockSocket,
      log: vm.paths.log,
      boot,
      template,
    };
    if (skipped) state.fast_start_skipped = skipped;
    return state;
  }

  connect(state: SandboxState, options: { timeoutMs?: number } = {}): Promise<Duplex> {
    return connectVsock(FIRECRACKER_STATE.read(state).vsock_socket, AGENT_VSOCK_PORT, {
      timeoutMs: options.timeoutMs ?? 5000,
    });
  }

  /** The network mux's channel (agent/netmux.ts): guest vsock NET_VSOCK_PORT, bridged to the agent. */
  connectNet(state: SandboxState, options: { timeoutMs?: number } = {}): Promise<Duplex> {
    return connectVsock(FIRECRACKER_STATE.read(state).vsock_socket, NET_VSOCK_PORT, {
      timeoutMs: options.timeoutMs ?? 5000,
    });
  }

  isRunning(state: SandboxState): Promise<boolean> {
    const s = FIRECRACKER_STATE.readPartial(state);
    return sameProcessAlive(s.pid, s.start_time);
  }

  /**
   * Has the guest flush its page cache to the state disk (best effort, bounded), then
   * kills Firecracker (the guest dies with it) and removes its sockets; the disks stay.
   */
  stop(state: SandboxState): Promise<void> {
    return this.halt(state, true);
  }

  private async halt(state: SandboxState, sync: boolean): Promise<void> {
    const s = FIRECRACKER_STATE.readPartial(state);
    if (s.pid !== undefined && s.start_time !== undefined) {
      if (sync && (await sameProcessAlive(s.pid, s.start_time))) {
        try {
          await this.deps.syncGuest(() => this.connect(state, { timeoutMs: 2000 }));
        } catch {
          // A hung or half-dead guest: what it did not flush is lost, as on a power cut.
        }
      }
      await killVm(s.pid, s.start_time);
    }
    for (const sock of [s.api_socket, s.vsock_socket]) if (sock) await rm(sock, { force: true });
  }

  protected stateDiskFile(spec: SandboxSpec) {
    return { path: vmPaths(spec.dir).state, format: "raw" as const };
  }

  async discardChanges(spec: SandboxSpec): Promise<void> {
    await rm(vmPaths(spec.dir).state, { force: true });
  }

  async destroy(spec: SandboxSpec, state: SandboxState | null): Promise<void> {
    if (state) await this.halt(state, false);
    await removeTree(spec.dir);
  }
}
