import { z } from "zod";
import {
  listServices,
  serviceLogs as readServiceLogs,
  serviceStatus as readServiceStatus,
  startService,
  stopService,
} from "../../core/services.js";
import {
  boundedString,
  commandArg,
  envArg,
  INPUT_LIMITS,
  workspaceIdArg,
  workspacePathArg,
} from "../schemas.js";
import { defineTool, mutating, READ_ONLY } from "../tool.js";
import { defined } from "./common.js";

/** Contract §5 argument names: `service_name`, `readiness {type, ..., timeout_seconds?}`, `tail_lines`. */
const serviceNameArg = z
  .string()
  .regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/, "service names are 1-63 letters, digits, '.', '_' or '-'")
  .describe("Service name: 1-63 letters, digits, '.', '_' or '-', e.g. \"web\".");

const probeTimeout = z
  .number()
  .positive()
  .max(86_400)
  .optional()
  .describe(
    "Seconds to wait for readiness (default 30); past it the call fails with timeout and the service keeps running.",
  );

const readinessArg = z
  .discriminatedUnion("type", [
    z.strictObject({
      type: z.literal("file"),
      path: boundedString(INPUT_LIMITS.path, "path").describe("Ready once this file exists."),
      timeout_seconds: probeTimeout,
    }),
    z.strictObject({
      type: z.literal("tcp"),
      port: z
        .number()
        .int()
        .min(1)
        .max(65535)
        .describe("Ready once this guest TCP port accepts a connection."),
      timeout_seconds: probeTimeout,
    }),
    z.strictObject({
      type: z.literal("http"),
      url: boundedString(2048, "url").describe("Ready once this URL answers (inside the workspace)."),
      timeout_seconds: probeTimeout,
    }),
    z.strictObject({
      type: z.literal("command"),
      command: commandArg.describe("Ready once this shell command exits 0."),
      timeout_seconds: probeTimeout,
    }),
  ])
  .describe(
    'How to know the service is ready: {type: "tcp", port: 8000}, {type: "http", url}, {type: "file", path} or {type: "command", command}, each with an optional timeout_seconds (default 30). Omit it: ready once started.',
  );

const probeObject = z
  .discriminatedUnion("kind", [
    z.looseObject({ kind: z.literal("file"), path: z.string() }),
    z.looseObject({ kind: z.literal("tcp"), port: z.number() }),
    z.looseObject({ kind: z.literal("http"), url: z.string() }),
    z.looseObject({ kind: z.literal("command"), command: z.string() }),
  ])
  .nullable();

const serviceShape = {
  workspace_id: z.string(),
  name: z.string(),
  command: z.string(),
  state: z.enum(["starting", "ready", "failed", "stopped"]),
  pid: z.number().int().nullable(),
  started_at: z.string(),
  ready_at: z.string().nullable(),
  exit_code: z.number().int().nullable(),
  ready: probeObject,
};
const serviceObject = z.looseObject(serviceShape);

type Service = z.infer<typeof serviceObject>;

function renderService(s: Service): string {
  const details = [
    s.pid !== null ? `pid ${s.pid}` : null,
    s.ready_at ? `ready at ${s.ready_at}` : null,
    s.exit_code !== null ? `exit ${s.exit_code}` : null,
  ].filter((d) => d !== null);
  return `service ${s.name}: ${s.state}${details.length > 0 ? ` (${details.join(", ")})` : ""}; command: ${s.command}`;
}

