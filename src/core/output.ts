/**
 * The output cap of commands on every surface (contract §10): `max_output_bytes` per
 * stream, past which a stream keeps its head and its tail around one marker line (the
 * cutting itself is src/agent/capture.ts, shared with the guest agent and the one-shot
 * runners).
 */
import { StringDecoder } from "node:string_decoder";
import { MAX_EXEC_OUTPUT_BYTES } from "../agent/capture.js";
import { PyroError } from "../errors.js";
import { MIN_SECRET_LENGTH } from "../state/redact.js";

export {
  characterStart,
  clipText,
  HeadTailCapture,
  MARKER_MAX_BYTES,
  omittedMarker,
} from "../agent/capture.js";

/** Smallest `max_output_bytes` accepted: room for a useful head and tail. */
export const MIN_OUTPUT_BYTES = 1024;
/** Largest `max_output_bytes` accepted: two streams this size fit in one agent message. */
export const MAX_OUTPUT_BYTES = MAX_EXEC_OUTPUT_BYTES;
/**
 * What the command history keeps of each stream (head and tail), whatever the call's own
 * cap: `workspace_logs` with a `seq` reads it back.
 */
export const HISTORY_OUTPUT_BYTES = 1024 * 1024;

/** Checks a `max_output_bytes` value; `what` names it in the error (a flag, an argument). */
export function checkMaxOutputBytes(value: unknown, what = "max_output_bytes"): number {
  if (
    typeof value !== "number" ||
    !Number.isInteger(value) ||
    value < MIN_OUTPUT_BYTES ||
    value > MAX_OUTPUT_BYTES
  ) {
    throw new PyroError(
      "invalid_argument",
      `${what} must be a whole number of bytes from ${MIN_OUTPUT_BYTES} to ${MAX_OUTPUT_BYTES} (4 MiB), got ${describe(value)}`,
      "past the cap each stream keeps its head and its tail; redirect to a file in the workspace for more",
    );
  }
  return value;
}

const UNITS: Record<string, number> = {
  "": 1,
  k: 1024,
  kb: 1024,
  kib: 1024,
  m: 1 << 20,
  mb: 1 << 20,
  mib: 1 << 20,
};

/**
 * Parses a byte size as a user types it: `65536`, `64k`, `64KiB`, `1m`, `1MiB` (k and m
 * are binary units), then checks it with `checkMaxOutputBytes`.
 */
export function parseMaxOutputBytes(text: string, what = "--max-output-bytes"): number {
  const m = /^\s*(\d+)\s*([A-Za-z]*)\s*$/.exec(text);
  const unit = m ? UNITS[(m[2] ?? "").toLowerCase()] : undefined;
  if (!m || unit === undefined) {
    throw new PyroError(
      "invalid_argument",
      `${what} must be a number of bytes (e.g. 65536, 64k, 1MiB), got '${text.slice(0, 40)}'`,
    );
  }
  return checkMaxOutputBytes(Number(m[1]) * unit, what);
}

function describe(value: unknown): string {
  if (typeof value === "string") return `'${value.slice(0, 40)}'`;
  if (typeof value === "number" || typeof value === "boolean" || value === null || value === undefined)
    return String(value);
  return typeof value;
}

/** Which stream a live chunk of output belongs to. */
export type OutputStream = "stdout" | "stderr";

/** Receives a command's output as it is produced (CLI streaming). */
export type OutputListener = (stream: OutputStream, chunk: Buffer) => void;

/**
 * Redacts secrets from a live stream: text is held back until no secret can still be
 * completing at its end (the longest secret's length minus one character), then written
 * with every secret replaced. With no secrets the bytes pass through untouched (binary
 * output stays binary); with secrets the stream is decoded as UTF-8.
 */
export class LiveRedactor {
  private readonly decoder = new StringDecoder("utf8");
  private pending = "";
  private readonly hold: number;
  private readonly pattern: RegExp | null;

  constructor(
    secrets: ReadonlyMap<string, string>,
    private readonly redact: (text: string) => string,
  ) {
    // Longest first, as the redactor matches: a secret that contains another is one match.
    const values = [...secrets.values()]
      .filter((v) => v.length >= MIN_SECRET_LENGTH)
      .sort((a, b) => b.length - a.length);
    this.hold = Math.max(0, ...values.map((v) => v.length - 1));
    this.pattern =
      values.length === 0
        ? null
        : new RegExp(values.map((v) => v.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")).join("|"), "g");
  }

  /** What may be written now of this chunk (and what was held back before). */
  push(chunk: Buffer): Buffer {
    if (!this.pattern) return chunk;
    this.pending += this.decoder.write(chunk);
    let end = Math.max(0, this.pending.length - this.hold);
    // Never cut through a secret: one that the cut would split waits for the next chunk.
    for (const m of this.pending.matchAll(this.pattern)) {
      if (m.index >= end) break;
      if (m.index + m[0].length > end) end = m.index;
    }
    const ready = this.pending.slice(0, end);
    this.pending = this.pending.slice(end);
    return Buffer.from(this.redact(ready));
  }

  /** The rest, at the end of the stream. */
  end(): Buffer {
    if (!this.pattern) return Buffer.alloc(0);
    const rest = this.pending + this.decoder.end();
    this.pending = "";
    return Buffer.from(this.redact(rest));
  }
}
