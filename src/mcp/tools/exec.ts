import { z } from "zod";
import { workspaceLogs as coreWorkspaceLogs, execInWorkspace } from "../../core/exec.js";
import { runOnce } from "../../core/oneshot.js";
import { summarizeWorkspace } from "../../core/summary.js";
import { BACKEND_NAMES, DEFAULT_ENVIRONMENT } from "../../core/vocabulary.js";
import { fitLogs, fitStreams, MCP_OUTPUT_BYTES, maxOutputArg, truncationNote } from "../output.js";
import {
  backendArg,
  boundedString,
  changeEntry,
  commandArg,
  diffSummary,
  diskArg,
  envArg,
  environmentArg,
  executionMode,
  INPUT_LIMITS,
  memoryArg,
  timeoutArg,
  vcpusArg,
  workspaceIdArg,
} from "../schemas.js";
import { defineTool, ifOffered, mutating, READ_ONLY, sentences } from "../tool.js";
import { defined, ensureEnvironment, renderCommand } from "./common.js";

const count = z.number().int().min(0);

const commandResult = {
  exit_code: z.number().int(),
  stdout: z.string(),
  stderr: z.string(),
  stdout_bytes: count,
  stderr_bytes: count,
  duration_ms: z.number().min(0),
  timed_out: z.boolean(),
  truncated: z.boolean(),
  execution_mode: executionMode,
};

const vmRunOutput = z.looseObject({
  environment: z.string(),
  backend: z.enum(BACKEND_NAMES),
  ...commandResult,
  total_ms: z.number().min(0),
});

export const vmRun = defineTool({
  name: "vm_run",
  title: "Run one command in a throwaway sandbox",
  description:
    "Run one shell command in a fresh, isolated sandbox and return its exit code and output; the sandbox is destroyed afterwards, so nothing persists and no project files are in it. Use it for quick self-contained checks (a tool's version, a snippet of Python). For work on a project (its files, several commands, edits, a diff) create a workspace instead. Network is off unless network_policy grants some. A non-zero exit code is a normal result, not a tool error.",
  next: [["workspace_create", "work on project files"]],
  input: z.strictObject({
    command: commandArg,
    environment: environmentArg.optional(),
    timeout_seconds: timeoutArg.optional(),
    vcpus: vcpusArg.optional(),
    memory_mib: memoryArg.optional(),
    disk_mib: diskArg.optional(),
    network_policy: boundedString(INPUT_LIMITS.networkPolicy, "network_policy")
      .optional()
      .describe(
        "Network policy: 'off' (default, no network at all), 'egress' (public destinations through a proxy that package managers, git and curl use by themselves) or 'allowlist:HOST,...' (only those hosts: exact names, *.suffix, optional :PORT).",
      ),
    backend: backendArg.optional(),
    env: envArg.optional(),
    max_output_bytes: maxOutputArg.optional(),
  }),
  output: vmRunOutput,
  annotations: mutating({ destructive: false, idempotent: false }),
  long: "running the command",
  async run(a, ctx) {
    await ensureEnvironment(ctx, a.environment, a.backend);
    const cap = a.max_output_bytes ?? MCP_OUTPUT_BYTES;
    const r = await runOnce(ctx.engine, a.command, {
      ...defined({
        timeout_seconds: a.timeout_seconds,
        vcpus: a.vcpus,
        memory_mib: a.memory_mib,
        disk_mib: a.disk_mib,
        network_policy: a.network_policy,
        backend: a.backend,
        env: a.env,
      }),
      environment: a.environment ?? DEFAULT_ENVIRONMENT,
      max_output_bytes: cap,
      allow_host_compat: ctx.allowHostCompat,
      signal: ctx.signal,
    });
    return a.max_output_bytes === undefined ? fitStreams(r, (x) => renderRun({ ...x }), cap) : r;
  },
  render: renderRun,
});

function renderRun(r: z.input<typeof vmRunOutput>): string {
  return renderCommand(r, `${r.environment} on ${r.backend}`, truncationNote(r));
}

const execOutput = z.looseObject({
  workspace_id: z.string(),
  command: z.string(),
  cwd: z.string(),
  ...commandResult,
  seq: count,
});

