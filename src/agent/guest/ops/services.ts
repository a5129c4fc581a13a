/**
 * Services: named long-running commands the agent keeps for its whole life (contract §4
 * "service"). One registry per agent process, shared by every connection: a service
 * started over one connection is listed, tailed and stopped over any other. Each runs
 * as `/bin/sh -c COMMAND` leading its own session and process group (stop signals the
 * whole group), at the priority of commands, with its stdout and stderr kept as lines in
 * a bounded ring (SERVICE_LOG_LINES lines, each cut at SERVICE_LINE_BYTES).
 *
 * Readiness: a probe (a file exists, 127.0.0.1:PORT accepts, an http:// URL answers below
 * 500, a command exits 0) is polled, from every 5 ms backing off to every 100 ms, until it passes (`ready`),
 * the service exits first (`failed`, with its exit code), or the timeout passes (it keeps
 * running as `starting`; the result says `timed_out` with the log's last lines). A
 * service without a probe is ready once started.
 *
 * The agent dies with its sandbox, and its services with it: the host restarts them
 * (core/services.ts) when it starts the workspace again.
 */
import { randomBytes } from "node:crypto";
import { stat } from "node:fs/promises";
import net from "node:net";
import { AgentError } from "../../errors.js";
import type { OpResult } from "../../op-schemas.js";
import type { Workspace } from "../paths.js";
import type { OpHandler } from "./context.js";
import { commandCwd, exitCodeOf, startCommand } from "./exec.js";

/** Lines of output kept per service (both streams, in order). */
export const SERVICE_LOG_LINES = 2000;
/** A longer line is cut here. */
export const SERVICE_LINE_BYTES = 4096;
/** At most this many services per workspace. */
export const MAX_SERVICES = 32;
/** Probe intervals: quick at first (a service is often up within milliseconds), backing off to the maximum. */
const PROBE_FIRST_MS = 5;
const PROBE_INTERVAL_MS = 100;
const PROBE_TIMEOUT_MS = 2000;

type Status = OpResult<"service_status">["service"];
type Probe = NonNullable<Status["ready"]>;

interface Line {
  stream: "stdout" | "stderr";
  text: string;
}

/** A bounded ring of output lines, with a partial line kept per stream. */
class LineRing {
  private readonly lines: Line[] = [];
  private readonly partial = { stdout: "", stderr: "" };
  dropped = 0;

  push(stream: Line["stream"], chunk: Buffer): void {
    const parts = (this.partial[stream] + chunk.toString("utf8")).split("\n");
    this.partial[stream] = parts.pop()!.slice(0, SERVICE_LINE_BYTES);
    for (const text of parts) this.add({ stream, text: text.slice(0, SERVICE_LINE_BYTES) });
  }

  private add(line: Line): void {
    this.lines.push(line);
    if (this.lines.length > SERVICE_LOG_LINES) {
      this.lines.shift();
      this.dropped++;
    }
  }

  /** The last `n` lines, unfinished lines included. */
  tail(n: number): { lines: Line[]; truncated: boolean } {
    const all = [...this.lines];
    for (const stream of ["stdout", "stderr"] as const)
      if (this.partial[stream]) all.push({ stream, text: this.partial[stream] });
    return { lines: all.slice(-n), truncated: this.dropped > 0 || all.length > n };
  }
}

interface Service {
  status: Status;
  log: LineRing;
  exited: Promise<void>;
  child: ReturnType<typeof startCommand>;
}

/**
 * The services, by name, of each workspace this process serves. A real agent serves one;
 * in-process guests (the fake backend) serve several, which must not see (or collide
 * with) each other's services, nor a stopped guest's.
 */
const registries = new Map<Workspace, Map<string, Service>>();

function registry(workspace: Workspace): Map<string, Service> {
  let r = registries.get(workspace);
  if (!r) {
    r = new Map();
    registries.set(workspace, r);
  }
  return r;
}

function running(s: Service): boolean {
  return s.status.state === "starting" || s.status.state === "ready";
}

function named(services: Map<string, Service>, name: string): Service {
  const s = services.get(name);
  if (!s)
    throw new AgentError(
      "not_found",
      `no service named '${name}'`,
      "list the workspace's services to see their names",
    );
  return s;
}

/** One try of a probe; true when it passes. */
async function probeOnce(p: Probe, cwd: string, env: Record<string, string> | undefined): Promise<boolean> {
  switch (p.kind) {
    case "file": {
      const path = p.path.startsWith("/") ? p.path : `${cwd}/${p.path}`;
      return (await stat(path).catch(() => null)) !== null;
    }
    case "tcp":
      return new Promise((resolve) => {
        const s = net.connect({ host: "127.0.0.1", port: p.port });
        const done = (ok: boolean) => {
          s.destroy();
          resolve(ok);
        };
        s.setTimeout(PROBE_TIMEOUT_MS, () => done(false));
        s.once("connect", () => done(true));
        s.once("error", () => done(false));
      });
    case "http": {
      // Imported here: node:http is the agent's largest built-in, and only this probe uses it.
      const http = await import("node:http");
      return new Promise((resolve) => {
        let req: import("node:http").ClientRequest;
        try {
          req = http.get(p.url, { timeout: PROBE_TIMEOUT_MS, agent: false }, (res) => {
            res.resume();
            resolve((res.statusCode ?? 500) < 500);
          });
        } catch {
          return resolve(false);
        }
        req.on("timeout", () => req.destroy());
        req.on("error", () => resolve(false));
      });
    }
    case "command": {
      const child = startCommand(
        { command: p.command, env, stdin: false },
        cwd,
        randomBytes(8).toString("hex"),
        {
          upload: null,
        },
      );
      child.stdout?.resume();
      child.stderr?.resume();
      return new Promise((resolve) => {
        const timer = setTimeout(() => {
          try {
            process.kill(-child.pid!, "SIGKILL");
          } catch {}
          resolve(false);
        }, PROBE_TIMEOUT_MS);
        child.once("exit", (code) => {
          clearTimeout(timer);
          resolve(code === 0);
        });
        child.once("error", () => resolve(false));
      });
    }
  }
}

