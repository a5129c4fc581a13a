/**
 * The standby sandbox of a gVisor workspace: a reset that hands the workspace over to a
 * sandbox started ahead of time instead of starting one (issue 18; the docker backend's
 * standby container is the same idea, docs/backends.md). Profiled here, a gVisor reset
 * that restarts spends ~5% stopping the old sandbox and ~90% waiting for the new one's
 * agent (runsc's boot, then Node under the ptrace platform): 0.9-1.2 s against a
 * `runsc do true` of 0.2-0.37 s. Nothing of that can be done in place: runsc's gofer
 * serves /workspace from directories it opened at start (a new overlay stacked on the
 * mount point would not be seen) and gVisor's sentry caches what it has walked.
 *
 * A standby is what a restart would start, started earlier: the same OCI config (the
 * workspace's hostname, mounts, limits, agent), a fresh disk image and so fresh root and
 * /workspace layers on the same snapshot, in a directory and cgroup of its own:
 * `<workspace>/gvisor-standby/s-<token>/` and `<id>-s<token>`. The hand-out (backend.ts
 * resetInPlace) ends every process of the old sandbox, renames its directory aside
 * (`r-<token>`) and the standby's onto the workspace's sandbox directory (the mounts
 * below both follow the renames: the host's socket tmpfs, the launch step's disk image),
 * and records the standby's state; the old directory goes after the answer.
 *
 * Made only by a process that reset the workspace before, STANDBY_DELAY_MS after its
 * reset (an unref'd timer: a CLI call has exited by then). An idle gVisor sandbox costs
 * ~65 MiB of private memory here, so a create makes none. A standby never outlives its
 * owner unused: a watchdog (`sh` waiting on a pipe from the owner, outside the sandbox's
 * cgroup) runs the reaper (standby-reaper.ts) when the owner exits or dies, which ends the
 * standby if it is still one (its directory is still under its standby name). The
 * hand-out kills the watchdog first. The workspace's next start, stop or delete ends
 * any standby of it, whoever made it.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readdir, stat } from "node:fs/promises";
import type { Socket } from "node:net";
import { dirname, join } from "node:path";
import { PyroError } from "../../errors.js";
import { exists } from "../../util/fs.js";
import { removeTree } from "../../util/mounts.js";
import type { SandboxSpec } from "../backend.js";
import { type CgroupLayout, CgroupLimits } from "../linux/cgroups.js";
import { sweepCgroups } from "./runsc.js";

/** Delay before a standby is made: a CLI call has exited by then (the timer is unref'd). */
export const STANDBY_DELAY_MS = 300;

export const STANDBY_TOKEN = /^[0-9a-f]{8}$/;

/** The directory of a workspace's standbys and retired sandboxes, beside its sandbox directory. */
export function standbyRoot(sandboxDir: string): string {
  return join(dirname(sandboxDir), "gvisor-standby");
}

/** A standby's names: its directory, its cgroup (and runsc container id). */
export function standbyNames(spec: { dir: string; workspace_id: string }, token: string) {
  if (!STANDBY_TOKEN.test(token)) throw new Error(`bad standby token ${JSON.stringify(token)}`);
  return {
    dir: join(standbyRoot(spec.dir), `s-${token}`),
    retired: join(standbyRoot(spec.dir), `r-${token}`),
    cgroup: `${spec.workspace_id}-s${token}`,
  };
}

export function newToken(): string {
  return randomBytes(4).toString("hex");
}

/** Whether a cgroup name is one of the workspace's standbys'. */
export function isStandbyCgroup(workspaceId: string, name: string): boolean {
  return name.startsWith(`${workspaceId}-s`) && STANDBY_TOKEN.test(name.slice(workspaceId.length + 2));
}

/** The workspace id of a sandbox's cgroup: its own, or a standby's (`<id>-s<token>`). */
export function workspaceOfCgroup(cg: string): string {
  const m = /^(.+)-s[0-9a-f]{8}$/.exec(cg);
  return m ? m[1]! : cg;
}

