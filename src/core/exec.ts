import type { Readable } from "node:stream";
import { EXEC_STREAM_TAG } from "../agent/op-schemas.js";
import { PyroError } from "../errors.js";
import { LIMITS } from "./limits.js";
import {
  checkMaxOutputBytes,
  clipText,
  HISTORY_OUTPUT_BYTES,
  LiveRedactor,
  type OutputListener,
} from "./output.js";
import { secretRedactor } from "./secrets.js";
import type { JournalWriter } from "./workspace-deps.js";
import { DEFAULTS } from "./workspace-spec.js";
import type { Workspaces } from "./workspaces.js";

export interface ExecOptions {
  timeout_seconds?: number;
  cwd?: string;
  env?: Record<string, string>;
  /** Per stream (default 1 MiB); past it a stream keeps its head and tail (see output.ts). */
  max_output_bytes?: number;
  signal?: AbortSignal;
  /** Receives the output live, secrets redacted (the result still holds it, capped). */
  on_output?: OutputListener;
  /** The command's stdin (default: none, /dev/null); its end is the command's EOF. */
  stdin?: AsyncIterable<Uint8Array> | Readable;
}

/** The exec result every surface returns. */
export interface ExecResult {
  workspace_id: string;
  command: string;
  cwd: string;
  exit_code: number;
  stdout: string;
  stderr: string;
  /** Full sizes of the streams in bytes, whatever `stdout`/`stderr` kept. */
  stdout_bytes: number;
  stderr_bytes: number;
  duration_ms: number;
  timed_out: boolean;
  /** A stream was over `max_output_bytes`: it holds its head, a marker line and its tail. */
  truncated: boolean;
  execution_mode: "guest_agent" | "host_compat";
  seq: number;
}

/**
 * Runs a shell command string in the workspace (`/bin/sh -c`, cwd /workspace by default),
 * records it in the command history and as a review event.
 */
export async function execInWorkspace(
  ws: Workspaces,
  idOrName: string,
  command: string,
  options: ExecOptions = {},
): Promise<ExecResult> {
  if (command.trim() === "")
    throw new PyroError("invalid_argument", "the command is empty", "pass a shell command, e.g. `make test`");
  const timeoutSeconds = options.timeout_seconds ?? DEFAULTS.timeout_seconds;
  if (!(timeoutSeconds > 0 && timeoutSeconds <= LIMITS.timeout_seconds.max)) {
    throw new PyroError(
      "invalid_argument",
      `timeout must be between 1 and ${LIMITS.timeout_seconds.max} seconds, got ${timeoutSeconds}`,
    );
  }
  const cap = checkMaxOutputBytes(options.max_output_bytes ?? DEFAULTS.max_output_bytes);
  // The history keeps HISTORY_OUTPUT_BYTES of each stream even when the call asks for
  // less: the agent cuts both from one capture.
  const logCap = cap < HISTORY_OUTPUT_BYTES ? HISTORY_OUTPUT_BYTES : undefined;
  return ws.withAgent(idOrName, "exec", async (agent, w, journal) => {
    const startedAt = new Date().toISOString();
    const cwd = options.cwd ?? "/workspace";
    const secrets = await ws.secretValues(w);
    const redact = secretRedactor(secrets);
    const live = options.on_output ? liveOutput(options.on_output, secrets, redact) : undefined;
    const r = await agent.request(
      "exec",
      {
        command,
        cwd,
        // The proxy settings, forwarded env, then secrets, then this call's env.
        env: { ...(await ws.networkEnv(w)), ...w.spec.env, ...Object.fromEntries(secrets), ...options.env },
        timeout_ms: Math.round(timeoutSeconds * 1000),
        max_output_bytes: cap,
        ...(logCap !== undefined ? { log_output_bytes: logCap } : {}),
        stream: live !== undefined,
        stdin: options.stdin !== undefined,
      },
      {
        ...(options.signal ? { signal: options.signal } : {}),
        ...(live ? { onData: live.data } : {}),
        ...(options.stdin ? { upload: options.stdin } : {}),
      },
    );
    live?.end();
    const mode = ws.executionMode(w);
    const shown = { command: redact(command), stdout: redact(r.stdout), stderr: redact(r.stderr) };
    // The history's cut: the agent's larger one when it sent one (redacted here), else the result's.
    const logged = {
      stdout: r.stdout_log !== undefined ? redact(r.stdout_log) : shown.stdout,
      stderr: r.stderr_log !== undefined ? redact(r.stderr_log) : shown.stderr,
    };
    const seq = journal((store) =>
      recordExec(store, w.workspace_id, { command: shown.command, cwd, startedAt, mode }, r, logged),
    );
    ws.reportNetworkBlocks(w, startedAt);
    return {
      workspace_id: w.workspace_id,
      command: shown.command,
      cwd,
      exit_code: r.exit_code,
      stdout: shown.stdout,
      stderr: shown.stderr,
      stdout_bytes: r.stdout_bytes,
      stderr_bytes: r.stderr_bytes,
      duration_ms: Math.round(r.duration_ms),
      timed_out: r.timed_out,
      truncated: r.truncated,
      execution_mode: mode,
      seq,
    };
  });
}

