/**
 * `exec`: runs `/bin/sh -c command` in the workspace with a clean environment, a
 * timeout that kills the whole process tree, and per-stream output caps that keep each
 * stream's head and tail (capture.ts).
 */

import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { writeFileSync } from "node:fs";
import os from "node:os";
import type { Readable, Writable } from "node:stream";
import { HeadTailCapture } from "../../capture.js";
import { AgentError } from "../../errors.js";
import { EXEC_STREAM_TAG } from "../../op-schemas.js";
import { hangUpSession, killTree, TREE_MARKER_VAR } from "../proctree.js";
import { REAP_WAIT_MS } from "../reaping.js";
import { Spawner, type StartedCommand } from "../spawner.js";
import type { OpHandler } from "./context.js";

/** The environment every command starts from; `args.env` is merged over it. */
export const BASE_ENV: Readonly<Record<string, string>> = {
  PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
  HOME: "/root",
  LANG: "C.UTF-8",
  TERM: "dumb",
};

/** Exit code reported for a command killed at its timeout (as coreutils `timeout` does). */
export const TIMEOUT_EXIT_CODE = 124;

// After the shell exits, background children may still hold stdout/stderr open. We
// wait this long for the pipes to drain, then stop reading: exec returns when the
// command's shell is done, not when everything it spawned is.
const PIPE_GRACE_MS = 250;

/**
 * Pipes the request's upload into the command's stdin; EOF of the upload closes it. What
 * the command does not read (it exited, or closed its stdin) is read and discarded, so
 * the connection is not held up by it.
 */
function feedStdin(upload: Readable, stdin: Writable): void {
  stdin.on("error", () => upload.resume());
  upload.on("error", () => stdin.destroy());
  upload.pipe(stdin);
}

function closed(stream: Readable): Promise<void> {
  return new Promise((resolve) => {
    if (stream.destroyed || stream.readableEnded) resolve();
    else stream.once("close", () => resolve());
  });
}

/**
 * Nice value of commands where the agent shares a cgroup's CPU with them (see
 * GuestOptions.idleCommands): set on the shell right after it starts (one syscall,
 * inherited by what it forks from then on; a child forked in the shell's first instant
 * keeps 0), so under a fork bomb the agent keeps a share of the CPU (weight 1024 against
 * 15 per command) and its timers fire near their time. `chrt --idle` did better but cost
 * an exec per command.
 */
export const COMMAND_NICE = 19;
/** oom_score_adj of commands in the same sandboxes (the agent keeps 0). */
export const COMMAND_OOM_SCORE_ADJ = 500;

type ExecArgs = Parameters<OpHandler<"exec">>[0];
type ExecContext = Parameters<OpHandler<"exec">>[1];

/** The command's working directory: the workspace root, or `cwd` resolved inside it. */
export async function commandCwd(
  cwd: string | undefined,
  workspace: ExecContext["workspace"],
): Promise<string> {
  // The root itself (the default every host sends) needs no look at the disk: resolve()
  // would only lstat the directory the agent opened as its root (a thread-pool round trip).
  if (cwd === undefined || workspace.relative(cwd) === "") return workspace.root;
  const resolved = await workspace.resolve(cwd);
  if (!resolved.stat) throw new AgentError("not_found", `cwd does not exist: ${cwd}`);
  if (!resolved.stat.isDirectory())
    throw new AgentError("invalid_argument", `cwd is not a directory: ${cwd}`);
  return resolved.real;
}

/**
 * Starts `/bin/sh -c command` as the leader of a new session and process group (so the
 * group kill reaches what it starts and a Ctrl-C aimed at the agent does not), with the
 * tree marker in its environment, its stdin fed from the upload, and below the agent in
 * CPU and OOM priority where they share a cgroup.
 */
export function startCommand(
  args: Pick<ExecArgs, "command" | "env" | "stdin">,
  cwd: string,
  marker: string,
  ctx: Pick<ExecContext, "upload" | "idleCommands">,
) {
  const child = spawn("/bin/sh", ["-c", args.command], {
    cwd,
    env: { ...BASE_ENV, ...args.env, [TREE_MARKER_VAR]: marker },
    stdio: [args.stdin ? "pipe" : "ignore", "pipe", "pipe"],
    detached: true,
  });
  if (args.stdin && ctx.upload && child.stdin) feedStdin(ctx.upload, child.stdin);
  if (ctx.idleCommands && child.pid !== undefined) lowerPriority(child.pid);
  return child;
}

