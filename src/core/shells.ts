/**
 * Shells of a running workspace (contract §4 "shell", docs/workspaces.md "Shells"):
 * interactive bash sessions on a PTY kept by the guest agent (agent/guest/ops/shells.ts)
 * with the workspace's env, secrets and proxy settings. They live as long as the
 * sandbox's agent: a stop, reset or delete ends them. Reads return the raw terminal
 * bytes, or with `plain` the text a person would see (core/terminal.ts); secrets are
 * redacted from both.
 */

import type { OpResult } from "../agent/op-schemas.js";
import { WAIT_SLACK_MS } from "../agent/slack.js";
import { PyroError } from "../errors.js";
import { secretRedactor } from "./secrets.js";
import { renderPlain } from "./terminal.js";
import type { Workspaces } from "./workspaces.js";

/** Bytes of earlier output a plain read renders first, for the terminal's state. */
const PLAIN_PREFIX_BYTES = 64 * 1024;
/** How much of a write's input a review event keeps. */
const EVENT_INPUT_CHARS = 200;

type AgentShell = OpResult<"shell_open">["shell"];

/** A shell as every surface shows it. */
function view(workspaceId: string, s: AgentShell) {
  return { workspace_id: workspaceId, ...s };
}

export type ShellView = ReturnType<typeof view>;

export interface OpenShellOptions {
  cwd?: string;
  cols?: number;
  rows?: number;
}

export interface ReadShellOptions {
  /** Byte cursor to read from; default where the last read of this shell ended. */
  cursor?: number;
  /** Render the terminal as text (no control sequences). */
  plain?: boolean;
  /** Wait until the shell has printed nothing for this long (at most 10 s) before reading. */
  wait_for_idle_ms?: number;
  /** Longest a read waits in all (default 30 s). */
  max_wait_ms?: number;
  /** Most bytes of raw output one read returns (default 64 KiB). */
  max_bytes?: number;
}

const SHELL_ID = /^sh_[0-9a-f]{12}$/;
/** Longest input one write takes (characters). */
export const MAX_SHELL_INPUT = 64 * 1024;

/** A shell id as openShell gives them; anything else is refused before the agent is asked. */
function checkShellId(id: string): void {
  if (typeof id !== "string" || !SHELL_ID.test(id))
    throw new PyroError(
      "invalid_argument",
      `not a shell id: '${String(id)}'`,
      "shell ids look like sh_ and 12 hex digits; list a workspace's shells with `pyro workspace shell list`",
    );
}

function checkWhole(what: string, n: number | undefined, min: number, max: number): void {
  if (n === undefined) return;
  if (!Number.isSafeInteger(n) || n < min || n > max)
    throw new PyroError(
      "invalid_argument",
      `${what} must be a whole number from ${min} to ${max}, got ${String(n).slice(0, 20)}`,
    );
}

function checkSize(what: "cols" | "rows", n: number | undefined, max: number): void {
  if (n === undefined) return;
  if (!Number.isInteger(n) || n < 1 || n > max)
    throw new PyroError(
      "invalid_argument",
      `${what} must be a whole number from 1 to ${max}, got ${String(n).slice(0, 20)}`,
    );
}

/** Opens a shell (bash, interactive) in the workspace; `cwd` is inside /workspace. */
export async function openShell(ws: Workspaces, idOrName: string, options: OpenShellOptions = {}) {
  checkSize("cols", options.cols, 500);
  checkSize("rows", options.rows, 200);
  return ws.withAgent(idOrName, "exec", async (agent, w, journal) => {
    const secrets = await ws.secretValues(w);
    const env = { ...(await ws.networkEnv(w)), ...w.spec.env, ...Object.fromEntries(secrets) };
    const r = await agent.request("shell_open", {
      ...(options.cwd !== undefined ? { cwd: options.cwd } : {}),
      ...(options.cols !== undefined ? { cols: options.cols } : {}),
      ...(options.rows !== undefined ? { rows: options.rows } : {}),
      env,
    });
    journal((store) =>
      store.recordEvent(w.workspace_id, "shell_open", { shell_id: r.shell.shell_id, cwd: r.shell.cwd }),
    );
    return view(w.workspace_id, r.shell);
  });
}

/** Types `input` into the shell, with Enter unless `newline` is false. */
export async function writeShell(
  ws: Workspaces,
  idOrName: string,
  shellId: string,
  input: string,
  options: { newline?: boolean } = {},
) {
  checkShellId(shellId);
  if (input.length > MAX_SHELL_INPUT)
    throw new PyroError(
      "invalid_argument",
      `input is ${input.length} characters, at most ${MAX_SHELL_INPUT} go in one write`,
      "write it in parts, or put a long script in a file with workspace file write",
    );
  return ws.withAgent(idOrName, "exec", async (agent, w, journal) => {
    const redact = secretRedactor(await ws.secretValues(w));
    const r = await agent.request("shell_write", {
      shell_id: shellId,
      input,
      newline: options.newline ?? true,
    });
    journal((store) =>
      store.recordEvent(w.workspace_id, "shell_write", {
        shell_id: shellId,
        input: redact(input).slice(0, EVENT_INPUT_CHARS),
        bytes: r.bytes,
      }),
    );
    return { ...view(w.workspace_id, r.shell), bytes: r.bytes };
  });
}

