/**
 * The network helper of one workspace (docs/network.md), a detached host process:
 *
 *   node dist/core/netd.js CONFIG.json
 *
 * - Serves the workspace's egress proxy (src/net/proxy.ts) on a unix socket in the
 *   workspace's net directory, which the backend binds read-only into the sandbox (and,
 *   for host-compat, which has no sandbox, on a loopback TCP port). Every decision reads
 *   the workspace's row, so a policy update or an approval applies to the next
 *   connection; every refusal is counted in the state store (`network_blocks`).
 * - Binds each published port on 127.0.0.1 and forwards every connection through the
 *   backend that owns the sandbox (`connectPort`), reading the sandbox's state per
 *   connection, so a restarted sandbox is found again.
 *
 * It writes its outcome to READY_FILE once everything is bound (or failed), and exits
 * on SIGTERM or when its workspace is gone. It outlives the pyro process that started
 * it, like the sandbox.
 */
import { chmodSync, readFileSync, rmSync } from "node:fs";
import net from "node:net";
import { join } from "node:path";
import { NetMux } from "../agent/netmux.js";
import { listen, splice } from "../agent/pipe.js";
import type { SandboxState, WorkspaceBackend } from "../backends/backend.js";
import { procStartTime } from "../backends/common.js";
import { PROXY_SOCKET } from "../backends/guest.js";
import { kvmCheck } from "../backends/kvm.js";
import { loadBackend } from "../backends/load.js";
import { PyroError, toPyroError } from "../errors.js";
import { parsePolicy, parseTarget, policyAllows, ruleMatches } from "../net/policy.js";
import { createEgressProxy } from "../net/proxy.js";
import { StateStore } from "../state/store.js";
import type { PublishedPort, WorkspaceRow } from "../state/types.js";
import { atomicWriteFile } from "../util/fs.js";
import { SandboxListener, serveControl } from "./netd-attach.js";
import { CTL_SOCKET, type NetdConfig, type NetdReady, READY_FILE, SANDBOX_NET_DIR } from "./netd-files.js";

export { NETD_CONFIG, type NetdConfig, type NetdReady, READY_FILE, SANDBOX_NET_DIR } from "./netd-files.js";

/** How soon the helper attaches again to a VM's network port after losing it. */
const MUX_RETRY_MS = 250;

/** How often the helper checks that its workspace still exists. */
const WATCH_MS = 5000;

function writeReady(dir: string, ready: NetdReady): Promise<void> {
  return atomicWriteFile(join(dir, READY_FILE), JSON.stringify(ready), 0o600);
}

/** The proxy's decision for one destination, from the workspace's current row. */
export function decideFor(row: WorkspaceRow | null, host: string, port: number) {
  if (!row) return { allowed: false as const, reason: "the workspace is gone" };
  const approved = (row.spec.network_approved ?? []).map(parseTarget);
  if (approved.some((r) => ruleMatches(r, host, port))) return { allowed: true as const, trustPrivate: true };
  const policy = parsePolicy(row.network_policy);
  if (policyAllows(policy, host, port)) return { allowed: true as const };
  return {
    allowed: false as const,
    reason: policy.kind === "off" ? "the network policy is off" : "not in the workspace's allowlist",
  };
}

/**
 * How a published port's connection reaches the guest: through the backend's
 * `connectPort` (sandboxes whose agent serves a forward socket), or over the VM's
 * network mux, which this helper keeps attached while the VM runs (its egress comes
 * back over the same mux, to the proxy socket).
 */
function makeForwarder(
  backend: WorkspaceBackend,
  row: () => WorkspaceRow | null,
  proxySocket: string,
): (guestPort: number, client: net.Socket) => void {
  const running = () => {
    const w = row();
    const state = w?.runtime.sandbox as SandboxState | null | undefined;
    return w?.state === "running" && state ? state : null;
  };
  if (backend.connectPort) {
    const connectPort = backend.connectPort.bind(backend);
    return (guestPort, client) => {
      const state = running();
      if (!state) return void client.destroy();
      connectPort(state, guestPort, { timeoutMs: 5000 }).then(
        (guest) => splice(client, guest),
        () => client.destroy(),
      );
    };
  }
  const connectNet = backend.connectNet?.bind(backend);
  if (!connectNet) return (_port, client) => void client.destroy();
  let mux: NetMux | null = null;
  const attach = async () => {
    for (;;) {
      const state = running();
      if (state) {
        try {
          const wire = await connectNet(state, { timeoutMs: 5000 });
          const m = new NetMux(wire, "host", async (req) => {
            if (req.kind !== "egress") throw new Error("the host serves egress only");
            return net.connect({ path: proxySocket });
          });
          mux = m;
          await m.closed;
          if (mux === m) mux = null;
        } catch {
          // Not up yet, or restarting: try again.
        }
      }
      await new Promise((r) => setTimeout(r, MUX_RETRY_MS));
    }
  };
  void attach();
  return (guestPort, client) => {
    if (!mux) return void client.destroy();
    mux.open({ kind: "port", port: guestPort }, client).catch(() => {});
  };
}

/** Binds one published port; a port in use is a `conflict`. */
async function publish(
  p: PublishedPort,
  forward: (guestPort: number, client: net.Socket) => void,
): Promise<{ server: net.Server; port: PublishedPort }> {
  const server = net.createServer((client) => {
    client.on("error", () => client.destroy());
    client.pause();
    forward(p.guest_port, client);
  });
  try {
    await listen(server, { host: "127.0.0.1", port: p.host_port });
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    throw new PyroError(
      code === "EADDRINUSE" ? "conflict" : "backend_unavailable",
      `cannot bind 127.0.0.1:${p.host_port} for guest port ${p.guest_port}: ${code ?? (err as Error).message}`,
      code === "EADDRINUSE" ? "pick another host port, or 0 for a free one" : undefined,
    );
  }
  const bound = (server.address() as net.AddressInfo).port;
  return { server, port: { host_port: bound, guest_port: p.guest_port } };
}

