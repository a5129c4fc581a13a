import type { Command } from "commander";
import {
  listServices,
  type Readiness,
  type ServiceView,
  serviceLogs,
  serviceStatus,
  startService,
  stopService,
} from "../../../core/services.js";
import { PyroError } from "../../../errors.js";
import { collect, commandString, keyValues, positiveNumber, wholeNumber } from "../../args.js";
import type { CliContext } from "../../main.js";
import { act, table } from "../../output.js";

const SERVICE_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;

function serviceName(name: string): string {
  if (!SERVICE_NAME.test(name))
    throw new PyroError(
      "invalid_argument",
      `service name must be 1-63 letters, digits, '.', '_' or '-', got '${name.slice(0, 80)}'`,
    );
  return name;
}

function tcpPort(value: string): number {
  const n = /^\s*\d+\s*$/.test(value) ? Number(value) : Number.NaN;
  if (!Number.isInteger(n) || n < 1 || n > 65535)
    throw new PyroError("invalid_argument", `--ready-tcp must be a port from 1 to 65535, got '${value}'`);
  return n;
}

interface StartFlags {
  readyFile?: string;
  readyTcp?: number;
  readyHttp?: string;
  readyCommand?: string;
  readyTimeout?: number;
  cwd?: string;
  env?: string[];
  json?: boolean;
}

/** The one probe the flags give (none: ready once started); two or more are refused. */
function probe(o: StartFlags): Readiness | null {
  const given: [string, Readiness][] = [];
  if (o.readyFile !== undefined) given.push(["--ready-file", { type: "file", path: o.readyFile }]);
  if (o.readyTcp !== undefined) given.push(["--ready-tcp", { type: "tcp", port: o.readyTcp }]);
  if (o.readyHttp !== undefined) given.push(["--ready-http", { type: "http", url: o.readyHttp }]);
  if (o.readyCommand !== undefined)
    given.push(["--ready-command", { type: "command", command: o.readyCommand }]);
  if (given.length > 1)
    throw new PyroError(
      "invalid_argument",
      `give at most one readiness probe, got ${given.map(([f]) => f).join(" and ")}`,
      "pick one of --ready-file, --ready-tcp, --ready-http, --ready-command",
    );
  for (const [flag, p] of given)
    if (p.path === "" || p.url === "" || p.command?.trim() === "")
      throw new PyroError("invalid_argument", `${flag} must not be empty`);
  const chosen = given[0]?.[1] ?? null;
  if (o.readyTimeout !== undefined) {
    if (!chosen)
      throw new PyroError(
        "invalid_argument",
        "--ready-timeout needs a readiness probe",
        "add one of --ready-file, --ready-tcp, --ready-http, --ready-command",
      );
    chosen.timeout_seconds = o.readyTimeout;
  }
  return chosen;
}

function probeText(p: ServiceView["ready"]): string {
  if (!p) return "none";
  switch (p.kind) {
    case "file":
      return `file ${p.path}`;
    case "tcp":
      return `tcp ${p.port}`;
    case "http":
      return `http ${p.url}`;
    case "command":
      return `command ${p.command}`;
  }
}

/** `web: ready (pid 42, ready at ...)`, the line start and status print. */
function stateLine(s: ServiceView): string {
  const details = [
    s.pid !== null ? `pid ${s.pid}` : null,
    s.ready_at ? `ready at ${s.ready_at}` : null,
    s.exit_code !== null ? `exit ${s.exit_code}` : null,
  ].filter((d) => d !== null);
  return `service ${s.name}: ${s.state}${details.length > 0 ? ` (${details.join(", ")})` : ""}`;
}

function describe(s: ServiceView): string {
  return [
    stateLine(s),
    `  command: ${s.command}`,
    `  ready probe: ${probeText(s.ready)}`,
    `  started at: ${s.started_at}`,
  ].join("\n");
}

/**
 * `pyro workspace service start|list|status|logs|stop`: named long-running commands of a
 * workspace with a readiness probe (docs/workspaces.md "Services").
 */
