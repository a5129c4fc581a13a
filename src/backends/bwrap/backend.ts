import { closeSync, openSync, readFileSync, readlinkSync } from "node:fs";
import { join } from "node:path";
import type { Duplex } from "node:stream";
import * as z from "zod/mini";
import type { AgentClient } from "../../agent/client.js";
import { PyroError } from "../../errors.js";
import { removeTree } from "../../util/mounts.js";
import { agentApp } from "../agent-app.js";
import type {
  OneShotResult,
  OneShotSpec,
  PackedPath,
  SandboxSpec,
  SandboxState,
  WorkspaceBackend,
  WorkspaceWriter,
} from "../backend.js";
import { procStartTime, sameProcessAlive, waitForSocket } from "../common.js";
import { spawnGatedDetached } from "../gated-run.js";
import { agentArgv, guestNet, sandboxHostname } from "../guest.js";
import { CgroupLimits, detectCgroups, limitedCgroup } from "../linux/cgroups.js";
import { launchArgv } from "../linux/launch.js";
import {
  detectLayout,
  layoutDisk,
  layoutOverlays,
  prepareLayout,
  type SandboxLayout,
} from "../linux/layout.js";
import { LinuxSocketBackend } from "../linux/socket-backend.js";
import { prepareNodeRuntime } from "../runtime.js";
import { socketSandboxShape, stateReader } from "../sandbox-state.js";
import { linuxDiskView, openDiskView } from "./disk-view.js";
import { isolationArgs } from "./isolation.js";
import { bwrapRunOnce } from "./oneshot.js";
import { packWorkspacePath } from "./pack.js";
import { adoptSpare } from "./pool.js";
import { AGENT_TMP, type ResetBase, resetBase, resetInPlace } from "./reset.js";
import { writeSeccompFile } from "./seccomp.js";
import { workspaceWriter } from "./unpack.js";

/** Mount points inside the sandbox. */
export const IN_SANDBOX = {
  workspace: "/workspace",
  runtime: "/run/pyro/runtime",
  app: "/run/pyro/app",
  snapshots: "/run/pyro/snapshots",
  sock: "/run/pyro/sock",
  net: "/run/pyro/net",
} as const;

/**
 * What a bwrap sandbox records: its launch process, agent socket, log and cgroup, and
 * what an in-place reset compares against (reset.ts; absent when it cannot be done).
 */
const BWRAP_STATE = stateReader("bwrap", {
  ...socketSandboxShape,
  agent_pid: z.optional(z.int().check(z.positive())),
  agent_start_time: z.optional(z.string().check(z.minLength(1))),
  layers_sig: z.optional(z.string().check(z.minLength(1))),
  in_place_reset: z.optional(z.boolean()),
});
type BwrapState = z.output<z.ZodMiniObject<typeof socketSandboxShape>> & Partial<ResetBase>;

/** How deep below the launcher the sandbox's first process may be (launcher → bwrap → bwrap). */
const SANDBOX_DEPTH = 4;

/** The first descendant of `root` (breadth first) whose network namespace is not `root`'s. */
export function processInOtherNetns(root: number): number | null {
  let own: string;
  try {
    own = readlinkSync(`/proc/${root}/ns/net`);
  } catch {
    return null;
  }
  let level = [root];
  for (let depth = 0; depth < SANDBOX_DEPTH && level.length > 0; depth++) {
    const next: number[] = [];
    for (const pid of level) {
      let children: string;
      try {
        children = readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8");
      } catch {
        continue;
      }
      for (const c of children.split(" ").filter(Boolean).map(Number)) {
        try {
          if (readlinkSync(`/proc/${c}/ns/net`) !== own) return c;
        } catch {
          continue;
        }
        next.push(c);
      }
    }
    level = next;
  }
  return null;
}

/**
 * The bubblewrap backend: Linux namespaces (mount, pid, ipc, uts, net, cgroup), all
 * capabilities dropped, a seccomp filter, cgroup limits, and a copy-on-write root per
 * workspace. Needs root (overlay mounts, cgroups).
 */
