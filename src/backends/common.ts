import { spawn } from "node:child_process";
import { closeSync, openSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { connect as netConnect, type Socket } from "node:net";
import { PyroError } from "../core/errors.js";

/** Start time of a process in clock ticks since boot (field 22 of /proc/PID/stat), or null. */
export async function procStartTime(pid: number): Promise<string | null> {
  try {
    const stat = await readFile(`/proc/${pid}/stat`, "utf8");
    // The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return fields[19] ?? null;
  } catch {
    return null;
  }
}

/**
 * True when `pid` is alive and is the same process (start time matches): pid reuse safe.
 * A zombie is dead: a sandbox whose starter exited is reparented to pid 1, and where pid 1
 * does not reap (many containers and VMs), the dead sandbox would otherwise look alive forever.
 */
export async function sameProcessAlive(pid: unknown, startTime: unknown): Promise<boolean> {
  if (typeof pid !== "number" || typeof startTime !== "string") return false;
  let stat: string;
  try {
    stat = await readFile(`/proc/${pid}/stat`, "utf8");
  } catch {
    return false;
  }
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return fields[0] !== "Z" && fields[0] !== "X" && fields[19] === startTime;
}

/** Connects to a unix socket with a timeout. */
export function connectUnix(path: string, timeoutMs: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const sock = netConnect({ path });
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new PyroError("timeout", `connecting to ${path} timed out`));
    }, timeoutMs);
    sock.once("connect", () => {
      clearTimeout(timer);
      resolve(sock);
    });
    sock.once("error", (err) => {
      clearTimeout(timer);
      reject(err);
    });
  });
}

/**
 * Waits until the agent's socket accepts a connection, failing early (with the log tail)
 * if the sandbox process dies first.
 */
export async function waitForSocket(
  path: string,
  alive: () => Promise<boolean>,
  options: { timeoutMs: number; logFile?: string; what: string; signal?: AbortSignal },
): Promise<void> {
  const deadline = Date.now() + options.timeoutMs;
  let delay = 5;
  for (;;) {
    try {
      const s = await connectUnix(path, 1000);
      s.destroy();
      return;
    } catch {
      // not yet
    }
    if (options.signal?.aborted) throw new PyroError("cancelled", `${options.what} start was cancelled`);
    if (!(await alive())) {
      throw new PyroError(
        "backend_unavailable",
        `${options.what} exited during start: ${await logTail(options.logFile)}`,
      );
    }
    if (Date.now() > deadline) {
      throw new PyroError(
        "timeout",
        `${options.what} did not answer within ${options.timeoutMs} ms: ${await logTail(options.logFile)}`,
      );
    }
    await new Promise((r) => setTimeout(r, delay));
    delay = Math.min(delay * 2, 100);
  }
}

export async function logTail(file: string | undefined, lines = 5): Promise<string> {
  if (!file) return "(no log)";
  try {
    const text = (await readFile(file, "utf8")).trim();
    return text ? text.split("\n").slice(-lines).join(" | ") : "(empty log)";
  } catch {
    return "(no log)";
  }
}

/**
 * Spawns a process that outlives its parent: own session, stdio to a log file, unref'd.
 * Extra fds (e.g. a seccomp program for bwrap) are passed from index 3 on.
 */
export function spawnDetached(
  argv: readonly string[],
  options: {
    logFile: string;
    env?: NodeJS.ProcessEnv;
    cwd?: string;
    extraFds?: number[];
    stdinPipe?: boolean;
  },
): { pid: number; stdin: import("node:stream").Writable | null } {
  const [file, ...args] = argv;
  if (!file) throw new Error("spawnDetached: empty argv");
  const log = openSync(options.logFile, "a", 0o600);
  try {
    const child = spawn(file, args, {
      detached: true,
      stdio: [options.stdinPipe ? "pipe" : "ignore", log, log, ...(options.extraFds ?? [])],
      env: options.env ?? process.env,
      ...(options.cwd ? { cwd: options.cwd } : {}),
    });
    if (child.pid === undefined) throw new PyroError("backend_unavailable", `cannot start ${file}`);
    child.unref();
    // Do not let an open gate pipe keep the parent's event loop alive.
    (child.stdin as unknown as { unref?: () => void } | null)?.unref?.();
    return { pid: child.pid, stdin: child.stdin };
  } finally {
    closeSync(log);
  }
}

/** SIGTERM a process (it may close its files cleanly), then SIGKILL if it is still there after `graceMs`. */
export async function terminateAndWait(pid: number, startTime: string, graceMs: number): Promise<void> {
  if (!(await sameProcessAlive(pid, startTime))) return;
  try {
    process.kill(pid, "SIGTERM");
  } catch {
    return;
  }
  const until = Date.now() + graceMs;
  while (Date.now() < until) {
    if (!(await sameProcessAlive(pid, startTime))) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  await killAndWait(pid, startTime);
}

/** SIGKILL a process and wait (bounded) until it is gone. */
export async function killAndWait(pid: number, startTime: string, timeoutMs = 5000): Promise<void> {
  if (!(await sameProcessAlive(pid, startTime))) return;
  try {
    process.kill(pid, "SIGKILL");
  } catch {
    return;
  }
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const st = await readFile(`/proc/${pid}/stat`, "utf8").catch(() => null);
    // Gone, or a zombie (state Z) waiting for a parent that is not us.
    if (!st || st.slice(st.lastIndexOf(")") + 2).startsWith("Z")) return;
    await new Promise((r) => setTimeout(r, 10));
  }
}
