/** The shell ops' schemas (guest/ops/shells.ts); op-schemas.ts lists them in OPS. */
import * as z from "zod/mini";
import "./zod.js";
import { count, envName, envValue, pathArg } from "./schema-parts.js";

/** A shell's id as the agent makes it: `sh_` and 12 hex digits. */
export const shellId = z
  .string()
  .check(z.regex(/^sh_[0-9a-f]{12}$/, "shell ids look like sh_ and 12 hex digits"));
/** Terminal size bounds (columns, rows). */
export const SHELL_MAX_COLS = 500;
export const SHELL_MAX_ROWS = 200;
/** Most bytes one write sends, and one read returns. */
export const SHELL_MAX_INPUT_BYTES = 64 * 1024;
export const SHELL_MAX_READ_BYTES = 1024 * 1024;
/** Longest idle wait, and longest a read waits in all. */
export const SHELL_MAX_IDLE_MS = 10_000;
export const SHELL_MAX_WAIT_MS = 60_000;

export const shellStatus = z.strictObject({
  shell_id: z.string(),
  pid: z.nullable(z.int()),
  cwd: z.string(),
  cols: z.int(),
  rows: z.int(),
  state: z.enum(["running", "exited"]),
  exit_code: z.nullable(z.int()),
  started_at: z.string(),
  /** Bytes the shell has printed so far (the cursor of the end of its output). */
  end_cursor: count,
  /** The oldest byte still kept (older output fell out of the bounded buffer). */
  buffer_start: count,
});

export const shellOpenArgs = z.strictObject({
  cwd: z.optional(pathArg),
  cols: z._default(z.int().check(z.minimum(1), z.maximum(SHELL_MAX_COLS)), 120),
  rows: z._default(z.int().check(z.minimum(1), z.maximum(SHELL_MAX_ROWS)), 40),
  env: z.optional(z.record(envName, envValue)),
});
export const shellOpenResult = z.strictObject({ shell: shellStatus });
export const shellWriteArgs = z.strictObject({
  shell_id: shellId,
  input: z.string().check(z.maxLength(SHELL_MAX_INPUT_BYTES)),
  newline: z._default(z.boolean(), true),
});
export const shellWriteResult = z.strictObject({ shell: shellStatus, bytes: count });
/**
 * Output from `cursor` (default: where the last read ended), at most `max_bytes`;
 * `prefix_bytes` of what came before it too (for rendering); `wait_for_idle_ms` first
 * waits until the shell has printed nothing for that long (at most `max_wait_ms`).
 */
export const shellReadArgs = z.strictObject({
  shell_id: shellId,
  cursor: z.optional(count),
  max_bytes: z._default(z.int().check(z.minimum(1), z.maximum(SHELL_MAX_READ_BYTES)), 64 * 1024),
  prefix_bytes: z._default(z.int().check(z.minimum(0), z.maximum(SHELL_MAX_READ_BYTES)), 0),
  wait_for_idle_ms: z._default(z.int().check(z.minimum(0), z.maximum(SHELL_MAX_IDLE_MS)), 0),
  max_wait_ms: z._default(z.int().check(z.minimum(0), z.maximum(SHELL_MAX_WAIT_MS)), 30_000),
});
export const shellReadResult = z.strictObject({
  shell: shellStatus,
  output: z.string(),
  prefix: z.string(),
  /** Where `output` starts: the asked cursor, or the buffer's start when that fell out (`truncated`). */
  cursor: count,
  next_cursor: count,
  truncated: z.boolean(),
  /** More output is already there past `next_cursor`. */
  has_more: z.boolean(),
});
export const shellSignalArgs = z.strictObject({
  shell_id: shellId,
  signal: z.enum(["INT", "TERM", "KILL"]),
});
/** `pgid`: the process group signalled (the terminal's foreground job, or the shell). */
export const shellSignalResult = z.strictObject({ shell: shellStatus, pgid: z.int() });
export const shellResizeArgs = z.strictObject({
  shell_id: shellId,
  cols: z.int().check(z.minimum(1), z.maximum(SHELL_MAX_COLS)),
  rows: z.int().check(z.minimum(1), z.maximum(SHELL_MAX_ROWS)),
});
export const shellResizeResult = z.strictObject({ shell: shellStatus });
export const shellCloseArgs = z.strictObject({ shell_id: shellId });
export const shellCloseResult = z.strictObject({ shell: shellStatus });
export const shellListArgs = z.strictObject({});
export const shellListResult = z.strictObject({ shells: z.array(shellStatus) });