/** Polls the probe until ready, exit or timeout; updates the status. */
async function awaitReady(
  s: Service,
  cwd: string,
  env: Record<string, string> | undefined,
  timeoutMs: number,
  signal: AbortSignal,
): Promise<boolean> {
  const probe = s.status.ready;
  if (!probe) {
    s.status.state = "ready";
    s.status.ready_at = new Date().toISOString();
    return false;
  }
  const deadline = Date.now() + timeoutMs;
  let delay = PROBE_FIRST_MS;
  let exited = false;
  void s.exited.then(() => {
    exited = true;
  });
  for (;;) {
    if (exited || !running(s)) return false;
    if (await probeOnce(probe, cwd, env)) {
      if (s.status.state === "starting") {
        s.status.state = "ready";
        s.status.ready_at = new Date().toISOString();
      }
      return false;
    }
    if (Date.now() >= deadline || signal.aborted) return true;
    await new Promise((r) => setTimeout(r, delay));
    delay = Math.min(delay * 2, PROBE_INTERVAL_MS);
  }
}

export const serviceStart: OpHandler<"service_start"> = async (args, ctx) => {
  const services = registry(ctx.workspace);
  const old = services.get(args.name);
  if (old && running(old))
    throw new AgentError(
      "conflict",
      `a service named '${args.name}' is already running`,
      "stop it first, or pick another name",
    );
  if (!old && services.size >= MAX_SERVICES)
    throw new AgentError("conflict", `at most ${MAX_SERVICES} services per workspace`, "stop one first");
  const cwd = await commandCwd(args.cwd, ctx.workspace);
  const child = startCommand(
    { command: args.command, env: args.env, stdin: false },
    cwd,
    randomBytes(12).toString("hex"),
    { upload: null, ...(ctx.idleCommands ? { idleCommands: true } : {}) },
  );
  const log = new LineRing();
  child.stdout?.on("data", (c: Buffer) => log.push("stdout", c));
  child.stderr?.on("data", (c: Buffer) => log.push("stderr", c));
  const status: Status = {
    name: args.name,
    command: args.command,
    state: "starting",
    pid: child.pid ?? null,
    started_at: new Date().toISOString(),
    ready_at: null,
    exit_code: null,
    ready: args.ready,
  };
  const exited = new Promise<void>((resolve) => {
    child.once("exit", (code, sig) => {
      status.exit_code = exitCodeOf(code, sig);
      if (status.state !== "stopped") status.state = "failed";
      status.pid = null;
      resolve();
    });
    child.once("error", () => {
      status.state = "failed";
      status.exit_code = 127;
      status.pid = null;
      resolve();
    });
  });
  const service: Service = { status, log, exited, child };
  services.set(args.name, service);
  const timedOut = await awaitReady(service, cwd, args.env, args.ready_timeout_ms, ctx.signal);
  // Give an exit racing the last probe its moment, so `failed` carries its code.
  if (status.state === "failed") await exited;
  return {
    service: { ...status },
    timed_out: timedOut,
    log_tail: timedOut || status.state === "failed" ? log.tail(20).lines.map((l) => l.text) : [],
  };
};

export const serviceList: OpHandler<"service_list"> = async (_args, ctx) => ({
  services: [...registry(ctx.workspace).values()].map((s) => ({ ...s.status })),
});

export const serviceStatus: OpHandler<"service_status"> = async (args, ctx) => ({
  service: { ...named(registry(ctx.workspace), args.name).status },
});

export const serviceLogs: OpHandler<"service_logs"> = async (args, ctx) => {
  const { lines, truncated } = named(registry(ctx.workspace), args.name).log.tail(args.tail_lines);
  return { name: args.name, lines, truncated };
};

/** TERM to the whole process group, KILL after the grace period. */
export const serviceStop: OpHandler<"service_stop"> = async (args, ctx) => {
  const s = named(registry(ctx.workspace), args.name);
  let killed = false;
  if (running(s) && s.child.pid !== undefined) {
    s.status.state = "stopped";
    const group = -s.child.pid;
    try {
      process.kill(group, "SIGTERM");
    } catch {}
    const graceful = await Promise.race([
      s.exited.then(() => true),
      new Promise<boolean>((r) => setTimeout(() => r(false), args.grace_ms)),
    ]);
    if (!graceful) {
      killed = true;
      try {
        process.kill(group, "SIGKILL");
      } catch {}
      await s.exited;
    }
  }
  return { service: { ...s.status }, killed };
};

/**
 * Ends every service's process group at once (SIGKILL): the agent is shutting down. In a
 * sandbox they would die with it anyway; on host-compat they are host processes.
 */
export function killAllServices(): void {
  for (const workspace of registries.keys()) killServicesOf(workspace);
}

/** Ends the services of one served workspace (its guest is closing). */
export function killServicesOf(workspace: Workspace): void {
  for (const s of registries.get(workspace)?.values() ?? []) {
    if (!running(s) || s.child.pid === undefined) continue;
    s.status.state = "stopped";
    try {
      process.kill(-s.child.pid, "SIGKILL");
    } catch {}
  }
}

/** Drops a closed guest's services from the registry (after killServicesOf). */
export function forgetServicesOf(workspace: Workspace): void {
  registries.delete(workspace);
}
