import { mkdir, readdir, rename, rm, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import type { Duplex } from "node:stream";
import { z } from "zod";
import type { AgentClient } from "../../agent/client.js";
import { PyroError } from "../../errors.js";
import { removeTree } from "../../util/mounts.js";
import { which } from "../../util/run.js";
import { agentApp } from "../agent-app.js";
import type { OneShotResult, OneShotSpec, SandboxSpec, SandboxState, WorkspaceBackend } from "../backend.js";
import { linuxDiskView, openDiskView } from "../bwrap/disk-view.js";
import { connectSandboxSocket, sameProcessAlive, waitForSocket } from "../common.js";
import { spawnGatedDetached } from "../gated-run.js";
import { agentArgv, guestNet, sandboxHostname } from "../guest.js";
import { type KvmCheck, kvmCheck } from "../kvm.js";
import { detectCgroups, limitedCgroup } from "../linux/cgroups.js";
import { launchArgv } from "../linux/launch.js";
import {
  isLegacyLayout,
  layoutDisk,
  layoutOverlays,
  prepareLayout,
  type SandboxLayout,
  sandboxLayout,
} from "../linux/layout.js";
import { LinuxSocketBackend } from "../linux/socket-backend.js";
import { prepareNodeRuntime } from "../runtime.js";
import { socketSandboxShape, stateReader } from "../sandbox-state.js";
import { prepareHostnameHelper } from "./hostname-helper.js";
import { GVISOR_IN_SANDBOX, workspaceConfig } from "./oci.js";
import { gvisorRunOnce } from "./oneshot.js";
import { type GvisorPlatform, platformFor } from "./platform.js";
import { adoptGvisorSpare, SPARE_LOWER } from "./pool.js";
import { cgroupsPath, containerId, hostPidsMax, type RunscGlobal, runArgv, sweepCgroups } from "./runsc.js";
import { endCgroup, standbyNames, workspaceOfCgroup } from "./standby.js";
import { GvisorStandbys } from "./standby-table.js";
import { preparePreloadFile, prepareStatxShim } from "./statx-shim.js";

/** Host paths of one workspace's sandbox: the Linux sandbox layout, plus runsc's bundle and state. */
export interface GvisorLayout extends SandboxLayout {
  bundle: string;
  runscRoot: string;
}

export function gvisorLayout(dir: string, legacy = false): GvisorLayout {
  return { ...sandboxLayout(dir, legacy), bundle: join(dir, "bundle"), runscRoot: join(dir, "runsc") };
}

/** What a gVisor sandbox records: a Linux sandbox's fields and runsc's state directory and ids. */
const GVISOR_SHAPE = {
  ...socketSandboxShape,
  runsc_root: z.string().min(1),
  container_id: z.string().min(1),
  platform: z.string().min(1),
  /** Recorded by the core while a reset hands over (resetInPlace): not running for any reader. */
  in_place_reset: z.optional(z.boolean()),
};
const GVISOR_STATE = stateReader("gvisor", GVISOR_SHAPE);
type GvisorState = z.output<z.ZodObject<typeof GVISOR_SHAPE>> & SandboxState;

const START_TIMEOUT_MS = 30_000;

/**
 * The gVisor backend: each workspace is a runsc sandbox (a user-space kernel between its
 * processes and the host) with a copy-on-write root over the cached environment, no
 * network, cgroup limits, and the same guest agent as bwrap. runsc is driven directly
 * with an OCI bundle; no Docker.
 *
 * Shape of a running sandbox: a launch step mounts the two overlays in a private mount
 * namespace and becomes `runsc run` (foreground, so runsc's gofer and sandbox inherit
 * the mounts); the container's init is a shell that runs the agent and reaps orphans.
 * The agent listens on a unix socket in a host directory mounted at /run/pyro/sock;
 * with `--host-uds` that socket is a real host socket, so the host connects to it as it
 * does for bwrap (one persistent agent, warm connections in milliseconds, instead of a
 * `runsc exec` and a fresh Node per connection). Everything runs in the workspace's
 * cgroup, created and verified before anything starts (fail closed).
 */
export class GvisorBackend
  extends LinuxSocketBackend<z.output<z.ZodObject<typeof GVISOR_SHAPE>>>
  implements WorkspaceBackend
{
  readonly name = "gvisor" as const;
  readonly executionMode = "guest_agent" as const;
  protected readonly sandboxState = GVISOR_STATE;

  private runscBin: Promise<string | null> | undefined;

  /** Standbys this process makes or holds (standby.ts). */
  private readonly standbys = new GvisorStandbys<GvisorState>((spec, cg) =>
    this.launch(spec, gvisorLayout(spec.dir), cg, {}),
  );

  private readonly kvm: KvmCheck;

  /** `kvm`: the KVM verdict to use (the engine's); default: a check of its own in process.env. */
  constructor(private readonly options: { probeTimeoutMs?: number; kvm?: KvmCheck } = {}) {
    super();
    this.kvm = options.kvm ?? kvmCheck(process.env, options.probeTimeoutMs);
  }

  /** runsc and the platform to use, or `backend_unavailable` with the reason. */
  async runtime(): Promise<{ bin: string; platform: GvisorPlatform }> {
    if (process.getuid?.() !== 0) {
      throw new PyroError(
        "backend_unavailable",
        "the gvisor backend needs root here (overlay mounts, cgroups, runsc)",
        "run as root, or choose another backend",
      );
    }
    this.runscBin ??= which("runsc");
    const bin = await this.runscBin;
    if (!bin)
      throw new PyroError(
        "backend_unavailable",
        "runsc is not installed",
        "install the Debian package runsc (npm run setup)",
      );
    const timeoutMs = this.options.probeTimeoutMs ?? 10_000;
    const verdict = await platformFor(bin, {
      timeoutMs,
      kvm: this.kvm,
    });
    if (!verdict.platform)
      throw new PyroError(
        "backend_unavailable",
        `runsc could not start a sandbox (${verdict.failures.join("; ")})`,
        "run `pyro doctor`",
      );
    return { bin, platform: verdict.platform };
  }

  async runOnce(spec: OneShotSpec): Promise<OneShotResult> {
    const { bin, platform } = await this.runtime();
    return gvisorRunOnce(spec, { bin, platform, tools: await this.launchTools() });
  }

  agentRoot(): string {
    return GVISOR_IN_SANDBOX.workspace;
  }

  agentSnapshotPath(_spec: SandboxSpec, name: string): string {
    return `${GVISOR_IN_SANDBOX.snapshots}/${name}`;
  }

  /** The OCI config of a workspace sandbox (oci.ts): mounts, the agent's argv, limits, the statx shim. */
  private async bundleConfig(spec: SandboxSpec, l: GvisorLayout, cgroupBase: string, cg: string) {
    const runtime = await prepareNodeRuntime(spec.runtimeCacheDir);
    const so = await prepareStatxShim(spec.runtimeCacheDir);
    const shim = so ? { so, preload: await preparePreloadFile(so) } : null;
    return workspaceConfig({
      rootfs: l.rootMerged,
      workspace: l.wsMerged,
      runtimeDir: runtime.dir,
      appDir: await agentApp(spec),
      snapshotsDir: spec.snapshotsDir,
      sockDir: l.sock,
      ...(spec.netDir ? { netDir: spec.netDir } : {}),
      hostname: sandboxHostname(spec.workspace_id),
      agentArgv: agentArgv(
        runtime,
        GVISOR_IN_SANDBOX,
        GVISOR_IN_SANDBOX.workspace,
        { listen: `${GVISOR_IN_SANDBOX.sock}/agent.sock` },
        spec.netDir ? { net: guestNet(GVISOR_IN_SANDBOX) } : {},
      ),
      cgroupsPath: cgroupsPath(cgroupBase, cg),
      limits: spec.limits,
      shim,
      hostnameHelper: await prepareHostnameHelper(spec.runtimeCacheDir),
    });
  }

  async start(spec: SandboxSpec, options: { signal?: AbortSignal } = {}): Promise<SandboxState> {
    const l = gvisorLayout(spec.dir, await isLegacyLayout(spec.dir));
    // Standbys of the workspace (this process's or any other's): a started workspace keeps none.
    await this.standbys.endAll(spec);
    const state = await this.launch(spec, l, spec.workspace_id, options);
    await this.standbys.afterStart(spec);
    return state;
  }

  /**
   * Starts a sandbox of `spec` in layout `l` under cgroup (and runsc container id) `cg`:
   * the workspace's own (`start`), or a standby's (standby.ts). The hostname, mounts and
   * limits are the workspace's either way.
   */
  private async launch(
    spec: SandboxSpec,
    l: GvisorLayout,
    cg: string,
    options: { signal?: AbortSignal },
  ): Promise<GvisorState> {
    const { bin, platform } = await this.runtime();
    await prepareLayout(l, spec, [l.bundle]);
    await rm(join(spec.dir, SPARE_LOWER), { recursive: true, force: true });
    // State of a sandbox that died without cleaning up (host reboot, SIGKILL) would make
    // `runsc run` refuse the id; nothing of it is alive (stop() ran or the host rebooted).
    await rm(l.runscRoot, { recursive: true, force: true });
    await mkdir(l.runscRoot, { mode: 0o700 });

    const id = containerId(cg);
    const layout = await detectCgroups();
    // A sandbox under this cgroup that no record points to (its starter was killed
    // between starting it and recording it) still holds the cgroup: end it first.
    await endCgroup(layout, cg);
    await writeFile(
      join(l.bundle, "config.json"),
      `${JSON.stringify(await this.bundleConfig(spec, l, layout.base, cg), null, 2)}\n`,
      { mode: 0o600 },
    );

    // Limits first: fail closed before anything runs if they cannot be applied. runsc is
    // given the same group (cgroupsPath): it finds it configured and only reads the
    // memory limit from it (the sandbox's MemTotal).
    const cgroups = await limitedCgroup(layout, cg, {
      ...spec.limits,
      pids_max: hostPidsMax(spec.limits.pids_max),
    });

    const g: RunscGlobal = { bin, root: l.runscRoot };
    const logFile = join(l.logs, "sandbox.log");
    const argv = launchArgv(
      layoutOverlays(l, spec),
      runArgv(g, platform, l.bundle, id),
      await this.launchTools(),
      {
        cappedLog: true,
        ...layoutDisk(l),
      },
    );
    const { pid, startTime } = await spawnGatedDetached(argv, { logFile, cgroups });
    const state: GvisorState = {
      backend: "gvisor",
      pid,
      start_time: startTime,
      socket: l.socket,
      log: logFile,
      cgroup: cg,
      runsc_root: l.runscRoot,
      container_id: id,
      platform,
    };
    try {
      await waitForSocket(l.socket, () => sameProcessAlive(pid, startTime), {
        timeoutMs: START_TIMEOUT_MS,
        logFile,
        what: "gvisor sandbox",
        ...(options.signal ? { signal: options.signal } : {}),
      });
    } catch (err) {
      await this.stopSandbox(state);
      throw err;
    }
    return state;
  }

  /**
   * The launch process runs `runsc run` (and the capped log reader), and lives as long as
   * the container. A sandbox
   * killed by the host's OOM killer dies piecemeal (a platform stub first, the sentry
   * later), so a live `runsc run` whose agent socket refuses connections counts as dead:
   * the core then stops what is left and starts it again on the kept files.
   */
  async isRunning(state: SandboxState): Promise<boolean> {
    const s = GVISOR_STATE.read(state);
    if (s.in_place_reset) return false;
    if (!(await sameProcessAlive(s.pid, s.start_time))) return false;
    try {
      (await connectSandboxSocket(s.socket, 1000)).destroy();
      return true;
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      // Only "nobody listens" is proof; a slow accept is not.
      return code !== "ECONNREFUSED" && code !== "ENOENT";
    }
  }

  /**
   * Kills every host process of the sandbox through its cgroup (runsc, gofer, sentry and
   * the platform's stubs: the guest's processes exist only inside the sentry), then
   * removes what runsc could not clean up after a SIGKILL: its other cgroups and its
   * state directory. The writable layers stay. The workspace's standbys (this process's
   * or another's) are ended: a stopped workspace keeps none.
   */
  async stop(state: SandboxState): Promise<void> {
    const s = GVISOR_STATE.readPartial(state);
    const id = s.cgroup ? workspaceOfCgroup(s.cgroup) : null;
    if (id) await this.standbys.drop(id);
    await this.stopSandbox(s);
    // The sandbox directory is runsc's root's parent (gvisorLayout).
    if (id && s.runsc_root)
      await this.standbys.endAll({ dir: dirname(s.runsc_root), workspace_id: id }).catch(() => {});
  }

  /** stop() of one sandbox: its processes and runsc's leftovers. */
  private async stopSandbox(s: Partial<GvisorState>): Promise<void> {
    const layout = await this.killSandbox(s);
    if (s.cgroup) await this.sweep(layout.root, layout.base, s.cgroup);
    if (s.runsc_root) await rm(s.runsc_root, { recursive: true, force: true });
  }

  /**
   * The writable layers, and what a command left in the socket directory: a small host
   * tmpfs that outlives the sandbox (layout.ts), so a restart would show it again, which a
   * standby's fresh one does not.
   */
  override async discardChanges(spec: SandboxSpec): Promise<void> {
    await super.discardChanges(spec);
    const sock = gvisorLayout(spec.dir).sock;
    for (const e of await readdir(sock).catch(() => [] as string[]))
      await rm(join(sock, e), { recursive: true, force: true });
  }

  /**
   * A stopped workspace's files: its layers are host files like bwrap's, read by a
   * read-only agent in a bwrap sandbox (bwrap/disk-view.ts), not by runsc (a reader
   * needs no user-space kernel for file reads; starting one costs ~0.3 s).
   */
  async openDisk(spec: SandboxSpec): Promise<Duplex> {
    return openDiskView(spec, await linuxDiskView(spec));
  }

  async destroy(spec: SandboxSpec, state: SandboxState | null): Promise<void> {
    if (state) await this.stop(state);
    else {
      const layout = await this.killSandbox({}, spec.workspace_id);
      await this.sweep(layout.root, layout.base, spec.workspace_id);
    }
    await this.standbys.endAll(spec);
    await removeTree(spec.dir);
  }

  private async sweep(root: string, base: string, id: string): Promise<void> {
    const left = await sweepCgroups(root, base, id);
    if (left.length > 0)
      throw new PyroError("internal", `cannot remove the sandbox's cgroups: ${left.join(", ")}`);
  }

  /** The recorded paths of the sandbox in `spec.dir` (a spare's or a standby's renamed there). */
  private pathsOf(spec: SandboxSpec) {
    const l = gvisorLayout(spec.dir);
    return { socket: l.socket, log: join(l.logs, "sandbox.log"), runsc_root: l.runscRoot };
  }

  /** Hands a spare sandbox of the pool to a new workspace (pool.ts). */
  async adoptSpare(
    spare: SandboxSpec,
    state: SandboxState,
    spec: SandboxSpec,
  ): Promise<SandboxState | { declined: string }> {
    const s = GVISOR_STATE.read(state);
    const { bin } = await this.runtime();
    const alive = () => sameProcessAlive(s.pid, s.start_time);
    const r = await adoptGvisorSpare(spare, s, spec, bin, alive);
    if ("declined" in r) return r;
    return { ...s, ...this.pathsOf(spec), backend: "gvisor", cgroup: r.cgroup };
  }

  /**
   * A reset that hands the workspace over to its standby (standby.ts): every process of
   * the old sandbox killed, its directory renamed aside and the standby's onto the
   * workspace's, the old directory removed after the answer. Null (the caller restarts)
   * without a live standby made for exactly this reset; the restart is then followed by
   * one.
   */
  async resetInPlace(
    spec: SandboxSpec,
    state: SandboxState,
    agent: AgentClient,
  ): Promise<SandboxState | null> {
    const id = spec.workspace_id;
    const taken = await this.standbys.take(spec);
    if (!taken || !(await this.isRunning(taken.standby).catch(() => false))) {
      // A dead standby is ended by the restart's start (it ends every standby).
      this.standbys.want(id);
      return null;
    }
    const n = standbyNames(spec, taken.token);
    const old = GVISOR_STATE.read(state);
    // Every process of the old sandbox gone before the answer; its leftovers after it.
    // A failure from here on leaves the restart to end both sandboxes.
    const layout = await this.killSandbox(old);
    await rename(spec.dir, n.retired);
    await rename(n.dir, spec.dir);
    agent.close();
    const handed: GvisorState = { ...taken.standby, ...this.pathsOf(spec) };
    this.standbys.cleanup(
      id,
      this.sweep(layout.root, layout.base, old.cgroup).then(() => removeTree(n.retired)),
    );
    await this.standbys.schedule(spec).catch(() => {});
    return handed;
  }
}
