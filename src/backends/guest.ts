import { normalize } from "node:path";
import type { NodeRuntime } from "./runtime.js";

/**
 * What every backend tells its guest, spelled once: where the agent's entry point is in
 * the pyro package, how it is started, and the sandbox's hostname.
 */

/**
 * The guest agent's entry point, relative to the pyro package (the app directory): the
 * bundle scripts/bundle-agent.mjs makes of dist/agent/guest/main.js at build time, which
 * starts in well under half the CPU time of the unbundled module graph.
 */
export const AGENT_ENTRY = "dist/agent/bundle/main.js";

/** How the agent serves the host: a unix socket it listens on, stdio, or a VM's ports. */
export type AgentChannel = { listen: string } | { stdio: true } | { vm: string };

/**
 * Where a sandboxed agent finds the host's egress proxy socket and serves published
 * ports (agent/guest/net.ts), as paths inside the sandbox.
 */
export interface GuestNet {
  /** The proxy socket the agent relays 127.0.0.1:3128 to; absent where the host listens there itself. */
  egress?: string;
  forward: string;
}

/** The proxy socket's name in the workspace's net directory (core/network.ts makes it). */
export const PROXY_SOCKET = "proxy.sock";

/** The agent's socket's name in its socket directory. */
export const AGENT_SOCKET = "agent.sock";

/** The published-port socket's name beside the agent's socket. */
export const FORWARD_SOCKET = "forward.sock";

/** GuestNet for a sandbox that mounts the net directory at `dirs.net` and its sockets at `dirs.sock`. */
export function guestNet(dirs: { net: string; sock: string }): GuestNet {
  return { egress: `${dirs.net}/${PROXY_SOCKET}`, forward: `${dirs.sock}/${FORWARD_SOCKET}` };
}

/**
 * The agent's argv inside a sandbox: `runtime` (node) mounted at `runtimeDir`, the pyro
 * package at `appDir`, serving `root` over `channel`. `idleCommands`: commands run at
 * nice 19, below the agent, so a busy workspace still answers (agent/server.ts).
 * `readOnly`: only the ops that read (the disk reader of a stopped workspace). `alias`:
 * the path commands see the root as, where the root is not /workspace (host-compat).
 */
export function agentArgv(
  runtime: Pick<NodeRuntime, "argv" | "nonDumpableArgv">,
  dirs: { runtime: string; app: string },
  root: string,
  channel: AgentChannel,
  options: {
    idleCommands?: boolean;
    net?: GuestNet;
    readOnly?: boolean;
    tmp?: string;
    nonDumpable?: boolean;
    alias?: string;
  } = {},
): string[] {
  const serve =
    "listen" in channel
      ? ["--listen", channel.listen]
      : "stdio" in channel
        ? ["--stdio"]
        : ["--vm", channel.vm];
  return (options.nonDumpable ? runtime.nonDumpableArgv : runtime.argv).call(
    runtime,
    dirs.runtime,
    `${dirs.app}/${AGENT_ENTRY}`,
    "--root",
    root,
    ...serve,
    ...(options.idleCommands ? ["--idle-commands"] : []),
    ...(options.tmp ? ["--tmp", options.tmp] : []),
    ...(options.readOnly ? ["--read-only"] : []),
    ...(options.alias ? ["--alias", options.alias] : []),
    ...(options.net
      ? [
          ...(options.net.egress ? ["--egress", options.net.egress] : ["--host-egress"]),
          "--forward",
          options.net.forward,
        ]
      : []),
  );
}

/**
 * The host's own node, for the host-compat backend's agent: no sandbox, so nothing is
 * mounted and the package is used where it is (`dirs` are ignored but for `app`).
 */
export const HOST_NODE: Pick<NodeRuntime, "argv" | "nonDumpableArgv"> = {
  argv: (_mountPoint, script, ...args) => [process.execPath, normalize(script), ...args],
  nonDumpableArgv: (_mountPoint, script, ...args) => [process.execPath, normalize(script), ...args],
};

/** The hostname of a workspace's or one-shot's sandbox: `pyro-` and its id's first 12 characters. */
export function sandboxHostname(id: string): string {
  return `pyro-${id
    .replace(/^(ws|run)_/, "")
    .replace(/[^A-Za-z0-9-]/g, "-")
    .slice(0, 12)}`;
}
