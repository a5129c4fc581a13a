import net, { type Socket } from "node:net";
import { splice } from "../agent/pipe.js";
import { type Decision, type Destination, normalizeDestHost, type Opened, openDestination } from "./gate.js";
import { createHttpSide, HEADERS_TIMEOUT_MS } from "./http-proxy.js";
import {
  ByteReader,
  methodReply,
  readGreeting,
  readRequest,
  reply,
  replyFor,
  SocksProtocolError,
} from "./socks.js";

/**
 * The host-side egress proxy of a workspace: one listener that speaks HTTP (CONNECT
 * and absolute-URI forwarding) and SOCKS5, told apart by the first byte (0x05 is
 * SOCKS). Every destination goes through the gate (gate.ts): policy by name, one
 * resolution, every address checked, one checked address dialled.
 *
 * It fails closed: a malformed request, a policy that throws or a name that resolves
 * anywhere forbidden gets a refusal and a closed connection, never a dial. Errors on
 * one client socket stay on that socket.
 */

export type { Decision, Destination } from "./gate.js";

export interface EgressProxyOptions {
  /** The policy, by name; asked once per request. May be async. */
  decide(dest: Destination): Decision | Promise<Decision>;
  /** Told of each refusal by policy or by address (not of lookup or connect failures). */
  onBlock(dest: Destination, reason: string): void;
  /** Name → addresses. Default: `dns.promises.lookup(host, {all: true, verbatim: true})`. */
  resolve?: (host: string) => Promise<string[]>;
  /**
   * TEST ONLY: names that resolve to the given address WITHOUT the address check (so a
   * test can reach a loopback server). It opens holes by design; it must only ever be
   * filled by test code, never from an environment variable, config file or user input.
   */
  testHosts?: ReadonlyMap<string, string>;
  /** Whether an address is this machine's own (default: its interfaces). Tests replace it. */
  ownAddress?: (ip: string) => boolean;
  /** Limit for the lookup and for the TCP connect, each. Default 10 s. */
  connectTimeoutMs?: number;
  /** The workspace id, to name in the "approve it with" line of refusals. Default `ID`. */
  workspaceId?: string;
  /** Debug lines (one per decision); stderr behind a switch is the caller's call. */
  log?: (line: string) => void;
}

export interface EgressProxy {
  /** Not yet listening: the caller calls `server.listen(unixPath)` or a TCP port. */
  server: net.Server;
  /** Stops listening and destroys every client and upstream socket. */
  close(): Promise<void>;
  stats(): { connections: number; blocked: number };
}

export function createEgressProxy(options: EgressProxyOptions): EgressProxy {
  const sockets = new Set<Socket>();
  const counters = { connections: 0, blocked: 0 };
  const track = (s: Socket) => {
    sockets.add(s);
    s.on("error", () => {});
    s.once("close", () => sockets.delete(s));
  };

  const open = async (asked: Destination): Promise<Opened> => {
    const opened = await openDestination(asked, options, track);
    // Report the canonical name (what `decide` saw), so an approval made from it matches.
    const dest = { host: normalizeDestHost(asked.host) ?? asked.host, port: asked.port };
    const shown = showTarget(dest);
    if (opened.ok) options.log?.(`egress: ${shown} → ${opened.address}`);
    else {
      options.log?.(`egress: ${shown} ${opened.refusal}: ${opened.reason}`);
      if (opened.refusal === "blocked") {
        counters.blocked++;
        try {
          options.onBlock(dest, opened.reason);
        } catch {
          // a failing observer must not change the answer to the client
        }
      }
    }
    return opened;
  };

  const refusalBody = (dest: Destination, opened: Extract<Opened, { ok: false }>) =>
    refusalText(
      { host: normalizeDestHost(dest.host) ?? dest.host, port: dest.port },
      opened,
      options.workspaceId ?? "ID",
    );
  const httpSide = createHttpSide({ open, refusalBody, splice });

  const server = net.createServer((socket) => {
    counters.connections++;
    track(socket);
    sniff(socket, (first) => {
      if (first === 0x05) void serveSocks(socket, open);
      else httpSide.emit("connection", socket);
    });
  });

  return {
    server,
    stats: () => ({ ...counters }),
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        httpSide.close();
        if (!server.listening) return resolve();
        server.close(() => resolve());
      }),
  };
}

/** Waits for the first chunk, puts it back, and reports its first byte. */
function sniff(socket: Socket, route: (first: number) => void): void {
  socket.setTimeout(HEADERS_TIMEOUT_MS, () => socket.destroy());
  socket.once("data", (chunk: Buffer) => {
    socket.pause();
    socket.setTimeout(0);
    socket.unshift(chunk);
    route(chunk[0]!);
    socket.resume();
  });
}

async function serveSocks(client: Socket, open: (d: Destination) => Promise<Opened>): Promise<void> {
  const reader = new ByteReader(client, HEADERS_TIMEOUT_MS);
  let dest: Destination;
  try {
    const acceptable = await readGreeting(reader);
    client.write(methodReply(acceptable));
    if (!acceptable) return void client.end();
    dest = await readRequest(reader);
  } catch (err) {
    reader.detach();
    if (err instanceof SocksProtocolError && err.reply !== undefined) client.end(reply(err.reply));
    else client.destroy();
    return;
  }
  const early = reader.detach();
  const opened = await open(dest);
  if (!opened.ok) return void client.end(reply(replyFor(opened.refusal)));
  if (client.destroyed) return void opened.socket.destroy();
  client.write(reply(0x00));
  if (early.length > 0) opened.socket.write(early);
  splice(client, opened.socket);
  client.resume();
}

function refusalText(dest: Destination, opened: Extract<Opened, { ok: false }>, workspaceId: string): string {
  const target = showTarget(dest);
  const reason = opened.reason.replace(/[\x00-\x1f\x7f]+/g, " ").slice(0, 300);
  if (opened.refusal === "blocked")
    return (
      `pyro egress proxy: connection to ${target} blocked: ${reason}\n` +
      `A human can approve it with: pyro workspace network approve ${workspaceId} ${target}\n`
    );
  if (opened.refusal === "bad_target") return `pyro egress proxy: bad target: ${reason}\n`;
  return `pyro egress proxy: cannot reach ${target}: ${reason}\n`;
}

/** `host:port` for messages, bracketing IPv6 and clipping what a client sent. */
function showTarget(dest: Destination): string {
  const host = dest.host.replace(/[^A-Za-z0-9.:_[\]-]/g, "?").slice(0, 100);
  return net.isIPv6(host) ? `[${host}]:${dest.port}` : `${host}:${dest.port}`;
}