export const serviceStart = defineTool({
  name: "service_start",
  title: "Start a service",
  description:
    "Start a named long-running command (a server, a database, a watcher) in the workspace and wait until its readiness probe passes. Returns state ready, or failed with exit_code and log_tail when it exits first; a probe that never passes is a timeout error with the last log lines (the service keeps running: look at service_logs). The service keeps running across calls and is started again when the workspace is started; a reset ends it. Starting a name that exists replaces it.",
  next: [
    ["workspace_exec", "use the running service"],
    ["service_logs", "read what it printed"],
  ],
  input: z.strictObject({
    workspace_id: workspaceIdArg,
    service_name: serviceNameArg,
    command: commandArg,
    readiness: readinessArg.optional(),
    cwd: workspacePathArg.optional(),
    env: envArg.optional(),
  }),
  output: z.looseObject({ ...serviceShape, log_tail: z.array(z.string()) }),
  annotations: mutating({ destructive: false, idempotent: false }),
  long: "starting the service",
  run: async (a, ctx) => {
    const r = await startService(
      ctx.ws,
      a.workspace_id,
      a.service_name,
      a.command,
      defined({
        readiness: a.readiness,
        cwd: a.cwd,
        env: a.env,
      }),
    );
    return r;
  },
  render: (r) =>
    r.state === "failed" && r.log_tail.length > 0
      ? `${renderService(r)}\nlast log lines:\n${r.log_tail.join("\n")}`
      : renderService(r),
});

export const serviceList = defineTool({
  name: "service_list",
  title: "List services",
  description:
    "List the services of a workspace: name, state (starting, ready, failed, stopped), pid, readiness probe and command.",
  input: z.strictObject({ workspace_id: workspaceIdArg }),
  output: z.looseObject({
    workspace_id: z.string(),
    count: z.number().int().min(0),
    running_count: z.number().int().min(0),
    services: z.array(serviceObject),
  }),
  annotations: READ_ONLY,
  run: (a, ctx) => listServices(ctx.ws, a.workspace_id),
  render: (r) =>
    r.count === 0
      ? `no services in ${r.workspace_id}`
      : [
          `${r.count} service(s) in ${r.workspace_id}, ${r.running_count} running:`,
          ...r.services.map((s) => `- ${renderService(s)}`),
        ].join("\n"),
});

export const serviceStatus = defineTool({
  name: "service_status",
  title: "Service status",
  description:
    "One service's state (starting, ready, failed, stopped), pid, when it became ready, exit code and command.",
  input: z.strictObject({ workspace_id: workspaceIdArg, service_name: serviceNameArg }),
  output: serviceObject,
  annotations: READ_ONLY,
  run: (a, ctx) => readServiceStatus(ctx.ws, a.workspace_id, a.service_name),
  render: renderService,
});

export const serviceLogs = defineTool({
  name: "service_logs",
  title: "Service logs",
  description:
    "The last lines a service printed on stdout and stderr (each line tagged with its stream). The workspace keeps the last 2000 lines of each service; truncated says older ones were dropped.",
  input: z.strictObject({
    workspace_id: workspaceIdArg,
    service_name: serviceNameArg,
    tail_lines: z
      .number()
      .int()
      .min(1)
      .max(2000)
      .optional()
      .describe("How many of the last lines (default 100)."),
  }),
  output: z.looseObject({
    workspace_id: z.string(),
    name: z.string(),
    lines: z.array(z.looseObject({ stream: z.enum(["stdout", "stderr"]), text: z.string() })),
    truncated: z.boolean(),
  }),
  annotations: READ_ONLY,
  run: (a, ctx) => readServiceLogs(ctx.ws, a.workspace_id, a.service_name, a.tail_lines),
  render: (r) =>
    r.lines.length === 0
      ? `no output from service ${r.name} yet`
      : [
          ...(r.truncated ? ["(older lines were dropped)"] : []),
          ...r.lines.map((l) => (l.stream === "stderr" ? `[stderr] ${l.text}` : l.text)),
        ].join("\n"),
});

export const serviceStop = defineTool({
  name: "service_stop",
  title: "Stop a service",
  description:
    "Stop a service: TERM to its whole process group, KILL after 5 seconds. It is not started again when the workspace starts.",
  input: z.strictObject({ workspace_id: workspaceIdArg, service_name: serviceNameArg }),
  output: z.looseObject({ ...serviceShape, killed: z.boolean() }),
  annotations: mutating({ destructive: true, idempotent: true }),
  run: (a, ctx) => stopService(ctx.ws, a.workspace_id, a.service_name),
  render: (r) => `${renderService(r)}${r.killed ? " (killed after the grace period)" : ""}`,
});
