import { closeSync, openSync } from "node:fs";
import { mkdir, rm } from "node:fs/promises";
import { join } from "node:path";
import type { Duplex } from "node:stream";
import { PyroError } from "../../errors.js";
import { exists } from "../../util/fs.js";
import { removeTree } from "../../util/mounts.js";
import type { OneShotResult, OneShotSpec, SandboxSpec, SandboxState, WorkspaceBackend } from "../backend.js";
import { connectSandboxSocket, killAndWait, sameProcessAlive, waitForSocket } from "../common.js";
import { DEFAULT_DISK_MIB, ensureDiskImage } from "../disk-image.js";
import { spawnGatedDetached } from "../gated-run.js";
import { prepareNodeRuntime } from "../runtime.js";
import { CgroupLimits, detectCgroups } from "./cgroups.js";
import { detectLaunchTools, isolationArgs, type LaunchTools, launchArgv } from "./launch.js";
import { bwrapRunOnce } from "./oneshot.js";
import { writeSeccompFile } from "./seccomp.js";

/** Mount points inside the sandbox. */
export const IN_SANDBOX = {
  workspace: "/workspace",
  runtime: "/run/pyro/runtime",
  app: "/run/pyro/app",
  snapshots: "/run/pyro/snapshots",
  sock: "/run/pyro/sock",
} as const;

interface Layout {
  /** The disk image holding the writable layers (absent in a legacy layout). */
  disk: string;
  diskMount: string;
  rootUpper: string;
  rootWork: string;
  rootMerged: string;
  wsUpper: string;
  wsWork: string;
  wsMerged: string;
  sock: string;
  logs: string;
}

/**
 * Paths of a workspace's sandbox. The writable layers live in the disk image, mounted at
 * `mnt/disk` inside the launch step's mount namespace only. A workspace made before disk
 * limits keeps its layers in host directories (`root/`, `ws/`) until its next reset.
 */
async function layout(dir: string): Promise<Layout & { legacy: boolean }> {
  const legacy = (await exists(join(dir, "root", "upper"))) && !(await exists(join(dir, "disk.img")));
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
    sock: join(dir, "sock"),
    logs: join(dir, "logs"),
  };
}

/**
 * The bubblewrap backend: Linux namespaces (mount, pid, ipc, uts, net, cgroup), all
 * capabilities dropped, a seccomp filter, cgroup limits, and a copy-on-write root per
 * workspace. Needs root (overlay mounts, cgroups).
 */
export class BwrapBackend implements WorkspaceBackend {
  readonly name = "bwrap" as const;
  readonly executionMode = "guest_agent" as const;

  private tools: Promise<LaunchTools> | undefined;

  private launchTools(): Promise<LaunchTools> {
    this.tools ??= detectLaunchTools();
    return this.tools;
  }

  async runOnce(spec: OneShotSpec): Promise<OneShotResult> {
    return bwrapRunOnce(spec, await this.launchTools());
  }

  agentRoot(): string {
    return IN_SANDBOX.workspace;
  }

  agentSnapshotPath(_spec: SandboxSpec, name: string): string {
    return `${IN_SANDBOX.snapshots}/${name}`;
  }

  /** The bwrap argv (without the launch wrapper), separate so tests can pin it. */
  bwrapArgv(spec: SandboxSpec, l: Layout, runtimeDir: string, agentArgv: string[]): string[] {
    return [
      "bwrap",
      // Binds come first: /proc and /dev from isolationArgs must land on the new root.
      "--bind",
      l.rootMerged,
      "/",
      "--bind",
      l.wsMerged,
      IN_SANDBOX.workspace,
      ...isolationArgs(`pyro-${spec.workspace_id.replace(/^ws_/, "").slice(0, 12)}`),
      "--ro-bind",
      runtimeDir,
      IN_SANDBOX.runtime,
      "--ro-bind",
      spec.appDir,
      IN_SANDBOX.app,
      "--ro-bind",
      spec.snapshotsDir,
      IN_SANDBOX.snapshots,
      "--bind",
      l.sock,
      IN_SANDBOX.sock,
      "--chdir",
      IN_SANDBOX.workspace,
      "--",
      ...agentArgv,
    ];
  }

