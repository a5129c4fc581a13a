/**
 * A workspace's network (docs/network.md): its policy and published ports, the network
 * helper (core/netd.ts) that applies them, the proxy settings every command gets, and
 * the capability blocks a human may approve.
 *
 * The helper runs while the workspace runs and needs it (a policy other than `off`, or
 * a published port); it is a detached process like the sandbox, recorded in its net
 * directory's READY_FILE, so any pyro process finds it and a killed CLI or server
 * leaves it serving.
 */
import { readFileSync } from "node:fs";
import { rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { EGRESS_PORT } from "../agent/guest/net.js";
import type { SandboxSpec, SandboxState, WorkspaceBackend } from "../backends/backend.js";
import {
  killAndWait,
  LAUNCH_ENV,
  logTail,
  procStartTime,
  sameProcessAlive,
  spawnDetached,
  terminateAndWait,
} from "../backends/common.js";
import { ACTIONS, PyroError } from "../errors.js";
import { formatPolicy, formatRule, parsePolicy, parseTarget } from "../net/policy.js";
import type { NetworkPolicy, PublishedPort, WorkspaceRow } from "../state/types.js";
import { makeDirs } from "../util/fs.js";
import { acquireLock } from "../util/lock.js";
import {
  CTL_SOCKET,
  NETD_CONFIG,
  type NetdConfig,
  type NetdReady,
  READY_FILE,
  SANDBOX_NET_DIR,
} from "./netd-files.js";

/** How long a starting helper may take to bind everything (its listener in a sandbox: up to 10 s of it). */
const NETD_START_MS = 20_000;

/** The most published ports of one workspace. */
const MAX_PUBLISHED = 32;

/**
 * The report of a starting helper (`read`: null until it wrote one), or null once it is
 * gone without one or `deadline` passed. Whether it lives is asked before its report is
 * read: a helper writes its report (an error too) and then exits, so a helper found gone
 * had written whatever the read after it finds. (Read first, a report written and the
 * process gone between the two reads was taken for a helper that never reported.)
 */
export async function awaitReport<T>(
  read: () => Promise<T | null>,
  alive: () => Promise<boolean>,
  deadline: number,
): Promise<T | null> {
  for (;;) {
    const living = await alive();
    const r = await read();
    if (r) return r;
    if (!living || Date.now() > deadline) return null;
    await new Promise((resolve) => setTimeout(resolve, 15));
  }
}

/** Parses a policy as given on any surface; bad input is `invalid_argument`. */
export function parseNetworkPolicy(text: string | undefined): NetworkPolicy {
  if (text === undefined) return "off";
  return formatPolicy(parsePolicy(text)) as NetworkPolicy;
}

/** Checks published ports: host 0-65535 (0: a free one), guest 1-65535, no host port twice. */
export function checkPublishedPorts(ports: readonly PublishedPort[] | undefined): PublishedPort[] {
  const list = ports ?? [];
  if (list.length > MAX_PUBLISHED)
    throw new PyroError(
      "invalid_argument",
      `at most ${MAX_PUBLISHED} published ports`,
      "publish fewer ports, or reach more services through one",
    );
  const seen = new Set<number>();
  for (const p of list) {
    const ok = (n: unknown, min: number) =>
      Number.isInteger(n) && (n as number) >= min && (n as number) <= 65535;
    if (!ok(p.host_port, 0) || !ok(p.guest_port, 1))
      throw new PyroError(
        "invalid_argument",
        `published port ${String(p.host_port).slice(0, 12)}:${String(p.guest_port).slice(0, 12)} is out of range`,
        "give HOST_PORT:GUEST_PORT with a host port 0-65535 (0 picks a free one) and a guest port 1-65535",
      );
    if (p.host_port !== 0 && seen.has(p.host_port))
      throw new PyroError(
        "invalid_argument",
        `host port ${p.host_port} is published twice`,
        "give each host port once (0 picks a free one each time)",
      );
    seen.add(p.host_port);
  }
  return list.map((p) => ({ host_port: p.host_port, guest_port: p.guest_port }));
}

/** Parses `HOST_PORT:GUEST_PORT` (the CLI's --publish); 127.0.0.1 is the only host address. */
export function parsePublish(text: string): PublishedPort {
  const m = /^(?:(127\.0\.0\.1|localhost):)?([0-9]{1,5}):([0-9]{1,5})$/.exec(text);
  if (!m)
    throw new PyroError(
      "invalid_argument",
      `bad published port '${text.slice(0, 64)}'`,
      "give HOST_PORT:GUEST_PORT (published ports bind 127.0.0.1 only; 0 as the host port picks a free one)",
    );
  return checkPublishedPorts([{ host_port: Number(m[2]), guest_port: Number(m[3]) }])[0]!;
}

/** Refuses what `backend` cannot apply, before anything is made (fail closed). */
export function checkNetworkSupport(
  backend: WorkspaceBackend,
  policy: NetworkPolicy,
  ports: readonly PublishedPort[],
): void {
  if (backend.connectPort || backend.connectNet) return;
  if (policy === "off" && ports.length === 0) return;
  throw new PyroError(
    "backend_unavailable",
    `the ${backend.name} backend cannot apply ${policy === "off" ? "published ports" : `network policy '${policy}'`} in this build`,
    "use another backend (pyro doctor lists what each applies), or {action} without published ports",
    { action: ACTIONS.networkOff },
  );
}

export interface NetworkDeps {
  dbPath: string;
  workspaceDir(id: string): string;
  appDir: string;
  /** Test-only destination overrides for the proxy (never from the environment). */
  testHosts?: Record<string, string>;
}

/** The network side of the workspace service. */
export class WorkspaceNetwork {
  constructor(private readonly deps: NetworkDeps) {}

  dir(id: string): string {
    return join(this.deps.workspaceDir(id), "net");
  }

  /** The net directory for the sandbox spec of a backend that supports networking. */
  specFor(id: string, backend: WorkspaceBackend | undefined): Pick<SandboxSpec, "netDir"> {
    return backend?.connectPort ? { netDir: join(this.dir(id), SANDBOX_NET_DIR) } : {};
  }

  /** Whether the workspace needs its helper running. */
  needed(w: WorkspaceRow): boolean {
    return w.network_policy !== "off" || (w.spec.published_ports ?? []).length > 0;
  }

  /**
   * Read synchronously: every call on a workspace with a helper reads it (refreshState),
   * and the small file's async read is thread-pool round trips (~0.4 ms) where the sync
   * one takes ~0.03 ms.
   */
  private async ready(id: string): Promise<NetdReady | null> {
    try {
      return JSON.parse(readFileSync(join(this.dir(id), READY_FILE), "utf8")) as NetdReady;
    } catch {
      return null;
    }
  }

  /** The running helper's report, or null. */
  async running(id: string): Promise<NetdReady | null> {
    const r = await this.ready(id);
    return r && !r.error && (await sameProcessAlive(r.pid, r.start_time)) ? r : null;
  }

  /** Makes the directory the sandbox binds (at /run/pyro/net): it must exist before a start. */
  async prepare(id: string): Promise<void> {
    await makeDirs(join(this.dir(id), SANDBOX_NET_DIR), 0o700);
  }

  /**
   * Makes the helper's state match the row: started when needed and not running,
   * stopped when not needed. Returns the published ports as bound (host port 0 resolved)
   * for the caller to record, so a restart binds the same ones.
   */
  async ensure(w: WorkspaceRow, backend: WorkspaceBackend): Promise<PublishedPort[] | null> {
    // The sandbox's view must exist before it starts, whatever the policy (a bind needs its source).
    await this.prepare(w.workspace_id);
    return this.locked(w.workspace_id, async () => {
      if (!this.needed(w)) {
        await this.stopUnlocked(w.workspace_id);
        return null;
      }
      // Checked under the lock: a helper another client just started is the one.
      const live = await this.running(w.workspace_id);
      return live ? live.published : this.startHelper(w, backend);
    });
  }

  /**
   * One helper change at a time per workspace, across processes (two clients that each
   * found no helper must not both start one: the second would fail to listen where the
   * first does, and its report would hide it).
   */
  private async locked<T>(id: string, f: () => Promise<T>): Promise<T> {
    let release: (() => Promise<void>) | null = null;
    try {
      release = await acquireLock(join(this.dir(id), "netd.lock"), {
        timeoutMs: 2 * NETD_START_MS,
        pollMs: 25,
      });
    } catch (err) {
      // No net directory: no helper was ever started here, nothing to race with.
      if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
    }
    try {
      return await f();
    } finally {
      await release?.();
    }
  }

  private async startHelper(w: WorkspaceRow, backend: WorkspaceBackend): Promise<PublishedPort[]> {
    const dir = this.dir(w.workspace_id);
    await rm(join(dir, READY_FILE), { force: true });
    const config: NetdConfig = {
      workspace_id: w.workspace_id,
      db: this.deps.dbPath,
      dir,
      proxy_tcp: backend.executionMode === "host_compat",
      published: w.spec.published_ports ?? [],
      ...(this.deps.testHosts ? { test_hosts: this.deps.testHosts } : {}),
    };
    const configFile = join(dir, NETD_CONFIG);
    await writeFile(configFile, JSON.stringify(config), { mode: 0o600 });
    const logFile = join(dir, "netd.log");
    const { pid } = spawnDetached(
      [process.execPath, join(this.deps.appDir, "dist/core/netd.js"), configFile],
      {
        logFile,
        env: { ...LAUNCH_ENV },
      },
    );
    // Its start time, so neither the wait nor the kill below can take a process that
    // reused its pid for it (null: it has already gone, and its report says why).
    const started = await procStartTime(pid);
    const r = await awaitReport(
      () => this.ready(w.workspace_id).then((x) => (x && x.pid === pid ? x : null)),
      () => (started === null ? Promise.resolve(false) : sameProcessAlive(pid, started)),
      Date.now() + NETD_START_MS,
    );
    if (r?.error) throw new PyroError(r.error.code, r.error.message, r.error.hint);
    if (r) return r.published;
    if (started !== null) await killAndWait(pid, started);
    throw new PyroError(
      "backend_unavailable",
      `the workspace's network helper did not start: ${await logTail(logFile)}`,
      "nothing was started; see `pyro doctor`",
    );
  }

  /**
   * After every sandbox start, before anything runs in it: where the backend's sandbox
   * has a network namespace of its own (`egressNamespace`, bwrap), asks the workspace's
   * helper to listen on 127.0.0.1:3128 in it (core/netd-attach.ts) and waits for it. A
   * failure stops the new sandbox (fail closed: a workspace whose policy is not `off`
   * does not run without its proxy) and is the start's error.
   */
  async attach(w: WorkspaceRow, backend: WorkspaceBackend, state: SandboxState): Promise<void> {
    if (!backend.egressNamespace || !this.needed(w)) return;
    try {
      const holder = await backend.egressNamespace(state);
      if (!holder)
        throw new PyroError(
          "backend_unavailable",
          "no process of the new sandbox was found to listen in (it ended as it started)",
          "try again; `pyro doctor` checks the backend",
        );
      const { requestAttach, HelperUnreachable } = await import("./netd-attach.js");
      const path = join(this.dir(w.workspace_id), CTL_SOCKET);
      await requestAttach(path, holder).catch(async (err) => {
        if (!(err instanceof HelperUnreachable)) throw err;
        // A live helper that has no control socket (one an older build started): a new one.
        await this.stop(w.workspace_id);
        await this.ensure(w, backend);
        await requestAttach(path, holder);
      });
    } catch (err) {
      await backend.stop(state).catch(() => {});
      throw err;
    }
  }

  /** Stops the helper (published ports are unbound; the proxy socket goes away). */
  stop(id: string): Promise<void> {
    return this.locked(id, () => this.stopUnlocked(id));
  }

  private async stopUnlocked(id: string): Promise<void> {
    const r = await this.ready(id);
    if (r) await terminateAndWait(r.pid, r.start_time, 2000);
    await rm(join(this.dir(id), READY_FILE), { force: true });
  }

  /**
   * What every command of the workspace gets when its policy is not `off`: the proxy
   * variables in both cases (tools read one or the other), with loopback excluded.
   */
  async env(w: WorkspaceRow, backend: WorkspaceBackend): Promise<Record<string, string>> {
    if (w.network_policy === "off") return {};
    let port = EGRESS_PORT;
    if (backend.executionMode === "host_compat") {
      const r = await this.running(w.workspace_id);
      if (!r?.proxy_port) return {};
      port = r.proxy_port;
    }
    const http = `http://127.0.0.1:${port}`;
    const vars: Record<string, string> = {
      HTTP_PROXY: http,
      HTTPS_PROXY: http,
      ALL_PROXY: `socks5h://127.0.0.1:${port}`,
      NO_PROXY: "localhost,127.0.0.1,::1",
    };
    for (const [k, v] of Object.entries(vars)) vars[k.toLowerCase()] = v;
    return vars;
  }
}

/** The new policy and approvals after a human approves `target` (see docs/network.md). */
export function approvedPolicy(
  w: WorkspaceRow,
  text: string,
): { policy: NetworkPolicy; approved: string[]; target: string } {
  const rule = parseTarget(text);
  const target = formatRule(rule);
  const approved = [...(w.spec.network_approved ?? [])];
  if (w.network_policy === "off")
    throw new PyroError(
      "conflict",
      `workspace ${w.workspace_id} has no network (policy off): there is nothing to approve`,
      "set a policy first: {action}",
      {
        action: {
          cli: `pyro workspace update ${w.workspace_id} --network allowlist:${target}`,
          tool: `workspace_update with network_policy "allowlist:${target}"`,
        },
      },
    );
  if (!approved.includes(target)) approved.push(target);
  const policy =
    w.network_policy === "egress" ? "egress" : parseNetworkPolicy(`${w.network_policy},${target}`);
  return { policy, approved, target };
}
