import type { Command } from "commander";
import { execInWorkspace, workspaceLogs } from "../../../core/exec.js";
import { parseMaxOutputBytes } from "../../../core/output.js";
import { summarizeWorkspace } from "../../../core/summary.js";
import { PyroError } from "../../../errors.js";
import { collect, commandString, keyValues, positiveNumber } from "../../args.js";
import { liveCommand } from "../../live.js";
import type { CliContext } from "../../main.js";
import { act } from "../../output.js";

export function registerExec(ws: Command, ctx: CliContext): void {
  ws.command("exec")
    .description("run a command in /workspace; exits with the command's exit code")
    .argument("<id>", "workspace id or name")
    .argument("[command...]", "command after --: one shell string, or an argv")
    .option(
      "--timeout <s>",
      "timeout in seconds (default 300); the whole process tree is killed",
      positiveNumber("--timeout"),
    )
    .option("--cwd <path>", "working directory (default /workspace)")
    .option("--env <K=V>", "environment variable (repeatable)", collect)
    .option(
      "--max-output-bytes <n>",
      "per stream (default 1MiB, 1k..4MiB); past it a stream keeps its head and tail",
    )
    .option("--json", "print the structured result")
    .action(
      async (
        id: string,
        command: string[],
        o: { timeout?: number; cwd?: string; env?: string[]; maxOutputBytes?: string; json?: boolean },
      ) => {
        const live = liveCommand(ctx.io, o.json === true);
        ctx.exitCode = await act(
          ctx.io,
          o,
          async () =>
            execInWorkspace(ctx.engine().workspaces, id, commandString(command), {
              ...(o.timeout ? { timeout_seconds: o.timeout } : {}),
              ...(o.cwd ? { cwd: o.cwd } : {}),
              ...(o.env ? { env: keyValues(o.env, "--env") } : {}),
              ...(o.maxOutputBytes !== undefined
                ? { max_output_bytes: parseMaxOutputBytes(o.maxOutputBytes) }
                : {}),
              ...(live.on_output ? { on_output: live.on_output } : {}),
              ...(live.stdin ? { stdin: live.stdin } : {}),
              signal: ctx.signal,
            }).finally(live.done),
          (r) => {
            // The streams were written live; only pyro's own notes remain.
            if (r.timed_out) ctx.io.stderr.write("pyro: command timed out; its process tree was killed\n");
            return "";
          },
          (r) => (r.timed_out ? 124 : r.exit_code),
        );
      },
    );

  ws.command("logs")
    .description("command history of a workspace; --seq N prints one command's kept output")
    .argument("<id>", "workspace id or name")
    .option("--limit <n>", "most recent N commands (default 100)", positiveNumber("--limit"))
    .option("--seq <n>", "one command: its stdout and stderr as the history kept them (up to 1 MiB each)")
    .option("--json", "print the structured result")
    .action(async (id: string, o: { limit?: number; seq?: string; json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        async () =>
          workspaceLogs(ctx.engine().workspaces, id, {
            ...(o.limit ? { limit: o.limit } : {}),
            ...(o.seq !== undefined ? { seq: commandNumber(o.seq) } : {}),
          }),
        (r) => {
          if (o.seq !== undefined) {
            // One command: its streams, as exec printed them.
            const c = r.commands[0]!;
            if (c.stderr) ctx.io.stderr.write(c.stderr);
            if (!("full_output" in c && c.full_output))
              ctx.io.stderr.write("pyro: only the last 4 KiB of this command's output are kept\n");
            return c.stdout;
          }
          return r.commands.length === 0
            ? "no commands yet"
            : r.commands
                .map(
                  (c) =>
                    `#${c.seq} [${c.timed_out ? "timeout" : `exit ${c.exit_code}`}] ${c.duration_ms} ms  ${c.command}`,
                )
                .join("\n");
        },
      );
    });

  ws.command("summary")
    .description("review a workspace: commands, edits, changes, exports, snapshots")
    .argument("<id>", "workspace id or name")
    .option("--json", "print the structured result")
    .action(async (id: string, o: { json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () => summarizeWorkspace(ctx.engine().workspaces, id),
        (r) => {
          const lines = [
            `workspace ${r.workspace_id}${r.name ? ` (${r.name})` : ""}: ${r.state}`,
            `commands: ${r.outcome.command_count}${r.outcome.last_command ? `, last: ${r.outcome.last_command.command} → exit ${r.outcome.last_command.exit_code}` : ""}`,
            `edits: ${r.edits.recent.length} recent; exports: ${r.outcome.export_count}; snapshots: ${r.outcome.snapshot_count}; resets: ${r.outcome.reset_count}`,
          ];
          if (r.changes.available) {
            lines.push(
              `changes vs baseline: ${r.changes.changed ? (r.changes.entries as { path: string; status: string }[]).map((e) => `${e.status} ${e.path}`).join(", ") : "none"}`,
            );
          }
          return lines.join("\n");
        },
      );
    });
}

function commandNumber(text: string): number {
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1)
    throw new PyroError(
      "invalid_argument",
      `--seq must be a command number (1, 2, 3...), got '${text.slice(0, 40)}'`,
    );
  return n;
}
