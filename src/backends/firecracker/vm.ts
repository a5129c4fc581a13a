import { rm, symlink } from "node:fs/promises";
import { join } from "node:path";
import type { Duplex } from "node:stream";
import { AgentClient } from "../../agent/client.js";
import { PyroError } from "../../errors.js";
import type { SandboxSpec } from "../backend.js";
import {
  killAndWait,
  logTail,
  procStartTime,
  sameProcessAlive,
  spawnDetached,
  terminateAndWait,
} from "../common.js";
import { AGENT_VSOCK_PORT, DISK_SERIAL, type VmArtifacts } from "../vm/types.js";
import { type Drive, FirecrackerApi } from "./api.js";
import { connectVsock } from "./vsock.js";

/**
 * What one Firecracker microVM needs on the host, shared by cold boot, template builds
 * and restores. Every VM runs with its own directory as working directory, and its
 * drives and vsock socket are configured by paths relative to it: Firecracker records
 * those paths in a snapshot as given and resolves them again on restore, against the
 * restoring process's working directory ("these host-resources need to be accessible at
 * the same relative paths", docs/snapshotting/snapshot-support.md upstream). That is
 * what lets a snapshot taken in a template's directory come back on a workspace's disks.
 */

export const DISK_ROLES = ["env", "agent", "state", "seed"] as const;
export type DiskRole = (typeof DISK_ROLES)[number];

/** File names of the drives inside a VM's directory (the disks or symlinks to them). */
export const DRIVE_FILES: Record<DiskRole, string> = {
  env: "env.img",
  agent: "agent.img",
  state: "state.img",
  seed: "seed.img",
};

export const API_SOCKET = "fc.sock";
/** Relative on purpose (see above); the host connects to `<dir>/vsock.sock`. */
export const VSOCK_SOCKET = "vsock.sock";
export const LOG_FILE = "firecracker.log";
/** Guest CID of every VM: each VM has its own vsock device, so they never meet. */
export const GUEST_CID = 3;

/**
 * Firecracker drive id of a disk: its virtio serial with `-` as `_`, because the API
 * accepts only alphanumerics and `_` in ids (checked_id in its API server).
 */
export function driveId(role: DiskRole): string {
  return DISK_SERIAL[role].replace(/[^A-Za-z0-9_]/g, "_");
}

/**
 * The drives in attach order. Firecracker's API has no serial per drive, so the guest
 * cannot find disks by serial as under QEMU; instead the kernel command line carries the
 * role → device mapping. Firecracker makes a root drive /dev/vda and the others follow
 * in the order they were configured (docs/block.md upstream); with no root drive, the
 * n-th configured drive is the n-th virtio disk.
 */
export function driveConfigs(): Drive[] {
  return DISK_ROLES.map((role) => ({
    drive_id: driveId(role),
    path_on_host: DRIVE_FILES[role],
    is_root_device: false,
    is_read_only: role !== "state",
  }));
}

/** `pyro.disks=env:vda,agent:vdb,state:vdc,seed:vdd`: the attach order above, for the guest init. */
export function disksArg(): string {
  return `pyro.disks=${DISK_ROLES.map((role, i) => `${role}:vd${String.fromCharCode(97 + i)}`).join(",")}`;
}

/** The kernel command line: the artifacts' own plus the vsock channel and the disk map. */
export function bootArgs(artifacts: VmArtifacts): string {
  return [...artifacts.cmdline, "pyro.channel=vsock", `pyro.vsock_port=${AGENT_VSOCK_PORT}`, disksArg()].join(
    " ",
  );
}

export function vmPaths(dir: string) {
  return {
    dir,
    apiSocket: join(dir, API_SOCKET),
    vsockSocket: join(dir, VSOCK_SOCKET),
    log: join(dir, LOG_FILE),
    state: join(dir, DRIVE_FILES.state),
  };
}

/** Points `<dir>/<role>.img` at `target` (replacing an older link). */
export async function linkDrive(dir: string, role: DiskRole, target: string): Promise<void> {
  const link = join(dir, DRIVE_FILES[role]);
  await rm(link, { force: true });
  await symlink(target, link);
}

/** Starts a detached Firecracker process; resolves with its pid and start time. */
export type FirecrackerSpawner = (
  argv: readonly string[],
  options: { cwd: string; logFile: string },
) => Promise<{ pid: number; startTime: string }>;

export const spawnFirecracker: FirecrackerSpawner = async (argv, options) => {
  const { pid } = spawnDetached(argv, { logFile: options.logFile, cwd: options.cwd });
  const startTime = await procStartTime(pid);
  if (!startTime)
    throw new PyroError(
      "backend_unavailable",
      `firecracker exited at once: ${await logTail(options.logFile)}`,
    );
  return { pid, startTime };
};

/** Performs the agent protocol handshake on `stream` and closes it (proof the agent serves). */
export type AgentProbe = (stream: Duplex, timeoutMs: number) => Promise<void>;

export const helloAgent: AgentProbe = async (stream, timeoutMs) => {
  const client = await AgentClient.connect(stream, { timeoutMs });
  client.close();
};

/** Has the guest flush its page cache to its disks (the agent's `vm_sync`). */
export type GuestSync = (connect: () => Promise<Duplex>) => Promise<void>;

