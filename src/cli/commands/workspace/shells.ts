import type { Command } from "commander";
import {
  closeShell,
  listShells,
  openShell,
  readShell,
  resizeShell,
  type ShellView,
  signalShell,
  writeShell,
} from "../../../core/shells.js";
import { PyroError } from "../../../errors.js";
import { wholeNumber } from "../../args.js";
import type { CliContext } from "../../main.js";
import { act, table } from "../../output.js";

/** A whole number that may be 0 (`--cursor 0`, `--wait-for-idle-ms 0`). */
function count(name: string) {
  return (value: string): number => {
    const n = /^\s*\d+\s*$/.test(value) ? Number(value) : Number.NaN;
    if (!Number.isSafeInteger(n))
      throw new PyroError("invalid_argument", `${name} must be a whole number, got '${value.slice(0, 40)}'`);
    return n;
  };
}

function stateText(s: ShellView): string {
  return s.state === "exited" ? `exited (${s.exit_code})` : `running (pid ${s.pid})`;
}

/**
 * `pyro workspace shell open|write|read|signal|resize|close|list`: interactive shells
 * in a running workspace (docs/workspaces.md "Shells").
 */
export function registerShells(ws: Command, ctx: CliContext): void {
  const sh = ws.command("shell").description("interactive shells (bash on a PTY) in a running workspace");
  sh.command("open")
    .description("open a shell; prints its id")
    .argument("<id>", "workspace id or name")
    .option("--cwd <path>", "working directory (default /workspace)")
    .option("--cols <n>", "terminal columns (default 120)", wholeNumber("--cols"))
    .option("--rows <n>", "terminal rows (default 40)", wholeNumber("--rows"))
    .option("--json", "print the structured result")
    .action(async (id: string, o: { cwd?: string; cols?: number; rows?: number; json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () =>
          openShell(ctx.engine().workspaces, id, {
            ...(o.cwd !== undefined ? { cwd: o.cwd } : {}),
            ...(o.cols !== undefined ? { cols: o.cols } : {}),
            ...(o.rows !== undefined ? { rows: o.rows } : {}),
          }),
        (r) => r.shell_id,
      );
    });
  sh.command("write")
    .description("type input into a shell, then Enter (unless --no-newline)")
    .argument("<id>", "workspace id or name")
    .argument("<shell>", "shell id")
    .requiredOption("--input <text>", "the text to type")
    .option("--no-newline", "do not press Enter after the input")
    .option("--json", "print the structured result")
    .action(async (id: string, shell: string, o: { input: string; newline: boolean; json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () => writeShell(ctx.engine().workspaces, id, shell, o.input, { newline: o.newline }),
        () => "",
      );
    });
  sh.command("read")
    .description("print a shell's output since a cursor (default: since the last read)")
    .argument("<id>", "workspace id or name")
    .argument("<shell>", "shell id")
    .option("--cursor <n>", "byte cursor to read from (a next_cursor of an earlier read)", count("--cursor"))
    .option("--plain", "render the terminal as text: no colours or control sequences")
    .option(
      "--wait-for-idle-ms <n>",
      "first wait until the shell has printed nothing for this long (at most 10000)",
      count("--wait-for-idle-ms"),
    )
    .option("--max-wait-ms <n>", "longest wait in all (default 30000, at most 60000)", count("--max-wait-ms"))
    .option("--json", "print the structured result")
    .action(
      async (
        id: string,
        shell: string,
        o: { cursor?: number; plain?: boolean; waitForIdleMs?: number; maxWaitMs?: number; json?: boolean },
      ) => {
        ctx.exitCode = await act(
          ctx.io,
          o,
          () =>
            readShell(ctx.engine().workspaces, id, shell, {
              ...(o.cursor !== undefined ? { cursor: o.cursor } : {}),
              plain: o.plain ?? false,
              ...(o.waitForIdleMs !== undefined ? { wait_for_idle_ms: o.waitForIdleMs } : {}),
              ...(o.maxWaitMs !== undefined ? { max_wait_ms: o.maxWaitMs } : {}),
            }),
          (r) => {
            if (r.truncated) ctx.io.stderr.write("pyro: older output fell out of the shell's buffer\n");
            if (r.state === "exited") ctx.io.stderr.write(`pyro: the shell exited (${r.exit_code})\n`);
            ctx.io.stderr.write(
              `pyro: next cursor ${r.next_cursor}${r.has_more ? " (more output waiting)" : ""}\n`,
            );
            return r.output;
          },
        );
      },
    );
  sh.command("signal")
    .description("send INT, TERM or KILL to the shell's foreground job")
    .argument("<id>", "workspace id or name")
    .argument("<shell>", "shell id")
    .argument("<signal>", "INT, TERM or KILL")
    .option("--json", "print the structured result")
    .action(async (id: string, shell: string, signal: string, o: { json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () => signalShell(ctx.engine().workspaces, id, shell, signal),
        (r) => `sent ${r.signal} to process group ${r.pgid}`,
      );
    });
  sh.command("resize")
    .description("change a shell's terminal size")
    .argument("<id>", "workspace id or name")
    .argument("<shell>", "shell id")
    .requiredOption("--cols <n>", "terminal columns", wholeNumber("--cols"))
    .requiredOption("--rows <n>", "terminal rows", wholeNumber("--rows"))
    .option("--json", "print the structured result")
    .action(async (id: string, shell: string, o: { cols: number; rows: number; json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () => resizeShell(ctx.engine().workspaces, id, shell, o.cols, o.rows),
        (r) => `shell ${r.shell_id}: ${r.cols}x${r.rows}`,
      );
    });
  sh.command("close")
    .description("end a shell and everything started in it")
    .argument("<id>", "workspace id or name")
    .argument("<shell>", "shell id")
    .option("--json", "print the structured result")
    .action(async (id: string, shell: string, o: { json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () => closeShell(ctx.engine().workspaces, id, shell),
        (r) => `closed shell ${r.shell_id}`,
      );
    });
  sh.command("list")
    .description("list a workspace's shells")
    .argument("<id>", "workspace id or name")
    .option("--json", "print the structured result")
    .action(async (id: string, o: { json?: boolean }) => {
      ctx.exitCode = await act(
        ctx.io,
        o,
        () => listShells(ctx.engine().workspaces, id),
        (r) =>
          r.count === 0
            ? "no shells"
            : table(
                ["shell", "state", "cwd", "size", "output bytes", "started"],
                r.shells.map((s) => [
                  s.shell_id,
                  stateText(s),
                  s.cwd,
                  `${s.cols}x${s.rows}`,
                  String(s.end_cursor),
                  s.started_at,
                ]),
              ),
      );
    });
}
