import {
  accessSync,
  constants,
  existsSync,
  mkdirSync,
  readFileSync,
  renameSync,
  rmdirSync,
  writeFileSync,
} from "node:fs";
import { writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { PyroError } from "../../errors.js";

/**
 * Per-sandbox resource limits through cgroups, on both layouts found in the wild:
 * - v2 (pure unified, most current hosts): one tree at `<root>/pyro/<id>`, controllers
 *   enabled top-down through `cgroup.subtree_control`.
 * - v1 (legacy or hybrid hosts such as the CI machines): one tree per controller at
 *   `<root>/<controller>/pyro/<id>`.
 *
 * Groups live under a fixed base rather than under the caller's own cgroup so that any
 * pyro process (the CLI that started a sandbox, a later one that stops it) finds the
 * same directories from the workspace id alone. On v2 the base also has to sit outside
 * any cgroup that holds processes ("no internal processes" rule).
 *
 * Fail closed: `create` throws when a requested limit cannot be applied and verified,
 * after removing what it made; the caller maps that to `backend_unavailable`.
 *
 * The file system calls are synchronous: each is a few microseconds in cgroupfs, where a
 * thread-pool round trip per call (~40 for a v1 create, limits read back, and removal)
 * cost 10-40 ms on a busy host, paid by every create, start, reset and one-shot. Except
 * moving a process in (`addProcess`), which can wait for an RCU grace period.
 *
 * Placement pattern for callers: a process only inherits a cgroup at fork, so the
 * workload must be started through a gate. Spawn
 * `["/bin/sh", "-c", 'read -r _ && exec "$@"', "pyro-gate", ...argv]` with a stdin pipe,
 * call `addProcess(child.pid)`, then write one line to its stdin: everything the gate
 * execs (bwrap and all it forks) is born inside the group. Never add the supervisor's
 * own pid: the whole supervisor would then count against one sandbox.
 */

/** The controllers pyro sets limits with. */
export const CGROUP_CONTROLLERS = ["memory", "cpu", "pids"] as const;
export type CgroupController = (typeof CGROUP_CONTROLLERS)[number];

/** What cgroups can do on this host, from {@link detectCgroups}. */
export interface CgroupLayout {
  /** 1 or 2, or null when no usable cgroup filesystem was found. */
  version: 1 | 2 | null;
  /** Mount point of the cgroup filesystem(s), normally /sys/fs/cgroup. */
  root: string;
  /** Directory name pyro's groups are created under. */
  base: string;
  /** Controllers that can be used for limits. */
  usable: Record<CgroupController, boolean>;
  /** Why a controller is not usable (missing entries mean usable). */
  reasons: Partial<Record<CgroupController, string>>;
}

/** Limits for one sandbox; an omitted field is not limited. */
export interface CgroupLimitSpec {
  /** CPU bandwidth in cores (fractions allowed): quota = vcpus × 100 ms per 100 ms. */
  vcpus?: number;
  memoryMib?: number;
  pidsMax?: number;
}

export interface CgroupStats {
  memory_bytes: number | null;
  pids: number | null;
}

export interface DetectOptions {
  /** Defaults to /sys/fs/cgroup; tests point it at a fake tree. */
  root?: string;
  /** Defaults to "pyro". */
  base?: string;
}

const CPU_PERIOD_US = 100_000;
const DESTROY_TIMEOUT_MS = 5_000;

let hostLayout: Promise<CgroupLayout> | undefined;

/**
 * The host's layout (default root and base), detected once per process: it does not
 * change while pyro runs. A failed detection is tried again next time.
 */
export function hostCgroups(): Promise<CgroupLayout> {
  hostLayout ??= detectCgroups().catch((err: unknown) => {
    hostLayout = undefined;
    throw err;
  });
  return hostLayout;
}

/** Finds the cgroup layout and which controllers pyro can use, with reasons when not. */
export async function detectCgroups(options: DetectOptions = {}): Promise<CgroupLayout> {
  const root = options.root ?? "/sys/fs/cgroup";
  const base = options.base ?? "pyro";
  const layout: CgroupLayout = {
    version: null,
    root,
    base,
    usable: { memory: false, cpu: false, pids: false },
    reasons: {},
  };

  const unified = await readText(join(root, "cgroup.controllers"));
  if (unified !== null) {
    layout.version = 2;
    const available = new Set(unified.split(/\s+/).filter(Boolean));
    const writable = await canWrite(root);
    for (const c of CGROUP_CONTROLLERS) {
      if (!writable) layout.reasons[c] = `${root} is not writable (read-only mount or not root)`;
      else if (!available.has(c))
        layout.reasons[c] = `the ${c} controller is not available in ${root}/cgroup.controllers`;
      else layout.usable[c] = true;
    }
    return layout;
  }

  // v1: each controller is its own hierarchy. A v2 tree mounted at <root>/unified on a
  // hybrid host carries no controllers of its own, so it is ignored here.
  const keyFile: Record<CgroupController, string> = {
    memory: "memory.limit_in_bytes",
    cpu: "cpu.cfs_quota_us",
    pids: "cgroup.procs",
  };
  for (const c of CGROUP_CONTROLLERS) {
    const dir = join(root, c);
    if (!existsSync(join(dir, "cgroup.procs"))) layout.reasons[c] = `no cgroup v1 ${c} hierarchy at ${dir}`;
    else if (!existsSync(join(dir, keyFile[c]))) layout.reasons[c] = `${dir} has no ${keyFile[c]}`;
    else if (!(await canWrite(dir)))
      layout.reasons[c] = `${dir} is not writable (read-only mount or not root)`;
    else {
      layout.usable[c] = true;
      layout.version = 1;
    }
  }
  if (layout.version === null && Object.keys(layout.reasons).length === 3) {
    if (!existsSync(root))
      for (const c of CGROUP_CONTROLLERS) layout.reasons[c] = `no cgroup filesystem at ${root}`;
  }
  return layout;
}

/** One sandbox's cgroup(s). Create with {@link CgroupLimits.create}, find again with `attach`. */
export class CgroupLimits {
  private constructor(
    readonly layout: CgroupLayout,
    readonly id: string,
    /** v2: one directory; v1: one per controller in use. */
    readonly dirs: ReadonlyMap<CgroupController | "unified", string>,
  ) {}

  /**
   * Creates the group(s) for `id` and applies every requested limit, reading each one
   * back. Throws (after removing what it created) if any of them cannot be applied.
   */
  static async create(layout: CgroupLayout, id: string, limits: CgroupLimitSpec = {}): Promise<CgroupLimits> {
    checkId(id);
    const needed = requestedControllers(limits);
    for (const c of needed) {
      if (layout.version === null || !layout.usable[c]) {
        throw new Error(`cannot apply the ${c} limit: ${layout.reasons[c] ?? "cgroups are unavailable"}`);
      }
    }
    // memory and pids also give stats, so they are used whenever they work.
    const used = CGROUP_CONTROLLERS.filter((c) => needed.includes(c) || (c !== "cpu" && layout.usable[c]));
    const dirs = new Map<CgroupController | "unified", string>();
    const cg = new CgroupLimits(layout, id, dirs);
    try {
      if (layout.version === 2) {
        dirs.set("unified", await makeV2Group(layout, id, used));
      } else if (layout.version === 1) {
        for (const c of used) {
          const parent = join(layout.root, c, layout.base);
          mkdirSync(parent, { recursive: true });
          dirs.set(c, await makeGroupDir(join(parent, id)));
        }
      }
      await cg.applyLimits(limits);
    } catch (err) {
      await cg.removeDirs().catch(() => {});
      throw err;
    }
    return cg;
  }

  /** Finds the group(s) of an existing sandbox, or null when there are none. */
  static async attach(layout: CgroupLayout, id: string): Promise<CgroupLimits | null> {
    checkId(id);
    const dirs = new Map<CgroupController | "unified", string>();
    if (layout.version === 2) {
      const dir = join(layout.root, layout.base, id);
      if (existsSync(dir)) dirs.set("unified", dir);
    } else if (layout.version === 1) {
      for (const c of CGROUP_CONTROLLERS) {
        const dir = join(layout.root, c, layout.base, id);
        if (existsSync(dir)) dirs.set(c, dir);
      }
    }
    return dirs.size > 0 ? new CgroupLimits(layout, id, dirs) : null;
  }

  /**
   * Renames the group(s) to `id` (within the same parent: cgroup directories can be
   * renamed in place, their processes stay) and applies `limits`, reading each back.
   * A pool's spare sandbox takes its workspace's name and limits this way. Throws, with
   * the group under whichever name it reached, when either step fails.
   */
  async renameTo(id: string, limits: CgroupLimitSpec): Promise<CgroupLimits> {
    checkId(id);
    const dirs = new Map<CgroupController | "unified", string>();
    for (const [c, dir] of this.dirs) {
      const to = join(dirname(dir), id);
      renameSync(dir, to);
      dirs.set(c, to);
    }
    const renamed = new CgroupLimits(this.layout, id, dirs);
    await renamed.applyLimits(limits);
    return renamed;
  }

  /** Moves a process (all its threads) into the group(s). Children forked later follow. */
  async addProcess(pid: number): Promise<void> {
    if (!Number.isInteger(pid) || pid <= 0) throw new Error(`cgroups: invalid pid ${pid}`);
    for (const dir of this.dirs.values()) {
      // Off the event loop, unlike the other calls: a migration can wait for an RCU grace
      // period (~20 ms here for the first one in a while, on v1), which would stall a server.
      try {
        await writeFile(join(dir, "cgroup.procs"), String(pid));
      } catch (err) {
        throw controlError(dir, "cgroup.procs", String(pid), err);
      }
    }
  }

  /** The processes in the group (any one of its directories lists them all). */
  async pids(): Promise<number[]> {
    const dir = this.dirs.get("unified") ?? this.dirs.get("pids") ?? [...this.dirs.values()][0];
    const text = dir ? await readText(join(dir, "cgroup.procs")) : null;
    return (text ?? "").split("\n").filter(Boolean).map(Number);
  }

  /** Current memory use and number of tasks; null where the controller is not in use. */
  async stats(): Promise<CgroupStats> {
    const v2 = this.dirs.get("unified");
    const memDir = v2 ?? this.dirs.get("memory");
    const pidsDir = v2 ?? this.dirs.get("pids");
    const memFile = v2 ? "memory.current" : "memory.usage_in_bytes";
    return {
      memory_bytes: memDir ? toNumber(await readText(join(memDir, memFile))) : null,
      pids: pidsDir ? toNumber(await readText(join(pidsDir, "pids.current"))) : null,
    };
  }

  /**
   * Kills every process left in the group(s) and removes the directories. Idempotent.
   * Throws if the groups cannot be emptied within a few seconds (a leak the caller
   * should report rather than hide).
   */
  async destroy(): Promise<void> {
    const v2 = this.dirs.get("unified");
    // cgroup.kill (Linux 5.14+) kills atomically, so a fork race cannot outrun it.
    if (v2 && existsSync(join(v2, "cgroup.kill"))) {
      await writeControl(v2, "cgroup.kill", "1").catch((err: NodeJS.ErrnoException) => {
        if (err.code !== "ENOENT") throw err;
      });
    }
    await this.removeDirs();
  }

  private async applyLimits(limits: CgroupLimitSpec): Promise<void> {
    const v2 = this.dirs.get("unified");
    if (limits.memoryMib !== undefined) {
      const bytes = String(positiveInt(limits.memoryMib, "memoryMib") * 1024 * 1024);
      if (v2) {
        await setVerified(v2, "memory.max", bytes);
        // Without this, a host with swap lets the sandbox exceed its limit by swapping.
        if (existsSync(join(v2, "memory.swap.max"))) await setVerified(v2, "memory.swap.max", "0");
      } else {
        const dir = this.dirs.get("memory")!;
        const memsw = existsSync(join(dir, "memory.memsw.limit_in_bytes"));
        // memsw must stay >= the memory limit at every step, even in a reused group.
        if (memsw) await writeControl(dir, "memory.memsw.limit_in_bytes", "-1");
        await setVerified(dir, "memory.limit_in_bytes", bytes);
        if (memsw) await setVerified(dir, "memory.memsw.limit_in_bytes", bytes);
        // Without swap accounting, at least keep the group from preferring swap.
        else await writeControl(dir, "memory.swappiness", "0").catch(() => {});
      }
    }
    if (limits.vcpus !== undefined) {
      if (!(Number.isFinite(limits.vcpus) && limits.vcpus > 0))
        throw new Error(`cgroups: vcpus must be > 0, got ${limits.vcpus}`);
      const quota = String(Math.round(limits.vcpus * CPU_PERIOD_US));
      if (v2) await setVerified(v2, "cpu.max", `${quota} ${CPU_PERIOD_US}`);
      else {
        const dir = this.dirs.get("cpu")!;
        await setVerified(dir, "cpu.cfs_period_us", String(CPU_PERIOD_US));
        await setVerified(dir, "cpu.cfs_quota_us", quota);
      }
    }
    if (limits.pidsMax !== undefined) {
      await setVerified(
        v2 ?? this.dirs.get("pids")!,
        "pids.max",
        String(positiveInt(limits.pidsMax, "pidsMax")),
      );
    }
  }

  /** Empties and removes each directory: SIGKILL what is listed, retry until rmdir works. */
  private async removeDirs(): Promise<void> {
    const deadline = Date.now() + DESTROY_TIMEOUT_MS;
    // v1's groups (one per controller) at once: each kills what it lists, so the others
    // find the same processes dying; one after another cost ~8 ms each on a busy host.
    const dirs = [...this.dirs.values()];
    const failed = await Promise.all(dirs.map((dir) => killAndRemoveCgroup(dir, deadline)));
    const i = failed.findIndex((f) => f !== null);
    if (i >= 0) throw new Error(`cannot remove cgroup ${dirs[i]}: ${failed[i]}`);
  }
}

/**
 * SIGKILLs every process a cgroup lists and removes the group, retrying while killed
 * tasks are still exiting (EBUSY) until `deadline`. Returns null once it is gone (or was
 * never there), else the error code that stopped it.
 */
export async function killAndRemoveCgroup(dir: string, deadline: number): Promise<string | null> {
  // Killed tasks are usually gone within a few milliseconds: poll fast first (a reset
  // waits for this), then every 20 ms.
  for (let attempt = 0; ; attempt++) {
    const procs = await readText(join(dir, "cgroup.procs"));
    if (procs === null && !existsSync(dir)) return null;
    for (const pid of (procs ?? "").split("\n").filter(Boolean)) {
      try {
        process.kill(Number(pid), "SIGKILL");
      } catch {
        // exited meanwhile
      }
    }
    try {
      rmdirSync(dir);
      return null;
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === "ENOENT") return null;
      // EBUSY while killed tasks are still exiting; anything else is final.
      if (code !== "EBUSY" || Date.now() > deadline) return code ?? String(err);
      await sleep(Math.min(20, 1 << attempt));
    }
  }
}