/**
 * What a standby must have been made for to serve a reset: the same spec and snapshot tree
 * (its directory's identity: a snapshot deleted and made again under the same name is
 * another tree, which the standby's overlay would not show).
 */
export async function standbyKey(spec: SandboxSpec): Promise<string> {
  const st = await stat(join(spec.snapshotsDir, spec.snapshot), { bigint: true });
  return JSON.stringify([spec, String(st.ino), String(st.ctimeNs)]);
}

/** Kills every process of a cgroup of pyro's (and runsc's groups of that name) and removes them. */
export async function endCgroup(layout: CgroupLayout, name: string): Promise<void> {
  await (await CgroupLimits.attach(layout, name))?.destroy();
  const left = await sweepCgroups(layout.root, layout.base, name);
  if (left.length > 0)
    throw new PyroError("internal", `cannot remove the sandbox's cgroups: ${left.join(", ")}`);
}

/**
 * Ends every standby of a workspace, whoever made it: their cgroups (found by name under
 * pyro's base in each hierarchy), then the standby root (retired sandboxes included).
 */
export async function endAllStandbys(layout: CgroupLayout, spec: { dir: string; workspace_id: string }) {
  const names = new Set<string>();
  for (const parent of [join(layout.root, layout.base), ...(await controllerBases(layout))])
    for (const e of await readdir(parent).catch(() => [] as string[]))
      if (isStandbyCgroup(spec.workspace_id, e)) names.add(e);
  for (const name of names) await endCgroup(layout, name);
  await removeTree(standbyRoot(spec.dir));
}

/** `<root>/<controller>/<base>` of each v1 hierarchy (runsc makes groups in all of them). */
async function controllerBases(layout: CgroupLayout): Promise<string[]> {
  const entries = await readdir(layout.root).catch(() => [] as string[]);
  return entries.map((e) => join(layout.root, e, layout.base));
}

/** Ends one standby (or a half-made one): its processes and cgroups, then its directory. */
export async function endStandby(
  layout: CgroupLayout,
  spec: { dir: string; workspace_id: string },
  token: string,
): Promise<void> {
  const n = standbyNames(spec, token);
  await endCgroup(layout, n.cgroup);
  await removeTree(n.dir);
}

/**
 * Starts the watchdog of a standby: `sh` reading a pipe this process holds open (and
 * never closes while it lives), then running the reaper when it reads end of file.
 * Detached (its own session, not in the sandbox's cgroup: ending the standby must not end
 * it first). Null when the reaper is not built (TS sources without dist/).
 */
export async function startWatchdog(
  appDir: string,
  spec: { dir: string; workspace_id: string },
  token: string,
): Promise<ChildProcess | null> {
  const reaper = join(appDir, "dist", "backends", "gvisor", "standby-reaper.js");
  if (!(await exists(reaper))) return null;
  const child = spawn(
    "/bin/sh",
    [
      "-c",
      'cat >/dev/null 2>&1; exec "$@"',
      "pyro-standby-watch",
      process.execPath,
      reaper,
      dirname(spec.dir),
      spec.workspace_id,
      token,
    ],
    { detached: true, stdio: ["pipe", "ignore", "ignore"], cwd: "/", env: { PATH: "/usr/bin:/bin" } },
  );
  child.on("error", () => {});
  child.stdin?.on("error", () => {});
  // Neither the child nor the pipe keeps this process alive; the pipe closes when it exits.
  child.unref();
  (child.stdin as unknown as Socket | null)?.unref?.();
  return child;
}

/** Ends a watchdog without running its reaper (a hand-out, or the owner ending the standby itself). */
export function stopWatchdog(w: ChildProcess | null | undefined): void {
  if (!w?.pid || w.exitCode !== null || w.signalCode !== null) return;
  try {
    // Its process group: the shell and its `cat`.
    process.kill(-w.pid, "SIGKILL");
  } catch {
    // gone already
  }
}
