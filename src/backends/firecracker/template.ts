import { createHash } from "node:crypto";
import {
  chmod,
  mkdir,
  mkdtemp,
  readFile,
  realpath,
  rename,
  rm,
  stat,
  truncate,
  writeFile,
} from "node:fs/promises";
import { join } from "node:path";
import { PyroError } from "../../errors.js";
import { acquireLock } from "../../util/lock.js";
import type { SandboxSpec } from "../backend.js";
import { killAndWait } from "../common.js";
import { DEFAULT_DISK_MIB } from "../disk-image.js";
import { SEED_DISK_BYTES } from "../vm/disks.js";
import type { VmArtifacts } from "../vm/types.js";
import {
  type AgentProbe,
  bootArgs,
  coldBoot,
  DRIVE_FILES,
  type FirecrackerSpawner,
  launchVm,
  linkDrive,
  waitForAgent,
} from "./vm.js";

/**
 * Template snapshots: the fast start. Per environment (more exactly: per kernel,
 * initramfs, environment disk, agent disk, kernel command line, vCPUs, memory and
 * Firecracker binary), one VM is cold-booted in the template's own directory until its
 * agent answers, paused, snapshotted (full) and killed without ever being resumed. A new
 * workspace VM then loads that snapshot instead of booting.
 *
 * Why a restored VM is correct on the workspace's own disks:
 * - drives and the vsock socket were configured by paths relative to Firecracker's
 *   working directory, and the snapshot records them as given; the clone runs in the
 *   workspace's directory, where the same names are the workspace's files;
 * - env and agent disks are the very same files (symlinks to the cached images), and
 *   their identity is part of the template key;
 * - the guest has the state disk mounted (root and /workspace upper layers), so the
 *   clone's state disk must be byte-identical to the template's at snapshot time: a
 *   fresh workspace gets a copy of it. A workspace with a state disk of its own (a
 *   restart) cannot be restored this way and cold-boots;
 * - the seed disk is not mounted when the snapshot is taken (the agent mounts it in
 *   setupGuest, after the restore, dropping what the kernel cached of the placeholder).
 *   The guest kernel keeps the capacity it probed at boot, so the placeholder has the
 *   size every seed image is padded to (SEED_DISK_BYTES); on top of that, `PATCH /drives`
 *   after the load makes Firecracker re-read the backing file and notify the guest, which
 *   rescans the device (docs/api_requests/patch-block.md upstream: allowed while the
 *   disk is not mounted);
 * - vsock connections are reset by the snapshot and listening sockets survive (the guest
 *   bridge keeps listening); the clock and the RNG are reset by setupGuest (Firecracker's
 *   VMGenID device also reseeds the guest kernel's RNG on restore).
 */

export interface TemplateFiles {
  key: string;
  dir: string;
  snapshot: string;
  memory: string;
  /** The template's state disk as it was when the snapshot was taken. */
  state: string;
}

const TEMPLATE_FORMAT = 1;
/** A template build is one cold boot plus writing the guest memory out. */
const LOCK_TIMEOUT_MS = 10 * 60_000;

export function templateFiles(root: string, key: string): TemplateFiles {
  const dir = join(root, key);
  return {
    key,
    dir,
    snapshot: join(dir, "vm.snap"),
    memory: join(dir, "vm.mem"),
    state: join(dir, DRIVE_FILES.state),
  };
}

async function identity(path: string): Promise<Record<string, unknown>> {
  const real = await realpath(path);
  const st = await stat(real);
  return { path: real, size: st.size, mtime: st.mtimeMs, ino: st.ino, dev: st.dev };
}

/** Everything a snapshot depends on, hashed: any change means another template. */
export async function templateKey(
  bin: string,
  artifacts: VmArtifacts,
  limits: SandboxSpec["limits"],
): Promise<string> {
  const inputs = {
    format: TEMPLATE_FORMAT,
    firecracker: await identity(bin),
    image: artifacts.image.key,
    vmlinux: await identity(artifacts.image.vmlinux),
    initrd: await identity(artifacts.image.initrd),
    env: await identity(artifacts.envDisk),
    agent: await identity(artifacts.agentDisk),
    boot_args: bootArgs(artifacts),
    vcpus: limits.vcpus,
    memory_mib: limits.memory_mib,
    // The saved state has the state filesystem mounted: one template per disk limit.
    state_disk_mib: limits.disk_mib ?? DEFAULT_DISK_MIB,
  };
  return createHash("sha256").update(JSON.stringify(inputs)).digest("hex").slice(0, 16);
}

export interface TemplateContext {
  bin: string;
  spawn: FirecrackerSpawner;
  probe: AgentProbe;
  blankExt4: (path: string, sizeMib: number) => Promise<void>;
  bootTimeoutMs: number;
  signal?: AbortSignal;
}