export class BwrapBackend extends LinuxSocketBackend<BwrapState> implements WorkspaceBackend {
  readonly name = "bwrap" as const;
  readonly executionMode = "guest_agent" as const;
  protected readonly sandboxState = BWRAP_STATE;

  async runOnce(spec: OneShotSpec): Promise<OneShotResult> {
    return bwrapRunOnce(spec, await this.launchTools());
  }

  /**
   * The agent, where the state records it (a sandbox that can reset in place); else the
   * first process below the launcher that is in a network namespace other than this
   * process's (the sandbox's init), found through the recorded launcher.
   */
  async egressNamespace(state: SandboxState): Promise<{ pid: number; start_time: string } | null> {
    const s = this.sandboxState.read(state);
    if (s.agent_pid !== undefined && s.agent_start_time !== undefined)
      return { pid: s.agent_pid, start_time: s.agent_start_time };
    if (!(await sameProcessAlive(s.pid, s.start_time))) return null;
    const pid = processInOtherNetns(s.pid);
    const start = pid === null ? null : await procStartTime(pid);
    return pid !== null && start !== null ? { pid, start_time: start } : null;
  }

  agentRoot(): string {
    return IN_SANDBOX.workspace;
  }

  agentSnapshotPath(_spec: SandboxSpec, name: string): string {
    return `${IN_SANDBOX.snapshots}/${name}`;
  }

