/**
 * Commands started by the spawn helper (`bin/pyro-spawn` beside the agent's dist/; its
 * source and protocol: src/backends/spawn-helper.ts) instead of Node's `spawn`, which
 * forks the whole agent for every command (~1.7 ms of the agent blocked here, more with
 * more memory held; docs/architecture.md "Warm exec"). The helper starts `/bin/sh -c`
 * with posix_spawn as a session leader, every signal at its default, stdin /dev/null and
 * two pipes, which the agent opens through /proc/<helper>/fd (the commands run in the
 * same sandbox as the helper, so this gives no one more than they had); it reports each
 * command's raw wait status.
 *
 * Used where it can be: the helper exists (namespace backends: agent-app.ts builds it
 * with the host's `cc`) and passed a self-test (a `true` started, its pipes opened, its
 * exit seen) at first use. Otherwise, after the helper died, for commands with stdin or
 * a NUL, the agent starts commands itself as before. Same semantics either way: the
 * tests of exec run on both.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { accessSync, constants, openSync, readFileSync } from "node:fs";
import net from "node:net";
import os from "node:os";
import type { Readable } from "node:stream";
import { fileURLToPath } from "node:url";
import { stateLetter } from "./reaping.js";

/** A started command, as exec uses it. */
export interface StartedCommand {
  pid: number | undefined;
  stdout: Readable;
  stderr: Readable;
  /** Its exit, as Node reports one: a code, or the signal that ended it. */
  exited: Promise<{ code: number | null; sig: NodeJS.Signals | null }>;
  /** Started by the helper (its processes are the helper's descendants), not by the agent. */
  viaHelper: boolean;
  /** Stops waiting for an exit that will not come (a killed command whose zombie a tracer holds). */
  forget?: () => void;
}

/** The helper's path in the agent's copy of the package: <app>/bin/pyro-spawn. */
export const HELPER_PATH = fileURLToPath(new URL("../../../bin/pyro-spawn", import.meta.url));

type Exit = { code: number | null; sig: NodeJS.Signals | null };

/** How long the helper's ends of opened pipes are kept at most, waiting for a request to ride on. */
const CLOSE_LATER_MS = 1000;

/** How long the helper's self-test may take before commands are started by the agent. */
const SELF_TEST_MS = 5000;
/** How often a helper something waits on is looked at for a stop (Spawner.wake). */
const WAKE_MS = 1000;

const SIGNAL_NAMES = new Map<number, NodeJS.Signals>(
  Object.entries(os.constants.signals).map(([name, n]) => [n, name as NodeJS.Signals]),
);

/** A raw wait status as Node reports an exit. */
export function exitOfStatus(status: number): Exit {
  const sig = status & 0x7f;
  if (sig === 0) return { code: (status >> 8) & 0xff, sig: null };
  return { code: null, sig: SIGNAL_NAMES.get(sig) ?? "SIGKILL" };
}

/** One helper per agent, started at first use. */
export class Spawner {
  private helper: ChildProcess | null = null;
  private dead = false;
  private lines = "";
  private nextId = 0;
  private readonly starting = new Map<string, (r: StartedCommand | Error) => void>();
  private readonly waiting = new Map<number, { resolve: (e: Exit) => void; reject: (e: Error) => void }>();
  private ready: Promise<boolean> | null = null;
  /** The helper's ends of opened pipes, closed with the next request (or by `closeTimer`). */
  private toClose: number[] = [];
  private closeTimer: NodeJS.Timeout | null = null;
  /** The helper said it is its commands' subreaper (its first line, before any reply). */
  private subreaper = false;
  /** While anything waits on the helper: looks every WAKE_MS whether a command stopped it (wake). */
  private watch: NodeJS.Timeout | null = null;

  constructor(private readonly path: string = HELPER_PATH) {}

  /**
   * Whether commands can go through the helper (started and self-tested once). With
   * `lower`, commands run below the agent: at nice `lower.nice`, set by the helper in
   * each one before its exec (the helper itself stays at the agent's priority: it reaps
   * their orphans), and below it for the OOM killer through `lower.oom`, run once on the
   * helper, whose value every command inherits.
   */
  usable(lower?: { nice: number; oom: (pid: number) => void }): Promise<boolean> {
    this.ready ??= this.open(lower);
    return this.ready.then((ok) => ok && !this.dead);
  }