/** Below the agent in CPU and OOM priority (see COMMAND_NICE). */
function lowerPriority(pid: number): void {
  try {
    os.setPriority(pid, COMMAND_NICE);
    lowerOom(pid);
  } catch {
    // Exited already.
  }
}

/**
 * At the memory limit the OOM killer takes commands before the agent (raising the value
 * needs no privilege; children inherit it like the nice value).
 */
function lowerOom(pid: number): void {
  try {
    writeFileSync(`/proc/${pid}/oom_score_adj`, String(COMMAND_OOM_SCORE_ADJ));
  } catch {
    // Exited already.
  }
}

/** How the command starter lowers commands (spawner.ts): the nice value in each, OOM on itself. */
const LOWER = { nice: COMMAND_NICE, oom: lowerOom };

/** Commands without stdin go through the spawn helper where there is one (spawner.ts). */
const spawner = new Spawner();

/** Starts the exec's command: through the spawn helper when it can, else as startCommand does. */
async function startExecCommand(
  args: ExecArgs,
  cwd: string,
  marker: string,
  ctx: ExecContext,
): Promise<StartedCommand> {
  // The helper lowers each command itself, from its first instruction (LOWER, told once
  // where the agent lowers commands): nothing to set per command here.
  // A helper a tracer holds (Spawner.wake) would not start it until the tracer lets go,
  // before the call's timeout is even armed: the agent starts it itself then.
  if (
    !args.stdin &&
    !args.command.includes("\0") &&
    (await spawner.usable(ctx.idleCommands ? LOWER : undefined)) &&
    !spawner.held()
  )
    return spawner.start(args.command, cwd, { ...BASE_ENV, ...args.env, [TREE_MARKER_VAR]: marker });
  const child = startCommand(args, cwd, marker, ctx);
  return {
    pid: child.pid,
    // Both pipes exist: stdio[1] and stdio[2] are "pipe".
    stdout: child.stdout!,
    stderr: child.stderr!,
    exited: new Promise((resolve, reject) => {
      child.once("error", reject);
      child.once("exit", (code, sig) => resolve({ code, sig }));
    }),
    viaHelper: false,
  };
}

/** Captures a stream's head and tail; with `stream`, also sends it live, tagged, with backpressure. */
function capture(
  pipe: Readable,
  keep: number,
  tag: number,
  args: ExecArgs,
  ctx: ExecContext,
): HeadTailCapture {
  const kept = new HeadTailCapture(keep);
  pipe.on("data", (c: Buffer) => {
    kept.push(c);
    if (!args.stream) return;
    // Live copy: the pipe waits while the host's channel is full, as a terminal would.
    pipe.pause();
    ctx.send(Buffer.concat([Buffer.of(tag), c])).then(
      () => pipe.resume(),
      () => pipe.resume(),
    );
  });
  return kept;
}

/** A shell's exit code, or 128 + the signal that killed it (as shells report it). */
export function exitCodeOf(code: number | null, sig: NodeJS.Signals | null): number {
  return code !== null ? code : 128 + (sig ? (os.constants.signals[sig] ?? 0) : 0);
}

/** Who collects a command's dead: the command starter for the commands it started. */
const reaperOf = (child: StartedCommand) => (child.viaHelper ? spawner.reaper() : undefined);

/**
 * What a command left running in its session ends with it (see hangUpSession): a
 * background job or a fork bomb must not outlive the call; nohup and setsid do. Started
 * by the helper, which holds every process of its commands: nothing to scan for when it
 * has none but commands still running (Spawner.mayHaveLeftovers).
 */
async function hangUpLeftovers(child: StartedCommand, command: string): Promise<void> {
  if (child.pid === undefined || (child.viaHelper && !spawner.mayHaveLeftovers())) return;
  await hangUpSession(child.pid, ["/bin/sh", "-c", command], reaperOf(child));
}

/**
 * The command's exit; once the call has killed it (`killed`), at most REAP_WAIT_MS more,
 * then null: the exit of a killed command whose zombie a tracer holds never comes, and
 * neither does one whose command starter a tracer holds. When the command starter died,
 * nobody will report the exit: the command's processes are ended rather than left
 * running behind a failed call, and the call fails.
 */
