import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { closeSync, openSync, renameSync, writeFileSync } from "node:fs";
import { mkdir } from "node:fs/promises";
import { join } from "node:path";
import { Readable, type Writable } from "node:stream";
import { HeadTailCapture } from "../../agent/capture.js";
import { PyroError } from "../../errors.js";
import { removeTree } from "../../util/mounts.js";
import type { OneShotResult, OneShotSpec } from "../backend.js";
import { LAUNCH_ENV } from "../common.js";
import { claimDiskImage, DEFAULT_DISK_MIB, diskTemplates } from "../disk-image.js";
import { oneShotResult, signalNumber } from "../gated-run.js";
import { type CgroupLimits, hostCgroups, limitedCgroup } from "../linux/cgroups.js";
import type { LaunchTools } from "../linux/launch.js";
import { bwrapPrefix, seccompFile } from "./oneshot-argv.js";
import { preparedLaunchArgv, preparedRunArgs, READY_LINE } from "./prepared-launch.js";

/** What a prepared launch is made for: a run on this environment, disk size and cache. */
/** Seconds a prepared launch's step waits past a run's timeout before it kills the run itself. */
export const STEP_DEADLINE_SLACK_S = 2;

export type PrepareSpec = Pick<OneShotSpec, "rootfs" | "scratchDir" | "runtimeCacheDir" | "limits">;

const READY_TIMEOUT_MS = 10_000;
const END_TIMEOUT_MS = 10_000;

/**
 * A bwrap one-shot launch made ahead (prepared-launch.ts): its disk image copied, cgroup
 * made with limits, the launch step placed in it, the image and overlay mounted, waiting
 * for its command. Used once; its owner (a LaunchKeeper) ends it when unused. While idle
 * its process and pipes do not keep the owner's event loop alive, and the owner's exit
 * closes its stdin, on which it removes everything it made.
 */
export class PreparedRun {
  private used = false;

  private constructor(
    private readonly child: ChildProcess,
    /** Resolves when the launch step has exited (listened to from its spawn on). */
    private readonly exit: Promise<{ code: number | null; signal: NodeJS.Signals | null }>,
    private cgroups: CgroupLimits,
    private readonly dir: string,
    private readonly argsFile: string,
    private readonly limits: PrepareSpec["limits"],
  ) {}

  private get exited(): boolean {
    return this.child.exitCode !== null || this.child.signalCode !== null;
  }

  /** The launch step's pid (tests check what it leaves behind). */
  get pid(): number {
    return this.child.pid!;
  }

