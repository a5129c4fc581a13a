import { createHash, randomBytes } from "node:crypto";
import {
  copyFile,
  link,
  mkdir,
  open,
  readdir,
  readFile,
  rename,
  rm,
  stat,
  writeFile,
} from "node:fs/promises";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { AgentClient } from "../../agent/client.js";
import { PyroError } from "../../errors.js";
import { exists, touch } from "../../util/fs.js";
import { acquireLock } from "../../util/lock.js";
import { killAndWait, logTail, procStartTime, spawnDetached } from "../common.js";
import { blankExt4, qcow2Overlay, SEED_DISK_BYTES, standaloneQcow2, tmpName } from "../vm/disks.js";
import { SERIAL_PORTS, type VmArtifacts } from "../vm/types.js";
import { type Accel, qemuArgv, qmpSocket } from "./machine.js";
import { connectPort } from "./ports.js";
import { QmpClient } from "./qmp.js";
import { describeSetupHelper } from "./setup-diagnosis.js";
import { askSetupPort, setupRequest } from "./setup-port.js";

/** A saved, paused VM that new workspaces start from. */
export interface Template {
  dir: string;
  /** The template's frozen state disk, self-contained (a few MB); each workspace copies it. */
  stateDisk: string;
  /** The saved VM state (RAM and devices), restored with `-incoming`. */
  vmState: string;
  /** How long building it took (a cold boot plus the save), when it was built now. */
  built_ms: number | null;
}

/** Bumped when the VM's hardware or the guest's pre-save state changes shape. */
const TEMPLATE_VERSION = 5;

export interface TemplateInputs {
  qemu: string;
  /** `qemu --version`: a saved state loads only into the QEMU that wrote it. */
  qemuVersion: string;
  accel: Accel;
  vcpus: number;
  memoryMib: number;
  /**
   * Size of the state disk's filesystem: the workspace's disk limit. The saved state has
   * that filesystem mounted, so each size has its own template.
   */
  diskMib: number;
  artifacts: VmArtifacts;
  /** `.vm` cache directory. */
  cacheDir: string;
  signal?: AbortSignal;
  onProgress?: (line: string) => void;
}

/** Cache key of a template: everything the saved state depends on. */
export function templateKey(t: Omit<TemplateInputs, "cacheDir" | "signal" | "onProgress">): string {
  return createHash("sha256")
    .update(
      JSON.stringify([
        TEMPLATE_VERSION,
        t.qemu,
        t.qemuVersion,
        t.accel,
        t.vcpus,
        t.memoryMib,
        t.artifacts.image,
        t.artifacts.envDisk,
        t.artifacts.agentDisk,
        t.artifacts.cmdline,
        SERIAL_PORTS,
        t.diskMib,
      ]),
    )
    .digest("hex")
    .slice(0, 16);
}

/**
 * The template for this VM shape, built once (cold boot until the agent answers, pause,
 * save the state with `migrate` to a file) and cached under `<cacheDir>/templates/<key>`.
 * The seed disk is a blank placeholder while the template runs: the guest never mounts
 * it before the save, so each workspace can bring its own.
 */
export async function ensureTemplate(t: TemplateInputs): Promise<Template> {
  const key = templateKey(t);
  const root = join(t.cacheDir, "templates");
  const dir = join(root, key);
  const result = (built_ms: number | null): Template => ({
    dir,
    stateDisk: join(dir, "state.qcow2"),
    vmState: join(dir, "vm.state"),
    built_ms,
  });
  if (await touch(join(dir, "ready"))) return result(null);
  await mkdir(root, { recursive: true });
  const release = await acquireLock(join(root, `${key}.lock`), t.signal ? { signal: t.signal } : {});
  try {
    if (await exists(join(dir, "ready"))) return result(null);
    t.onProgress?.("booting the VM template (once per environment and VM size)");
    const started = performance.now();
    await buildTemplate(t, dir);
    await removeUnusedTemplates(root, key);
    return result(Math.round(performance.now() - started));
  } finally {
    await release();
  }
}

/**
 * The blank ext4 image of `mib` MiB a state disk starts from (sparse: only what is
 * written takes space), built once per cache and size and never replaced afterwards
 * (overlays of it may be in use: a replaced blank would corrupt them).
 */
