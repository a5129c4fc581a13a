/**
 * runsc command lines and the host-side cgroup arithmetic of a gVisor sandbox. Argv
 * builders only: callers spawn them without a shell, and unit tests pin them.
 */
import { readdir } from "node:fs/promises";
import { join } from "node:path";
import { exists } from "../../util/fs.js";
import { killAndRemoveCgroup } from "../linux/cgroups.js";
import type { GvisorPlatform } from "./platform.js";

export interface RunscGlobal {
  bin: string;
  /** runsc's state directory for this sandbox (`--root`). */
  root: string;
}

/**
 * Global flags for starting a sandbox:
 * - `--network=none`: no network stack beyond loopback inside gVisor's netstack; the host's
 *   interfaces and loopback are unreachable.
 * - `--host-uds=all`: a unix socket bound in a mounted directory is a host socket. That is
 *   how the host reaches the agent (it listens in /run/pyro/sock, a 0700 host directory),
 *   and it keeps guest programs that bind sockets under /workspace or the root working
 *   (with `create` alone they could not connect to their own sockets). The only host
 *   sockets inside the sandbox's mounts are the ones its own processes made.
 * - `--cpu-num-from-quota`: `nproc` follows the CPU quota (never below 2) rather than the
 *   host's core count.
 */
export function runscStartFlags(g: RunscGlobal, platform: GvisorPlatform): string[] {
  return [
    g.bin,
    "--root",
    g.root,
    "--network=none",
    `--platform=${platform}`,
    "--host-uds=all",
    "--cpu-num-from-quota",
  ];
}

/** `runsc run` in the foreground: the caller's process stays runsc's parent until the container exits. */
export function runArgv(g: RunscGlobal, platform: GvisorPlatform, bundle: string, id: string): string[] {
  return [...runscStartFlags(g, platform), "run", "--bundle", bundle, id];
}

export function stateArgv(g: RunscGlobal, id: string): string[] {
  return [g.bin, "--root", g.root, "state", id];
}

export function killArgv(g: RunscGlobal, id: string): string[] {
  return [g.bin, "--root", g.root, "kill", "--all", id, "KILL"];
}

export function deleteArgv(g: RunscGlobal, id: string): string[] {
  return [g.bin, "--root", g.root, "delete", "--force", id];
}

/** A container id runsc accepts (letters, digits, `_`, `-`, `.`), from a pyro id. */
export function containerId(id: string): string {
  const clean = id.replace(/[^A-Za-z0-9_.-]/g, "-");
  if (!/^[A-Za-z0-9]/.test(clean)) return `pyro-${clean}`;
  return clean;
}

/**
 * The host pids limit of a sandbox. Inside, RLIMIT_NPROC holds processes to `pids_max`;
 * on the host each of them costs gVisor several tasks (the ptrace platform runs a stub
 * process and tracer threads per guest process: ~8 measured), plus ~100 for runsc
 * itself. The host limit is a backstop against a runaway sentry, sized to never bind
 * before the guest's own limit does.
 */
export const HOST_TASKS_PER_GUEST_PROCESS = 16;
export const HOST_TASKS_BASE = 512;

export function hostPidsMax(pidsMax: number): number {
  return pidsMax * HOST_TASKS_PER_GUEST_PROCESS + HOST_TASKS_BASE;
}

/** The cgroup path runsc is given (relative to each hierarchy): pyro's own group for the sandbox. */
export function cgroupsPath(base: string, id: string): string {
  return `/${base}/${id}`;
}

/**
 * Removes the groups runsc created beside pyro's own (cgroup v1: blkio, cpuset, devices,
 * freezer, ... under `<root>/<controller>/<base>/<id>`). runsc removes them itself when
 * it exits normally; after a SIGKILL they would stay. Processes still listed are killed.
 * Returns the directories that could not be removed.
 */
export async function sweepCgroups(
  root: string,
  base: string,
  id: string,
  timeoutMs = 5000,
): Promise<string[]> {
  const entries = await readdir(root).catch(() => [] as string[]);
  const left: string[] = [];
  for (const entry of entries) {
    const dir = join(root, entry, base, id);
    // Only groups: a controller directory without this path, or a file, is not one.
    if (!(await exists(join(dir, "cgroup.procs")))) continue;
    const failed = await killAndRemoveCgroup(dir, Date.now() + timeoutMs);
    if (failed) left.push(`${dir} (${failed})`);
  }
  return left;
}
