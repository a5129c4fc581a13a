/**
 * A pool of started sandboxes, handed to new workspaces (issue 18: a bwrap create that
 * starts a sandbox costs ~300-600 ms here, most of it the agent's start; a spare's
 * hand-out costs a few renames and one mount). Design and limits: docs/backends.md
 * "Pool of started sandboxes".
 *
 * - Spares are kept per backend and environment (root filesystem), `size` of each, for
 *   the MAX_KEYS pairs created on most recently; only backends with `adoptSpare` (bwrap,
 *   gVisor).
 * - A spare is started on directories of its own under `<home>/pool/<id>/` with the
 *   default limits and disk size; a create whose disk size differs starts its own
 *   sandbox. Other limits are written at hand-out (gVisor's spares decline other limits
 *   and seeds: backends/gvisor/pool.ts).
 * - Off unless asked for: `pyro mcp serve` keeps one per pair by default (PYRO_POOL), a
 *   CLI call or an SDK object none (a spare would outlive a CLI call for nothing).
 * - Each spare's record (pool-records.ts: its owner process, backend, spec and state) is
 *   written before it starts, so spares of a killed owner are found and ended by the next
 *   pool or any process's reap (`reapSpares`, from workspace-removal.ts reapExpired) and
 *   shown by `pyro doctor` (`poolReport`).
 */
import { randomBytes } from "node:crypto";
import { mkdir, rename, rm } from "node:fs/promises";
import { join } from "node:path";
import type { AgentClient } from "../agent/client.js";
import type { BackendName, SandboxSpec, SandboxState, WorkspaceBackend } from "../backends/backend.js";
import { procStartTime } from "../backends/common.js";
import { atomicWriteFile } from "../util/fs.js";
import { agentClient } from "./connections.js";
import { discardSpare, RECORD, reapSpares, type SpareRecord, spareDirs, TAKEN } from "./pool-records.js";
import { DEFAULTS, resolveDisk } from "./workspace-spec.js";

/** Pairs of backend and environment kept warm at once (the most recently created on). */
const MAX_KEYS = 2;
/** Hand-outs declined in a row after which a pair gets no more spares. */
const MAX_DECLINES = 2;
/** The pool size of `pyro mcp serve` when PYRO_POOL does not say. */
export const SERVE_POOL_SIZE = 1;
/** The snapshot a spare's /workspace starts on: an empty directory, never a snapshot's name. */
export const SPARE_SNAPSHOT = ".spare-empty";

export interface PoolDeps {
  /** Spares kept per backend and environment; 0 turns the pool off. */
  size: number;
  /** `<home>/pool`. */
  dir: string;
  appDir: string;
  runtimeCacheDir: string;
  backend(name: BackendName): WorkspaceBackend;
  /** What went wrong in the background (a spare that did not start, or could not take a workspace). */
  warn?(message: string, workspaceId?: string): void;
}

interface Spare {
  key: string;
  /** `<pool>/<id>`: the spare's directories (written after its record, removed before it). */
  root: string;
  record: SpareRecord & { state: SandboxState };
  agent: AgentClient;
}

interface Wanted {
  key: string;
  backend: WorkspaceBackend;
  rootfs: string;
}

const keyOf = (backend: BackendName, rootfs: string) => `${backend}\0${rootfs}`;

/**
 * Whether a spare started on `spare` can become `spec`'s sandbox: the same environment,
 * disk size, package and runtime (the rest is the workspace's to set at hand-out).
 */
export function spareFits(spare: SandboxSpec, spec: SandboxSpec): boolean {
  return (
    spare.rootfs === spec.rootfs &&
    spare.limits.disk_mib === spec.limits.disk_mib &&
    spare.appDir === spec.appDir &&
    spare.runtimeCacheDir === spec.runtimeCacheDir &&
    (spare.netDir === undefined) === (spec.netDir === undefined)
  );
}

export class SandboxPool {
  private readonly spares: Spare[] = [];
  private readonly starting = new Map<Promise<void>, string>();
  private wanted: Wanted[] = [];
  /** Spares being ended in the background (close waits for them). */
  private readonly ending = new Set<Promise<void>>();
  /** Hand-outs declined in a row per pair; past MAX_DECLINES the pair gets no more spares. */
  private readonly declines = new Map<string, number>();
  private closed = false;
  private reaped: Promise<void> | undefined;
  private owner: Promise<SpareRecord["owner"]> | undefined;