export async function blankStateDisk(cacheDir: string, mib: number): Promise<string> {
  const blank = join(cacheDir, `state-blank-${mib}.ext4`);
  await publishOnce(cacheDir, blank, (tmp) => blankExt4(tmp, mib));
  return blank;
}

/** The seed disk the template runs with: sparse zeros of the seed size, never mounted. */
async function seedPlaceholder(cacheDir: string): Promise<string> {
  const placeholder = join(cacheDir, `seed-placeholder-${SEED_DISK_BYTES}.raw`);
  await publishOnce(cacheDir, placeholder, async (tmp) => {
    const fh = await open(tmp, "w");
    await fh.truncate(SEED_DISK_BYTES);
    await fh.close();
  });
  return placeholder;
}

/**
 * Creates `path` with `make(tmp)` unless it exists, under a lock, publishing with link()
 * (which never replaces an existing file).
 */
async function publishOnce(
  cacheDir: string,
  path: string,
  make: (tmp: string) => Promise<void>,
): Promise<void> {
  if (await exists(path)) return;
  await mkdir(cacheDir, { recursive: true });
  const release = await acquireLock(`${path}.lock`);
  try {
    if (await exists(path)) return;
    const tmp = tmpName(path);
    try {
      await make(tmp);
      await link(tmp, path);
    } finally {
      await rm(tmp, { force: true });
    }
  } finally {
    await release();
  }
}

async function buildTemplate(t: TemplateInputs, dir: string): Promise<void> {
  const blank = await blankStateDisk(t.cacheDir, t.diskMib);
  const placeholder = await seedPlaceholder(t.cacheDir);
  const tmp = `${dir}.building-${process.pid}-${Date.now()}`;
  await rm(tmp, { recursive: true, force: true });
  const sockets = join(tmp, "s");
  await mkdir(sockets, { recursive: true, mode: 0o700 });
  const stateDisk = join(tmp, "state.qcow2");
  await qcow2Overlay(stateDisk, blank, "raw");
  const argv = qemuArgv({
    qemu: t.qemu,
    accel: t.accel,
    vcpus: t.vcpus,
    memoryMib: t.memoryMib,
    artifacts: t.artifacts,
    stateDisk,
    seedDisk: placeholder,
    socketDir: sockets,
    // Its state is saved with `migrate exec:cat > file`: QEMU starts that program.
    allowSpawn: true,
  });
  const logFile = join(tmp, "qemu.log");
  const { pid } = spawnDetached(argv, { logFile, cwd: sockets });
  const startTime = (await procStartTime(pid)) ?? "";
  let qmp: QmpClient | null = null;
  try {
    qmp = await QmpClient.connect(qmpSocket(sockets), 30_000);
    await primeGuest(sockets, t.artifacts.setupHelper === true);
    // Let the guest see the hang-ups and go back to waiting before it is frozen.
    await sleep(200);
    await qmp.execute("stop");
    const state = join(tmp, "vm.state");
    await qmp.execute("migrate", { uri: `exec:cat > '${state.replace(/'/g, "'\\''")}'` });
    await qmp.waitMigration(120_000);
    await qmp.execute("quit").catch(() => {});
  } catch (err) {
    const consoleTail = qmp ? await qmp.consoleTail() : "(no QMP)";
    await killAndWait(pid, startTime);
    const tail = await logTail(logFile);
    await rm(tmp, { recursive: true, force: true });
    throw new PyroError(
      "backend_unavailable",
      `building the VM template failed: ${(err as Error).message} (qemu: ${tail}; console: ${consoleTail})`,
    );
  } finally {
    qmp?.close();
  }
  await killAndWait(pid, startTime, 30_000);
  await rm(sockets, { recursive: true, force: true });
  // Flattened: workspaces copy it, and then depend on nothing shared.
  await standaloneQcow2(stateDisk, "qcow2", `${stateDisk}.flat`);
  await rename(`${stateDisk}.flat`, stateDisk);
  await writeFile(join(tmp, "ready"), `${JSON.stringify({ created_at: new Date().toISOString() })}\n`);
  await rm(dir, { recursive: true, force: true });
  await rename(tmp, dir);
}

