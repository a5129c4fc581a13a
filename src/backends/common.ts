import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { closeSync, type FSWatcher, openSync, readFileSync, watch } from "node:fs";
import { link, lstat, mkdir, open, readFile, unlink } from "node:fs/promises";
import { type NetConnectOpts, connect as netConnect, type Socket } from "node:net";
import { dirname, join } from "node:path";
import { PyroError } from "../errors.js";
import { FORWARD_SOCKET } from "./guest.js";
import { withSocketPath } from "./sockpath.js";

/**
 * The fields of a /proc/PID/stat text after the command name, state first (field 3 of
 * proc(5) is index 0). The name (field 2) may hold spaces and parentheses: split after
 * the last ')'.
 */
export function statFields(stat: string): string[] {
  return stat.slice(stat.lastIndexOf(")") + 2).split(" ");
}

/** Start time of a process in clock ticks since boot (field 22 of /proc/PID/stat), or null. */
export async function procStartTime(pid: number): Promise<string | null> {
  try {
    const stat = await readFile(`/proc/${pid}/stat`, "utf8");
    return statFields(stat)[19] ?? null;
  } catch {
    return null;
  }
}

/**
 * True when `pid` is alive and is the same process (start time matches): pid reuse safe.
 * A zombie is dead: a sandbox whose starter exited is reparented to pid 1, and where pid 1
 * does not reap (many containers and VMs), the dead sandbox would otherwise look alive forever.
 * Read synchronously: every call on a workspace checks its sandbox this way (refreshState),
 * and an async readFile of a /proc file costs ~0.4 ms of thread-pool round trips where a
 * sync read takes ~0.03 ms (procfs answers from memory; it does not block on a disk).
 */
export async function sameProcessAlive(pid: unknown, startTime: unknown): Promise<boolean> {
  if (typeof pid !== "number" || typeof startTime !== "string") return false;
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  } catch {
    return false;
  }
  const fields = statFields(stat);
  return fields[0] !== "Z" && fields[0] !== "X" && fields[19] === startTime;
}

/**
 * Connects to a unix socket with a timeout. Paths longer than a socket address holds
 * (107 bytes: a deep PYRO_HOME reaches that) go through the socket's directory's
 * descriptor (see withSocketPath).
 */
export function connectUnix(path: string, timeoutMs: number): Promise<Socket> {
  return withSocketPath(path, (usable) => connectWithin({ path: usable }, path, timeoutMs));
}

/**
 * The directory beside a sandbox's socket directory where the host links the agent's
 * socket before connecting: `<dir>/sock/agent.sock` → `<dir>/hostlink/`. It is never
 * mounted into the sandbox.
 */
export function hostLinkDir(socketPath: string): string {
  return join(dirname(dirname(socketPath)), "hostlink");
}

/**
 * Connects to an agent socket that lives in a directory the sandbox can write, without
 * ever following a path the sandbox controls. The sandbox could replace `agent.sock` by a
 * symlink to any host socket (a Docker socket, another workspace's agent) and make the
 * host connect there. So the socket is hard-linked into a host-only directory first
 * (link(2) does not follow a symlink: a symlink is linked as a symlink, and a link
 * cannot cross the sandbox's mount), checked to be a socket there, and connected through
 * that link, which the sandbox cannot touch. What answers is still treated as hostile:
 * the protocol client bounds every frame.
 */
export async function connectSandboxSocket(path: string, timeoutMs: number): Promise<Socket> {
  const dir = hostLinkDir(path);
  await mkdir(dir, { recursive: true, mode: 0o700 });
  // Short: the whole path must fit a socket address where it can (see connectUnix).
  const linked = join(dir, `s.${randomBytes(6).toString("hex")}`);
  try {
    await link(path, linked);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    // ENOENT: nothing there yet. Anything else (EXDEV, EPERM on a directory): not a socket.
    if (code === "ENOENT") throw err;
    throw tampered(path, `cannot link it (${code})`);
  }
  try {
    const st = await lstat(linked);
    if (!st.isSocket()) throw tampered(path, st.isSymbolicLink() ? "it is a symlink" : "it is not a socket");
    return await connectUnix(linked, timeoutMs);
  } finally {
    await unlink(linked).catch(() => {});
  }
}