export const workspaceExec = defineTool({
  name: "workspace_exec",
  title: "Run a command in a workspace",
  description: (d) =>
    sentences(
      "Run a shell command in the workspace (`/bin/sh -c`, in /workspace unless cwd is given) and return exit_code, stdout, stderr and duration_ms.",
      "A non-zero exit code is a normal result (a failing test), not a tool error.",
      "Files and installed packages persist between calls; shell state (cd, variables) does not, so chain with && or pass cwd/env.",
      "Background jobs the command leaves behind end when the call returns; to keep one running (a dev server), start it with `nohup CMD >log 2>&1 &` or `setsid CMD &`: it then runs until the workspace is stopped, reset or deleted.",
      `Each stream is cut past max_output_bytes (default ${MCP_OUTPUT_BYTES} bytes) to its head and its tail (where test runners print their summary) around one '[... N bytes omitted ...]' line, with truncated: true; stdout_bytes/stderr_bytes are the full sizes.`,
      ifOffered(
        d,
        "workspace_logs",
        "workspace_logs with the command's seq reads back up to 1 MiB per stream of it.",
      ),
      ifOffered(
        d,
        "workspace_patch_apply",
        "To create or edit files prefer workspace_file_write or workspace_patch_apply: no shell quoting involved.",
      ),
    ),
  next: [
    ["workspace_patch_apply", "fix what failed"],
    ["workspace_diff", "review your changes"],
    ["workspace_logs", "see earlier commands' output"],
  ],
  input: z.strictObject({
    workspace_id: workspaceIdArg,
    command: commandArg,
    timeout_seconds: timeoutArg.optional(),
    cwd: boundedString(INPUT_LIMITS.path, "cwd")
      .optional()
      .describe("Working directory inside the workspace (default /workspace)."),
    env: envArg.optional(),
    max_output_bytes: maxOutputArg.optional(),
  }),
  output: execOutput,
  annotations: mutating({ destructive: true, idempotent: false }),
  long: "running the command",
  async run(a, ctx) {
    const cap = a.max_output_bytes ?? MCP_OUTPUT_BYTES;
    const r = await execInWorkspace(ctx.ws, a.workspace_id, a.command, {
      ...defined({ timeout_seconds: a.timeout_seconds, cwd: a.cwd, env: a.env }),
      max_output_bytes: cap,
      signal: ctx.signal,
    });
    return a.max_output_bytes === undefined ? fitStreams(r, (x) => renderExec({ ...x }), cap) : r;
  },
  render: renderExec,
});

function renderExec(r: z.input<typeof execOutput>): string {
  return renderCommand(r, `command #${r.seq} in ${r.cwd}`, truncationNote(r));
}

const logsOutput = z.looseObject({
  workspace_id: z.string(),
  count,
  commands: z.array(
    z.looseObject({
      seq: count,
      command: z.string(),
      cwd: z.string().nullable(),
      exit_code: z.number().int().nullable(),
      timed_out: z.boolean(),
      duration_ms: z.number().min(0),
      started_at: z.string(),
      stdout: z.string(),
      stderr: z.string(),
      stdout_bytes: count.nullable(),
      stderr_bytes: count.nullable(),
      truncated: z.boolean(),
      execution_mode: executionMode,
      full_output: z.boolean().optional(),
    }),
  ),
});

export const workspaceLogs = defineTool({
  name: "workspace_logs",
  title: "Command history",
  description: `The workspace's command history, oldest first: each command with its seq, exit code, duration, the full sizes of its output (stdout_bytes, stderr_bytes) and the last few KiB of stdout and stderr. With seq, that one command with the output the history kept (full_output: true): the whole of each stream up to 1 MiB, its head and tail beyond, cut again to max_output_bytes (default ${MCP_OUTPUT_BYTES}); older outputs past the workspace's 32 MiB budget keep only their tails. Use it to look again at an earlier command's output without rerunning it; workspace_summary gives the overall picture.`,
  input: z.strictObject({
    workspace_id: workspaceIdArg,
    limit: z
      .number()
      .int()
      .min(1)
      .max(1000)
      .optional()
      .describe("At most this many most recent commands (default 100)."),
    seq: z
      .number()
      .int()
      .min(1)
      .optional()
      .describe("One command (its seq from workspace_exec or this listing), with its kept output."),
    max_output_bytes: maxOutputArg.optional(),
  }),
  output: logsOutput,
  annotations: READ_ONLY,
  async run(a, ctx) {
    if (a.seq === undefined) {
      const r = await coreWorkspaceLogs(ctx.ws, a.workspace_id, defined({ limit: a.limit }));
      return fitLogs(r, renderLogs);
    }
    const cap = a.max_output_bytes ?? MCP_OUTPUT_BYTES;
    const r = await coreWorkspaceLogs(ctx.ws, a.workspace_id, { seq: a.seq, max_output_bytes: cap });
    const [c] = r.commands;
    if (a.max_output_bytes !== undefined || !c) return r;
    return { ...r, commands: [fitStreams(c, (x) => renderLogs({ ...r, commands: [x] }), cap)] };
  },
  render: renderLogs,
});

