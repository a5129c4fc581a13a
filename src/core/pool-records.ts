/**
 * The records of a pool's spares (core/pool.ts) and what reads them: the reaper that ends
 * the spares of a process that is gone, `pyro doctor`'s report, and environment prune.
 *
 * A spare's record is `<pool>/<id>.json` (its owner process, backend, spec and state),
 * written before its directory `<pool>/<id>/` and removed after it, and renamed
 * `<id>.taken.json` when a hand-out begins: from then on its sandbox may be the new
 * workspace's, which a reaper must leave to the workspace.
 */
import { readdirSync, readFileSync } from "node:fs";
import { lstat, readdir, readFile, rm } from "node:fs/promises";
import { join } from "node:path";
import type { BackendName, SandboxSpec, SandboxState, WorkspaceBackend } from "../backends/backend.js";
import { procStartTime, sameProcessAlive } from "../backends/common.js";
import { removeTree } from "../util/mounts.js";

/** A spare's record beside its directory: `<id>.json`, renamed `<id>.taken.json` at hand-out. */
export const RECORD = ".json";
export const TAKEN = ".taken.json";
/** The ids the pool gives its spares (the reaper ends a sandbox only under such a name). */
export const SPARE_ID = /^spare_[0-9a-f]{12}$/;

export interface SpareRecord {
  owner: { pid: number; start_time: string };
  backend: BackendName;
  spec: SandboxSpec;
  state?: SandboxState;
}

/** Where a home's pool keeps its spares and their records. */
export function poolDirOf(home: string): string {
  return join(home, "pool");
}

/** The directories of the spare whose directory is `root` (`<pool>/<id>`), bound into its sandbox. */
export function spareDirs(root: string): { dir: string; snapshotsDir: string; netDir: string } {
  return { dir: join(root, "sandbox"), snapshotsDir: join(root, "snapshots"), netDir: join(root, "net") };
}

/** The spare a file of the pool directory is the record of, or null for any other file. */
function recordOf(name: string): { id: string; taken: boolean } | null {
  if (name.startsWith(".") || !name.endsWith(RECORD)) return null;
  const taken = name.endsWith(TAKEN);
  return { id: name.slice(0, -(taken ? TAKEN : RECORD).length), taken };
}

/** What the reaper needs: the pool directory and the backends by name. */
export interface RecordDeps {
  dir: string;
  backend(name: BackendName): WorkspaceBackend;
}

/**
 * Ends a spare's sandbox and removes its directories, then its record. A spare `taken`
 * (its hand-out began) may already be a workspace's sandbox under the workspace's cgroup
 * and directory, which the workspace's own recovery keeps or rolls back: only what is
 * still under the spare's names is ended (its cgroup and directory; never its recorded
 * processes, which may be the workspace's now).
 */
export async function discardSpare(
  deps: Pick<RecordDeps, "backend">,
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
    const ended = await backend?.destroy(record.spec, taken ? null : (record.state ?? null)).then(
      () => true,
      () => false,
    );
    // Not ended (its processes would not die in time): the record stays, so that a later
    // reaper tries again rather than a cgroup being left with no trace.
    if (ended === false) return;
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
    const r = recordOf(name);
    if (r) out.push({ ...r, record: await readRecord(join(dir, name)) });
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
    if (!recordOf(name)) continue;
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
export async function reapSpares(deps: RecordDeps): Promise<number> {
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
  const own = spareDirs(join(dir, id));
  const { netDir, ...spec } = record.spec;
  return {
    owner: record.owner,
    backend: record.backend,
    spec: {
      ...spec,
      workspace_id: id,
      dir: own.dir,
      snapshotsDir: own.snapshotsDir,
      ...(netDir !== undefined ? { netDir: own.netDir } : {}),
    },
  };
}

async function pidAlive(pid: number): Promise<boolean> {
  return (await procStartTime(pid)) !== null;
}
