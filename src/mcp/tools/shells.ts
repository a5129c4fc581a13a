import { z } from "zod";
import { closeShell, openShell, readShell, signalShell, writeShell } from "../../core/shells.js";
import { workspaceIdArg, workspacePathArg } from "../schemas.js";
import { defineTool, mutating, READ_ONLY } from "../tool.js";
import { defined } from "./common.js";

/** Contract §5 argument names: `shell_id`, `cursor`, `plain`, `wait_for_idle_ms`, `input`, `signal`. */
const shellIdArg = z
  .string()
  .regex(/^sh_[0-9a-f]{12}$/, "shell ids look like sh_ and 12 hex digits")
  .describe("The shell's id from shell_open (sh_ and 12 hex digits).");

const shellShape = {
  workspace_id: z.string(),
  shell_id: z.string(),
  pid: z.number().int().nullable(),
  cwd: z.string(),
  cols: z.number().int(),
  rows: z.number().int(),
  state: z.enum(["running", "exited"]),
  exit_code: z.number().int().nullable(),
  started_at: z.string(),
  end_cursor: z.number().int().min(0),
  buffer_start: z.number().int().min(0),
};
const shellObject = z.looseObject(shellShape);

function renderShell(s: z.infer<typeof shellObject>): string {
  const state = s.state === "exited" ? `exited (${s.exit_code})` : "running";
  return `shell ${s.shell_id}: ${state}, cwd ${s.cwd}, ${s.cols}x${s.rows}, ${s.end_cursor} bytes of output`;
}

export const shellOpen = defineTool({
  name: "shell_open",
  title: "Open a shell",
  description:
    "Open an interactive bash shell on a terminal in a running workspace (for REPLs, prompts, debuggers, full-screen programs). Returns shell_id. Then shell_write a command and shell_read its output with wait_for_idle_ms. The shell keeps running between calls; a reset, stop or delete of the workspace ends it. For one-off commands workspace_exec is simpler.",
  next: [
    ["shell_write", "type a command"],
    ["shell_read", "read what it printed"],
  ],
  input: z.strictObject({
    workspace_id: workspaceIdArg,
    cwd: workspacePathArg.optional(),
    cols: z.number().int().min(1).max(500).optional().describe("Terminal columns (default 120)."),
    rows: z.number().int().min(1).max(200).optional().describe("Terminal rows (default 40)."),
  }),
  output: shellObject,
  annotations: mutating({ destructive: false, idempotent: false }),
  run: (a, ctx) => openShell(ctx.ws, a.workspace_id, defined({ cwd: a.cwd, cols: a.cols, rows: a.rows })),
  render: renderShell,
});

export const shellWrite = defineTool({
  name: "shell_write",
  title: "Type into a shell",
  description:
    'Type input into a shell, followed by Enter unless newline is false. Control keys are characters: "\\u0003" is Ctrl-C, "\\u0004" Ctrl-D. Then shell_read with wait_for_idle_ms to see the result.',
  next: [["shell_read", "read the output"]],
  input: z.strictObject({
    workspace_id: workspaceIdArg,
    shell_id: shellIdArg,
    input: z.string().max(65_536).describe("The text to type (at most 65536 characters)."),
    newline: z.boolean().optional().describe("Press Enter after the input (default true)."),
  }),
  output: z.looseObject({ ...shellShape, bytes: z.number().int().min(0) }),
  annotations: mutating({ destructive: true, idempotent: false }),
  run: (a, ctx) => writeShell(ctx.ws, a.workspace_id, a.shell_id, a.input, defined({ newline: a.newline })),
  render: (r) => `sent ${r.bytes} bytes to shell ${r.shell_id}`,
});

export const shellRead = defineTool({
  name: "shell_read",
  title: "Read a shell",
  description:
    "Read a shell's output since a cursor (default: since the last read). plain (default true here) renders the terminal as the text a person would see: no colour codes, progress bars collapsed to their last state, full-screen programs as their screen. wait_for_idle_ms first waits until the shell has printed nothing for that long (e.g. 500; at most 10000; the whole wait is capped at 30 s), so one read returns a command's whole output. Returns output, cursor, next_cursor (pass it as cursor next time to reread from there), truncated (older output fell out of the 1 MiB buffer), has_more (call again for the rest), state.",
  input: z.strictObject({
    workspace_id: workspaceIdArg,
    shell_id: shellIdArg,
    cursor: z
      .number()
      .int()
      .min(0)
      .optional()
      .describe(
        "Byte cursor to read from (a next_cursor of an earlier read); default: where the last read ended.",
      ),
    plain: z.boolean().optional().describe("Render as plain screen text (default true)."),
    wait_for_idle_ms: z
      .number()
      .int()
      .min(0)
      .max(10_000)
      .optional()
      .describe("Wait until the shell has been quiet this long before reading (default 0: read now)."),
  }),
  output: z.looseObject({
    workspace_id: z.string(),
    shell_id: z.string(),
    output: z.string(),
    plain: z.boolean(),
    cursor: z.number().int().min(0),
    next_cursor: z.number().int().min(0),
    truncated: z.boolean(),
    has_more: z.boolean(),
    state: z.enum(["running", "exited"]),
    exit_code: z.number().int().nullable(),
  }),
  annotations: READ_ONLY,
  run: (a, ctx) =>
    readShell(
      ctx.ws,
      a.workspace_id,
      a.shell_id,
      defined({ cursor: a.cursor, plain: a.plain ?? true, wait_for_idle_ms: a.wait_for_idle_ms }),
    ),
  render: (r) => {
    const notes = [
      r.truncated ? "older output fell out of the buffer" : null,
      r.has_more ? "more output is waiting: read again" : null,
      r.state === "exited" ? `the shell exited (${r.exit_code})` : null,
    ].filter((n) => n !== null);
    return `${r.output}\n[next_cursor ${r.next_cursor}${notes.length > 0 ? `; ${notes.join("; ")}` : ""}]`;
  },
});

export const shellSignal = defineTool({
  name: "shell_signal",
  title: "Signal a shell",
  description:
    "Send INT (like Ctrl-C), TERM or KILL to the shell's foreground job (the shell itself when nothing runs in it).",
  input: z.strictObject({
    workspace_id: workspaceIdArg,
    shell_id: shellIdArg,
    signal: z.enum(["INT", "TERM", "KILL"]).describe('"INT", "TERM" or "KILL".'),
  }),
  output: z.looseObject({ ...shellShape, signal: z.string(), pgid: z.number().int() }),
  annotations: mutating({ destructive: true, idempotent: false }),
  run: (a, ctx) => signalShell(ctx.ws, a.workspace_id, a.shell_id, a.signal),
  render: (r) => `sent ${r.signal} to process group ${r.pgid} in shell ${r.shell_id}`,
});

export const shellClose = defineTool({
  name: "shell_close",
  title: "Close a shell",
  description:
    "End a shell and every process started in it (its jobs, background ones included). Shells also end with the workspace's reset, stop or delete.",
  input: z.strictObject({ workspace_id: workspaceIdArg, shell_id: shellIdArg }),
  output: z.looseObject({ ...shellShape, closed: z.boolean() }),
  annotations: mutating({ destructive: true, idempotent: false }),
  run: (a, ctx) => closeShell(ctx.ws, a.workspace_id, a.shell_id),
  render: (r) => `closed shell ${r.shell_id}`,
});