  constructor(private readonly deps: PoolDeps) {}

  get enabled(): boolean {
    return this.deps.size > 0;
  }

  /** Spares ready to hand out now (tests and the bench wait for a refill with `ready`). */
  get readyCount(): number {
    return this.spares.length;
  }

  /**
   * The sandbox of a new workspace from a spare, or null (none fits: the caller starts
   * one). Either way the pool starts a spare for the pair afterwards.
   */
  async take(backend: WorkspaceBackend, spec: SandboxSpec): Promise<SandboxState | null> {
    if (!this.enabled || this.closed || !backend.adoptSpare) return null;
    this.remember(backend, spec.rootfs);
    const key = keyOf(backend.name, spec.rootfs);
    const i = this.spares.findIndex((s) => s.key === key && spareFits(s.record.spec, spec));
    if (i < 0) {
      this.refill();
      return null;
    }
    const [spare] = this.spares.splice(i, 1) as [Spare];
    // Marked taken first: from here on its sandbox may become the workspace's, which a
    // reaper must then leave to the workspace (see discardSpare). A spare that cannot be
    // marked (its record is gone) is ended, and the workspace starts its own sandbox.
    const marked = await rename(`${spare.root}${RECORD}`, `${spare.root}${TAKEN}`).then(
      () => true,
      () => false,
    );
    if (!marked) {
      spare.agent.close();
      await discardSpare(this.deps, spare.root, spare.record, false);
      this.refill();
      return null;
    }
    let state: SandboxState | null = null;
    try {
      const r = await backend.adoptSpare(spare.record.spec, spare.record.state, spec, spare.agent);
      const declined = (r as { declined?: unknown }).declined;
      if (typeof declined === "string") this.declined(key, spec.workspace_id, declined);
      else {
        state = r as SandboxState;
        this.declines.delete(key);
      }
    } finally {
      spare.agent.close();
      if (state) await rm(spare.root, { recursive: true, force: true }).catch(() => {});
      // Not the workspace's (the hand-out ended it or failed): ended as the spare it was.
      else await discardSpare(this.deps, spare.root, spare.record, false);
      await rm(`${spare.root}${TAKEN}`, { force: true });
      // The next spare starts after the hand-out, not against it for the CPU.
      this.refill();
    }
    return state;
  }

  /**
   * A hand-out the backend declined: said, and after MAX_DECLINES in a row the pair gets
   * no more spares (a spare that can never be handed out, as when the runtime cannot make
   * the agent non-dumpable, would cost a sandbox start per create for nothing).
   */
  private declined(key: string, workspaceId: string, reason: string): void {
    const n = (this.declines.get(key) ?? 0) + 1;
    this.declines.set(key, n);
    const stop = n >= MAX_DECLINES;
    this.deps.warn?.(
      `the pool's started sandbox could not take workspace ${workspaceId} (${reason}); it starts its own${stop ? "; the pool keeps no more spares of this environment" : ""}`,
      workspaceId,
    );
  }

  /** Keeps spares for `rootfs` on `backend` from now on (up to MAX_KEYS pairs), starting them now. */
  want(backend: WorkspaceBackend, rootfs: string): void {
    if (!this.enabled || this.closed || !backend.adoptSpare) return;
    this.remember(backend, rootfs);
    this.refill();
  }

  /** Puts the pair first among the wanted ones, ending the spares of a pair that falls out. */
  private remember(backend: WorkspaceBackend, rootfs: string): void {
    const key = keyOf(backend.name, rootfs);
    this.wanted = [{ key, backend, rootfs }, ...this.wanted.filter((w) => w.key !== key)];
    const dropped = this.wanted.slice(MAX_KEYS);
    this.wanted = this.wanted.slice(0, MAX_KEYS);
    for (const d of dropped) {
      for (const s of this.spares.filter((x) => x.key === d.key)) {
        this.spares.splice(this.spares.indexOf(s), 1);
        s.agent.close();
        const ending: Promise<void> = this.discard(s.root, s.record).finally(() =>
          this.ending.delete(ending),
        );
        this.ending.add(ending);
      }
    }
  }