  /** Starts `/bin/sh -c command` through the helper. */
  start(command: string, cwd: string, env: Record<string, string>): Promise<StartedCommand> {
    const helper = this.helper;
    if (!helper || this.dead) return Promise.reject(new Error("the command starter is not running"));
    this.wake();
    this.watchWhileWaiting();
    const id = String(++this.nextId);
    const entries = Object.entries(env).map(([k, v]) => `${k}=${v}`);
    return new Promise<StartedCommand>((resolve, reject) => {
      this.starting.set(id, (r) => (r instanceof Error ? reject(r) : resolve(r)));
      const request = frame(["S", id, cwd, String(entries.length), ...entries, command]);
      helper.stdin!.write(this.toClose.length > 0 ? Buffer.concat([this.takeCloses(), request]) : request);
    });
  }

  /**
   * A command runs as the helper's uid and can stop it (`kill -STOP`): then no command
   * starts and no exit is reported, and every call in the workspace would wait for the
   * host's own timeout. A stopped helper is continued: before every start, when an exec
   * times out, and every WAKE_MS while anything waits on it. One a tracer holds (state
   * `t`) is left be: the tracer lets it go when it detaches or ends, and meanwhile a call
   * that times out answers without its exit (ops/exec.ts exitOf). Not a defence against
   * a hostile command, which can stop the agent itself (same uid): against an accident.
   */
  wake(): void {
    if (this.helperState() === "T") process.kill(this.helper!.pid!, "SIGCONT");
  }

  /** Whether a tracer holds the helper now (state `t`): a start would wait for the tracer. */
  held(): boolean {
    return this.helperState() === "t";
  }

  /** The live helper's state letter (stateLetter); null when there is none. */
  private helperState(): string | null {
    const pid = this.helper?.pid;
    return this.dead || pid === undefined ? null : stateLetter(pid);
  }

  /** Keeps `wake` looking while a start or an exit is awaited. */
  private watchWhileWaiting(): void {
    this.watch ??= setInterval(() => {
      if (this.starting.size === 0 && this.waiting.size === 0) {
        clearInterval(this.watch!);
        this.watch = null;
      } else this.wake();
    }, WAKE_MS).unref();
  }

  /** The helper's pid while it collects its commands' orphans (their subreaper). */
  reaper(): number | undefined {
    return this.subreaper && !this.dead ? this.helper?.pid : undefined;
  }

  /**
   * Whether a command that exited may have left processes behind (its hangup must scan
   * /proc): false only when the helper is its commands' subreaper and its children, read
   * from /proc, are all commands still running. Every process of a command's session is
   * a descendant of its shell, so of the helper (orphans come to it): none other than
   * running commands means none left. Anything unreadable or unknown answers true.
   */
  mayHaveLeftovers(): boolean {
    const pid = this.helper?.pid;
    if (!this.subreaper || this.dead || pid === undefined) return true;
    let children: string;
    try {
      children = readFileSync(`/proc/${pid}/task/${pid}/children`, "latin1");
    } catch {
      return true;
    }
    for (const child of children.split(" "))
      if (child !== "" && !this.waiting.has(Number(child))) return true;
    return false;
  }