export const syncViaAgent: GuestSync = async (connect) => {
  const client = await AgentClient.connect(await connect(), { timeoutMs: 5000 });
  try {
    await client.request("vm_sync", {}, { timeoutMs: 15_000 });
  } finally {
    client.close();
  }
};

export interface RunningVm {
  pid: number;
  startTime: string;
  api: FirecrackerApi;
  paths: ReturnType<typeof vmPaths>;
}

const API_READY_TIMEOUT_MS = 10_000;

/**
 * Spawns Firecracker in `dir` (its working directory) and waits until its API answers.
 * The API socket is given relative to `dir`, like every path Firecracker binds or opens,
 * so a long directory path never exceeds a socket address.
 */
export async function launchVm(
  bin: string,
  dir: string,
  spawn: FirecrackerSpawner,
  signal?: AbortSignal,
): Promise<RunningVm> {
  const paths = vmPaths(dir);
  // Firecracker binds both sockets itself and refuses a path that exists.
  await rm(paths.apiSocket, { force: true });
  await rm(paths.vsockSocket, { force: true });
  const { pid, startTime } = await spawn([bin, "--api-sock", API_SOCKET], { cwd: dir, logFile: paths.log });
  const vm: RunningVm = {
    pid,
    startTime,
    api: new FirecrackerApi(paths.apiSocket, signal ? { signal } : {}),
    paths,
  };
  try {
    await waitForApi(vm, signal);
  } catch (err) {
    await killAndWait(pid, startTime);
    throw err;
  }
  return vm;
}

async function waitForApi(vm: RunningVm, signal: AbortSignal | undefined): Promise<void> {
  const deadline = Date.now() + API_READY_TIMEOUT_MS;
  let delay = 5;
  let last = "";
  for (;;) {
    try {
      await vm.api.call({ method: "GET", path: "/" }, 1000);
      return;
    } catch (err) {
      if ((err as { code?: unknown }).code === "cancelled") throw err;
      last = (err as Error).message;
    }
    if (signal?.aborted) throw new PyroError("cancelled", "firecracker start was cancelled");
    if (!(await sameProcessAlive(vm.pid, vm.startTime)))
      throw new PyroError(
        "backend_unavailable",
        `firecracker exited during start: ${await logTail(vm.paths.log)}`,
      );
    if (Date.now() > deadline)
      throw new PyroError(
        "timeout",
        `firecracker's API did not answer within ${API_READY_TIMEOUT_MS} ms (${last}): ${await logTail(vm.paths.log)}`,
      );
    await new Promise((r) => setTimeout(r, delay));
    delay = Math.min(delay * 2, 100);
  }
}

/** Configures a fresh VM (machine, kernel, the four drives, vsock) and boots it. */
export async function coldBoot(
  vm: RunningVm,
  artifacts: VmArtifacts,
  limits: SandboxSpec["limits"],
): Promise<void> {
  await vm.api.putMachineConfig({ vcpu_count: limits.vcpus, mem_size_mib: limits.memory_mib, smt: false });
  await vm.api.putBootSource({
    kernel_image_path: artifacts.image.vmlinux,
    initrd_path: artifacts.image.initrd,
    boot_args: bootArgs(artifacts),
  });
  for (const drive of driveConfigs()) await vm.api.putDrive(drive.drive_id, drive);
  await vm.api.putVsock({ guest_cid: GUEST_CID, uds_path: VSOCK_SOCKET });
  await vm.api.instanceStart();
}

/**
 * Waits until the agent answers a handshake over vsock. A vsock `OK` alone only proves
 * the guest bridge accepted; the bridge closes the connection while the agent's socket
 * is not there yet, so the handshake is retried until `timeoutMs`. Fails early, with the
 * log tail, when Firecracker dies.
 */
export async function waitForAgent(
  vm: Pick<RunningVm, "pid" | "startTime" | "paths">,
  probe: AgentProbe,
  options: { timeoutMs: number; signal?: AbortSignal },
): Promise<void> {
  const deadline = Date.now() + options.timeoutMs;
  let last = "no attempt finished";
  for (;;) {
    if (options.signal?.aborted) throw new PyroError("cancelled", "firecracker start was cancelled");
    if (!(await sameProcessAlive(vm.pid, vm.startTime)))
      throw new PyroError(
        "backend_unavailable",
        `firecracker exited during start: ${await logTail(vm.paths.log)}`,
      );
    const remaining = deadline - Date.now();
    if (remaining <= 0)
      throw new PyroError(
        "timeout",
        `the guest agent did not answer within ${options.timeoutMs} ms (${last}): ${await logTail(vm.paths.log)}`,
      );
    try {
      const stream = await connectVsock(vm.paths.vsockSocket, AGENT_VSOCK_PORT, {
        timeoutMs: Math.min(remaining, 2000),
        ...(options.signal ? { signal: options.signal } : {}),
      });
      await probe(stream, Math.min(Math.max(deadline - Date.now(), 1), 5000));
      return;
    } catch (err) {
      const code = (err as { code?: unknown }).code;
      if (code === "cancelled" || code === "version_mismatch") throw err;
      last = (err as Error).message;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Stops a VM: SIGTERM, then SIGKILL if it is still there after `graceMs`. */
export function killVm(pid: number, startTime: string, graceMs = 1000): Promise<void> {
  return terminateAndWait(pid, startTime, graceMs);
}