  static async start(spec: PrepareSpec, tools: LaunchTools): Promise<PreparedRun> {
    const id = `run_${randomBytes(6).toString("hex")}`;
    const dir = join(spec.scratchDir, id);
    const diskMount = join(dir, "disk");
    const paths = {
      image: join(dir, "disk.img"),
      diskMount,
      upper: join(diskMount, "upper"),
      work: join(diskMount, "work"),
      lower: spec.rootfs,
      merged: join(dir, "merged"),
      argsFile: join(dir, "args"),
      dir,
    };
    let cgroups: CgroupLimits | undefined;
    let child: ChildProcess | undefined;
    try {
      await Promise.all([diskMount, paths.merged].map((d) => mkdir(d, { recursive: true, mode: 0o700 })));
      const disk = spec.limits.disk_mib ?? DEFAULT_DISK_MIB;
      const { refill } = await claimDiskImage(paths.image, disk, diskTemplates(spec));
      const layout = await hostCgroups();
      cgroups = await limitedCgroup(layout, id, spec.limits);
      const cg = [...cgroups.dirs].map(([c, d]) => ({
        dir: d,
        rootProcs: join(layout.root, ...(c === "unified" ? [] : [c]), "cgroup.procs"),
      }));
      const argv = preparedLaunchArgv({ ...paths, cgroups: cg }, bwrapPrefix(paths.merged, id), tools);
      const fd = openSync(await seccompFile(spec.runtimeCacheDir), "r");
      try {
        child = spawn(argv[0]!, argv.slice(1), {
          env: { ...LAUNCH_ENV },
          cwd: "/",
          stdio: ["pipe", "pipe", "pipe", fd, "ignore", "pipe"],
        });
      } finally {
        closeSync(fd);
      }
      const launched = child;
      const exit = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
        launched.on("exit", (code, signal) => resolve({ code, signal })),
      );
      child.stdin!.on("error", () => {});
      await cgroups.addProcess(child.pid!);
      child.stdin!.write("go\n");
      await readyLine(child);
      // Part of the preparation (background work the keeper waits for), not of the next run.
      await refill;
      const p = new PreparedRun(child, exit, cgroups, dir, paths.argsFile, spec.limits);
      p.idle(true);
      return p;
    } catch (err) {
      child?.kill("SIGKILL");
      await cgroups?.destroy().catch(() => {});
      await removeTree(dir).catch(() => {});
      throw err;
    }
  }

  /** While idle, nothing of it keeps the owner's event loop alive. */
  private idle(on: boolean): void {
    const handles = [this.child, ...this.child.stdio] as ({ ref?(): void; unref?(): void } | null)[];
    for (const h of handles) on ? h?.unref?.() : h?.ref?.();
  }

  /**
   * Runs the command of `spec` in it, or returns null when it cannot be used (gone,
   * used, or its limits could not be set: the caller runs the command the cold way).
   * The run's vCPU, memory and pids limits are written (and read back) before its
   * command is released.
   */
  async run(spec: OneShotSpec): Promise<OneShotResult | null> {
    if (this.used || this.exited) return null;
    this.used = true;
    const l = spec.limits;
    try {
      if (
        l.vcpus !== this.limits.vcpus ||
        l.memory_mib !== this.limits.memory_mib ||
        l.pids_max !== this.limits.pids_max
      )
        this.cgroups = await this.cgroups.renameTo(this.cgroups.id, {
          vcpus: l.vcpus,
          memoryMib: l.memory_mib,
          pidsMax: l.pids_max,
        });
      // Written whole, then renamed: the launch step never reads a partial list.
      writeFileSync(`${this.argsFile}.partial`, preparedRunArgs(spec.command, spec.env), { mode: 0o600 });
      renameSync(`${this.argsFile}.partial`, this.argsFile);
    } catch {
      return null; // the caller closes it
    }
    if (this.exited) return null;
    // Aborted while the limits were written (the core checked before): the gate stays
    // shut, and the caller's close ends the launch. From here to the gate it is synchronous.
    if (spec.signal?.aborted)
      throw new PyroError("cancelled", "the bwrap run was cancelled before it started");
    this.idle(false);
    return this.released(spec);
  }

  /** Releases the command and collects its output and exit status (fd 5). */
  private released(spec: OneShotSpec): Promise<OneShotResult> {
    const started = performance.now();
    const child = this.child;
    const out = new HeadTailCapture(spec.maxOutputBytes);
    const err = new HeadTailCapture(spec.maxOutputBytes);
    const pipe = (s: Readable, cap: HeadTailCapture, name: "stdout" | "stderr") => {
      s.on("data", (c: Buffer) => {
        cap.push(c);
        spec.onOutput?.(name, c);
      });
      return new Promise<void>((ok) => s.on("close", ok));
    };
    child.stdout!.removeAllListeners("data");
    const streams = [pipe(child.stdout!, out, "stdout"), pipe(child.stderr!, err, "stderr")];
    let status = "";
    const statusStream = (child.stdio as unknown as Readable[])[5]!;
    statusStream.on("data", (c: Buffer) => {
      status += c.toString();
    });
    streams.push(new Promise<void>((ok) => statusStream.on("close", ok)));
    let timedOut = false;
    // Every process of the run is in the cgroup: destroying it kills them all.
    const killAll = () => void this.cgroups.destroy().catch(() => child.kill("SIGKILL"));
    const timer = setTimeout(() => {
      timedOut = true;
      killAll();
    }, spec.timeoutMs);
    spec.signal?.addEventListener("abort", killAll, { once: true });
    const stdin = child.stdin as Writable;
    // The step's own deadline, after the owner's: only an owner gone by then leaves it to the step.
    const gate = `run ${Math.ceil(spec.timeoutMs / 1000) + STEP_DEADLINE_SLACK_S}\n`;
    if (!spec.stdin) stdin.end(gate);
    else {
      stdin.write(gate);
      Readable.from(spec.stdin).pipe(stdin);
    }
    return Promise.all(streams).then(async () => {
      clearTimeout(timer);
      spec.signal?.removeEventListener("abort", killAll);
      let code = /^\d+\n?$/.test(status) ? Number(status.trim()) : null;
      if (code === null) {
        const e = await this.exit;
        code = e.code ?? 128 + signalNumber(e.signal);
      }
      return oneShotResult(out, err, { exitCode: code, timedOut, durationMs: performance.now() - started });
    });
  }

  /**
   * Ends it (an unused launch: its gate closes, and it unmounts and removes what it made)
   * and resolves once its process is gone and nothing of it is left (checked: the cgroup
   * and the directory are removed here too if it could not).
   */
  async close(): Promise<void> {
    this.used = true;
    this.child.stdin?.end();
    const timer = setTimeout(() => void this.cgroups.destroy().catch(() => {}), END_TIMEOUT_MS);
    await this.exit;
    clearTimeout(timer);
    await this.cgroups.destroy().catch(() => {});
    await removeTree(this.dir);
  }
}

/** Waits for the launch step's ready line on stdout (or its early end: a failed mount). */
function readyLine(child: ChildProcess): Promise<void> {
  return new Promise((resolve, reject) => {
    let text = "";
    let errText = "";
    const onErr = (c: Buffer) => {
      errText += c.toString();
    };
    child.stderr!.on("data", onErr);
    const fail = (why: string) => {
      clearTimeout(timer);
      reject(new Error(`the prepared launch ${why}: ${errText.trim().split("\n").slice(-1)[0] ?? ""}`));
    };
    const timer = setTimeout(() => fail("was not ready in time"), READY_TIMEOUT_MS);
    child.on("exit", () => fail("ended before it was ready"));
    child.on("error", (e) => fail(`did not start (${e.message})`));
    child.stdout!.on("data", (c: Buffer) => {
      text += c.toString();
      if (text === `${READY_LINE}\n`) {
        clearTimeout(timer);
        child.stderr!.off("data", onErr);
        resolve();
      } else if (!`${READY_LINE}\n`.startsWith(text)) fail("printed something unexpected");
    });
  });
}
