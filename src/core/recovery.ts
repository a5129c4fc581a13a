/**
 * Recovery of work a killed process left half-done. Any client (CLI call, SDK object,
 * MCP server) may be killed at any moment; the next one finishes or undoes what it was
 * doing, so no workspace stays `creating` or `deleting` forever and nothing is left
 * behind on the host:
 *
 * - A workspace row in `creating` or `deleting` names its owner (pid and start time). If
 *   the owner is gone, the create is rolled back (its sandbox destroyed through the
 *   backend, which finds it by workspace id: cgroup, container name, QEMU pid file) and
 *   the delete is finished.
 * - A workspace directory without a row (a create killed before its row was written) is
 *   removed once the process named in its `creator` file is gone.
 * - A sandbox started but never recorded (a start or reset killed in between) is ended by
 *   the backend's next start for that workspace, under the workspace's start lock.
 */
import { mkdir, readdir, readFile, rename, stat, writeFile } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { procStartTime, sameProcessAlive } from "../backends/common.js";
import type { WorkspaceRow } from "../state/types.js";
import { removeTree } from "../util/mounts.js";

/** The process doing a create or a delete, recorded so others can tell it died. */
export interface Owner {
  pid: number;
  start_time: string;
}

let self: Promise<Owner> | undefined;

/** This process as an owner (its start time makes the record safe against pid reuse). */
export function currentOwner(): Promise<Owner> {
  self ??= procStartTime(process.pid).then((t) => ({ pid: process.pid, start_time: t ?? "" }));
  return self;
}

function isOwner(o: unknown): o is Owner {
  return (
    typeof o === "object" &&
    o !== null &&
    typeof (o as Owner).pid === "number" &&
    typeof (o as Owner).start_time === "string"
  );
}

/** True unless the record names a process that is gone (a missing record is judged by age). */
async function ownerAlive(o: unknown, sinceIso: string): Promise<boolean> {
  if (isOwner(o)) return sameProcessAlive(o.pid, o.start_time);
  // Rows written before owners were recorded: give them ten minutes.
  return Date.now() - Date.parse(sinceIso) < 10 * 60_000;
}

export const CREATOR_FILE = "creator";

/** Marks a new workspace directory with its creator, before anything else goes in it. */
export async function writeCreator(dir: string): Promise<void> {
  await writeFile(join(dir, CREATOR_FILE), JSON.stringify(await currentOwner()), { mode: 0o600 });
}

/** Prefix of a workspace directory being made (see makeWorkspaceDir). */
const STAGING_PREFIX = ".creating-";

/**
 * Makes a workspace's directory (with its `sandbox/`) so that it never exists without
 * its creator record: both are made under a staging name, then renamed into place. A
 * create killed in between leaves only a staging directory, which recovery collects once
 * its creator is gone (a `ws_` directory without a record used to wait out a minute,
 * and a client in that minute saw a directory without a workspace).
 */
export async function makeWorkspaceDir(dir: string): Promise<void> {
  const staging = join(dirname(dir), `${STAGING_PREFIX}${basename(dir)}`);
  await mkdir(join(staging, "sandbox"), { recursive: true, mode: 0o700 });
  await writeCreator(staging);
  await rename(staging, dir);
}

/** What recovery needs from the workspace service (kept narrow; see Workspaces). */
export interface RecoveryHost {
  rows(): WorkspaceRow[];
  row(id: string): WorkspaceRow | null;
  workspacesDir: string;
  /** Destroys the sandbox and files of a workspace and deletes its row. */
  destroy(w: WorkspaceRow): Promise<void>;
}

/** True when `w` is mid-create or mid-delete and whoever was doing it is gone. */
export async function interrupted(w: WorkspaceRow): Promise<boolean> {
  if (w.state !== "creating" && w.state !== "deleting") return false;
  return !(await ownerAlive(w.runtime.owner, w.last_activity_at ?? w.created_at));
}

/**
 * Rolls back creates and finishes deletes whose process died, and removes directories a
 * killed create left without a row. Returns the workspace ids it cleaned up. Errors on one
 * do not stop the others (the next pass retries).
 */
export async function recoverInterrupted(host: RecoveryHost): Promise<string[]> {
  const done: string[] = [];
  for (const w of host.rows()) {
    if (!(await interrupted(w))) continue;
    try {
      await host.destroy(w);
      done.push(w.workspace_id);
    } catch {
      // retried at the next pass
    }
  }
  const names = await readdir(host.workspacesDir).catch(() => [] as string[]);
  for (const name of names) {
    const staged = name.startsWith(STAGING_PREFIX);
    const id = staged ? name.slice(STAGING_PREFIX.length) : name;
    if (!/^ws_[0-9a-f]{12}$/.test(id) || (!staged && host.row(id))) continue;
    const dir = join(host.workspacesDir, name);
    const creator = await readFile(join(dir, CREATOR_FILE), "utf8")
      .then((t) => JSON.parse(t) as unknown)
      .catch(() => null);
    if (isOwner(creator)) {
      if (await sameProcessAlive(creator.pid, creator.start_time)) continue;
    } else {
      // No creator file: made by a version that did not write one, or a create between
      // its mkdir and writing the file. Old enough, nothing of it can be running.
      const st = await stat(dir).catch(() => null);
      if (!st || Date.now() - st.mtimeMs < 60_000) continue;
    }
    if (!staged && host.row(id)) continue; // its row appeared meanwhile
    try {
      await removeTree(dir);
      done.push(id);
    } catch {
      // retried at the next pass
    }
  }
  return done;
}
