/**
 * The output cap of commands on every surface (contract §10): `max_output_bytes` per
 * stream, past which a stream keeps its head and its tail around one marker line (the
 * cutting itself is src/agent/capture.ts, shared with the guest agent and the one-shot
 * runners).
 */
import { MAX_EXEC_OUTPUT_BYTES } from "../agent/op-schemas.js";
import { PyroError } from "./errors.js";

export { clipText, HeadTailCapture, MARKER_MAX_BYTES, omittedMarker } from "../agent/capture.js";

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
