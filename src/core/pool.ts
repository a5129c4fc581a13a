/**
 * A pool of started sandboxes, handed to new workspaces (issue 18: a bwrap create that
 * starts a sandbox costs ~300-600 ms here, most of it the agent's start; a spare's
 * hand-out costs a few renames and one mount). Design and limits: docs/backends.md
 * "Pool of started sandboxes".
 *
 * - Spares are kept per backend and environment (root filesystem), `size` of each, for
 *   the MAX_KEYS pairs created on most recently; only backends with `adoptSpare` (bwrap).
 * - A spare is started on directories of its own under `<home>/pool/<id>/` with the
 *   default limits and disk size; a create whose disk size differs starts its own
 *   sandbox. Other limits are written at hand-out.
 * - Off unless asked for: `pyro mcp serve` keeps one per pair by default (PYRO_POOL), a
 *   CLI call or an SDK object none (a spare would outlive a CLI call for nothing).
 * - Each spare's record (`spare.json`: its owner process, backend, spec and state) is
 *   written before it starts, so spares of a killed owner are found and ended by the next
 *   pool (`reap`) and shown by `pyro doctor` (`poolReport`).
 */
import { randomBytes } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { lstat, mkdir, readdir, readFile, rename, rm } from "node:fs/promises";
import { join } from "node:path";
import { AgentClient } from "../agent/client.js";
import type { BackendName, SandboxSpec, SandboxState, WorkspaceBackend } from "../backends/backend.js";
import { procStartTime, sameProcessAlive } from "../backends/common.js";
import { atomicWriteFile } from "../util/fs.js";
import { removeTree } from "../util/mounts.js";
import { DEFAULTS } from "./workspace-spec.js";

/** Pairs of backend and environment kept warm at once (the most recently created on). */
const MAX_KEYS = 2;
/** The pool size of `pyro mcp serve` when PYRO_POOL does not say. */
export const SERVE_POOL_SIZE = 1;
/** Most spares a pool keeps of each pair (PYRO_POOL is capped to it). */
export const MAX_POOL_SIZE = 4;
/** The snapshot a spare's /workspace starts on: an empty directory, never a snapshot's name. */
export const SPARE_SNAPSHOT = ".spare-empty";
/** A spare's record beside its directory: `<id>.json`, renamed `<id>.taken.json` at hand-out. */
const RECORD = ".json";
const TAKEN = ".taken.json";
/** The ids startSpare gives (the reaper ends a sandbox only under such a name). */
const SPARE_ID = /^spare_[0-9a-f]{12}$/;

export interface PoolDeps {
  /** Spares kept per backend and environment; 0 turns the pool off. */
  size: number;
  /** `<home>/pool`. */
  dir: string;
  appDir: string;
  runtimeCacheDir: string;
  backend(name: BackendName): WorkspaceBackend;
}