/** v2: enables the controllers down to `<root>/<base>` and makes the leaf group. */
async function makeV2Group(
  layout: CgroupLayout,
  id: string,
  used: readonly CgroupController[],
): Promise<string> {
  const parent = join(layout.root, layout.base);
  await enableControllers(layout.root, used);
  mkdirSync(parent, { recursive: true });
  await enableControllers(parent, used);
  return makeGroupDir(join(parent, id));
}

async function enableControllers(dir: string, used: readonly CgroupController[]): Promise<void> {
  const enabled = new Set((await readText(join(dir, "cgroup.subtree_control")))?.split(/\s+/) ?? []);
  const missing = used.filter((c) => !enabled.has(c));
  if (missing.length === 0) return;
  try {
    writeFileSync(join(dir, "cgroup.subtree_control"), missing.map((c) => `+${c}`).join(" "));
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    const hint =
      code === "EBUSY"
        ? " (processes live in that cgroup: v2 only delegates controllers from a cgroup without processes)"
        : "";
    throw new Error(
      `cannot enable ${missing.join(", ")} in ${dir}/cgroup.subtree_control: ${code ?? String(err)}${hint}`,
    );
  }
}

/** mkdir; a leftover empty group of the same id (a crashed run) is reused. */
async function makeGroupDir(dir: string): Promise<string> {
  try {
    mkdirSync(dir);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
    const procs = (await readText(join(dir, "cgroup.procs"))) ?? "";
    if (procs.trim() !== "") throw new Error(`cgroup ${dir} already exists and has processes`);
  }
  return dir;
}

