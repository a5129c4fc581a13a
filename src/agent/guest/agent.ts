/**
 * Starting the agent: argument parsing and the two ways of being reached (a unix
 * socket serving every connection, or one session over stdin/stdout). Kept apart
 * from main.ts so tests can start an agent in-process.
 */

import { setMaxListeners } from "node:events";
import { chmod, lstat, mkdir, stat, unlink } from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { Duplex, type Readable, type Writable } from "node:stream";
import { AgentError } from "../errors.js";
import { serveConnection } from "../server.js";
import {
  configureApt,
  type NetHelper,
  serveEgress,
  serveForward,
  serveNetMux,
  serveNetMuxOn,
} from "./net.js";
import { BUILTIN_OPS, type OpHandlers } from "./ops/index.js";
import { forgetServicesOf, killServicesOf } from "./ops/services.js";
import { closeShellsOf } from "./ops/shells.js";
import { Workspace } from "./paths.js";
import { findPorts, servePort } from "./serial.js";

/** Parsed command line of the guest agent. */
export interface GuestOptions {
  root: string;
  /** Unix socket path to listen on; exclusive with `stdio`. */
  listen?: string;
  stdio?: boolean;
  /** Scratch directory outside the workspace (default: the OS temp dir). */
  tmpDir?: string;
  /** Another absolute name accepted for the root, e.g. /workspace when the root is a host directory. */
  alias?: string;
  /** Serve every virtio-serial port whose name starts with this (inside a QEMU VM). */
  serial?: string;
  /** Inside a pyro microVM: the agent disk's mount point (enables the vm_* ops). */
  vm?: string;
  /**
   * Run commands at a low priority (nice 19, ops/exec.ts): set by backends whose agent
   * shares a cgroup (and its CPU quota) with the commands, so a fork bomb cannot starve
   * the agent. Never on host-compat, where it would put commands below host processes.
   */
  idleCommands?: boolean;
  /** The host proxy's socket: serve 127.0.0.1:3128 forwarding to it (guest/net.ts). */
  egress?: string;
  /**
   * The host listens on 127.0.0.1:3128 in this sandbox's network namespace itself
   * (core/netd-attach.ts): serve no egress, only point apt at it.
   */
  hostEgress?: boolean;
  /** A unix socket to serve published ports on (guest/net.ts). */
  forward?: string;
  /** Inside a VM: serve egress and published ports over the virtio-serial port with this name (guest/net.ts). */
  netMux?: string;
  /** Inside a Firecracker VM: serve the network mux on connections to this unix socket. */
  netListen?: string;
  /**
   * Serve only the ops that read (ping, info, file_list, file_read, tar_out): the disk
   * reader of a stopped workspace (backends/disk-reader.ts), whose tree is read-only anyway.
   */
  readOnly?: boolean;
}

/** The ops a `--read-only` agent serves; every other op is refused before it runs. */
export const READ_ONLY_OPS = ["ping", "info", "file_list", "file_read", "tar_out"] as const;

export const USAGE =
  "usage: main.js --root DIR (--listen SOCKET | --stdio | --serial PORT_PREFIX) [--tmp DIR] [--alias PATH] [--vm DIR] [--idle-commands] [--egress SOCKET | --host-egress] [--forward SOCKET] [--net-mux PORT_NAME] [--net-listen SOCKET] [--read-only]";

/** Parses `--root DIR (--listen PATH | --stdio) [--tmp DIR]`; throws `invalid_argument`. */
export function parseGuestArgs(argv: readonly string[]): GuestOptions {
  const opts: Partial<GuestOptions> = {};
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const value = () => {
      const v = argv[++i];
      if (v === undefined || v.startsWith("--"))
        throw new AgentError("invalid_argument", `${arg} needs a value; ${USAGE}`);
      return v;
    };
    if (arg === "--root") opts.root = value();
    else if (arg === "--listen") opts.listen = value();
    else if (arg === "--tmp") opts.tmpDir = value();
    else if (arg === "--alias") opts.alias = value();
    else if (arg === "--serial") opts.serial = value();
    else if (arg === "--vm") opts.vm = value();
    else if (arg === "--egress") opts.egress = value();
    else if (arg === "--forward") opts.forward = value();
    else if (arg === "--net-mux") opts.netMux = value();
    else if (arg === "--net-listen") opts.netListen = value();
    else if (arg === "--stdio") opts.stdio = true;
    else if (arg === "--idle-commands") opts.idleCommands = true;
    else if (arg === "--host-egress") opts.hostEgress = true;
    else if (arg === "--read-only") opts.readOnly = true;
    else throw new AgentError("invalid_argument", `unknown argument '${arg}'; ${USAGE}`);
  }
  if (!opts.root) throw new AgentError("invalid_argument", `--root is required; ${USAGE}`);
  if ([opts.listen, opts.stdio, opts.serial].filter(Boolean).length !== 1)
    throw new AgentError("invalid_argument", `give exactly one of --listen, --stdio and --serial; ${USAGE}`);
  return opts as GuestOptions;
}