/** Splits exec's live frames (a tag byte, then bytes) into the listener, secrets redacted. */
function liveOutput(listener: OutputListener, secrets: Map<string, string>, redact: (t: string) => string) {
  const redactors = { stdout: new LiveRedactor(secrets, redact), stderr: new LiveRedactor(secrets, redact) };
  const emit = (stream: "stdout" | "stderr", chunk: Buffer) => {
    if (chunk.length > 0) listener(stream, chunk);
  };
  return {
    data: (frame: Buffer) => {
      const stream = frame[0] === EXEC_STREAM_TAG.stderr ? "stderr" : "stdout";
      emit(stream, redactors[stream].push(frame.subarray(1)));
    },
    end: () => {
      emit("stdout", redactors.stdout.end());
      emit("stderr", redactors.stderr.end());
    },
  };
}

/** Options of `workspaceLogs`. */
export interface LogsOptions {
  /** At most this many most recent commands (default 100). */
  limit?: number;
  /** Only this command, with the whole output the history kept instead of its tails. */
  seq?: number;
  /** With `seq`: cut each stream again to this many bytes (head and tail). */
  max_output_bytes?: number;
}

/**
 * Command history, oldest first. Each command carries the last `TAIL_BYTES` of its
 * streams and their full sizes; with `seq`, the one command carries everything the
 * history kept of its output (`full_output: true`): the whole stream up to
 * `HISTORY_OUTPUT_BYTES`, its head and tail beyond, until the workspace's output budget
 * prunes it back to the tails (`full_output: false`).
 */
export async function workspaceLogs(ws: Workspaces, idOrName: string, options: LogsOptions = {}) {
  const w = await ws.get(idOrName);
  const cap =
    options.max_output_bytes !== undefined ? checkMaxOutputBytes(options.max_output_bytes) : undefined;
  if (options.seq !== undefined && !(Number.isInteger(options.seq) && options.seq >= 1)) {
    throw new PyroError("invalid_argument", `seq must be a command number (1, 2, 3...), got ${options.seq}`);
  }
  const rows =
    options.seq === undefined
      ? ws.history.listCommands(w.workspace_id, { limit: options.limit ?? 100 })
      : [ws.history.getCommand(w.workspace_id, options.seq)].filter((c) => c !== undefined);
  const count = ws.history.countCommands(w.workspace_id);
  if (options.seq !== undefined && rows.length === 0) {
    throw new PyroError(
      "not_found",
      `workspace ${w.workspace_id} has no command #${options.seq} (it has ${count})`,
      "list the history without seq to see the command numbers",
    );
  }
  const sizes = ws.history.commandOutputSizes(w.workspace_id, rows[0]?.seq ?? 1);
  return {
    workspace_id: w.workspace_id,
    count,
    commands: rows.map((c) => {
      const size = sizes.get(c.seq);
      const entry = {
        seq: c.seq,
        command: c.command,
        cwd: c.cwd,
        exit_code: c.exit_code,
        timed_out: c.timed_out,
        duration_ms: c.duration_ms,
        started_at: c.started_at,
        stdout: c.stdout_tail,
        stderr: c.stderr_tail,
        /** Full sizes; null for commands recorded before pyro kept them. */
        stdout_bytes: size?.stdout_bytes ?? null,
        stderr_bytes: size?.stderr_bytes ?? null,
        truncated: c.truncated,
        execution_mode: c.execution_mode,
      };
      if (options.seq === undefined) return entry;
      const out = ws.history.commandOutput(w.workspace_id, c.seq);
      const full = out !== undefined && out.stdout !== null && out.stderr !== null;
      const stdout = full ? out.stdout! : c.stdout_tail;
      const stderr = full ? out.stderr! : c.stderr_tail;
      return {
        ...entry,
        stdout: cap === undefined ? stdout : clipText(stdout, cap, entry.stdout_bytes ?? undefined),
        stderr: cap === undefined ? stderr : clipText(stderr, cap, entry.stderr_bytes ?? undefined),
        full_output: full,
      };
    }),
  };
}

/**
 * Writes one exec to the journal: its history row (its output as `logged`, already
 * redacted, cut to HISTORY_OUTPUT_BYTES per stream) and its review event. Returns the
 * row's seq.
 */
function recordExec(
  store: JournalWriter,
  id: string,
  call: { command: string; cwd: string; startedAt: string; mode: "guest_agent" | "host_compat" },
  r: {
    exit_code: number;
    timed_out: boolean;
    duration_ms: number;
    stdout_bytes: number;
    stderr_bytes: number;
  },
  logged: { stdout: string; stderr: string },
): number {
  const kept = {
    stdout: clipText(logged.stdout, HISTORY_OUTPUT_BYTES, r.stdout_bytes),
    stderr: clipText(logged.stderr, HISTORY_OUTPUT_BYTES, r.stderr_bytes),
  };
  const seq = store.recordCommand(
    id,
    {
      command: call.command,
      cwd: call.cwd,
      exit_code: r.exit_code,
      timed_out: r.timed_out,
      duration_ms: Math.round(r.duration_ms),
      started_at: call.startedAt,
      // The store keeps the last few KiB of these as the tails.
      stdout_tail: kept.stdout,
      stderr_tail: kept.stderr,
      // Whether the history misses part of the output (not whether this call's cut did).
      truncated: r.stdout_bytes > HISTORY_OUTPUT_BYTES || r.stderr_bytes > HISTORY_OUTPUT_BYTES,
      execution_mode: call.mode,
    },
    { ...kept, stdout_bytes: r.stdout_bytes, stderr_bytes: r.stderr_bytes },
  );
  store.recordEvent(id, "exec", {
    seq,
    command: call.command,
    exit_code: r.exit_code,
    timed_out: r.timed_out,
  });
  return seq;
}