async function setVerified(dir: string, file: string, value: string): Promise<void> {
  await writeControl(dir, file, value);
  const back = (await readText(join(dir, file)))?.trim();
  if (back !== value)
    throw new Error(`cgroup ${dir}/${file}: wrote ${value} but it reads back ${back ?? "nothing"}`);
}

async function writeControl(dir: string, file: string, value: string): Promise<void> {
  try {
    writeFileSync(join(dir, file), value);
  } catch (err) {
    throw controlError(dir, file, value, err);
  }
}

function controlError(dir: string, file: string, value: string, err: unknown): NodeJS.ErrnoException {
  const e = err as NodeJS.ErrnoException;
  const wrapped = new Error(`cannot write ${value} to ${dir}/${file}: ${e.code ?? e.message}`, {
    cause: err,
  }) as NodeJS.ErrnoException;
  if (e.code) wrapped.code = e.code;
  return wrapped;
}

function requestedControllers(limits: CgroupLimitSpec): CgroupController[] {
  const out: CgroupController[] = [];
  if (limits.memoryMib !== undefined) out.push("memory");
  if (limits.vcpus !== undefined) out.push("cpu");
  if (limits.pidsMax !== undefined) out.push("pids");
  return out;
}

function checkId(id: string): void {
  // The id becomes a directory name: no separators, no dot-names.
  if (!/^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/.test(id))
    throw new Error(`cgroups: invalid group id ${JSON.stringify(id)}`);
}

