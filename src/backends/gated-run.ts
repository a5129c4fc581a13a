import { type ChildProcess, spawn } from "node:child_process";
import { Readable } from "node:stream";
import { HeadTailCapture } from "../agent/capture.js";
import { PyroError } from "../errors.js";
import type { OneShotResult, OneShotSpec } from "./backend.js";
import { killAndWait, LAUNCH_ENV, procStartTime, spawnDetached } from "./common.js";
import type { CgroupLimits } from "./linux/cgroups.js";

/**
 * Runs a launch argv (see linux/launch.ts: it waits for one stdin line) as a one-shot:
 * places it in its cgroup, releases the gate, captures stdout and stderr (head and tail past
 * the cap), and
 * on timeout or abort kills everything through the cgroup. Shared by the bwrap and gVisor
 * one-shot fast paths; the caller owns creating and destroying the cgroup.
 */
export function runGatedOneShot(
  argv: readonly string[],
  options: {
    cgroups: CgroupLimits;
    what: string;
    maxOutputBytes: number;
    timeoutMs: number;
    signal?: AbortSignal;
    /** Descriptors passed from index 3 on (bwrap's seccomp program). */
    extraFds?: number[];
    onOutput?: OneShotSpec["onOutput"];
    /** Fed to the command's stdin after the gate line (default: EOF at once). */
    stdin?: OneShotSpec["stdin"];
  },
): Promise<OneShotResult> {
  const started = performance.now();
  return new Promise<OneShotResult>((resolve, reject) => {
    const child = spawn(argv[0]!, argv.slice(1), {
      env: { ...LAUNCH_ENV },
      cwd: "/",
      stdio: ["pipe", "pipe", "pipe", ...(options.extraFds ?? [])],
    });
    const { out, err } = captureOutput(child, options.maxOutputBytes, options.onOutput);
    let timedOut = false;
    // Every process of the sandbox is in the cgroup: killing it kills them all.
    const killAll = () => {
      options.cgroups.destroy().catch(() => child.kill("SIGKILL"));
    };
    const timer = setTimeout(() => {
      timedOut = true;
      killAll();
    }, options.timeoutMs);
    const onAbort = () => killAll();
    options.signal?.addEventListener("abort", onAbort, { once: true });
    child.on("error", (e) => {
      clearTimeout(timer);
      reject(new PyroError("backend_unavailable", `cannot start ${options.what}: ${e.message}`));
    });
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      options.signal?.removeEventListener("abort", onAbort);
      resolve(
        oneShotResult(out, err, {
          exitCode: code ?? 128 + signalNumber(signal),
          timedOut,
          durationMs: performance.now() - started,
        }),
      );
    });
    placeAndRelease(child, options).catch(reject);
  });
}

/** A one-shot's result from its two captures; a run that timed out exits 124, whatever killed it. */
export function oneShotResult(
  out: HeadTailCapture,
  err: HeadTailCapture,
  r: { exitCode: number; timedOut: boolean; durationMs: number },
): OneShotResult {
  const stdout = out.render();
  const stderr = err.render();
  return {
    exit_code: r.timedOut ? 124 : r.exitCode,
    stdout: stdout.text,
    stderr: stderr.text,
    stdout_bytes: stdout.bytes,
    stderr_bytes: stderr.bytes,
    duration_ms: Math.round(r.durationMs),
    timed_out: r.timedOut,
    truncated: out.truncated || err.truncated,
  };
}

/** Both streams captured (head and tail past the cap), each chunk also handed to `onOutput`. */
function captureOutput(child: ChildProcess, cap: number, onOutput: OneShotSpec["onOutput"]) {
  const out = new HeadTailCapture(cap);
  const err = new HeadTailCapture(cap);
  child.stdout!.on("data", (c: Buffer) => {
    out.push(c);
    onOutput?.("stdout", c);
  });
  child.stderr!.on("data", (c: Buffer) => {
    err.push(c);
    onOutput?.("stderr", c);
  });
  return { out, err };
}

/**
 * Places the launch step in its cgroup, then opens its gate (and feeds stdin); rejects,
 * with the step killed, when it cannot be placed or the run was cancelled meanwhile.
 */
async function placeAndRelease(
  child: ChildProcess,
  options: { cgroups: CgroupLimits; what: string; signal?: AbortSignal; stdin?: OneShotSpec["stdin"] },
): Promise<void> {
  try {
    await options.cgroups.addProcess(child.pid!);
  } catch (e) {
    child.kill("SIGKILL");
    throw new PyroError(
      "backend_unavailable",
      `cannot place the sandbox in its cgroup: ${(e as Error).message}`,
    );
  }
  // An abort before the caller's listener was added (while it made the disk and the
  // cgroup) fired nothing: the gate stays shut and nothing runs.
  if (options.signal?.aborted) {
    child.kill("SIGKILL");
    throw new PyroError("cancelled", `the ${options.what} run was cancelled before it started`);
  }
  // The launch step reads exactly the gate line; the command inherits the rest.
  if (!options.stdin) {
    child.stdin!.end("go\n");
    return;
  }
  child.stdin!.write("go\n");
  // What the command does not read (it exited first) is discarded.
  child.stdin!.on("error", () => {});
  Readable.from(options.stdin).pipe(child.stdin!);
}

export function signalNumber(signal: NodeJS.Signals | null): number {
  const table: Partial<Record<NodeJS.Signals, number>> = {
    SIGKILL: 9,
    SIGTERM: 15,
    SIGINT: 2,
    SIGSEGV: 11,
    SIGABRT: 6,
  };
  return signal ? (table[signal] ?? 1) : 1;
}

/**
 * Starts a launch argv detached (it outlives this process), places it in its cgroup
 * before it runs anything, then releases the gate. On a placement failure the process is
 * killed and the cgroup removed: nothing runs without its limits. Shared by the bwrap and
 * gVisor workspace sandboxes.
 */
export async function spawnGatedDetached(
  argv: readonly string[],
  options: { logFile: string; cgroups: CgroupLimits; extraFds?: number[] },
): Promise<{ pid: number; startTime: string }> {
  const child = spawnDetached(argv, {
    logFile: options.logFile,
    stdinPipe: true,
    ...(options.extraFds ? { extraFds: options.extraFds } : {}),
  });
  try {
    await options.cgroups.addProcess(child.pid);
  } catch (err) {
    await killAndWait(child.pid, (await procStartTime(child.pid)) ?? "");
    await options.cgroups.destroy();
    throw new PyroError(
      "backend_unavailable",
      `cannot place the sandbox in its cgroup: ${(err as Error).message}`,
    );
  }
  child.stdin?.end("go\n");
  return { pid: child.pid, startTime: (await procStartTime(child.pid)) ?? "" };
}