export function registerServices(ws: Command, ctx: CliContext): void {
  const svc = ws
    .command("service")
    .description("long-running commands of a workspace, with readiness probes");
  svc
    .command("start")
    .description("start a named service and wait until its probe passes (or it exits, or the timeout)")
    .argument("<id>", "workspace id or name")
    .argument("<name>", "service name: 1-63 letters, digits, '.', '_' or '-'")
    .argument("[command...]", "command after --: one shell string, or an argv")
    .option("--ready-file <path>", "ready once this file exists")
    .option("--ready-tcp <port>", "ready once this guest TCP port accepts", tcpPort)
    .option("--ready-http <url>", "ready once this URL answers")
    .option("--ready-command <cmd>", "ready once this command exits 0")
    .option(
      "--ready-timeout <s>",
      "seconds to wait for readiness (default 30); past it the service keeps running",
      positiveNumber("--ready-timeout"),
    )
    .option("--cwd <path>", "working directory (default /workspace)")
    .option("--env <K=V>", "environment variable (repeatable)", collect)
    .option("--json", "print the structured result")
    .action(async (id: string, name: string, command: string[], o: StartFlags) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        async () => {
          const readiness = probe(o);
          return startService(ctx.engine().workspaces, id, serviceName(name), commandString(command), {
            readiness,
            ...(o.cwd ? { cwd: o.cwd } : {}),
            ...(o.env ? { env: keyValues(o.env, "--env") } : {}),
          });
        },
        (r) => {
          const tail = r.log_tail;
          return r.state === "failed" && tail.length > 0
            ? `${describe(r)}\nlast log lines:\n${tail.map((l) => `  ${l}`).join("\n")}`
            : describe(r);
        },
        (r) => (r.state === "failed" ? 1 : 0),
      );
    });
  svc
    .command("list")
    .description("list a workspace's services")
    .argument("<id>", "workspace id or name")
    .option("--json", "print the structured result")
    .action(async (id: string, o: { json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () => listServices(ctx.engine().workspaces, id),
        (r) =>
          r.count === 0
            ? "no services"
            : table(
                ["name", "state", "pid", "ready", "started", "command"],
                r.services.map((s) => [
                  s.name,
                  s.exit_code !== null ? `${s.state} (exit ${s.exit_code})` : s.state,
                  s.pid !== null ? String(s.pid) : "-",
                  probeText(s.ready),
                  s.started_at,
                  s.command,
                ]),
              ),
      );
    });
  svc
    .command("status")
    .description("one service's state, pid, readiness and command")
    .argument("<id>", "workspace id or name")
    .argument("<name>", "service name")
    .option("--json", "print the structured result")
    .action(async (id: string, name: string, o: { json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () => serviceStatus(ctx.engine().workspaces, id, serviceName(name)),
        describe,
      );
    });
  svc
    .command("logs")
    .description("the last lines of a service's stdout and stderr")
    .argument("<id>", "workspace id or name")
    .argument("<name>", "service name")
    .option("--tail-lines <n>", "how many lines (default 100, at most 10000)", wholeNumber("--tail-lines"))
    .option("--json", "print the structured result")
    .action(async (id: string, name: string, o: { tailLines?: number; json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        async () => {
          if (o.tailLines !== undefined && o.tailLines > 10_000)
            throw new PyroError("invalid_argument", `--tail-lines must be at most 10000, got ${o.tailLines}`);
          return serviceLogs(ctx.engine().workspaces, id, serviceName(name), o.tailLines);
        },
        (r) => {
          // stderr lines go to stderr, as exec prints them.
          const out: string[] = [];
          for (const l of r.lines)
            if (l.stream === "stderr") ctx.io.stderr.write(`${l.text}\n`);
            else out.push(l.text);
          if (r.truncated) ctx.io.stderr.write("pyro: older lines were dropped from the log ring\n");
          return out.join("\n");
        },
      );
    });
  svc
    .command("stop")
    .description("stop a service: TERM to its process group, KILL after the grace period")
    .argument("<id>", "workspace id or name")
    .argument("<name>", "service name")
    .option("--json", "print the structured result")
    .action(async (id: string, name: string, o: { json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () => stopService(ctx.engine().workspaces, id, serviceName(name)),
        (r) => `${stateLine(r)}${r.killed ? " (killed after the grace period)" : ""}`,
      );
    });
}
