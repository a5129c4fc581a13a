import type { Readable, Writable } from "node:stream";
import { debugEnabled } from "../core/config.js";
import { EXIT_FAILURE, EXIT_OK, type PyroError, toPyroError } from "../errors.js";

/** Where a CLI invocation writes, and how. One per `main()` call: no globals. */
export interface Io {
  stdout: Writable;
  stderr: Writable;
  /** stderr is a terminal: progress lines are shown. */
  stderrIsTTY: boolean;
  env: NodeJS.ProcessEnv;
  /** The CLI's stdin when it is not a terminal (piped in): commands that run read it. */
  stdin?: Readable;
}

export interface OutputOptions {
  json?: boolean;
}

/**
 * Runs one command action and renders its result: `--json` prints the result object
 * (stdout is data), otherwise the human renderer's text. Failures become one line on
 * stderr (or `{"error": {...}}` on stdout under --json) and exit code 1; stack traces
 * only with PYRO_DEBUG.
 */
export async function act<T>(
  io: Io,
  opts: OutputOptions,
  action: () => Promise<T>,
  human: (result: T) => string,
  exitCodeOf?: (result: T) => number,
): Promise<number> {
  try {
    const result = await action();
    if (opts.json) io.stdout.write(`${JSON.stringify(result, null, 2)}\n`);
    else {
      const text = human(result);
      if (text) io.stdout.write(text.endsWith("\n") ? text : `${text}\n`);
    }
    return exitCodeOf ? exitCodeOf(result) : EXIT_OK;
  } catch (err) {
    return reportError(io, opts, toPyroError(err));
  }
}

export function reportError(io: Io, opts: OutputOptions, error: PyroError, exitCode = EXIT_FAILURE): number {
  if (opts.json) io.stdout.write(`${JSON.stringify({ error: error.toJSON() }, null, 2)}\n`);
  const hint = error.hint ? ` (hint: ${error.hint})` : "";
  io.stderr.write(`pyro: error [${error.code}]: ${error.message}${hint}\n`);
  if (debugEnabled(io.env)) {
    const cause = (error as Error & { cause?: unknown }).cause;
    io.stderr.write(`${(cause instanceof Error ? cause : error).stack ?? ""}\n`);
  }
  return exitCode;
}

/** Renders rows as aligned columns. */
export function table(headers: string[], rows: string[][]): string {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  const line = (cells: string[]) =>
    cells
      .map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i] ?? 0)))
      .join("  ")
      .trimEnd();
  return [line(headers), ...rows.map(line)].join("\n");
}
