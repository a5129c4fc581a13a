import { PyroError } from "./errors.js";
import { secretRedactor } from "./secrets.js";
import type { Workspaces } from "./workspaces.js";
import { DEFAULTS } from "./workspaces.js";

export interface ExecOptions {
  timeout_seconds?: number;
  cwd?: string;
  env?: Record<string, string>;
  max_output_bytes?: number;
  signal?: AbortSignal;
}

/** The exec result every surface returns. */
export interface ExecResult {
  workspace_id: string;
  command: string;
  cwd: string;
  exit_code: number;
  stdout: string;
  stderr: string;
  duration_ms: number;
  timed_out: boolean;
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
  if (!(timeoutSeconds > 0 && timeoutSeconds <= 24 * 3600)) {
    throw new PyroError(
      "invalid_argument",
      `timeout must be between 1 and 86400 seconds, got ${timeoutSeconds}`,
    );
  }
  return ws.withAgent(idOrName, "exec", async (agent, w) => {
    const startedAt = new Date().toISOString();
    const cwd = options.cwd ?? "/workspace";
    const secrets = await ws.secretValues(w);
    const redact = secretRedactor(secrets);
    const r = await agent.request(
      "exec",
      {
        command,
        cwd,
        // Forwarded env, then secrets, then this call's env.
        env: { ...w.spec.env, ...Object.fromEntries(secrets), ...options.env },
        timeout_ms: Math.round(timeoutSeconds * 1000),
        max_output_bytes: options.max_output_bytes ?? DEFAULTS.max_output_bytes,
      },
      { timeoutMs: timeoutSeconds * 1000 + 30_000, ...(options.signal ? { signal: options.signal } : {}) },
    );
    const mode = ws.executionMode(w);
    const shown = { command: redact(command), stdout: redact(r.stdout), stderr: redact(r.stderr) };
    // One transaction for the history row and its review event.
    const seq = ws.store.atomically(() => {
      const n = ws.store.recordCommand(w.workspace_id, {
        command: shown.command,
        cwd,
        exit_code: r.exit_code,
        timed_out: r.timed_out,
        duration_ms: Math.round(r.duration_ms),
        started_at: startedAt,
        stdout_tail: shown.stdout,
        stderr_tail: shown.stderr,
        truncated: r.truncated,
        execution_mode: mode,
      });
      ws.store.recordEvent(w.workspace_id, "exec", {
        seq: n,
        command: shown.command,
        exit_code: r.exit_code,
        timed_out: r.timed_out,
      });
      return n;
    });
    return {
      workspace_id: w.workspace_id,
      command: shown.command,
      cwd,
      exit_code: r.exit_code,
      stdout: shown.stdout,
      stderr: shown.stderr,
      duration_ms: Math.round(r.duration_ms),
      timed_out: r.timed_out,
      truncated: r.truncated,
      execution_mode: mode,
      seq,
    };
  });
}

/** Command history, oldest first. */
export async function workspaceLogs(ws: Workspaces, idOrName: string, options: { limit?: number } = {}) {
  const w = await ws.get(idOrName);
  const commands = ws.store.listCommands(w.workspace_id, { limit: options.limit ?? 100 });
  return {
    workspace_id: w.workspace_id,
    count: ws.store.countCommands(w.workspace_id),
    commands: commands.map((c) => ({
      seq: c.seq,
      command: c.command,
      cwd: c.cwd,
      exit_code: c.exit_code,
      timed_out: c.timed_out,
      duration_ms: c.duration_ms,
      started_at: c.started_at,
      stdout: c.stdout_tail,
      stderr: c.stderr_tail,
      truncated: c.truncated,
      execution_mode: c.execution_mode,
    })),
  };
}