/** BUILTIN_OPS with every op outside READ_ONLY_OPS answering `invalid_argument`. */
function readOnlyHandlers(): OpHandlers {
  const refuse = async () => {
    throw new AgentError("invalid_argument", "this agent serves a read-only view: only reads are possible");
  };
  const handlers = Object.fromEntries(
    Object.keys(BUILTIN_OPS).map((op) => [op, refuse]),
  ) as unknown as OpHandlers;
  for (const op of READ_ONLY_OPS) (handlers as Record<string, unknown>)[op] = BUILTIN_OPS[op];
  return handlers;
}

/** A running agent. */
export interface GuestHandle {
  /** Stops accepting connections and closes open ones (their ops are cancelled). */
  close(): Promise<void>;
  /** Settles when the agent has nothing more to serve (stdio: the session ended). */
  done: Promise<void>;
}

/**
 * Debug logging to stderr, only when PYRO_AGENT_DEBUG is set: stdout may be the channel.
 * The one `PYRO_*` read outside src/core/config.ts: the agent runs inside the guest,
 * imports nothing from above agent/, and reads the guest's own environment.
 */
export function debugLog(env: NodeJS.ProcessEnv = process.env): ((line: string) => void) | undefined {
  if (!env.PYRO_AGENT_DEBUG) return undefined;
  return (line) => process.stderr.write(`pyro-agent[${process.pid}]: ${line}\n`);
}

/** Removes a leftover socket file, refusing to delete anything that is not a socket. */
async function removeStaleSocket(socketPath: string): Promise<void> {
  const st = await lstat(socketPath).catch(() => null);
  if (!st) return;
  if (!st.isSocket())
    throw new AgentError("conflict", `${socketPath} exists and is not a socket; refusing to replace it`);
  await unlink(socketPath);
}

/**
 * Makes the socket owner-only. gVisor's host-backed sockets (`runsc --host-uds`)
 * refuse chmod and even stat from inside the sandbox; such a socket is still private when
 * its directory is (mode 0700: nobody else can reach the name), so that is accepted.
 * Anything else fails closed.
 */
async function restrictToOwner(socketPath: string): Promise<void> {
  try {
    await chmod(socketPath, 0o600);
  } catch (err) {
    const dir = await stat(path.dirname(socketPath)).catch(() => null);
    if (!dir || (dir.mode & 0o077) !== 0) throw err;
  }
}

/** The egress listener and the published-port socket, when asked for (guest/net.ts). */
async function startNetHelpers(opts: GuestOptions): Promise<NetHelper[]> {
  const helpers: NetHelper[] = [];
  if (opts.egress) {
    helpers.push(await serveEgress(opts.egress));
    await configureApt();
  } else if (opts.hostEgress) await configureApt();
  if (opts.netListen) {
    await removeStaleSocket(opts.netListen);
    helpers.push(await serveNetMuxOn(opts.netListen));
    await restrictToOwner(opts.netListen);
    await configureApt();
  }
  if (opts.forward) {
    await removeStaleSocket(opts.forward);
    helpers.push(await serveForward(opts.forward));
    await restrictToOwner(opts.forward);
  }
  return helpers;
}

/**
 * The VM's network helper on the port named `name`; a VM started without that port (an
 * older machine) has no network, which the host refuses to configure anyway.
 */
