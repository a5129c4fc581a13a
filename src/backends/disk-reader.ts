import { spawn } from "node:child_process";
import { readdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { Duplex } from "node:stream";
import { LAUNCH_ENV } from "./common.js";

/**
 * The disk reader's channel (WorkspaceBackend.openDisk): a read-only agent started as a
 * child process speaking the agent protocol on its stdin and stdout. Closing the channel
 * kills the reader's whole process group and then runs `cleanup` (temp images, temp
 * directories); its mounts live in its own mount namespace and die with it. Should this
 * process die first, the reader sees EOF on stdin and exits (bwrap --die-with-parent).
 */

/** Bytes of the reader's stderr kept for the error that says why it failed. */
const STDERR_KEEP = 4096;

const stderrOf = new WeakMap<Duplex, () => string>();

/**
 * What the reader behind `stream` printed on stderr (its start-up failure: a mount that
 * failed, a missing tool), or "" when it printed nothing or `stream` is not a reader.
 */
export function readerStderr(stream: Duplex): string {
  return stderrOf.get(stream)?.() ?? "";
}

export interface ReaderOptions {
  /** Descriptors passed as fd 3, 4, ... (the seccomp program); the caller closes its copies. */
  extraFds?: number[];
  /** Runs once after the reader exited (also when it never started). */
  cleanup?: () => Promise<void>;
  env?: NodeJS.ProcessEnv;
  cwd?: string;
}

/** Starts `argv` as a reader and returns its stdio as one byte channel. */
export function spawnReader(argv: readonly string[], options: ReaderOptions = {}): Duplex {
  const [file, ...args] = argv;
  if (!file) throw new Error("spawnReader: empty argv");
  const child = spawn(file, args, {
    stdio: ["pipe", "pipe", "pipe", ...(options.extraFds ?? [])],
    env: options.env ?? { ...LAUNCH_ENV },
    // Not the caller's directory (it may be inside something the reader must not see).
    cwd: options.cwd ?? "/",
    detached: true,
  });
  let stderr = "";
  child.stderr?.on("data", (c: Buffer) => {
    if (stderr.length < STDERR_KEEP) stderr = (stderr + c.toString("utf8")).slice(0, STDERR_KEEP);
  });
  const exited = new Promise<void>((resolve) => {
    child.once("close", () => resolve());
    child.once("error", (err) => {
      stderr ||= `cannot start ${file}: ${err.message}`;
      resolve();
    });
  });
  const stream = Duplex.from({ readable: child.stdout!, writable: child.stdin! });
  stderrOf.set(stream, () => stderr.trim());
  // Cleanup once the reader is gone, whoever ended it.
  readerDone.set(
    stream,
    exited.then(() => options.cleanup?.()).catch(() => {}),
  );
  stream.once("close", () => {
    if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
    try {
      process.kill(-child.pid, "SIGKILL");
    } catch {
      // already gone
    }
  });
  // A reader that exits ends the channel (the client sees the EOF).
  void exited.then(() => {
    if (!stream.destroyed) stream.destroy();
  });
  return stream;
}

/**
 * Closes `stream` and waits until its reader has exited and cleaned up (at most
 * `timeoutMs`): a caller that reads a disk twice in a row must not find the first
 * reader's temp files or loop devices still there.
 */
export async function closeReader(stream: Duplex, timeoutMs = 10_000): Promise<void> {
  const done = readerDone.get(stream);
  stream.destroy();
  if (done) await Promise.race([done, new Promise((r) => setTimeout(r, timeoutMs).unref())]).catch(() => {});
}

const readerDone = new WeakMap<Duplex, Promise<void>>();

/**
 * Removes the entries of `dir` named `<prefix><pid>-...` whose process is gone: what a
 * reader's caller that was killed left (its temp directory, a VM image copy).
 */
export async function sweepStale(dir: string, prefix: string): Promise<void> {
  for (const name of await readdir(dir).catch(() => [])) {
    if (!name.startsWith(prefix)) continue;
    const pid = Number(name.slice(prefix.length).split("-")[0]);
    if (!Number.isInteger(pid) || pid <= 0 || pid === process.pid || alive(pid)) continue;
    await rm(join(dir, name), { recursive: true, force: true });
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}