  private async open(lower: { nice: number; oom: (pid: number) => void } | undefined): Promise<boolean> {
    try {
      accessSync(this.path, constants.X_OK);
    } catch {
      return false;
    }
    const helper = spawn(this.path, lower ? [String(lower.nice)] : [], { stdio: ["pipe", "pipe", "ignore"] });
    this.helper = helper;
    helper.stdin!.on("error", () => this.fail(new Error("the command starter's input closed")));
    helper.stdout!.setEncoding("utf8");
    helper.stdout!.on("data", (d: string) => this.onData(d));
    helper.stdout!.on("error", () => this.fail(new Error("the command starter's output failed")));
    helper.once("error", () => this.fail(new Error("the command starter could not start")));
    helper.once("exit", () => this.fail(new Error("the command starter exited")));
    if (helper.pid !== undefined) lower?.oom(helper.pid);
    // Not kept alive for it: the agent's own handles decide when it ends.
    helper.unref();
    (helper.stdout as unknown as { unref?: () => void }).unref?.();
    (helper.stdin as unknown as { unref?: () => void }).unref?.();
    // Bounded: a helper that does not answer is not waited for by every exec after it.
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error("no answer")), SELF_TEST_MS);
    });
    late.catch(() => {});
    try {
      const probe = await Promise.race([this.start("exit 0", "/", { PATH: "/usr/bin:/bin" }), late]);
      probe.stdout.resume();
      probe.stderr.resume();
      if ((await Promise.race([probe.exited, late])).code === 0) return true;
      throw new Error("a nonzero exit");
    } catch {
      this.fail(new Error("the command starter failed its self-test"));
      return false;
    } finally {
      clearTimeout(timer);
    }
  }

  private fail(err: Error): void {
    if (this.dead) return;
    this.dead = true;
    if (this.closeTimer) clearTimeout(this.closeTimer);
    if (this.watch) clearInterval(this.watch);
    this.helper?.kill("SIGKILL");
    for (const done of this.starting.values()) done(err);
    this.starting.clear();
    for (const w of this.waiting.values()) w.reject(err);
    this.waiting.clear();
  }

  private onData(chunk: string): void {
    this.lines += chunk;
    for (let nl = this.lines.indexOf("\n"); nl >= 0; nl = this.lines.indexOf("\n")) {
      const line = this.lines.slice(0, nl).split(" ");
      this.lines = this.lines.slice(nl + 1);
      if (line[0] === "S") this.started(line[1]!, Number(line[2]), Number(line[3]), Number(line[4]));
      else if (line[0] === "E") this.take(line[1]!)?.(new Error(`cannot start /bin/sh: errno ${line[2]}`));
      else if (line[0] === "X") this.exited(Number(line[1]), Number(line[2]));
      else if (line[0] === "R") this.subreaper = line[1] === "1";
    }
  }

  /** The waiter of start request `id`, no longer waiting. */
  private take(id: string): ((r: StartedCommand | Error) => void) | undefined {
    const done = this.starting.get(id);
    this.starting.delete(id);
    return done;
  }

  private started(id: string, pid: number, outFd: number, errFd: number): void {
    const done = this.take(id);
    const helper = this.helper!;
    let stdout: Readable;
    let stderr: Readable;
    try {
      stdout = this.pipe(helper.pid!, outFd);
      stderr = this.pipe(helper.pid!, errFd);
    } catch (err) {
      this.closeFds(outFd, errFd);
      done?.(err as Error);
      return;
    }
    this.closeFds(outFd, errFd);
    // Registered before the next line is read: the helper writes a command's `S` line
    // before it can reap it, so its `X` line always comes after.
    const exited = new Promise<Exit>((resolve, reject) => this.waiting.set(pid, { resolve, reject }));
    done?.({ pid, stdout, stderr, exited, viaHelper: true, forget: () => this.waiting.delete(pid) });
  }

  /** A command exited (one whose pipes could not be opened has no waiter: nothing to tell). */
  private exited(pid: number, status: number): void {
    const w = this.waiting.get(pid);
    this.waiting.delete(pid);
    w?.resolve(exitOfStatus(status));
  }

  /** The read end of a command's pipe, opened anew from the helper's descriptor. */
  private pipe(helperPid: number, fd: number): Readable {
    const own = openSync(`/proc/${helperPid}/fd/${fd}`, constants.O_RDONLY | constants.O_NONBLOCK);
    return new net.Socket({ fd: own, readable: true, writable: false });
  }

  /**
   * The helper's ends of a command's pipes, once the agent has its own: closed with the
   * next request, in the same write (a message of its own cost the helper a wake-up and
   * both sides a system call per exec), or within CLOSE_LATER_MS when none comes. Until
   * then the helper's copy only keeps the pipe open for a writer that outlives the
   * agent's reading (it blocks when the pipe is full instead of getting EPIPE).
   */
  private closeFds(...fds: number[]): void {
    this.toClose.push(...fds);
    if (this.closeTimer) return;
    this.closeTimer = setTimeout(() => {
      if (this.toClose.length > 0) this.helper?.stdin?.write(this.takeCloses());
    }, CLOSE_LATER_MS);
    this.closeTimer.unref();
  }

  /** A `C` request for the pipe ends waiting to be closed (taken). */
  private takeCloses(): Buffer {
    if (this.closeTimer) clearTimeout(this.closeTimer);
    this.closeTimer = null;
    const fds = this.toClose;
    this.toClose = [];
    return frame(["C", ...fds.map(String)]);
  }
}

/** A request to the helper: its length (4 bytes, little-endian), then NUL-terminated fields. */
function frame(fields: readonly string[]): Buffer {
  const payload = Buffer.from(`${fields.join("\0")}\0`);
  const head = Buffer.alloc(4);
  head.writeUInt32LE(payload.length);
  return Buffer.concat([head, payload]);
}
