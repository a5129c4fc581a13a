/**
 * Shells: interactive bash sessions on a pseudo-terminal (node-pty), kept by the agent
 * for its whole life like services (contract §4 "shell"). Each shell leads its own
 * session with the PTY as its controlling terminal, so job control, Ctrl-C and
 * full-screen programs behave as in a real terminal.
 *
 * Output is kept raw in a bounded buffer (SHELL_BUFFER_BYTES) addressed by byte cursors:
 * byte N of everything the shell ever printed has cursor N, and a read from a cursor that
 * fell out of the buffer starts at the oldest kept byte and says `truncated`. A read
 * without a cursor continues where the last read of that shell ended. Rendering for
 * chat (`plain`) is the host's job (core/shells.ts); the agent hands it the bytes before
 * the cursor too (`prefix`) so the terminal state there is known.
 *
 * node-pty is loaded on first use, so an agent that never opens a shell does not pay
 * for it; where it cannot load, opening a shell is `unsupported`.
 */

import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { readdir, readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import os from "node:os";
import { posix } from "node:path";
import { AgentError } from "../../errors.js";
import type { OpResult } from "../../op-schemas.js";
import type { Workspace } from "../paths.js";
import { killTree, TREE_MARKER_VAR } from "../proctree.js";
import type { OpHandler } from "./context.js";
import { BASE_ENV, COMMAND_NICE, commandCwd } from "./exec.js";

/** Output bytes kept per shell. */
export const SHELL_BUFFER_BYTES = 1024 * 1024;
/** At most this many shells per workspace. */
export const MAX_SHELLS = 16;

type Status = OpResult<"shell_open">["shell"];

/** The slice of node-pty this module uses. */
interface Pty {
  pid: number;
  onData(cb: (data: string) => void): unknown;
  onExit(cb: (e: { exitCode: number; signal?: number }) => void): unknown;
  write(data: string): void;
  resize(cols: number, rows: number): void;
  kill(signal?: string): void;
}
interface NodePty {
  spawn(
    file: string,
    args: string[],
    options: { name: string; cols: number; rows: number; cwd: string; env: Record<string, string> },
  ): Pty;
}

let nodePty: NodePty | null = null;

function loadPty(): NodePty {
  if (nodePty) return nodePty;
  try {
    nodePty = createRequire(import.meta.url)("node-pty") as NodePty;
    return nodePty;
  } catch (err) {
    throw new AgentError(
      "unsupported",
      `PTY shells are not available in this guest: node-pty did not load (${String((err as Error).message).slice(0, 200)})`,
      "run `pyro doctor`; setup builds node-pty with the other native modules",
    );
  }
}

/** Raw output as a bounded list of chunks; `start` is the cursor of the first kept byte. */
class OutputBuffer {
  private chunks: Buffer[] = [];
  private kept = 0;
  start = 0;
  end = 0;

  push(chunk: Buffer): void {
    this.chunks.push(chunk);
    this.kept += chunk.length;
    this.end += chunk.length;
    while (this.kept > SHELL_BUFFER_BYTES && this.chunks.length > 1) {
      const first = this.chunks.shift()!;
      this.kept -= first.length;
      this.start += first.length;
    }
  }

  /** Bytes in [from, to), clamped to what is kept. */
  slice(from: number, to: number): Buffer {
    const parts: Buffer[] = [];
    let at = this.start;
    for (const c of this.chunks) {
      const cStart = at;
      const cEnd = at + c.length;
      at = cEnd;
      if (cEnd <= from) continue;
      if (cStart >= to) break;
      parts.push(c.subarray(Math.max(0, from - cStart), Math.min(c.length, to - cStart)));
    }
    return Buffer.concat(parts);
  }
}

interface Shell {
  status: Status;
  pty: Pty;
  out: OutputBuffer;
  marker: string;
  /** Where the next read without a cursor starts. */
  readAt: number;
  lastOutputAt: number;
  exited: Promise<void>;
}

/** The shells of each workspace this process serves (see services.ts's registries). */
const registries = new Map<Workspace, Map<string, Shell>>();

function registry(workspace: Workspace): Map<string, Shell> {
  let r = registries.get(workspace);
  if (!r) {
    r = new Map();
    registries.set(workspace, r);
  }
  return r;
}

function byId(workspace: Workspace, id: string): Shell {
  const s = registry(workspace).get(id);
  if (!s)
    throw new AgentError(
      "not_found",
      `no shell '${id}' in this workspace`,
      "shells end with a reset, stop or delete; open a new one",
    );
  return s;
}

function view(s: Shell): Status {
  return { ...s.status, end_cursor: s.out.end, buffer_start: s.out.start };
}

/** bash where the environment has it (most do), else the POSIX shell. */
function shellProgram(): { file: string; args: string[] } {
  return existsSync("/bin/bash") ? { file: "/bin/bash", args: ["-i"] } : { file: "/bin/sh", args: ["-i"] };
}

/** How long the shell's first output must be followed by quiet to count as its prompt, and the longest wait for it. */
const PROMPT_QUIET_MS = 40;
const PROMPT_MAX_MS = 5000;

/**
 * Waits for the shell's first prompt (output, then a moment of quiet), so input written
 * right after open is read by the shell's line editor rather than echoed ahead of it.
 */
async function firstPrompt(s: Shell, signal: AbortSignal): Promise<void> {
  const began = Date.now();
  while (Date.now() - began < PROMPT_MAX_MS && s.status.state === "running" && !signal.aborted) {
    if (s.out.end > 0 && Date.now() - s.lastOutputAt >= PROMPT_QUIET_MS) return;
    await sleep(10);
  }
}

export const shellOpen: OpHandler<"shell_open"> = async (args, ctx) => {
  const shells = registry(ctx.workspace);
  if (shells.size >= MAX_SHELLS)
    throw new AgentError("conflict", `at most ${MAX_SHELLS} shells per workspace`, "close one first");
  const pty = loadPty();
  const cwd = await commandCwd(args.cwd, ctx.workspace);
  const marker = randomBytes(12).toString("hex");
  const program = shellProgram();
  let term: Pty;
  try {
    term = pty.spawn(program.file, program.args, {
      name: "xterm-256color",
      cols: args.cols,
      rows: args.rows,
      cwd,
      env: { ...BASE_ENV, TERM: "xterm-256color", ...args.env, [TREE_MARKER_VAR]: marker },
    });
  } catch (err) {
    throw new AgentError(
      "internal",
      `could not start a shell: ${String((err as Error).message).slice(0, 200)}`,
    );
  }
  if (ctx.idleCommands) {
    try {
      os.setPriority(term.pid, COMMAND_NICE);
    } catch {
      // Exited already.
    }
  }
  const status: Status = {
    shell_id: `sh_${randomBytes(6).toString("hex")}`,
    pid: term.pid,
    // As users name it: /workspace/..., whatever the agent's root is on this backend.
    cwd: posix.join("/workspace", posix.relative(ctx.workspace.root, cwd)),
    cols: args.cols,
    rows: args.rows,
    state: "running",
    exit_code: null,
    started_at: new Date().toISOString(),
    end_cursor: 0,
    buffer_start: 0,
  };
  const shell: Shell = {
    status,
    pty: term,
    out: new OutputBuffer(),
    marker,
    readAt: 0,
    lastOutputAt: Date.now(),
    exited: Promise.resolve(),
  };
  shell.exited = new Promise<void>((resolve) => {
    term.onExit(({ exitCode, signal }) => {
      status.state = "exited";
      status.exit_code = signal ? 128 + signal : exitCode;
      status.pid = null;
      resolve();
    });
  });
  term.onData((data) => {
    shell.out.push(Buffer.from(data, "utf8"));
    shell.lastOutputAt = Date.now();
  });
  shells.set(status.shell_id, shell);
  await firstPrompt(shell, ctx.signal);
  return { shell: view(shell) };
};

export const shellWrite: OpHandler<"shell_write"> = async (args, ctx) => {
  const s = byId(ctx.workspace, args.shell_id);
  if (s.status.state !== "running")
    throw new AgentError("conflict", `shell ${args.shell_id} has exited`, "open a new shell");
  const data = args.newline ? `${args.input}\r` : args.input;
  s.pty.write(data);
  return { shell: view(s), bytes: Buffer.byteLength(data) };
};

/** Moves `at` back to the start of a UTF-8 character in `buf` (never splits one). */
function charBoundary(buf: Buffer, at: number): number {
  let i = at;
  while (i > 0 && i < buf.length && (buf[i]! & 0xc0) === 0x80) i--;
  return i;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export const shellRead: OpHandler<"shell_read"> = async (args, ctx) => {
  const s = byId(ctx.workspace, args.shell_id);
  const asked = args.cursor ?? s.readAt;
  if (asked > s.out.end)
    throw new AgentError(
      "invalid_argument",
      `cursor ${asked} is past the end of the shell's output (${s.out.end})`,
      "use a next_cursor a read returned, or omit the cursor",
    );
  if (args.wait_for_idle_ms > 0) {
    const began = Date.now();
    const deadline = began + Math.max(args.max_wait_ms, args.wait_for_idle_ms);
    for (;;) {
      if (s.status.state !== "running" || ctx.signal.aborted) break;
      const now = Date.now();
      const quiet = now - Math.max(s.lastOutputAt, began);
      if (quiet >= args.wait_for_idle_ms || now >= deadline) break;
      await sleep(Math.min(args.wait_for_idle_ms - quiet, deadline - now, 50));
    }
    // An exiting shell's last bytes arrive just before its exit event.
    if (s.status.state !== "running") await sleep(20);
  }
  const from = Math.max(asked, s.out.start);
  const raw = s.out.slice(from, Math.min(s.out.end, from + args.max_bytes + 4));
  const cut = raw.length > args.max_bytes ? charBoundary(raw, args.max_bytes) : raw.length;
  const next = from + cut;
  const prefixFrom = Math.max(s.out.start, from - args.prefix_bytes);
  s.readAt = next;
  return {
    shell: view(s),
    output: raw.subarray(0, cut).toString("utf8"),
    prefix: args.prefix_bytes > 0 ? s.out.slice(prefixFrom, from).toString("utf8") : "",
    cursor: from,
    next_cursor: next,
    truncated: from > asked,
    has_more: next < s.out.end,
  };
};

/** Fields of /proc/PID/stat after the command name: [state, ppid, pgrp, session, tty_nr, tpgid, ...]. */
async function statFields(pid: number | string): Promise<string[] | null> {
  const stat = await readFile(`/proc/${pid}/stat`, "utf8").catch(() => null);
  return stat ? stat.slice(stat.lastIndexOf(")") + 2).split(" ") : null;
}

/**
 * The terminal's foreground process group: the shell's `tpgid` where the kernel reports
 * it. gVisor reports 0; there the newest other process group of the shell's
 * session stands in (the job started last, which is the foreground one unless it was
 * sent to the background).
 */
async function foregroundGroup(pid: number): Promise<number | null> {
  const own = await statFields(pid);
  if (!own) return null;
  const tpgid = Number(own[5]);
  if (Number.isInteger(tpgid) && tpgid > 0) return tpgid;
  let best: { pgid: number; started: number } | null = null;
  for (const entry of await readdir("/proc").catch(() => [] as string[])) {
    if (!/^[0-9]+$/.test(entry)) continue;
    const f = await statFields(entry);
    if (!f || f[0] === "Z" || Number(f[3]) !== pid || Number(f[2]) === pid) continue;
    const started = Number(f[19]);
    if (!best || started > best.started) best = { pgid: Number(f[2]), started };
  }
  return best?.pgid ?? null;
}

/**
 * Signals the terminal's foreground job (the shell itself when it is idle). Not by
 * typing Ctrl-C: gVisor's terminal does not turn it into a signal.
 */
export const shellSignal: OpHandler<"shell_signal"> = async (args, ctx) => {
  const s = byId(ctx.workspace, args.shell_id);
  if (s.status.state !== "running" || s.status.pid === null)
    throw new AgentError("conflict", `shell ${args.shell_id} has exited`, "open a new shell");
  const pgid = (await foregroundGroup(s.status.pid)) ?? s.status.pid;
  try {
    process.kill(-pgid, `SIG${args.signal}`);
  } catch {
    try {
      process.kill(s.status.pid, `SIG${args.signal}`);
    } catch {
      // Exited in between.
    }
  }
  return { shell: view(s), pgid };
};

export const shellResize: OpHandler<"shell_resize"> = async (args, ctx) => {
  const s = byId(ctx.workspace, args.shell_id);
  if (s.status.state === "running") s.pty.resize(args.cols, args.rows);
  s.status.cols = args.cols;
  s.status.rows = args.rows;
  return { shell: view(s) };
};

/** Ends the shell and everything started in it (the whole tree, by its marker). */
async function end(s: Shell): Promise<void> {
  if (s.status.state === "running" && s.status.pid !== null) {
    await killTree(s.status.pid, s.marker);
    await Promise.race([s.exited, sleep(2000)]);
  }
}

export const shellClose: OpHandler<"shell_close"> = async (args, ctx) => {
  const s = byId(ctx.workspace, args.shell_id);
  await end(s);
  registry(ctx.workspace).delete(args.shell_id);
  return { shell: view(s) };
};

export const shellList: OpHandler<"shell_list"> = async (_args, ctx) => ({
  shells: [...registry(ctx.workspace).values()].map(view),
});

/** Ends the shells of one served workspace (its guest is closing) and forgets them. */
export async function closeShellsOf(workspace: Workspace): Promise<void> {
  const shells = registries.get(workspace);
  registries.delete(workspace);
  await Promise.all([...(shells?.values() ?? [])].map(end));
}
