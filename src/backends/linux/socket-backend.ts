import type { Duplex } from "node:stream";
import type { SandboxSpec, SandboxState } from "../backend.js";
import { connectForward, connectSandboxSocket, killAndWait } from "../common.js";
import type { SocketSandbox, StateReader } from "../sandbox-state.js";
import { type CgroupLayout, CgroupLimits, detectCgroups } from "./cgroups.js";
import { detectLaunchTools, type LaunchTools } from "./launch.js";
import { discardLayers } from "./layout.js";

/**
 * What the Linux sandboxes whose agent listens on a host unix socket (bwrap, gVisor)
 * share, beside the layout (layout.ts) and the launch step (launch.ts): reaching the agent
 * and its forwarded ports through the recorded socket, discarding the writable layers,
 * and killing a sandbox through its cgroup. Each backend adds how it starts and what
 * else its stop must clean up.
 */
export abstract class LinuxSocketBackend<S extends SocketSandbox> {
  /** Reads this backend's recorded sandbox state (validated, never cast). */
  protected abstract readonly sandboxState: StateReader<S>;

  private tools: Promise<LaunchTools> | undefined;

  /** The launch step's shell and mount commands, detected once. */
  protected launchTools(): Promise<LaunchTools> {
    this.tools ??= detectLaunchTools();
    return this.tools;
  }

  connect(state: SandboxState, options: { timeoutMs?: number } = {}): Promise<Duplex> {
    return connectSandboxSocket(this.sandboxState.read(state).socket, options.timeoutMs ?? 5000);
  }

  connectPort(state: SandboxState, port: number, options: { timeoutMs?: number } = {}): Promise<Duplex> {
    return connectForward(this.sandboxState.read(state).socket, port, options.timeoutMs ?? 5000);
  }

  discardChanges(spec: SandboxSpec): Promise<void> {
    return discardLayers(spec.dir);
  }

  /**
   * Kills every process of the sandbox through its cgroup (the recorded one, or the
   * workspace's when nothing was recorded), then waits for its launch process. Returns
   * the cgroup layout for the caller's own cleanup.
   */
  protected async killSandbox(s: Partial<S>, workspaceId?: string): Promise<CgroupLayout> {
    const layout = await detectCgroups();
    const name = s.cgroup ?? workspaceId;
    const cg = name ? await CgroupLimits.attach(layout, name) : null;
    if (cg) await cg.destroy();
    if (s.pid !== undefined && s.start_time !== undefined) await killAndWait(s.pid, s.start_time);
    return layout;
  }
}
