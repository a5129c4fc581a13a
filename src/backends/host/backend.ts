import { cp, mkdir, rm, stat } from "node:fs/promises";
import { join, relative } from "node:path";
import type { Duplex } from "node:stream";
import { z } from "zod";
import type { SandboxSpec, SandboxState, WorkspaceBackend } from "../backend.js";
import {
  connectSandboxSocket,
  connectTcp,
  killAndWait,
  LAUNCH_ENV,
  procStartTime,
  sameProcessAlive,
  spawnDetached,
  terminateAndWait,
  waitForSocket,
} from "../common.js";
import { spawnReader } from "../disk-reader.js";
import { agentArgv, HOST_NODE } from "../guest.js";
import { stateReader } from "../sandbox-state.js";

/**
 * What a host-compat start records: the agent process and its socket. `start_time` may be
 * empty (the start time could not be read), so it is not held to processShape's rule.
 */
const HOST_STATE = stateReader("host", {
  pid: z.number().int().positive(),
  start_time: z.string(),
  socket: z.string().min(1),
  log: z.string(),
});

/**
 * The host-compat backend: no isolation at all. The agent runs as a plain host process
 * on a host directory. Only used with --allow-host-compat, and every result says
 * `execution_mode: host_compat`.
 */
export class HostBackend implements WorkspaceBackend {
  readonly name = "host" as const;
  readonly executionMode = "host_compat" as const;

  agentRoot(spec: SandboxSpec): string {
    return join(spec.dir, "workspace");
  }

  agentSnapshotPath(spec: SandboxSpec, name: string): string {
    return join(spec.snapshotsDir, name);
  }

  async start(spec: SandboxSpec, options: { signal?: AbortSignal } = {}): Promise<SandboxState> {
    const root = this.agentRoot(spec);
    // A missing workspace directory means fresh (created, or changes discarded): materialise the snapshot.
    if (!(await stat(root).catch(() => null))) {
      await cp(join(spec.snapshotsDir, spec.snapshot), root, {
        recursive: true,
        verbatimSymlinks: true,
        preserveTimestamps: true,
      });
    }
    await mkdir(join(spec.dir, "sock"), { recursive: true, mode: 0o700 });
    await mkdir(join(spec.dir, "logs"), { recursive: true });
    await mkdir(join(spec.dir, "tmp"), { recursive: true });
    const socket = join(spec.dir, "sock", "agent.sock");
    await rm(socket, { force: true });
    const logFile = join(spec.dir, "logs", "agent.log");
    const { pid } = spawnDetached(
      // The socket is relative to the agent's working directory (`root`): a socket
      // address holds only 107 bytes, and a deep PYRO_HOME makes the absolute path longer.
      agentArgv(
        HOST_NODE,
        { runtime: "", app: spec.appDir },
        root,
        { listen: relative(root, socket) },
        { alias: "/workspace", tmp: join(spec.dir, "tmp") },
      ),
      // No isolation here, but still nothing of the caller's environment (its keys and tokens).
      { logFile, cwd: root, env: { ...LAUNCH_ENV, HOME: root } },
    );
    const startTime = (await procStartTime(pid)) ?? "";
    try {
      await waitForSocket(socket, () => sameProcessAlive(pid, startTime), {
        timeoutMs: 15_000,
        logFile,
        what: "host agent",
        ...(options.signal ? { signal: options.signal } : {}),
      });
    } catch (err) {
      // A start that fails leaves nothing running (it once left the agent behind).
      await killAndWait(pid, startTime);
      throw err;
    }
    return { backend: "host", pid, start_time: startTime, socket, log: logFile };
  }

  async connect(state: SandboxState, options: { timeoutMs?: number } = {}): Promise<Duplex> {
    // Async so that a state read back incomplete rejects like a failed connection.
    return connectSandboxSocket(HOST_STATE.read(state).socket, options.timeoutMs ?? 5000);
  }

  /** No sandbox: the port is on the host's own loopback. */
  connectPort(_state: SandboxState, port: number, options: { timeoutMs?: number } = {}): Promise<Duplex> {
    return connectTcp("127.0.0.1", port, options.timeoutMs ?? 5000);
  }

  isRunning(state: SandboxState): Promise<boolean> {
    const s = HOST_STATE.readPartial(state);
    return sameProcessAlive(s.pid, s.start_time);
  }

  async stop(state: SandboxState): Promise<void> {
    const s = HOST_STATE.readPartial(state);
    if (s.pid !== undefined && s.start_time !== undefined) {
      // The agent leads its own session; its commands and services run in their own
      // process groups and are killed by the agent when it is asked to stop (SIGTERM);
      // SIGKILL only if it does not go.
      await terminateAndWait(s.pid, s.start_time, 3000);
    }
  }

  /**
   * A stopped workspace's files: its directory is on the host, served as it is by a
   * read-only agent process (no isolation, as everything on host-compat). A workspace
   * whose changes were discarded has no directory yet: its snapshot is what it shows.
   */
  async openDisk(spec: SandboxSpec): Promise<Duplex> {
    const own = this.agentRoot(spec);
    const root = (await stat(own).catch(() => null)) ? own : join(spec.snapshotsDir, spec.snapshot);
    return spawnReader(
      agentArgv(
        HOST_NODE,
        { runtime: "", app: spec.appDir },
        root,
        { stdio: true },
        {
          readOnly: true,
          alias: "/workspace",
        },
      ),
      { cwd: root, env: { ...LAUNCH_ENV, HOME: root } },
    );
  }

  async discardChanges(spec: SandboxSpec): Promise<void> {
    await rm(this.agentRoot(spec), { recursive: true, force: true });
  }

  async destroy(spec: SandboxSpec, state: SandboxState | null): Promise<void> {
    if (state) await this.stop(state);
    await rm(spec.dir, { recursive: true, force: true });
  }
}
