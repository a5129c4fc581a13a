import { spawn } from "node:child_process";

/**
 * The one process runner: every external tool (bwrap, runsc, qemu, debootstrap) is
 * spawned from an argv array, never through a shell, with a timeout and an AbortSignal.
 */
export interface RunOptions {
  cwd?: string;
  env?: NodeJS.ProcessEnv;
  timeoutMs?: number;
  signal?: AbortSignal;
  input?: string | Buffer;
  /** Called with each complete line of stdout/stderr as it arrives. */
  onLine?: (line: string, stream: "stdout" | "stderr") => void;
  /** Cap on captured bytes per stream (default 4 MiB). */
  maxCapture?: number;
  /** Kill the whole process group on timeout/abort (default true). */
  killGroup?: boolean;
}

export interface RunResult {
  exitCode: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  durationMs: number;
  timedOut: boolean;
  /** Set when the program could not be started at all (ENOENT, EACCES). */
  spawnError?: NodeJS.ErrnoException;
}

/**
 * Runs `argv` and collects its output. stdin is always a pipe (ended at once without
 * `input`), never the host's /dev/null: some programs change their stdio's owner (runsc
 * gives it to the sandbox's user).
 */
export function run(argv: readonly string[], options: RunOptions = {}): Promise<RunResult> {
  const [file, ...args] = argv;
  if (!file) throw new Error("run: empty argv");
  const started = performance.now();
  const maxCapture = options.maxCapture ?? 4 * 1024 * 1024;
  const killGroup = options.killGroup ?? true;
  return new Promise((resolvePromise) => {
    const child = spawn(file, args, {
      cwd: options.cwd,
      env: options.env ?? process.env,
      stdio: ["pipe", "pipe", "pipe"],
      detached: killGroup,
    });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    let outLen = 0;
    let errLen = 0;
    let timedOut = false;
    let spawnError: NodeJS.ErrnoException | undefined;
    const partial = { stdout: "", stderr: "" };

    const kill = () => {
      try {
        if (killGroup && child.pid) process.kill(-child.pid, "SIGKILL");
        else child.kill("SIGKILL");
      } catch {
        // already gone
      }
    };
    const timer = options.timeoutMs
      ? setTimeout(() => {
          timedOut = true;
          kill();
        }, options.timeoutMs)
      : undefined;
    const onAbort = () => kill();
    options.signal?.addEventListener("abort", onAbort, { once: true });

    const collect = (stream: "stdout" | "stderr", chunk: Buffer) => {
      if (stream === "stdout") {
        if (outLen < maxCapture) out.push(chunk.subarray(0, maxCapture - outLen));
        outLen += chunk.length;
      } else {
        if (errLen < maxCapture) err.push(chunk.subarray(0, maxCapture - errLen));
        errLen += chunk.length;
      }
      if (options.onLine) {
        const text = partial[stream] + chunk.toString("utf8");
        const lines = text.split("\n");
        partial[stream] = lines.pop() ?? "";
        for (const line of lines) options.onLine(line, stream);
      }
    };
    child.stdout?.on("data", (c: Buffer) => collect("stdout", c));
    child.stderr?.on("data", (c: Buffer) => collect("stderr", c));
    child.stdin?.on("error", () => {});
    child.stdin?.end(options.input ?? "");
    child.on("error", (e: NodeJS.ErrnoException) => {
      spawnError = e;
    });
    child.on("close", (code, sig) => {
      if (timer) clearTimeout(timer);
      options.signal?.removeEventListener("abort", onAbort);
      if (options.onLine) {
        if (partial.stdout) options.onLine(partial.stdout, "stdout");
        if (partial.stderr) options.onLine(partial.stderr, "stderr");
      }
      const result: RunResult = {
        exitCode: code,
        signal: sig,
        stdout: Buffer.concat(out).toString("utf8"),
        stderr: Buffer.concat(err).toString("utf8"),
        durationMs: performance.now() - started,
        timedOut,
      };
      if (spawnError) result.spawnError = spawnError;
      resolvePromise(result);
    });
  });
}

/** Finds an executable on PATH (or returns an absolute path as is when executable). */
export async function which(
  name: string,
  pathEnv: string | undefined = process.env.PATH,
): Promise<string | null> {
  const { access, constants } = await import("node:fs/promises");
  const { join, isAbsolute } = await import("node:path");
  const candidates = isAbsolute(name)
    ? [name]
    : (pathEnv ?? "")
        .split(":")
        .concat(["/usr/sbin", "/sbin"])
        .filter(Boolean)
        .map((d) => join(d, name));
  for (const c of candidates) {
    try {
      await access(c, constants.X_OK);
      return c;
    } catch {
      // keep looking
    }
  }
  return null;
}

/** First non-empty line of a tool's output: a compact reason or version string. */
export function firstLine(text: string): string {
  return (
    text
      .split("\n")
      .map((l) => l.trim())
      .find((l) => l.length > 0) ?? ""
  );
}