async function exitOf(
  child: StartedCommand,
  marker: string,
  killed: Promise<void>,
): Promise<{ code: number | null; sig: NodeJS.Signals | null } | null> {
  const late = killed.then(() => new Promise<null>((r) => setTimeout(() => r(null), REAP_WAIT_MS).unref()));
  const exit = await Promise.race([child.exited, late]).catch(async (e: unknown) => {
    if (child.pid !== undefined) await killTree(child.pid, marker, reaperOf(child));
    throw e;
  });
  if (exit === null) child.forget?.();
  return exit;
}

/** The call's kill of its command's tree (at its timeout or cancel): once; `killed` when done. */
function commandKiller(child: StartedCommand, marker: string) {
  let killing: Promise<void> | null = null;
  let done = () => {};
  const killed = new Promise<void>((r) => {
    done = r;
  });
  const kill = () => {
    // A stopped command starter would report no exit (Spawner.wake).
    if (child.viaHelper) spawner.wake();
    if (child.pid === undefined || killing) return;
    killing = killTree(child.pid, marker, reaperOf(child)).finally(done);
    // Not awaited on every path (a starter that died after the kill): never unhandled.
    killing.catch(() => {});
  };
  return { kill, killed, killing: () => killing };
}

/** See the module comment. */
export const exec: OpHandler<"exec"> = async (args, ctx) => {
  const { signal } = ctx;
  const cwd = await commandCwd(args.cwd, ctx.workspace);
  if (signal.aborted) throw new AgentError("cancelled", "the command was cancelled before it started");

  const marker = randomBytes(12).toString("hex");
  const started = performance.now();
  const child = await startExecCommand(args, cwd, marker, ctx).catch((err: Error) => {
    throw new AgentError("internal", `could not run the command: ${err.message}`, undefined, { cause: err });
  });
  const out = child.stdout;
  const err = child.stderr;
  // One capture per stream at the larger of the two cuts; each cut is rendered from it.
  const keep = Math.max(args.max_output_bytes, args.log_output_bytes ?? 0);
  const stdout = capture(out, keep, EXEC_STREAM_TAG.stdout, args, ctx);
  const stderr = capture(err, keep, EXEC_STREAM_TAG.stderr, args, ctx);

  let timedOut = false;
  let cancelled = false;
  const killer = commandKiller(child, marker);
  const timer = setTimeout(() => {
    timedOut = true;
    killer.kill();
  }, args.timeout_ms);
  const onAbort = () => {
    cancelled = true;
    killer.kill();
  };
  signal.addEventListener("abort", onAbort, { once: true });
  // Cancelled while it started: an abort before the listener fires no event.
  if (signal.aborted) onAbort();

  try {
    const exit = await exitOf(child, marker, killer.killed);
    clearTimeout(timer);
    const killing = killer.killing();
    if (killing) await killing;
    else await hangUpLeftovers(child, args.command);
    // Give the pipes a moment to deliver the tail of the output.
    const grace = new Promise((r) => setTimeout(r, PIPE_GRACE_MS).unref());
    await Promise.race([Promise.all([closed(out), closed(err)]), grace]);
    out.destroy();
    err.destroy();

    if (cancelled && !timedOut)
      throw new AgentError("cancelled", "the command was cancelled; its processes were killed");
    const exitCode = timedOut ? TIMEOUT_EXIT_CODE : exitCodeOf(exit?.code ?? null, exit?.sig ?? null);
    const o = stdout.render(args.max_output_bytes);
    const e = stderr.render(args.max_output_bytes);
    return {
      exit_code: exitCode,
      stdout: o.text,
      stderr: e.text,
      stdout_bytes: o.bytes,
      stderr_bytes: e.bytes,
      // The history's cut, only where the result's cut left something out.
      ...(keep > args.max_output_bytes && o.truncated ? { stdout_log: stdout.render().text } : {}),
      ...(keep > args.max_output_bytes && e.truncated ? { stderr_log: stderr.render().text } : {}),
      duration_ms: Math.round(performance.now() - started),
      timed_out: timedOut,
      truncated: o.truncated || e.truncated,
    };
  } catch (err) {
    if (err instanceof AgentError) throw err;
    throw new AgentError("internal", `could not run the command: ${(err as Error).message}`, undefined, {
      cause: err,
    });
  } finally {
    clearTimeout(timer);
    signal.removeEventListener("abort", onAbort);
  }
};