  /** Resolves once no spare is being started (every wanted pair is full, or failed to fill). */
  async ready(): Promise<void> {
    while (this.starting.size > 0) await Promise.allSettled([...this.starting.keys()]);
  }

  /** Ends every spare and stops making new ones. */
  async close(): Promise<void> {
    this.closed = true;
    await this.ready();
    await Promise.allSettled([...this.ending]);
    const all = this.spares.splice(0);
    await Promise.all(
      all.map(async (s) => {
        s.agent.close();
        await this.discard(s.root, s.record);
      }),
    );
  }

  private refill(): void {
    if (this.closed) return;
    for (const w of this.wanted) {
      if ((this.declines.get(w.key) ?? 0) >= MAX_DECLINES) continue;
      const have =
        this.spares.filter((s) => s.key === w.key).length +
        [...this.starting.values()].filter((k) => k === w.key).length;
      for (let n = have; n < this.deps.size; n++) {
        const p: Promise<void> = this.startSpare(w)
          .catch((err: Error) => {
            if (!this.closed) this.deps.warn?.(`the pool could not start a spare sandbox: ${err.message}`);
          })
          .finally(() => this.starting.delete(p));
        this.starting.set(p, w.key);
      }
    }
  }

  private async startSpare(w: Wanted): Promise<void> {
    this.reaped ??= reapSpares(this.deps).then(() => {});
    await this.reaped;
    const id = `spare_${randomBytes(6).toString("hex")}`; // SPARE_ID
    const root = join(this.deps.dir, id);
    const dirs = spareDirs(root);
    // The disk limit a workspace created now would get (none on an engine that cannot).
    const { disk_mib } = await resolveDisk(undefined, w.backend);
    const spec: SandboxSpec = {
      workspace_id: id,
      dir: dirs.dir,
      rootfs: w.rootfs,
      snapshotsDir: dirs.snapshotsDir,
      snapshot: SPARE_SNAPSHOT,
      limits: {
        vcpus: DEFAULTS.vcpus,
        memory_mib: DEFAULTS.memory_mib,
        pids_max: DEFAULTS.pids_max,
        ...(disk_mib !== undefined ? { disk_mib } : {}),
      },
      appDir: this.deps.appDir,
      runtimeCacheDir: this.deps.runtimeCacheDir,
      ...(w.backend.connectPort ? { netDir: dirs.netDir } : {}),
    };
    // The record before anything else: a spare whose owner dies at any point after this
    // is found, and a directory without one is no live pool's.
    await mkdir(this.deps.dir, { recursive: true, mode: 0o700 });
    const record: SpareRecord = { owner: await this.ownerOf(), backend: w.backend.name, spec };
    await atomicWriteFile(`${root}${RECORD}`, JSON.stringify(record), 0o600);
    for (const d of [
      spec.dir,
      join(spec.snapshotsDir, SPARE_SNAPSHOT),
      ...(spec.netDir ? [spec.netDir] : []),
    ])
      await mkdir(d, { recursive: true, mode: 0o700 });
    let state: SandboxState | undefined;
    try {
      state = await w.backend.start(spec);
      await atomicWriteFile(`${root}${RECORD}`, JSON.stringify({ ...record, state }), 0o600);
      const agent = await (await agentClient()).connect(await w.backend.connect(state, { timeoutMs: 5000 }), {
        timeoutMs: 10_000,
      });
      if (this.closed || !this.wanted.some((x) => x.key === w.key)) {
        agent.close();
        throw new Error("the pool no longer wants this spare");
      }
      this.spares.push({ key: w.key, root, record: { ...record, state }, agent });
    } catch (err) {
      await this.discard(root, { ...record, ...(state ? { state } : {}) });
      throw err;
    }
  }

  private ownerOf(): Promise<SpareRecord["owner"]> {
    this.owner ??= procStartTime(process.pid).then((t) => ({ pid: process.pid, start_time: t ?? "" }));
    return this.owner;
  }

  private async discard(root: string, record: SpareRecord): Promise<void> {
    await discardSpare(this.deps, root, record, false);
  }
}

export { poolDirOf, poolReport, reapSpares, type SpareReport, spareRootfsSync } from "./pool-records.js";