interface SpareRecord {
  owner: { pid: number; start_time: string };
  backend: BackendName;
  spec: SandboxSpec;
  state?: SandboxState;
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
      state = await backend.adoptSpare(spare.record.spec, spare.record.state, spec, spare.agent);
    } finally {
      spare.agent.close();
      if (state) {
        await rm(spare.root, { recursive: true, force: true }).catch(() => {});
        await rm(`${spare.root}${TAKEN}`, { force: true });
      } else {
        // Not the workspace's (the hand-out ended it or failed): ended as the spare it was.
        await discardSpare(this.deps, spare.root, spare.record, false);
        await rm(`${spare.root}${TAKEN}`, { force: true });
      }
      // The next spare starts after the hand-out, not against it for the CPU.
      this.refill();
    }
    return state;
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
        void this.discard(s.root, s.record);
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
      const have =
        this.spares.filter((s) => s.key === w.key).length +
        [...this.starting.values()].filter((k) => k === w.key).length;
      for (let n = have; n < this.deps.size; n++) {
        const p: Promise<void> = this.startSpare(w)
          .catch(() => {})
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
    const spec: SandboxSpec = {
      workspace_id: id,
      dir: join(root, "sandbox"),
      rootfs: w.rootfs,
      snapshotsDir: join(root, "snapshots"),
      snapshot: SPARE_SNAPSHOT,
      limits: {
        vcpus: DEFAULTS.vcpus,
        memory_mib: DEFAULTS.memory_mib,
        pids_max: DEFAULTS.pids_max,
        disk_mib: DEFAULTS.disk_mib,
      },
      appDir: this.deps.appDir,
      runtimeCacheDir: this.deps.runtimeCacheDir,
      ...(w.backend.connectPort ? { netDir: join(root, "net") } : {}),
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
      const agent = await AgentClient.connect(await w.backend.connect(state, { timeoutMs: 5000 }), {
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

/**
 * Ends a spare's sandbox and removes its directories, then its record. A spare `taken`
 * (its hand-out began) may already be a workspace's sandbox under the workspace's cgroup
 * and directory, which the workspace's own recovery keeps or rolls back: only what is
 * still under the spare's names is ended (its cgroup and directory; never its recorded
 * processes, which may be the workspace's now).
 */
async function discardSpare(
  deps: Pick<PoolDeps, "backend">,
  root: string,
  record: SpareRecord | null,
  taken: boolean,
): Promise<void> {
  // A spare's directory is one the pool made: a link there is removed, never followed
  // (the backend's removal below goes through `<root>/sandbox`).
  const st = await lstat(root).catch(() => null);
  if (st && !st.isDirectory()) await rm(root, { force: true });
  if (record) {
    const backend = (() => {
      try {
        return deps.backend(record.backend);
      } catch {
        return null;
      }
    })();
    await backend?.destroy(record.spec, taken ? null : (record.state ?? null)).catch(() => {});
  }
  await removeTree(root).catch(() => {});
  await rm(`${root}${taken ? TAKEN : RECORD}`, { force: true });
}

async function readRecord(file: string): Promise<SpareRecord | null> {
  try {
    const r = JSON.parse(await readFile(file, "utf8")) as SpareRecord;
    return r && typeof r.owner?.pid === "number" && r.spec && r.backend ? r : null;
  } catch {
    return null;
  }
}

/** The spares of a pool directory by id, from their records, with whether each was taken. */
async function spareRecords(
  dir: string,
): Promise<{ id: string; taken: boolean; record: SpareRecord | null }[]> {
  const names = await readdir(dir).catch(() => [] as string[]);
  const out: { id: string; taken: boolean; record: SpareRecord | null }[] = [];
  for (const name of names.sort()) {
    if (name.startsWith(".") || !name.endsWith(RECORD)) continue;
    const taken = name.endsWith(TAKEN);
    const id = name.slice(0, -(taken ? TAKEN : RECORD).length);
    out.push({ id, taken, record: await readRecord(join(dir, name)) });
  }
  return out;
}

/** The environments the spares of a pool directory run on, read synchronously (environment prune). */
export function spareRootfsSync(dir: string): Set<string> {
  const used = new Set<string>();
  let names: string[] = [];
  try {
    names = readdirSync(dir);
  } catch {
    return used;
  }
  for (const name of names) {
    if (name.startsWith(".") || !name.endsWith(RECORD)) continue;
    try {
      const r = JSON.parse(readFileSync(join(dir, name), "utf8")) as Partial<SpareRecord>;
      if (typeof r.spec?.rootfs === "string") used.add(r.spec.rootfs);
    } catch {
      // A record being written: its spare has not started on anything yet.
    }
  }
  return used;
}

/** A spare's directory as `pyro doctor` shows it. */
export interface SpareReport {
  id: string;
  backend: string | null;
  rootfs: string | null;
  owner_pid: number | null;
  /** Whether the process that started it still runs (a dead owner's spare is reaped by the next pool). */
  owner_alive: boolean;
}

/** The spares under `<home>/pool` and whether their owners still run. */
export async function poolReport(dir: string): Promise<SpareReport[]> {
  const out: SpareReport[] = [];
  for (const { id, record: r } of await spareRecords(dir)) {
    out.push({
      id,
      backend: r?.backend ?? null,
      rootfs: r?.spec.rootfs ?? null,
      owner_pid: r?.owner.pid ?? null,
      owner_alive: r ? await sameProcessAlive(r.owner.pid, r.owner.start_time) : false,
    });
  }
  return out;
}

/**
 * Ends the spares whose owner process is gone (a killed `mcp serve`) and removes their
 * directories and records; removes directories no record names (a record is written
 * before its directory and removed after it, so no live pool has one) and record temp
 * files of dead writers.
 */
export async function reapSpares(deps: Pick<PoolDeps, "dir" | "backend">): Promise<number> {
  let reaped = 0;
  for (const { id, taken, record } of await spareRecords(deps.dir)) {
    if (record && (await sameProcessAlive(record.owner.pid, record.owner.start_time))) continue;
    await discardSpare(deps, join(deps.dir, id), ownSpare(deps.dir, id, record), taken);
    reaped++;
  }
  for (const name of await readdir(deps.dir).catch(() => [] as string[])) {
    const path = join(deps.dir, name);
    if (name.startsWith(".") && name.endsWith(".tmp")) {
      // atomicWriteFile's `.<file>.<pid>.<random>.tmp` of a writer that died.
      const pid = Number(name.split(".").at(-3));
      if (!Number.isInteger(pid) || !(await pidAlive(pid))) await rm(path, { force: true });
    } else if (!name.endsWith(RECORD) && !(await hasRecord(path))) {
      // Checked now, not against the records read above: another process's pool may
      // have written a spare's record and then its directory since (never the reverse).
      await removeTree(path).catch(() => {});
      reaped++;
    }
  }
  return reaped;
}

async function hasRecord(root: string): Promise<boolean> {
  for (const file of [`${root}${RECORD}`, `${root}${TAKEN}`]) {
    if (await lstat(file).catch(() => null)) return true;
  }
  return false;
}

/**
 * A record read from disk, trusted for nothing but which backend and environment the
 * spare ran on: its sandbox is ended by the spare's own cgroup and directories (named
 * from its id, as startSpare names them), never by the paths, cgroup or process a
 * damaged or planted record names (a reaper runs as root and removes what it is given).
 */
function ownSpare(dir: string, id: string, record: SpareRecord | null): SpareRecord | null {
  // A name the pool never gives (a workspace's id, say) is no spare: nothing is ended by it.
  if (!record || !SPARE_ID.test(id)) return null;
  const root = join(dir, id);
  const { netDir, ...spec } = record.spec;
  return {
    owner: record.owner,
    backend: record.backend,
    spec: {
      ...spec,
      workspace_id: id,
      dir: join(root, "sandbox"),
      snapshotsDir: join(root, "snapshots"),
      ...(netDir !== undefined ? { netDir: join(root, "net") } : {}),
    },
  };
}

async function pidAlive(pid: number): Promise<boolean> {
  return (await procStartTime(pid)) !== null;
}
