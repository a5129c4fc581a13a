/**
 * The agent's two network helpers inside a sandbox that has no network but loopback
 * (docs/network.md):
 *
 * - Egress: a listener on 127.0.0.1:EGRESS_PORT that forwards every connection, byte for
 *   byte, to the host's proxy socket bound into the sandbox. The host proxy speaks HTTP
 *   (CONNECT and absolute URIs) and SOCKS5 on the same socket and applies the policy;
 *   this side decides nothing. While the policy is `off` the socket is absent and every
 *   connection is closed at once.
 * - Forward: a unix socket the host connects to for a published port. The host writes
 *   one line, the guest port in decimal and `\n`; the agent dials 127.0.0.1:PORT and
 *   pipes both ways. A bad line or a refused dial closes the connection.
 */
import { stat, writeFile } from "node:fs/promises";
import net from "node:net";
import { NetMux } from "../netmux.js";
import { listen, splice, spliceTo } from "../pipe.js";
import { servePort } from "./serial.js";

/** Where commands find the proxy: HTTP_PROXY, HTTPS_PROXY and ALL_PROXY point here. */
export const EGRESS_PORT = 3128;

/** The longest header line the forward socket accepts ("65535\n" is six bytes). */
const MAX_FORWARD_LINE = 8;

/** A closable listener. */
export interface NetHelper {
  close(): Promise<void>;
}

function listening(server: net.Server, sockets: Set<net.Socket>): NetHelper {
  server.on("connection", (s) => {
    sockets.add(s);
    s.once("close", () => sockets.delete(s));
  });
  return {
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

/** Serves 127.0.0.1:`port`, forwarding each connection to the unix socket `proxySocket`. */
export async function serveEgress(proxySocket: string, port = EGRESS_PORT): Promise<NetHelper> {
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    spliceTo(client, { path: proxySocket });
  });
  const helper = listening(server, sockets);
  await listen(server, { host: "127.0.0.1", port });
  return helper;
}

/**
 * Inside a VM (no socket can be bound in from the host): egress on 127.0.0.1:`port` and
 * published ports go over the network mux (agent/netmux.ts) on the virtio-serial port
 * `dev`, one host session at a time. A connection made while no host is attached is
 * closed at once.
 */
export async function serveNetMux(
  dev: string,
  signal: AbortSignal,
  log?: (line: string) => void,
  port = EGRESS_PORT,
): Promise<NetHelper> {
  return serveMuxSessions((serve) => servePort(dev, serve, signal, log), port);
}

/**
 * The same over a unix socket (Firecracker: its vsock bridge forwards the host's
 * connections on NET_VSOCK_PORT here). The newest connection is the session; an older
 * one is closed.
 */
export async function serveNetMuxOn(path: string, port = EGRESS_PORT): Promise<NetHelper> {
  const sockets = new Set<net.Socket>();
  let serve: ((wire: net.Socket) => Promise<void>) | null = null;
  let previous: net.Socket | null = null;
  const server = net.createServer((wire) => {
    wire.on("error", () => {});
    previous?.destroy();
    previous = wire;
    void serve?.(wire);
  });
  const listener = listening(server, sockets);
  await listen(server, { path });
  const mux = await serveMuxSessions(async (s) => {
    serve = s;
  }, port);
  return {
    close: async () => {
      await listener.close();
      await mux.close();
    },
  };
}

/** Egress on 127.0.0.1:`port` into whichever mux session `sessions` currently serves. */
async function serveMuxSessions(
  sessions: (serve: (wire: net.Socket) => Promise<void>) => Promise<void>,
  port: number,
): Promise<NetHelper> {
  let current: NetMux | null = null;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    client.on("error", () => {});
    if (!current) return void client.destroy();
    current.open({ kind: "egress" }, client).catch(() => {});
  });
  const helper = listening(server, sockets);
  await listen(server, { host: "127.0.0.1", port });
  const dial = (p: number) =>
    new Promise<net.Socket>((resolve, reject) => {
      const s = net.connect({ host: "127.0.0.1", port: p });
      s.once("connect", () => resolve(s));
      s.once("error", reject);
    });
  const running = sessions(async (wire) => {
    const mux = new NetMux(wire, "guest", async (req) => {
      if (req.kind !== "port") throw new Error("the guest serves ports only");
      return dial(req.port);
    });
    current = mux;
    await mux.closed;
    if (current === mux) current = null;
  });
  return {
    close: async () => {
      await helper.close();
      await running.catch(() => {});
    },
  };
}

/** Serves the unix socket `path` for published ports (see the module comment). */
export async function serveForward(path: string): Promise<NetHelper> {
  const sockets = new Set<net.Socket>();
  const server = net.createServer((host) => {
    host.on("error", () => host.destroy());
    let head = Buffer.alloc(0);
    const onData = (chunk: Buffer) => {
      head = Buffer.concat([head, chunk]);
      const nl = head.indexOf(10);
      if (nl < 0) {
        if (head.length > MAX_FORWARD_LINE) host.destroy();
        return;
      }
      host.off("data", onData);
      host.pause();
      const text = head.subarray(0, nl).toString("latin1");
      const port = /^[0-9]{1,5}$/.test(text) ? Number(text) : 0;
      if (port < 1 || port > 65535) return void host.destroy();
      const rest = head.subarray(nl + 1);
      const guest = net.connect({ host: "127.0.0.1", port });
      guest.once("connect", () => {
        if (rest.length > 0) guest.write(rest);
        splice(host, guest);
        host.resume();
      });
      guest.once("error", () => host.destroy());
    };
    host.on("data", onData);
  });
  const helper = listening(server, sockets);
  await listen(server, { path });
  return helper;
}

/**
 * apt ignores nothing it is told in apt.conf.d, and some of its methods ignore the
 * proxy variables: this file sends every apt download through the egress port. Best
 * effort (a root without /etc/apt has no apt to configure).
 */
export async function configureApt(etc = "/etc", port = EGRESS_PORT): Promise<void> {
  const dir = `${etc}/apt/apt.conf.d`;
  const proxy = `http://127.0.0.1:${port}/`;
  if (!(await stat(dir).catch(() => null))?.isDirectory()) return;
  try {
    await writeFile(
      `${dir}/99pyro-proxy`,
      `// Written by pyro: apt goes through the workspace's egress proxy.\nAcquire::http::Proxy "${proxy}";\nAcquire::https::Proxy "${proxy}";\n`,
    );
  } catch {
    // No apt here, or a read-only /etc: nothing to configure.
  }
}