async function startNetMux(
  name: string,
  signal: AbortSignal,
  log?: (line: string) => void,
): Promise<NetHelper | null> {
  const [dev] = (await findPorts(name)).filter(Boolean);
  if (!dev) {
    log?.(`no virtio-serial port named ${name}: no network`);
    return null;
  }
  const helper = await serveNetMux(dev, signal, log);
  await configureApt();
  return helper;
}

/** --serial: every virtio-serial port named with the prefix, and the network port (--net-mux). */
async function serveSerial(
  opts: GuestOptions & { serial: string },
  serve: (stream: net.Socket) => Promise<unknown>,
  log: ((line: string) => void) | undefined,
  root: string,
): Promise<GuestHandle> {
  const ports = await findPorts(opts.serial);
  if (ports.length === 0) throw new AgentError("not_found", `no virtio-serial port named ${opts.serial}*`);
  const stop = new AbortController();
  // Each port waits on the signal (plus its idle timer): more than Node's default 10.
  setMaxListeners(4 * ports.length + 10, stop.signal);
  const done = Promise.all(ports.map((dev) => servePort(dev, serve, stop.signal, log))).then(() => undefined);
  log?.(`serving ${ports.length} serial ports, root ${root}`);
  const network = opts.netMux ? await startNetMux(opts.netMux, stop.signal, log) : null;
  return {
    done,
    close: async () => {
      stop.abort();
      await network?.close();
      await done;
    },
  };
}

/** Starts an agent as described by `opts`. `io` replaces stdin/stdout in stdio mode. */
export async function startGuest(
  opts: GuestOptions,
  io: { input: Readable; output: Writable } = { input: process.stdin, output: process.stdout },
  log = debugLog(),
): Promise<GuestHandle> {
  const workspace = await Workspace.open(path.resolve(opts.root), opts.alias);
  // A spool directory of its own (bwrap's in-place reset leaves it out of the root
  // layer's signature and has the agent empty it).
  if (opts.tmpDir) await mkdir(opts.tmpDir, { recursive: true, mode: 0o700 });
  const handle = await serveGuest(workspace, opts, io, log);
  // A closing guest ends its services (in a sandbox they would die with it; in-process
  // guests and host-compat's are host processes).
  return {
    done: handle.done,
    close: async () => {
      killServicesOf(workspace);
      await closeShellsOf(workspace);
      await handle.close();
      forgetServicesOf(workspace);
    },
  };
}

async function serveGuest(
  workspace: Workspace,
  opts: GuestOptions,
  io: { input: Readable; output: Writable },
  log: ((line: string) => void) | undefined,
): Promise<GuestHandle> {
  const serve = (stream: Duplex) =>
    serveConnection(stream, {
      workspace,
      handlers: opts.readOnly ? readOnlyHandlers() : BUILTIN_OPS,
      tmpDir: opts.tmpDir ?? os.tmpdir(),
      ...(log ? { log } : {}),
      ...(opts.vm ? { vmDir: opts.vm } : {}),
      ...(opts.idleCommands ? { idleCommands: true } : {}),
    });

  if (opts.serial) return serveSerial({ ...opts, serial: opts.serial }, serve, log, workspace.givenRoot);

  if (opts.stdio) {
    const stream = Duplex.from({ readable: io.input, writable: io.output });
    const done = serve(stream).then(() => undefined);
    return {
      done,
      close: async () => {
        stream.destroy();
        await done;
      },
    };
  }

  const socketPath = opts.listen!;
  await removeStaleSocket(socketPath);
  const helpers = await startNetHelpers(opts);
  const sessions = new Set<Promise<unknown>>();
  const sockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    sockets.add(socket);
    const session = serve(socket).finally(() => {
      sockets.delete(socket);
      sessions.delete(session);
    });
    sessions.add(session);
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(socketPath, () => {
      server.off("error", reject);
      resolve();
    });
  });
  // Only the owner (and root) may talk to the agent.
  await restrictToOwner(socketPath);
  log?.(`listening on ${socketPath}, root ${workspace.givenRoot}`);
  const done = new Promise<void>((resolve) => server.once("close", () => resolve()));
  return {
    done,
    close: async () => {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      for (const socket of sockets) socket.destroy();
      await Promise.allSettled(helpers.map((h) => h.close()));
      await Promise.allSettled([...sessions]);
      await closed;
    },
  };
}
