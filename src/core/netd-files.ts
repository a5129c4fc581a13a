/**
 * The files through which a pyro process and a workspace's network helper (netd.ts)
 * talk: its configuration and its report. Apart from the helper itself, so that what
 * only starts or reads a helper (core/network.ts, and every `pyro run` through its
 * policy parsing) does not load the proxy, the state store and the backends the helper
 * runs with.
 */
import type { ErrorObject } from "../errors.js";
import type { PublishedPort } from "../state/types.js";

/** What core/network.ts hands the helper. */
export interface NetdConfig {
  workspace_id: string;
  /** The state database. */
  db: string;
  /** The net directory: the proxy socket and READY_FILE live here. */
  dir: string;
  /** Also serve the proxy on a loopback TCP port (host-compat: no sandbox to bind a socket into). */
  proxy_tcp: boolean;
  /** Ports to bind; host port 0 picks a free one. */
  published: PublishedPort[];
  /** Test-only name → address map (src/net/proxy.ts `testHosts`); never from the environment. */
  test_hosts?: Record<string, string>;
}

/** What the helper reports once started. */
export interface NetdReady {
  pid: number;
  start_time: string;
  proxy_port: number | null;
  published: PublishedPort[];
  error?: ErrorObject;
}

export const NETD_CONFIG = "netd.json";
export const READY_FILE = "netd.ready.json";
/** The helper's control socket (core/netd-attach.ts), beside READY_FILE: never in the sandbox's view. */
export const CTL_SOCKET = "netd.ctl.sock";
/**
 * The subdirectory of the net directory the sandbox sees (at /run/pyro/net): only the
 * proxy socket, not the helper's configuration, report or log.
 */
export const SANDBOX_NET_DIR = "sandbox";