  async start(spec: SandboxSpec, options: { signal?: AbortSignal } = {}): Promise<SandboxState> {
    if (process.getuid?.() !== 0) {
      throw new PyroError(
        "backend_unavailable",
        "the bwrap backend needs root here (overlay mounts and cgroups)",
        "run as root, or choose another backend",
      );
    }
    const l = await layout(spec.dir);
    const layers = [l.rootUpper, l.rootWork, l.wsUpper, l.wsWork];
    for (const d of [...(l.legacy ? layers : [l.diskMount]), l.rootMerged, l.wsMerged, l.sock, l.logs]) {
      await mkdir(d, { recursive: true, mode: 0o700 });
    }
    if (!l.legacy) await ensureDiskImage(l.disk, spec.limits.disk_mib ?? DEFAULT_DISK_MIB);
    const runtime = await prepareNodeRuntime(spec.runtimeCacheDir);
    const socket = join(l.sock, "agent.sock");
    await rm(socket, { force: true });
    const agentArgv = runtime.argv(
      IN_SANDBOX.runtime,
      `${IN_SANDBOX.app}/dist/agent/guest/main.js`,
      "--root",
      IN_SANDBOX.workspace,
      "--listen",
      `${IN_SANDBOX.sock}/agent.sock`,
      "--idle-commands",
    );
    const seccompFile = join(spec.dir, "seccomp.bpf");
    await writeSeccompFile(seccompFile);

    // A sandbox of this workspace that no record points to (its starter was killed
    // between starting it and recording it) still holds the cgroup: end it first.
    const cgLayout = await detectCgroups();
    await (await CgroupLimits.attach(cgLayout, spec.workspace_id))?.destroy();
    // Limits first: fail closed before anything runs if they cannot be applied.
    const cgroups = await CgroupLimits.create(cgLayout, spec.workspace_id, {
      vcpus: spec.limits.vcpus,
      memoryMib: spec.limits.memory_mib,
      pidsMax: spec.limits.pids_max,
    }).catch((err: Error) => {
      throw new PyroError(
        "backend_unavailable",
        `cannot apply resource limits: ${err.message}`,
        "pyro refuses to run without limits",
      );
    });

    const logFile = join(l.logs, "sandbox.log");
    const argv = launchArgv(
      [
        { lower: spec.rootfs, upper: l.rootUpper, work: l.rootWork, target: l.rootMerged },
        {
          lower: join(spec.snapshotsDir, spec.snapshot),
          upper: l.wsUpper,
          work: l.wsWork,
          target: l.wsMerged,
        },
      ],
      this.bwrapArgv(spec, l, runtime.dir, agentArgv),
      await this.launchTools(),
      {
        cappedLog: true,
        ...(l.legacy ? {} : { disk: { image: l.disk, mount: l.diskMount, mkdirs: layers } }),
      },
    );
    const fd = openSync(seccompFile, "r");
    let started: { pid: number; startTime: string };
    try {
      started = await spawnGatedDetached(argv, { logFile, cgroups, extraFds: [fd] });
    } finally {
      closeSync(fd);
    }
    const { pid, startTime } = started;
    const state: SandboxState = {
      backend: "bwrap",
      pid,
      start_time: startTime,
      socket,
      log: logFile,
      cgroup: spec.workspace_id,
    };
    try {
      await waitForSocket(socket, () => sameProcessAlive(pid, startTime), {
        timeoutMs: 20_000,
        logFile,
        what: "bwrap sandbox",
        ...(options.signal ? { signal: options.signal } : {}),
      });
    } catch (err) {
      await this.stop(state);
      throw err;
    }
    return state;
  }

  connect(state: SandboxState, options: { timeoutMs?: number } = {}): Promise<Duplex> {
    return connectSandboxSocket(String(state.socket), options.timeoutMs ?? 5000);
  }

  isRunning(state: SandboxState): Promise<boolean> {
    return sameProcessAlive(state.pid, state.start_time);
  }

  /** Kills every process of the sandbox (through its cgroup) and waits for them. */
  async stop(state: SandboxState): Promise<void> {
    const cg = await CgroupLimits.attach(await detectCgroups(), String(state.cgroup));
    if (cg) await cg.destroy();
    if (typeof state.pid === "number" && typeof state.start_time === "string")
      await killAndWait(state.pid, state.start_time);
  }

  async discardChanges(spec: SandboxSpec): Promise<void> {
    for (const d of ["root", "ws"]) await removeTree(join(spec.dir, d));
    await rm(join(spec.dir, "disk.img"), { force: true });
  }

  async destroy(spec: SandboxSpec, state: SandboxState | null): Promise<void> {
    if (state) await this.stop(state);
    else {
      const cg = await CgroupLimits.attach(await detectCgroups(), spec.workspace_id);
      if (cg) await cg.destroy();
    }
    await removeTree(spec.dir);
  }
}