function tampered(path: string, why: string): PyroError {
  return new PyroError(
    "backend_unavailable",
    `refusing the sandbox's agent socket ${path}: ${why}`,
    "something in the sandbox replaced the agent's socket; stop and start the workspace",
  );
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
  // The socket's directory is watched, so a try follows the agent's bind at once instead
  // of up to one poll later (the polls stay: inotify can miss or be unavailable).
  const wake = watchDir(dirname(path));
  try {
    await waitLoop();
  } finally {
    wake.close();
  }

  async function waitLoop(): Promise<void> {
    for (;;) {
      try {
        const s = await connectSandboxSocket(path, 1000);
        s.destroy();
        return;
      } catch (err) {
        // Not yet; a tampered socket is final.
        if (err instanceof PyroError && err.code === "backend_unavailable") throw err;
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
      await wake.next(delay);
      // A try is a connect and a /proc read: cheap enough to keep the overshoot small
      // (an agent answers a few hundred ms after its sandbox starts).
      delay = Math.min(delay * 2, 20);
    }
  }
}

/**
 * Wakes a waiter when an entry of `dir` changes, or after `ms`, whichever comes first.
 * Where the directory cannot be watched, it is a plain sleep.
 */
function watchDir(dir: string): { next(ms: number): Promise<void>; close(): void } {
  let wakeUp: (() => void) | null = null;
  let watcher: FSWatcher | null = null;
  try {
    watcher = watch(dir, () => wakeUp?.());
    watcher.on("error", () => {});
  } catch {
    watcher = null;
  }
  return {
    next: (ms) =>
      new Promise<void>((resolve) => {
        const timer = setTimeout(done, ms);
        function done(): void {
          clearTimeout(timer);
          wakeUp = null;
          resolve();
        }
        wakeUp = done;
      }),
    close: () => watcher?.close(),
  };
}

/** Bytes read from the end of a log for {@link logTail}: sandbox logs are sandbox-written. */
const LOG_TAIL_BYTES = 4096;

/** The last lines of a log file (at most its last 4 KiB), for error messages. */
export async function logTail(file: string | undefined, lines = 5): Promise<string> {
  if (!file) return "(no log)";
  try {
    const fh = await open(file, "r");
    try {
      const { size } = await fh.stat();
      const start = Math.max(0, size - LOG_TAIL_BYTES);
      const buf = Buffer.alloc(size - start);
      await fh.read(buf, 0, buf.length, start);
      const text = buf.toString("utf8").trim();
      return text ? text.split("\n").slice(-lines).join(" | ") : "(empty log)";
    } finally {
      await fh.close();
    }
  } catch {
    return "(no log)";
  }
}

/**
 * The environment of every process pyro starts on the host's behalf (sandbox launchers,
 * VMMs, the host-compat agent): nothing of the caller's environment, which holds API
 * keys and tokens. A sandbox's pid 1 (bwrap's init) keeps the environment it was started
 * with, readable inside from /proc/1/environ.
 */
export const LAUNCH_ENV: Readonly<NodeJS.ProcessEnv> = Object.freeze({
  PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
  LANG: "C.UTF-8",
});

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
      env: options.env ?? { ...LAUNCH_ENV },
      // Not the caller's directory: a shell in the launch step would export it as PWD.
      cwd: options.cwd ?? "/",
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
    if (!st || statFields(st)[0] === "Z") return;
    await new Promise((r) => setTimeout(r, 10));
  }
}

/**
 * A channel to 127.0.0.1:`port` in a sandbox whose agent serves published ports on
 * FORWARD_SOCKET beside its `agentSocket` (agent/guest/net.ts): the socket is reached
 * like the agent's (connectSandboxSocket), then told the port.
 */
export async function connectForward(agentSocket: string, port: number, timeoutMs: number): Promise<Socket> {
  return connectForwardIn(dirname(agentSocket), port, timeoutMs);
}

/** connectForward for a sandbox whose forward socket is in `sockDir` (no agent socket beside it). */
export async function connectForwardIn(sockDir: string, port: number, timeoutMs: number): Promise<Socket> {
  const sock = await connectSandboxSocket(join(sockDir, FORWARD_SOCKET), timeoutMs);
  sock.write(`${port}\n`);
  return sock;
}

/** A TCP connection with a timeout. */
export function connectTcp(host: string, port: number, timeoutMs: number): Promise<Socket> {
  return connectWithin({ host, port }, `${host}:${port}`, timeoutMs);
}

/** A connection that fails with `timeout` when it is not made within `timeoutMs`. */
function connectWithin(where: NetConnectOpts, label: string, timeoutMs: number): Promise<Socket> {
  return new Promise<Socket>((resolve, reject) => {
    const sock = netConnect(where);
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new PyroError("timeout", `connecting to ${label} timed out`));
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
