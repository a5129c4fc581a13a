/**
 * The agent's channel inside a QEMU VM: virtio-serial ports, each one byte stream that a
 * host process connects to through a unix socket QEMU listens on. Each port serves one
 * session at a time; several ports give several concurrent host connections.
 *
 * A port is a character device. Node's file streams would read it with blocking reads on
 * the thread pool; instead the fd is opened non-blocking and wrapped in a libuv pipe
 * handle, so reads and writes go through epoll like a socket (~2.4 ms round trips
 * measured, see MACHINE.md). While no host is connected, the port reads as EOF at once
 * (and polls as hung up), so between sessions the port is probed on a timer: EAGAIN
 * means a host is connected (the session starts), 0 means nobody yet. The kernel's
 * SIGIO on host connect would avoid the timer, but Node cannot set O_ASYNC on an fd.
 *
 * The driver (virtio_console) learns that a host connected from a control message it
 * handles later, in a workqueue, while the host's first bytes are readable as soon as
 * they arrive. A session started on those bytes alone would answer while the port still
 * says no host is there: the write would wait, the next read would see EOF, and the
 * session would end with the host's handshake swallowed (the host then waits out its
 * timeout). So bytes read before the host is seen are kept, and the session starts
 * once a read says a host is there (EAGAIN), with them.
 */
import { closeSync, constants, openSync, readSync } from "node:fs";
import { readdir, readFile } from "node:fs/promises";
import net from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import { AgentError } from "../errors.js";

/**
 * Idle ports are checked together, by one timer: each check is a guest timer wake-up,
 * expensive under emulation, so one wake-up covers every port. Quick (IDLE_POLL_MIN_MS)
 * while a session started or ended in the last BUSY_WINDOW_MS (clients tend to come back
 * at once, on another port: the one they released is resting, see
 * src/backends/qemu/ports.ts), backing off to IDLE_POLL_MAX_MS when idle.
 */
const IDLE_POLL_MIN_MS = 10;
const IDLE_POLL_MAX_MS = 100;
const BUSY_WINDOW_MS = 2000;

/** Monotonic time of the last session start or end on any port (the wall clock jumps after a restore). */
let lastActivity = performance.now();

/**
 * Bytes read before their host was seen are dropped after this long without it: the
 * host gave up (connected, wrote and left before the guest handled its connect), and
 * they must not open the next host's session. The driver's workqueue takes far less.
 */
const EARLY_MAX_MS = 30_000;

interface Waiter {
  fd: number;
  /** Bytes read while no host was seen yet, and when the first of them came. */
  early: Buffer[];
  earlyAt: number;
  resolve: (host: { fd: number; first: Buffer | null }) => void;
  reject: (err: Error) => void;
}

const waiting = new Map<string, Waiter>();
let timer: NodeJS.Timeout | null = null;
let delay = IDLE_POLL_MIN_MS;
const readBuf = Buffer.alloc(64 * 1024);

/** One pass over every waiting port; reschedules itself while any port waits. */
function pollAll(): void {
  timer = null;
  for (const [dev, w] of waiting) {
    try {
      for (let n = readSync(w.fd, readBuf, 0, readBuf.length, null); n > 0; ) {
        if (w.early.length === 0) w.earlyAt = performance.now();
        w.early.push(Buffer.from(readBuf.subarray(0, n)));
        n = readSync(w.fd, readBuf, 0, readBuf.length, null);
      }
      // 0: no host seen on the other end yet (bytes read so far wait for it).
      if (w.early.length > 0 && performance.now() - w.earlyAt > EARLY_MAX_MS) w.early = [];
    } catch (err) {
      waiting.delete(dev);
      if ((err as NodeJS.ErrnoException).code === "EAGAIN")
        w.resolve({ fd: w.fd, first: w.early.length > 0 ? Buffer.concat(w.early) : null });
      else {
        closeSync(w.fd);
        w.reject(err as Error);
      }
    }
  }
  delay =
    performance.now() - lastActivity < BUSY_WINDOW_MS
      ? IDLE_POLL_MIN_MS
      : Math.min(IDLE_POLL_MAX_MS, Math.ceil(delay * 1.25));
  schedule();
}

