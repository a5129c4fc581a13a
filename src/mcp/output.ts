/**
 * Command output over MCP: a smaller default cap than the CLI's and the SDK's, and a
 * bound on the whole serialized result. Chat hosts refuse or cut tool results past about
 * 25,000 tokens (Claude Code's default); a result holds the output twice (the text
 * content a model reads, and structuredContent), so the streams are cut to fit.
 */
import { z } from "zod";
import {
  characterStart,
  clipText,
  HISTORY_OUTPUT_BYTES,
  MAX_OUTPUT_BYTES,
  MIN_OUTPUT_BYTES,
} from "../core/output.js";

/** Default `max_output_bytes` of MCP calls, per stream. */
export const MCP_OUTPUT_BYTES = 16 * 1024;
/**
 * Budget of a whole serialized tool result (text content and structuredContent), in
 * bytes: about 20,000 tokens of ordinary output, under the 25,000 hosts accept.
 */
export const MCP_RESULT_BYTES = 80_000;
/** The floor the fitting cuts streams down to (a pathological output: every byte escaped). */
const MIN_FIT_BYTES = 256;

/** The `max_output_bytes` argument of vm_run, workspace_exec and workspace_logs. */
export const maxOutputArg = z
  .number()
  .int()
  .min(MIN_OUTPUT_BYTES)
  .max(MAX_OUTPUT_BYTES)
  .describe(
    `Per stream, in bytes (default ${MCP_OUTPUT_BYTES}). Past it a stream keeps its first and last halves with one '[... N bytes omitted ...]' line between them (stdout_bytes/stderr_bytes give the full sizes). Raise it only when you need more: large results may be refused by your host.`,
  );

interface Streams {
  stdout: string;
  stderr: string;
  stdout_bytes: number | null;
  stderr_bytes: number | null;
  truncated: boolean;
}

/** Bytes of a tool result holding `structured` and the text `text`. */
export function resultBytes(structured: unknown, text: string): number {
  return Buffer.byteLength(JSON.stringify(structured)) + Buffer.byteLength(JSON.stringify(text)) + 128;
}

/**
 * Cuts a command result's streams (halving the cap, head and tail kept) until the result
 * with its rendering fits `budget`. Only a default cap is fitted: a caller who chose
 * `max_output_bytes` gets what it asked for.
 */
export function fitStreams<R extends Streams>(
  r: R,
  render: (r: R) => string,
  cap: number,
  budget = MCP_RESULT_BYTES,
): R {
  let fitted = r;
  let c = cap;
  while (resultBytes(fitted, render(fitted)) > budget && c > MIN_FIT_BYTES) {
    c = Math.max(MIN_FIT_BYTES, Math.floor(c / 2));
    const stdout = clipText(r.stdout, c, r.stdout_bytes ?? undefined);
    const stderr = clipText(r.stderr, c, r.stderr_bytes ?? undefined);
    fitted = { ...r, stdout, stderr, truncated: r.truncated || stdout !== r.stdout || stderr !== r.stderr };
  }
  return fitted;
}

interface LogsLike<C extends Streams> {
  count: number;
  commands: C[];
}

/**
 * Fits a history listing: shorter tails first (down to 64 bytes), then only the most
 * recent commands.
 */
export function fitLogs<C extends Streams, R extends LogsLike<C>>(
  r: R,
  render: (r: R) => string,
  budget = MCP_RESULT_BYTES,
): R {
  let fitted = r;
  for (let tail = 2048; resultBytes(fitted, render(fitted)) > budget && tail >= 64; tail /= 2) {
    fitted = {
      ...r,
      commands: r.commands.map((c) => ({
        ...c,
        stdout: lastBytes(c.stdout, tail),
        stderr: lastBytes(c.stderr, tail),
      })),
    };
  }
  while (resultBytes(fitted, render(fitted)) > budget && fitted.commands.length > 1) {
    fitted = { ...fitted, commands: fitted.commands.slice(Math.ceil(fitted.commands.length / 4)) };
  }
  return fitted;
}

/** The last `n` bytes of `text`, starting on a whole character. */
function lastBytes(text: string, n: number): string {
  const buf = Buffer.from(text, "utf8");
  if (buf.length <= n) return text;
  const t = buf.subarray(buf.length - n);
  return t.subarray(characterStart(t)).toString("utf8");
}

/** How a truncated result says where the rest is. */
export function truncationNote(r: {
  stdout_bytes: number | null;
  stderr_bytes: number | null;
  seq?: number;
}): string {
  const sizes = `stdout ${r.stdout_bytes ?? "?"} bytes, stderr ${r.stderr_bytes ?? "?"} bytes`;
  const more =
    r.seq !== undefined
      ? `; workspace_logs with seq ${r.seq} and a larger max_output_bytes shows up to ${HISTORY_OUTPUT_BYTES / 1024 / 1024} MiB per stream`
      : "; pass a larger max_output_bytes, or write the output to a file";
  return `note: output cut to its head and tail (${sizes})${more}`;
}
