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
 */
import { closeSync, constants, openSync, readSync } from "node:fs";
import { readdir, readFile } from "node:fs/promises";
import net from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import { AgentError } from "../errors.js";

/**
 * How often an idle port checks whether a host connected: often right after a session
 * (clients tend to come back soon), backing off to IDLE_POLL_MAX_MS so an idle VM costs
 * almost no CPU (each check is a guest timer wake-up, expensive under emulation).
 */
const IDLE_POLL_MIN_MS = 5;
const IDLE_POLL_MAX_MS = 150;

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
async function waitForHost(
  dev: string,
  signal: AbortSignal,
): Promise<{ fd: number; first: Buffer | null } | null> {
  const buf = Buffer.alloc(64 * 1024);
  // Kept open while polling: every open and close of a port is a message to the host.
  const fd = openSync(dev, constants.O_RDWR | constants.O_NONBLOCK);
  let delay = IDLE_POLL_MIN_MS;
  while (!signal.aborted) {
    try {
      const n = readSync(fd, buf, 0, buf.length, null);
      if (n > 0) return { fd, first: Buffer.from(buf.subarray(0, n)) };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "EAGAIN") return { fd, first: null };
      closeSync(fd);
      throw err;
    }
    // 0: no host on the other end yet.
    await sleep(delay, undefined, { signal }).catch(() => {});
    delay = Math.min(IDLE_POLL_MAX_MS, Math.ceil(delay * 1.25));
  }
  closeSync(fd);
  return null;
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
    const host = await waitForHost(dev, signal);
    if (!host) return;
    const sock = socketOverFd(host.fd);
    if (host.first) sock.unshift(host.first);
    live.add(sock);
    log?.(`session on ${dev}`);
    try {
      await serve(sock);
    } finally {
      live.delete(sock);
      sock.destroy();
    }
  }
}