function schedule(): void {
  if (timer || waiting.size === 0) return;
  timer = setTimeout(pollAll, delay);
}

/** Marks session activity: idle ports poll quickly for a while. */
function active(): void {
  lastActivity = performance.now();
  delay = IDLE_POLL_MIN_MS;
  if (timer && waiting.size > 0) {
    clearTimeout(timer);
    timer = null;
    schedule();
  }
}

/** Device paths of the virtio-serial ports whose name starts with `prefix`, sorted by name. */
export async function findPorts(prefix: string, sysDir = "/sys/class/virtio-ports"): Promise<string[]> {
  const found: { name: string; dev: string }[] = [];
  for (const entry of await readdir(sysDir).catch(() => [])) {
    const name = (await readFile(`${sysDir}/${entry}/name`, "utf8").catch(() => "")).trim();
    if (name.startsWith(prefix)) found.push({ name, dev: `/dev/${entry}` });
  }
  return found.sort((a, b) => a.name.localeCompare(b.name, "en", { numeric: true })).map((p) => p.dev);
}

interface PipeHandle {
  open(fd: number): number;
}

/** A socket over an open character-device fd (non-blocking), via a libuv pipe handle. */
function socketOverFd(fd: number): net.Socket {
  // pipe_wrap is the documented-legacy way to give libuv an arbitrary pollable fd.
  const binding = (process as unknown as { binding(name: string): unknown }).binding("pipe_wrap") as {
    Pipe: new (type: number) => PipeHandle;
    constants: { SOCKET: number };
  };
  const handle = new binding.Pipe(binding.constants.SOCKET);
  const err = handle.open(fd);
  if (err < 0) throw new AgentError("internal", `cannot wrap the serial port (uv error ${err})`);
  return new net.Socket({ handle, readable: true, writable: true } as net.SocketConstructorOpts);
}

/**
 * Waits until a host is connected to the port, returning its fd and any bytes already
 * read. Resolves null when `signal` aborts.
 */
function waitForHost(dev: string, signal: AbortSignal): Promise<{ fd: number; first: Buffer | null } | null> {
  if (signal.aborted) return Promise.resolve(null);
  // Kept open while polling: every open and close of a port is a message to the host.
  const fd = openSync(dev, constants.O_RDWR | constants.O_NONBLOCK);
  return new Promise((resolve, reject) => {
    const onAbort = () => {
      if (waiting.get(dev)?.fd !== fd) return;
      waiting.delete(dev);
      closeSync(fd);
      resolve(null);
    };
    signal.addEventListener("abort", onAbort, { once: true });
    waiting.set(dev, {
      fd,
      early: [],
      earlyAt: 0,
      resolve: (host) => {
        signal.removeEventListener("abort", onAbort);
        resolve(host);
      },
      reject: (err) => {
        signal.removeEventListener("abort", onAbort);
        reject(err);
      },
    });
    schedule();
  });
}

/**
 * Serves sessions on one port until `signal` aborts: wait for a host, run `serve` on the
 * stream, and when the host hangs up (EOF) start over on a fresh open of the port.
 */
export async function servePort(
  dev: string,
  serve: (stream: net.Socket) => Promise<unknown>,
  signal: AbortSignal,
  log?: (line: string) => void,
): Promise<void> {
  const live = new Set<net.Socket>();
  signal.addEventListener("abort", () => {
    for (const s of live) s.destroy();
  });
  while (!signal.aborted) {
    let host: Awaited<ReturnType<typeof waitForHost>>;
    try {
      host = await waitForHost(dev, signal);
    } catch (err) {
      // One port failing must not take the others (or the agent) down: retry it later.
      log?.(`${dev}: ${(err as Error).message}`);
      await sleep(1000, undefined, { signal }).catch(() => {});
      continue;
    }
    if (!host) return;
    const sock = socketOverFd(host.fd);
    if (host.first) sock.unshift(host.first);
    // The host hung up: release the port at once, even while ops are still winding down,
    // so the next host's first bytes go to a fresh session (not a closing one).
    sock.once("end", () => sock.destroy());
    live.add(sock);
    active();
    log?.(`session on ${dev}`);
    try {
      await serve(sock);
    } finally {
      live.delete(sock);
      sock.destroy();
      active();
    }
  }
}