function renderLogs(r: z.input<typeof logsOutput>): string {
  return r.commands.length === 0
    ? "no commands yet"
    : [
        `${r.count} command(s)${r.commands.length < r.count ? `, the last ${r.commands.length} shown` : ""}:`,
        ...r.commands.map((c) => {
          const status = c.timed_out ? "timed out" : `exit ${c.exit_code}`;
          const head = `#${c.seq} ${status} (${c.duration_ms} ms): ${c.command}`;
          if (c.full_output !== undefined) {
            // One command: its kept output, as exec shows it.
            return [
              head,
              c.full_output ? "" : "(only the tails are left: the full output was pruned)",
              c.stdout && `--- stdout (${c.stdout_bytes ?? "?"} bytes) ---\n${c.stdout.replace(/\n$/, "")}`,
              c.stderr && `--- stderr (${c.stderr_bytes ?? "?"} bytes) ---\n${c.stderr.replace(/\n$/, "")}`,
            ]
              .filter(Boolean)
              .join("\n");
          }
          const out = [
            c.stdout && `  stdout: ${tail(c.stdout)}`,
            c.stderr && `  stderr: ${tail(c.stderr)}`,
          ].filter(Boolean);
          return [head, ...out].join("\n");
        }),
      ].join("\n");
}

export const workspaceSummary = defineTool({
  name: "workspace_summary",
  title: "Review a workspace",
  description: (d) =>
    sentences(
      "One review of a workspace: outcome counts (commands, last command, exports, snapshots, resets), recent commands, recent edits (file writes, patches, pushes), the current changes against the baseline (a live diff summary), exports and snapshots.",
      "Use it before reporting back or deciding what to do next.",
      ifOffered(d, "workspace_diff", "workspace_diff gives the full patch."),
    ),
  next: [
    ["workspace_diff", "the full patch"],
    ["workspace_export", "take results out"],
  ],
  input: z.strictObject({ workspace_id: workspaceIdArg }),
  output: z.looseObject({
    workspace_id: z.string(),
    name: z.string().nullable(),
    state: z.string(),
    outcome: z.looseObject({
      command_count: count,
      last_command: z
        .looseObject({
          command: z.string(),
          exit_code: z.number().int().nullable(),
          timed_out: z.boolean(),
          started_at: z.string(),
        })
        .nullable(),
      service_count: count,
      running_service_count: count,
      export_count: count,
      snapshot_count: count,
      reset_count: count,
    }),
    commands: z.looseObject({
      total: count,
      recent: z.array(z.looseObject({ seq: count, command: z.string() })),
    }),
    edits: z.looseObject({ recent: z.array(z.looseObject({ kind: z.string(), at: z.string() })) }),
    changes: z.looseObject({
      available: z.boolean(),
      changed: z.boolean().nullable(),
      summary: diffSummary.nullable(),
      entries: z.array(changeEntry),
    }),
    services: z.looseObject({ current: z.array(z.unknown()), recent: z.array(z.unknown()) }),
    artifacts: z.looseObject({ exports: z.array(z.looseObject({ at: z.string() })) }),
    snapshots: z.looseObject({
      named_count: count,
      recent: z.array(z.looseObject({ snapshot_name: z.string() })),
    }),
  }),
  annotations: READ_ONLY,
  async run(a, ctx) {
    const s = await summarizeWorkspace(ctx.ws, a.workspace_id);
    // The core types the diff part as unknown; it is a diff summary and entries (checked at run time).
    const changes = s.changes as typeof s.changes & {
      summary: z.input<typeof diffSummary> | null;
      entries: z.input<typeof changeEntry>[];
    };
    return { ...s, changes };
  },
  render: (s) => {
    const o = s.outcome;
    const last = o.last_command;
    const changes = s.changes.available
      ? s.changes.changed
        ? `${s.changes.entries.length} changed file(s): ${s.changes.entries.map((e) => `${e.status} ${e.path}`).join(", ")}`
        : "no changes against the baseline"
      : "changes unavailable (the workspace is not running)";
    return [
      `workspace ${s.workspace_id}${s.name ? ` (${s.name})` : ""}: ${s.state}`,
      `${o.command_count} command(s)${last ? `, last: ${last.command} → ${last.timed_out ? "timed out" : `exit ${last.exit_code}`}` : ""}`,
      `${s.edits.recent.length} recent edit(s); ${changes}`,
      `${o.export_count} export(s), ${o.snapshot_count} snapshot(s), ${o.reset_count} reset(s)`,
    ].join("\n");
  },
});

function tail(text: string): string {
  const t = text.trimEnd();
  const lines = t.split("\n");
  return lines.length > 3 ? `... ${lines.slice(-3).join(" | ")}` : lines.join(" | ");
}
