/**
 * Services of a workspace (contract §4 "service", docs/workspaces.md "Services"): named
 * long-running commands with a readiness probe, run by the guest agent
 * (agent/guest/ops/services.ts) with the workspace's env, secrets and proxy settings.
 *
 * The workspace row keeps each running service's definition (`spec.services`), so a
 * `workspace start` (after a stop, or after the sandbox died) starts them again; `stop`
 * removes it, and a reset or delete ends them with the sandbox. Output and errors reach
 * every surface with the workspace's secrets redacted.
 */
import type { AgentClient } from "../agent/client.js";
import type { OpArgs, OpResult } from "../agent/op-schemas.js";
import { WAIT_SLACK_MS } from "../agent/slack.js";
import { type HintAction, PyroError } from "../errors.js";
import type { ServiceSpec, WorkspaceRow } from "../state/types.js";
import { LIMITS } from "./limits.js";
import { secretRedactor } from "./secrets.js";
import type { Workspaces } from "./workspaces.js";

/** How long a start waits for readiness by default, and at most. */
export const DEFAULT_READY_TIMEOUT_SECONDS = 30;

export type ReadyProbe = NonNullable<ServiceSpec["ready"]>;

/**
 * A readiness probe as every surface names it (contract §5): `type` and its one target,
 * and how long to wait for it (default DEFAULT_READY_TIMEOUT_SECONDS).
 */
export interface Readiness {
  type: "file" | "tcp" | "http" | "command";
  path?: string;
  port?: number;
  url?: string;
  command?: string;
  timeout_seconds?: number;
}

export interface StartServiceOptions {
  /** Absent or null: ready once started. */
  readiness?: Readiness | null;
  cwd?: string;
  env?: Record<string, string>;
}

/** The agent's probe for a readiness object; a probe without its target is `invalid_argument`. */
export function probeOf(r: Readiness | null | undefined): ReadyProbe | null {
  if (!r) return null;
  const need = { file: "path", tcp: "port", http: "url", command: "command" } as const;
  const key = need[r.type];
  if (key === undefined)
    throw new PyroError(
      "invalid_argument",
      `unknown readiness type '${String(r.type).slice(0, 40)}'`,
      "use file, tcp, http or command",
    );
  const target = r[key];
  if (target === undefined || target === "")
    throw new PyroError(
      "invalid_argument",
      `a ${r.type} readiness probe needs ${key}`,
      `give readiness.${key}`,
    );
  switch (r.type) {
    case "file":
      return { kind: "file", path: String(target) };
    case "tcp":
      if (!Number.isInteger(target) || (target as number) < 1 || (target as number) > 65535)
        throw new PyroError(
          "invalid_argument",
          `readiness port must be 1-65535, got ${String(target).slice(0, 20)}`,
        );
      return { kind: "tcp", port: target as number };
    case "http":
      return { kind: "http", url: String(target) };
    default:
      return { kind: "command", command: String(target) };
  }
}

type AgentStatus = OpResult<"service_status">["service"];

/** A service as every surface shows it (the agent's status, secrets redacted). */
function view(workspaceId: string, s: AgentStatus, redact: (t: string) => string) {
  return { workspace_id: workspaceId, ...s, command: redact(s.command) };
}

export type ServiceView = ReturnType<typeof view>;

/** Where a call sets how long to wait for readiness: the CLI flag, the tool argument. */
const READY_TIMEOUT: HintAction = { cli: "--ready-timeout", tool: "readiness.timeout_seconds" };

function checkReadyTimeout(seconds: number): number {
  if (!(seconds > 0 && seconds <= LIMITS.timeout_seconds.max))
    throw new PyroError(
      "invalid_argument",
      `ready timeout must be between 1 and ${LIMITS.timeout_seconds.max} seconds, got ${seconds}`,
      "give {action} in seconds",
      { action: READY_TIMEOUT },
    );
  return seconds;
}

/** The agent's start arguments for a definition, with the env every command gets. */
async function startArgs(
  ws: Workspaces,
  w: WorkspaceRow,
  def: ServiceSpec,
): Promise<OpArgs<"service_start">> {
  const secrets = await ws.secretValues(w);
  return {
    name: def.name,
    command: def.command,
    ...(def.cwd ? { cwd: def.cwd } : {}),
    env: { ...(await ws.networkEnv(w)), ...w.spec.env, ...Object.fromEntries(secrets), ...def.env },
    ready: def.ready,
    ready_timeout_ms: Math.round(def.ready_timeout_seconds * 1000),
  };
}

async function start(ws: Workspaces, agent: AgentClient, w: WorkspaceRow, def: ServiceSpec) {
  return agent.request("service_start", await startArgs(ws, w, def), {
    timeoutMs: def.ready_timeout_seconds * 1000 + WAIT_SLACK_MS,
  });
}