function positiveInt(n: number, what: string): number {
  if (!Number.isInteger(n) || n <= 0)
    throw new Error(`cgroups: ${what} must be a positive integer, got ${n}`);
  return n;
}

function toNumber(text: string | null): number | null {
  if (text === null) return null;
  const n = Number(text.trim());
  return Number.isFinite(n) ? n : null;
}

async function readText(path: string): Promise<string | null> {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return null;
  }
}

async function canWrite(path: string): Promise<boolean> {
  try {
    accessSync(path, constants.W_OK);
    return true;
  } catch {
    return false;
  }
}

/**
 * The cgroup of a sandbox with its limits applied, or `backend_unavailable`: the one
 * fail-closed refusal of every Linux sandbox (bwrap, gVisor; workspaces and one-shots).
 * Nothing may run until this returns.
 */
export async function limitedCgroup(
  layout: CgroupLayout,
  id: string,
  limits: { vcpus: number; memory_mib: number; pids_max: number },
): Promise<CgroupLimits> {
  try {
    return await CgroupLimits.create(layout, id, {
      vcpus: limits.vcpus,
      memoryMib: limits.memory_mib,
      pidsMax: limits.pids_max,
    });
  } catch (err) {
    throw new PyroError(
      "backend_unavailable",
      `cannot apply resource limits: ${(err as Error).message}`,
      "pyro refuses to run without limits",
    );
  }
}