/** The template's files when it is built; `null` when none exists yet. Throws the recorded reason if building it failed before. */
export async function findTemplate(root: string, key: string): Promise<TemplateFiles | null> {
  const failed = await readFile(join(root, `${key}.failed`), "utf8").catch(() => null);
  if (failed !== null)
    throw new PyroError(
      "backend_unavailable",
      `the firecracker template ${key} failed before: ${failed.trim()}`,
      `remove ${join(root, `${key}.failed`)} to try again`,
    );
  const files = templateFiles(root, key);
  return (await readFile(join(files.dir, "meta.json"), "utf8").catch(() => null)) === null ? null : files;
}

/**
 * Builds the template for `key` unless it exists. One builder at a time per key (a lock
 * file; a dead holder's lock is taken over); the build happens in a temp directory
 * renamed into place when complete, so a crash never leaves a half-built template. A
 * failure (other than cancellation) is recorded beside the template so later starts do
 * not pay for it again.
 */
export async function ensureTemplate(
  root: string,
  key: string,
  artifacts: VmArtifacts,
  limits: SandboxSpec["limits"],
  ctx: TemplateContext,
): Promise<TemplateFiles> {
  const found = await findTemplate(root, key);
  if (found) return found;
  await mkdir(root, { recursive: true, mode: 0o700 });
  const release = await acquireLock(join(root, `${key}.lock`), {
    timeoutMs: LOCK_TIMEOUT_MS,
    ...(ctx.signal ? { signal: ctx.signal } : {}),
  });
  try {
    // Whoever held the lock may have built it (or failed to).
    const built = await findTemplate(root, key);
    if (built) return built;
    // Short on purpose: the host connects to sockets inside it.
    const tmp = await mkdtemp(join(root, ".b-"));
    try {
      await buildIn(tmp, artifacts, limits, ctx);
      await writeFile(
        join(tmp, "meta.json"),
        `${JSON.stringify({ key, format: TEMPLATE_FORMAT, created_at: new Date().toISOString(), limits }, null, 2)}\n`,
      );
      const files = templateFiles(root, key);
      // A directory without meta.json is a leftover no clone uses (we hold the lock).
      await rm(files.dir, { recursive: true, force: true });
      await rename(tmp, files.dir);
      return files;
    } catch (err) {
      if ((err as { code?: unknown }).code !== "cancelled" && !ctx.signal?.aborted)
        await markTemplateFailed(root, key, (err as Error).message);
      throw err;
    } finally {
      await rm(tmp, { recursive: true, force: true });
    }
  } finally {
    await release();
  }
}

/** Records why a template cannot be used; later starts skip it until the file is removed. */
export async function markTemplateFailed(root: string, key: string, reason: string): Promise<void> {
  await writeFile(join(root, `${key}.failed`), `${reason}\n`).catch(() => {});
}

async function buildIn(
  dir: string,
  artifacts: VmArtifacts,
  limits: SandboxSpec["limits"],
  ctx: TemplateContext,
): Promise<void> {
  await linkDrive(dir, "env", artifacts.envDisk);
  await linkDrive(dir, "agent", artifacts.agentDisk);
  const seed = join(dir, DRIVE_FILES.seed);
  await writeFile(seed, "");
  // Every seed image is padded to this size, so the capacity the template's kernel probed
  // is the clone's real one (the PATCH after the load makes sure of it).
  await truncate(seed, SEED_DISK_BYTES);
  await ctx.blankExt4(join(dir, DRIVE_FILES.state), limits.disk_mib ?? DEFAULT_DISK_MIB);
  const vm = await launchVm(ctx.bin, dir, ctx.spawn, ctx.signal);
  try {
    await coldBoot(vm, artifacts, limits);
    await waitForAgent(vm, ctx.probe, {
      timeoutMs: ctx.bootTimeoutMs,
      ...(ctx.signal ? { signal: ctx.signal } : {}),
    });
    await vm.api.pause();
    await vm.api.createSnapshot({
      snapshot_type: "Full",
      snapshot_path: join(dir, "vm.snap"),
      mem_file_path: join(dir, "vm.mem"),
    });
  } finally {
    // Never resumed after the snapshot: the template's state must be used only by clones.
    await killAndWait(vm.pid, vm.startTime);
  }
  await rm(vm.paths.apiSocket, { force: true });
  await rm(vm.paths.vsockSocket, { force: true });
  // Clones map the memory file and copy the state disk: neither may change afterwards.
  for (const f of ["vm.snap", "vm.mem", DRIVE_FILES.state]) await chmod(join(dir, f), 0o444);
}
