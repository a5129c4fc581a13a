import { cp, mkdir, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import { Duplex, PassThrough } from "node:stream";
import { z } from "zod";
import { type GuestHandle, startGuest } from "../../agent/guest/agent.js";
import type { BackendName, SandboxSpec, SandboxState, WorkspaceBackend } from "../backend.js";
import { connectUnix } from "../common.js";
import { stateReader } from "../sandbox-state.js";

/** What a fake sandbox records: its token in this object and its agent socket. */
const FAKE_STATE = stateReader("fake", { token: z.string().min(1), socket: z.string().min(1) });

/**
 * A backend for unit tests: the real guest agent, in this process, on a temp directory.
 * No isolation and no child processes for the sandbox itself, so the core's logic
 * (lifecycle, store, snapshots, resets) is tested fast and without root. "Sandboxes" live
 * only as long as this object: a new FakeBackend sees every workspace as dead, which is
 * how tests simulate a crashed sandbox.
 */
export class FakeBackend implements WorkspaceBackend {
  readonly executionMode = "guest_agent" as const;
  readonly started: string[] = [];
  private readonly running = new Map<string, GuestHandle>();

  constructor(readonly name: BackendName = "bwrap") {}

  agentRoot(spec: SandboxSpec): string {
    return join(spec.dir, "workspace");
  }

  agentSnapshotPath(spec: SandboxSpec, name: string): string {
    return join(spec.snapshotsDir, name);
  }

  async start(spec: SandboxSpec): Promise<SandboxState> {
    const root = this.agentRoot(spec);
    if (!(await stat(root).catch(() => null))) {
      await cp(join(spec.snapshotsDir, spec.snapshot), root, { recursive: true, verbatimSymlinks: true });
    }
    await mkdir(join(spec.dir, "sock"), { recursive: true });
    const socket = join(spec.dir, "sock", "agent.sock");
    const handle = await startGuest(
      { root, listen: socket, tmpDir: spec.dir, alias: "/workspace" },
      undefined,
      undefined,
    );
    const token = `${spec.workspace_id}:${this.started.length}`;
    this.running.set(token, handle);
    this.started.push(token);
    return { backend: this.name, token, socket };
  }

  connect(state: SandboxState, options: { timeoutMs?: number } = {}): Promise<Duplex> {
    return connectUnix(FAKE_STATE.read(state).socket, options.timeoutMs ?? 2000);
  }

  async isRunning(state: SandboxState): Promise<boolean> {
    const { token } = FAKE_STATE.readPartial(state);
    return token !== undefined && this.running.has(token);
  }

  async stop(state: SandboxState): Promise<void> {
    const { token } = FAKE_STATE.readPartial(state);
    if (token === undefined) return;
    const h = this.running.get(token);
    this.running.delete(token);
    await h?.close();
  }

  /** Disk readers opened so far (tests check that a refused call opened none). */
  diskReads = 0;

  /** A stopped workspace's files: a read-only in-process guest on its directory (or its snapshot). */
  async openDisk(spec: SandboxSpec): Promise<Duplex> {
    const own = this.agentRoot(spec);
    const root = (await stat(own).catch(() => null)) ? own : join(spec.snapshotsDir, spec.snapshot);
    const toAgent = new PassThrough();
    const fromAgent = new PassThrough();
    const handle = await startGuest(
      { root, stdio: true, readOnly: true, alias: "/workspace", tmpDir: spec.dir },
      { input: toAgent, output: fromAgent },
      undefined,
    );
    this.diskReads++;
    const channel = Duplex.from({ readable: fromAgent, writable: toAgent });
    channel.once("close", () => void handle.close());
    return channel;
  }

  async discardChanges(spec: SandboxSpec): Promise<void> {
    await rm(this.agentRoot(spec), { recursive: true, force: true });
  }

  async destroy(spec: SandboxSpec, state: SandboxState | null): Promise<void> {
    if (state) await this.stop(state);
    await rm(spec.dir, { recursive: true, force: true });
  }

  /** Stops every sandbox (test teardown). */
  async closeAll(): Promise<void> {
    await Promise.all([...this.running.values()].map((h) => h.close()));
    this.running.clear();
  }
}