/**
 * Waits for the template's agent (the end of its boot), then has the guest run what every
 * clone runs first, so the saved state holds it loaded and compiled.
 */
async function primeGuest(sockets: string, setupHelper: boolean): Promise<void> {
  // The agent answering is the end of the boot.
  // Probe on the last port: a restored workspace's first connections take the first
  // ones, which no host has ever opened (no half-closed session can be frozen there).
  const client = await AgentClient.connect(await connectPort(sockets, 10_000, { fromLast: true }), {
    timeoutMs: 300_000,
  });
  await client.request("ping", {});
  // Runs vm_setup once (no /workspace: the seed disk is a placeholder), so the saved
  // state holds its code loaded and compiled, the agent's and Node's, and the setup
  // helper's server has answered once. A clone whose agent disk has no helper calls it
  // first: the module loaded and compiled after a restore under TCG cost seconds anew.
  await client.request("vm_setup", {
    time_ms: Date.now(),
    entropy: randomBytes(64).toString("base64"),
    hostname: "pyro",
    mount: false,
  });
  await client.close();
  // And once through the helper's own port, which clones are set up by (setup-port.ts):
  // its server has found the port, the mount points and the seed disk, has seen that
  // nothing is mounted yet, and waits for the next host there, as in every clone.
  if (setupHelper)
    await askSetupPort(
      sockets,
      setupRequest({ hostname: "pyro", timeMs: Date.now(), entropy: randomBytes(64), mount: false }),
      { timeoutMs: 120_000, describe: () => describeSetupHelper(() => connectPort(sockets, 10_000)) },
    );
}

/** Templates not used for this long are removed when another one is built. */
export const TEMPLATE_MAX_IDLE_MS = 24 * 3600 * 1000;

/**
 * Removes templates unused for TEMPLATE_MAX_IDLE_MS (their `ready` file is touched on every
 * use). Workspaces never depend on a template after they start: they copy its small
 * state disk (see QemuBackend.start), so this only costs a rebuild if one is needed again.
 */
export async function removeUnusedTemplates(root: string, keep: string, now = Date.now()): Promise<string[]> {
  const removed: string[] = [];
  for (const d of await readdir(root).catch(() => [] as string[])) {
    if (d === keep || d.includes(".")) continue;
    const st = await stat(join(root, d, "ready")).catch(() => null);
    if (st && now - st.mtimeMs < TEMPLATE_MAX_IDLE_MS) continue;
    // A template without `ready` is a failed or interrupted build (building ones are `<key>.building-<pid>`).
    await rm(join(root, d), { recursive: true, force: true });
    removed.push(d);
  }
  return removed;
}

/** A template build's identity: its state disk file (a rebuild renames a new directory into place). */
async function templateIdentity(templateStateDisk: string): Promise<string> {
  const st = await stat(templateStateDisk);
  return `${st.ino}-${Math.round(st.mtimeMs)}-${st.size}`;
}

/**
 * A workspace's new state disk (paths: backend.ts qemuLayout), made only while it has
 * none: a copy of the fresh overlay when base.id says the base is a copy of this template
 * build, else a new base (the template's state disk is a self-contained qcow2 of a few MB:
 * a private copy means the workspace never depends on the template, or anything shared,
 * being kept) and a new fresh overlay of it. base.id goes first and comes back last, so
 * it never vouches for a base or an overlay half made.
 */
export async function freshStateDisk(
  l: { stateDisk: string; baseDisk: string; freshDisk: string; baseId: string },
  templateStateDisk: string,
): Promise<void> {
  const id = await templateIdentity(templateStateDisk);
  const recorded = await readFile(l.baseId, "utf8").catch(() => null);
  if (recorded !== id || !(await exists(l.freshDisk))) {
    await rm(l.baseId, { force: true });
    await copyFile(templateStateDisk, l.baseDisk);
    await qcow2Overlay(l.freshDisk, l.baseDisk, "qcow2");
    await writeFile(l.baseId, id);
  }
  await copyFile(l.freshDisk, l.stateDisk);
}