  /** The bwrap argv (without the launch wrapper), separate so tests can pin it. */
  bwrapArgv(
    spec: SandboxSpec,
    l: SandboxLayout,
    dirs: { runtime: string; app: string },
    agentArgv: string[],
  ): string[] {
    return [
      "bwrap",
      // Binds come first: /proc and /dev from isolationArgs must land on the new root.
      "--bind",
      l.rootMerged,
      "/",
      "--bind",
      l.wsMerged,
      IN_SANDBOX.workspace,
      ...isolationArgs(sandboxHostname(spec.workspace_id)),
      "--ro-bind",
      dirs.runtime,
      IN_SANDBOX.runtime,
      // Only what the agent runs, not the package beside it (agent-app.ts).
      "--ro-bind",
      dirs.app,
      IN_SANDBOX.app,
      "--ro-bind",
      spec.snapshotsDir,
      IN_SANDBOX.snapshots,
      "--bind",
      l.sock,
      IN_SANDBOX.sock,
      ...(spec.netDir ? ["--ro-bind", spec.netDir, IN_SANDBOX.net] : []),
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
    const l = await detectLayout(spec.dir);
    await prepareLayout(l, spec);
    const runtime = await prepareNodeRuntime(spec.runtimeCacheDir);
    const argvOfAgent = agentArgv(
      runtime,
      IN_SANDBOX,
      IN_SANDBOX.workspace,
      { listen: `${IN_SANDBOX.sock}/agent.sock` },
      {
        idleCommands: true,
        tmp: AGENT_TMP,
        nonDumpable: true,
        // Egress: the network helper listens in the sandbox itself (egressNamespace).
        ...(spec.netDir ? { net: { forward: guestNet(IN_SANDBOX).forward } } : {}),
      },
    );
    const seccompFile = join(spec.dir, "seccomp.bpf");
    await writeSeccompFile(seccompFile);

    // A sandbox of this workspace that no record points to (its starter was killed
    // between starting it and recording it) still holds the cgroup: end it first.
    const cgLayout = await detectCgroups();
    await (await CgroupLimits.attach(cgLayout, spec.workspace_id))?.destroy();
    // Limits first: fail closed before anything runs if they cannot be applied.
    const cgroups = await limitedCgroup(cgLayout, spec.workspace_id, spec.limits);

    const logFile = join(l.logs, "sandbox.log");
    // /workspace's overlay shared, so that an in-place reset can mount over it (reset.ts).
    const [root, ws] = layoutOverlays(l, spec);
    const argv = launchArgv(
      [root!, { ...ws!, shared: true }],
      this.bwrapArgv(spec, l, { runtime: runtime.dir, app: await agentApp(spec) }, argvOfAgent),
      await this.launchTools(),
      { cappedLog: true, readOnlyHost: true, ...layoutDisk(l) },
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
      socket: l.socket,
      log: logFile,
      cgroup: spec.workspace_id,
    };
    try {
      await waitForSocket(l.socket, () => sameProcessAlive(pid, startTime), {
        timeoutMs: 20_000,
        logFile,
        what: "bwrap sandbox",
        ...(options.signal ? { signal: options.signal } : {}),
      });
    } catch (err) {
      await this.stop(state);
      throw err;
    }
    // In place only with an agent no command can take over (it outlives the reset).
    const helper = { spec, tools: await this.launchTools() };
    return runtime.nonDumpable
      ? { ...state, ...(await resetBase(l, pid, spec.workspace_id, helper)) }
      : state;
  }

  isRunning(state: SandboxState): Promise<boolean> {
    const s = BWRAP_STATE.read(state);
    if (s.in_place_reset) return Promise.resolve(false);
    return sameProcessAlive(s.pid, s.start_time);
  }

  /** Resets the running sandbox without restarting it, when it can (reset.ts). */
  async resetInPlace(
    spec: SandboxSpec,
    state: SandboxState,
    agent: AgentClient,
  ): Promise<SandboxState | null> {
    const s = BWRAP_STATE.read(state);
    if (s.agent_pid === undefined || s.agent_start_time === undefined || s.layers_sig === undefined)
      return null;
    const base = { agent_pid: s.agent_pid, agent_start_time: s.agent_start_time, layers_sig: s.layers_sig };
    const l = await detectLayout(spec.dir);
    const done = await resetInPlace(l, spec, s, base, agent, await this.launchTools()).catch(() => false);
    if (!done) return null;
    const { in_place_reset: _, ...kept } = state as SandboxState & { in_place_reset?: boolean };
    return kept;
  }

  /** Hands a spare sandbox of the pool to a new workspace (pool.ts). */
  async adoptSpare(
    spare: SandboxSpec,
    state: SandboxState,
    spec: SandboxSpec,
    agent: AgentClient,
  ): Promise<SandboxState | { declined: string }> {
    const s = BWRAP_STATE.read(state);
    if (s.agent_pid === undefined || s.agent_start_time === undefined || s.layers_sig === undefined)
      return { declined: "the spare has no in-place reset base (its agent can be taken over)" };
    const base = { agent_pid: s.agent_pid, agent_start_time: s.agent_start_time, layers_sig: s.layers_sig };
    return adoptSpare(spare, { ...s, ...base }, spec, agent, await this.launchTools());
  }

  /** Kills every process of the sandbox (through its cgroup) and waits for them. */
  async stop(state: SandboxState): Promise<void> {
    await this.killSandbox(BWRAP_STATE.readPartial(state));
  }

  /** A running workspace's path as a tar archive read from its overlay, not through its agent (pack.ts). */
  async packWorkspacePath(spec: SandboxSpec, state: SandboxState, rel: string): Promise<PackedPath | null> {
    const s = BWRAP_STATE.read(state);
    if ((await detectLayout(spec.dir)).legacy) return null;
    return packWorkspacePath(spec.dir, s, rel);
  }

  /** A running workspace's /workspace written by GNU tar from its overlay, not through its agent (unpack.ts). */
  async workspaceWriter(spec: SandboxSpec, state: SandboxState): Promise<WorkspaceWriter | null> {
    if ((await detectLayout(spec.dir)).legacy) return null;
    return workspaceWriter(spec.dir, BWRAP_STATE.read(state));
  }

  /** A stopped workspace's files, read by a read-only agent in its own bwrap sandbox (disk-view.ts). */
  async openDisk(spec: SandboxSpec): Promise<Duplex> {
    return openDiskView(spec, await linuxDiskView(spec));
  }

  async destroy(spec: SandboxSpec, state: SandboxState | null): Promise<void> {
    await this.killSandbox(state ? BWRAP_STATE.readPartial(state) : {}, spec.workspace_id);
    await removeTree(spec.dir);
  }
}
