import type { Command } from "commander";
import { execInWorkspace, workspaceLogs } from "../../../core/exec.js";
import { summarizeWorkspace } from "../../../core/summary.js";
import { collect, commandString, keyValues, positiveNumber } from "../../args.js";
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
    .option("--json", "print the structured result")
    .action(
      async (
        id: string,
        command: string[],
        o: { timeout?: number; cwd?: string; env?: string[]; json?: boolean },
      ) => {
        ctx.exitCode = await act(
          ctx.io,
          o,
          () =>
            execInWorkspace(ctx.engine().workspaces, id, commandString(command), {
              ...(o.timeout ? { timeout_seconds: o.timeout } : {}),
              ...(o.cwd ? { cwd: o.cwd } : {}),
              ...(o.env ? { env: keyValues(o.env, "--env") } : {}),
              signal: ctx.signal,
            }),
          (r) => {
            if (r.stderr) ctx.io.stderr.write(r.stderr);
            if (r.timed_out) ctx.io.stderr.write("pyro: command timed out; its process tree was killed\n");
            if (r.truncated) ctx.io.stderr.write("pyro: output truncated at the per-stream cap\n");
            return r.stdout;
          },
          (r) => (r.timed_out ? 124 : r.exit_code),
        );
      },
    );

  ws.command("logs")
    .description("command history of a workspace")
    .argument("<id>", "workspace id or name")
    .option("--limit <n>", "most recent N commands (default 100)", positiveNumber("--limit"))
    .option("--json", "print the structured result")
    .action(async (id: string, o: { limit?: number; json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () => workspaceLogs(ctx.engine().workspaces, id, o.limit ? { limit: o.limit } : {}),
        (r) =>
          r.commands.length === 0
            ? "no commands yet"
            : r.commands
                .map(
                  (c) =>
                    `#${c.seq} [${c.timed_out ? "timeout" : `exit ${c.exit_code}`}] ${c.duration_ms} ms  ${c.command}`,
                )
                .join("\n"),
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