/**
 * Starts service `name` and waits for its probe: `ready`, or `failed` with its exit code
 * when it exits first. A probe that never passes is a `timeout` error carrying the last
 * log lines (the service keeps running, as `starting`).
 */
export async function startService(
  ws: Workspaces,
  idOrName: string,
  name: string,
  command: string,
  options: StartServiceOptions = {},
): Promise<ServiceView & { log_tail: string[] }> {
  if (command.trim() === "") throw new PyroError("invalid_argument", "the service command is empty");
  const def: ServiceSpec = {
    name,
    command,
    ...(options.cwd ? { cwd: options.cwd } : {}),
    env: options.env ?? {},
    ready: probeOf(options.readiness),
    ready_timeout_seconds: checkReadyTimeout(
      options.readiness?.timeout_seconds ?? DEFAULT_READY_TIMEOUT_SECONDS,
    ),
  };
  return ws.withAgent(idOrName, "exec", async (agent, w, journal) => {
    const redact = secretRedactor(await ws.secretValues(w));
    const r = await start(ws, agent, w, def);
    journal((store) => {
      const fresh = store.getWorkspace(w.workspace_id) ?? w;
      const kept = (fresh.spec.services ?? []).filter((s) => s.name !== name);
      // One that exited before it was ready is not kept: a start would only fail again.
      const services = r.service.state === "failed" ? kept : [...kept, def];
      store.updateWorkspace(w.workspace_id, { spec: { ...fresh.spec, services } });
      store.recordEvent(w.workspace_id, "service_start", {
        name,
        command: redact(command),
        state: r.service.state,
      });
    });
    if (r.timed_out)
      throw new PyroError(
        "timeout",
        `service '${name}' did not become ready within ${def.ready_timeout_seconds} s (it keeps running); last log lines: ${redact(r.log_tail.join(" | ")).slice(-2000) || "(none)"}`,
        "look at its logs (service logs), stop it, or start it with a longer {action}",
        { action: READY_TIMEOUT },
      );
    return { ...view(w.workspace_id, r.service, redact), log_tail: r.log_tail.map(redact) };
  });
}

export async function listServices(ws: Workspaces, idOrName: string) {
  return ws.withAgent(idOrName, "exec", async (agent, w) => {
    const redact = secretRedactor(await ws.secretValues(w));
    const r = await agent.request("service_list", {});
    const services = r.services.map((s) => view(w.workspace_id, s, redact));
    return {
      workspace_id: w.workspace_id,
      count: services.length,
      running_count: services.filter((s) => s.state === "starting" || s.state === "ready").length,
      services,
    };
  });
}

export async function serviceStatus(ws: Workspaces, idOrName: string, name: string): Promise<ServiceView> {
  return ws.withAgent(idOrName, "exec", async (agent, w) => {
    const redact = secretRedactor(await ws.secretValues(w));
    return view(w.workspace_id, (await agent.request("service_status", { name })).service, redact);
  });
}

export async function serviceLogs(ws: Workspaces, idOrName: string, name: string, tailLines = 100) {
  return ws.withAgent(idOrName, "exec", async (agent, w) => {
    const redact = secretRedactor(await ws.secretValues(w));
    const r = await agent.request("service_logs", { name, tail_lines: tailLines });
    return {
      workspace_id: w.workspace_id,
      name,
      lines: r.lines.map((l) => ({ stream: l.stream, text: redact(l.text) })),
      truncated: r.truncated,
    };
  });
}

/** TERM to the whole process group, KILL after `grace_seconds`; not started again by `workspace start`. */
export async function stopService(ws: Workspaces, idOrName: string, name: string, graceSeconds = 5) {
  return ws.withAgent(idOrName, "exec", async (agent, w, journal) => {
    const redact = secretRedactor(await ws.secretValues(w));
    const r = await agent.request("service_stop", { name, grace_ms: Math.round(graceSeconds * 1000) });
    journal((store) => {
      const fresh = store.getWorkspace(w.workspace_id) ?? w;
      const kept = (fresh.spec.services ?? []).filter((s) => s.name !== name);
      store.updateWorkspace(w.workspace_id, { spec: { ...fresh.spec, services: kept } });
      store.recordEvent(w.workspace_id, "service_stop", { name, killed: r.killed });
    });
    return { ...view(w.workspace_id, r.service, redact), killed: r.killed };
  });
}

/**
 * Starts the workspace's kept services again on a freshly started sandbox (best effort:
 * a service that fails or times out is reported by its status, not thrown).
 */
export async function restartServices(ws: Workspaces, agent: AgentClient, w: WorkspaceRow): Promise<void> {
  for (const def of w.spec.services ?? []) {
    try {
      await start(ws, agent, w, def);
    } catch {
      // Its status says why (failed, starting); the workspace itself started.
    }
  }
}