/**
 * For a backend whose sandbox has a network namespace of its own (`egressNamespace`):
 * the helper listens on 127.0.0.1:3128 inside it and hands each connection to the proxy
 * (core/netd-attach.ts). Attached now when the workspace's sandbox already runs (a helper
 * started again beside it), and on every request on the control socket (a new sandbox).
 */
async function listenInSandbox(
  backend: WorkspaceBackend,
  row: () => WorkspaceRow | null,
  proxy: net.Server,
  controlPath: string,
): Promise<{ listener: SandboxListener; control: net.Server }> {
  const listener = new SandboxListener((socket) => proxy.emit("connection", socket));
  // Beside a running sandbox (a policy no longer off, a helper started again): attached
  // now, and a failure is the helper's (fail closed: reported, the caller's error). A
  // sandbox that is gone is left to its next start, which attaches.
  const w = row();
  const state = w?.state === "running" ? (w.runtime.sandbox as SandboxState | null) : null;
  if (state && (await backend.isRunning(state))) {
    const holder = await backend.egressNamespace?.(state);
    if (!holder)
      throw new PyroError("backend_unavailable", "no process of the running sandbox was found to listen in");
    await listener.attach(holder);
  }
  return { listener, control: await serveControl(controlPath, (h) => listener.attach(h)) };
}

export async function runNetd(config: NetdConfig): Promise<void> {
  const store = StateStore.open(config.db);
  const row = () => store.getWorkspace(config.workspace_id);
  const first = row();
  if (!first) throw new PyroError("workspace_not_found", `workspace ${config.workspace_id} is gone`);
  const backend = await loadBackend(first.backend, {
    env: process.env,
    kvm: kvmCheck(process.env),
    settings: {},
  });
  const options = {
    workspaceId: config.workspace_id,
    decide: (dest: { host: string; port: number }) => decideFor(row(), dest.host, dest.port),
    onBlock: (dest: { host: string; port: number }, reason: string) => {
      try {
        store.recordNetworkBlock(config.workspace_id, {
          kind: "network",
          target: `${dest.host}:${dest.port}`,
          reason,
        });
      } catch {
        // The workspace was deleted meanwhile: nothing to record.
      }
    },
    ...(config.test_hosts ? { testHosts: new Map(Object.entries(config.test_hosts)) } : {}),
  };
  const servers: net.Server[] = [];
  const proxy = createEgressProxy(options);
  const socketPath = join(config.dir, SANDBOX_NET_DIR, PROXY_SOCKET);
  // core/network.ts made the directory (the sandbox binds it before this runs).
  rmSync(socketPath, { force: true });
  await listen(proxy.server, { path: socketPath });
  chmodSync(socketPath, 0o600);
  servers.push(proxy.server);
  let proxyPort: number | null = null;
  if (config.proxy_tcp) {
    const tcp = createEgressProxy(options);
    await listen(tcp.server, { host: "127.0.0.1", port: 0 });
    proxyPort = (tcp.server.address() as net.AddressInfo).port;
    servers.push(tcp.server);
  }
  const inSandbox = backend.egressNamespace
    ? await listenInSandbox(backend, row, proxy.server, join(config.dir, CTL_SOCKET))
    : null;
  if (inSandbox) servers.push(inSandbox.control);
  const forward = makeForwarder(backend, row, socketPath);
  const published: PublishedPort[] = [];
  for (const p of config.published) {
    const bound = await publish(p, forward);
    servers.push(bound.server);
    published.push(bound.port);
  }
  await writeReady(config.dir, {
    pid: process.pid,
    start_time: (await procStartTime(process.pid)) ?? "",
    proxy_port: proxyPort,
    published,
  });
  // Gone with its workspace even if nobody stops it (a deleted row, a removed directory).
  const watch = setInterval(() => {
    let gone = false;
    try {
      gone = row() === null;
    } catch {
      gone = true;
    }
    if (gone) process.exit(0);
  }, WATCH_MS);
  watch.unref();
  await new Promise<void>((resolve) => {
    process.once("SIGTERM", resolve);
    process.once("SIGINT", resolve);
  });
  for (const s of servers) s.close();
  inSandbox?.listener.close();
  store.close();
}

async function main(): Promise<void> {
  const file = process.argv[2];
  let config: NetdConfig;
  try {
    if (!file) throw new PyroError("invalid_argument", "usage: netd.js CONFIG.json");
    config = JSON.parse(readFileSync(file, "utf8")) as NetdConfig;
  } catch (err) {
    process.stderr.write(`pyro-netd: ${(err as Error).message}\n`);
    process.exit(2);
  }
  try {
    await runNetd(config);
    process.exit(0);
  } catch (err) {
    const e = toPyroError(err);
    process.stderr.write(`pyro-netd: ${e.message}\n`);
    try {
      await writeReady(config.dir, {
        pid: process.pid,
        start_time: (await procStartTime(process.pid)) ?? "",
        proxy_port: null,
        published: [],
        error: e.toJSON(),
      });
    } catch {}
    process.exit(1);
  }
}

if (process.argv[1] && import.meta.url === new URL(`file://${process.argv[1]}`).href) void main();