/**
 * Output from a cursor: `output`, `cursor` (where it starts), `next_cursor` (pass it to
 * the next read), `truncated` (the cursor fell out of the kept buffer), `has_more`.
 */
export async function readShell(
  ws: Workspaces,
  idOrName: string,
  shellId: string,
  options: ReadShellOptions = {},
) {
  checkShellId(shellId);
  checkWhole("cursor", options.cursor, 0, Number.MAX_SAFE_INTEGER);
  checkWhole("wait_for_idle_ms", options.wait_for_idle_ms, 0, 10_000);
  checkWhole("max_wait_ms", options.max_wait_ms, 0, 60_000);
  checkWhole("max_bytes", options.max_bytes, 1, 1024 * 1024);
  const plain = options.plain ?? false;
  const maxWaitMs = options.max_wait_ms ?? 30_000;
  return ws.withAgent(idOrName, "exec", async (agent, w) => {
    const redact = secretRedactor(await ws.secretValues(w));
    const r = await agent.request(
      "shell_read",
      {
        shell_id: shellId,
        ...(options.cursor !== undefined ? { cursor: options.cursor } : {}),
        ...(options.max_bytes !== undefined ? { max_bytes: options.max_bytes } : {}),
        prefix_bytes: plain ? PLAIN_PREFIX_BYTES : 0,
        wait_for_idle_ms: options.wait_for_idle_ms ?? 0,
        max_wait_ms: maxWaitMs,
      },
      { timeoutMs: maxWaitMs + WAIT_SLACK_MS },
    );
    const output = plain ? await renderPlain(r.prefix, r.output, r.shell.cols, r.shell.rows) : r.output;
    return {
      workspace_id: w.workspace_id,
      shell_id: shellId,
      output: redact(output),
      plain,
      cursor: r.cursor,
      next_cursor: r.next_cursor,
      truncated: r.truncated,
      has_more: r.has_more,
      state: r.shell.state,
      exit_code: r.shell.exit_code,
    };
  });
}

/** INT, TERM or KILL to the terminal's foreground job (the shell itself when it is idle). */
export async function signalShell(ws: Workspaces, idOrName: string, shellId: string, signal: string) {
  checkShellId(shellId);
  const sig = signal.toUpperCase().replace(/^SIG/, "");
  if (sig !== "INT" && sig !== "TERM" && sig !== "KILL")
    throw new PyroError(
      "invalid_argument",
      `unknown signal '${signal.slice(0, 20)}'`,
      "use INT, TERM or KILL",
    );
  return ws.withAgent(idOrName, "exec", async (agent, w, journal) => {
    const r = await agent.request("shell_signal", { shell_id: shellId, signal: sig });
    journal((store) =>
      store.recordEvent(w.workspace_id, "shell_signal", { shell_id: shellId, signal: sig, pgid: r.pgid }),
    );
    return { ...view(w.workspace_id, r.shell), signal: sig, pgid: r.pgid };
  });
}

export async function resizeShell(
  ws: Workspaces,
  idOrName: string,
  shellId: string,
  cols: number,
  rows: number,
) {
  checkShellId(shellId);
  checkSize("cols", cols, 500);
  checkSize("rows", rows, 200);
  return ws.withAgent(idOrName, "exec", async (agent, w) =>
    view(w.workspace_id, (await agent.request("shell_resize", { shell_id: shellId, cols, rows })).shell),
  );
}

/** Ends the shell and everything started in it. */
export async function closeShell(ws: Workspaces, idOrName: string, shellId: string) {
  checkShellId(shellId);
  return ws.withAgent(idOrName, "exec", async (agent, w, journal) => {
    const r = await agent.request("shell_close", { shell_id: shellId });
    journal((store) =>
      store.recordEvent(w.workspace_id, "shell_close", { shell_id: shellId, exit_code: r.shell.exit_code }),
    );
    return { ...view(w.workspace_id, r.shell), closed: true };
  });
}

export async function listShells(ws: Workspaces, idOrName: string) {
  return ws.withAgent(idOrName, "exec", async (agent, w) => {
    const shells = (await agent.request("shell_list", {})).shells.map((s) => view(w.workspace_id, s));
    return { workspace_id: w.workspace_id, count: shells.length, shells };
  });
}
