/**
 * What the server accepts off the wire, the same on stdio and HTTP: a message is at most
 * MAX_MESSAGE_BYTES of JSON nested at most MAX_JSON_DEPTH deep. Anything else is refused
 * with an answer (never by closing the connection or exiting): the client's request gets
 * a JSON-RPC error with its id when the id can be found, `id: null` otherwise (JSON-RPC
 * 2.0 §5), and a `tools/call` that was too big gets an ordinary tool error result, so a
 * model sees why its call failed. Refusals never quote the input back beyond a short prefix.
 */
import { type JSONRPCMessage, JSONRPCMessageSchema } from "@modelcontextprotocol/sdk/types.js";
import { PyroError } from "../errors.js";
import { errorResult } from "./server.js";

/** Largest message: a 16 MiB file text (the file_write limit) escaped as JSON fits. */
export const MAX_MESSAGE_BYTES = 64 * 1024 * 1024;
/** Deepest nesting of arrays and objects; tool arguments need a handful. */
export const MAX_JSON_DEPTH = 64;

/** JSON-RPC 2.0 error codes. */
export const PARSE_ERROR = -32700;
export const INVALID_REQUEST = -32600;
export const INVALID_PARAMS = -32602;

export type RequestId = string | number | null;

/** A message read off the wire, or why it was refused and how to answer. */
export type Decoded =
  | { ok: true; message: JSONRPCMessage }
  | { ok: false; reply: JSONRPCMessage | undefined };

/** Decodes one complete message (a stdio line or an HTTP body's JSON text). */
export function decodeMessage(text: string): Decoded {
  if (exceedsDepth(text, MAX_JSON_DEPTH))
    return refuse(findId(text), INVALID_REQUEST, `the message nests deeper than ${MAX_JSON_DEPTH} levels`);
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    return refuse(null, PARSE_ERROR, `parse error: ${clip((err as Error).message)}`);
  }
  const parsed = JSONRPCMessageSchema.safeParse(value);
  if (!parsed.success) {
    const id = isObject(value) && isId(value.id) ? value.id : null;
    // A response or notification that is malformed gets no answer (nothing waits for it).
    if (isObject(value) && !("method" in value && "id" in value)) return { ok: false, reply: undefined };
    return refuse(id, INVALID_REQUEST, "not a JSON-RPC 2.0 message");
  }
  return { ok: true, message: parsed.data };
}

/**
 * The answer to a message over MAX_MESSAGE_BYTES, given only its first and last bytes
 * (the rest was never kept). The id is found at the start (`{"jsonrpc":"2.0","id":7,...`)
 * or at the end (`...,"id":7}`, how the official SDK's clients write it).
 */
export function oversizeReply(head: string, tail: string, bytes: number): JSONRPCMessage | undefined {
  const id = leadingId(head) ?? trailingId(tail);
  if (id === undefined) {
    // A notification (no id) needs no answer; an unreadable one gets id null.
    return /"method"\s*:/.test(head) && !/"id"\s*:/.test(head + tail)
      ? undefined
      : errorReply(null, INVALID_REQUEST, tooBig(bytes));
  }
  if (/"method"\s*:\s*"tools\/call"/.test(head))
    return {
      jsonrpc: "2.0",
      id,
      result: errorResult(new PyroError("invalid_argument", tooBig(bytes), hint())),
    } as JSONRPCMessage;
  return errorReply(id, INVALID_REQUEST, tooBig(bytes));
}

export function errorReply(id: RequestId, code: number, message: string): JSONRPCMessage {
  return { jsonrpc: "2.0", id, error: { code, message } } as JSONRPCMessage;
}

function refuse(id: RequestId, code: number, message: string): Decoded {
  return { ok: false, reply: errorReply(id, code, message) };
}

function tooBig(bytes: number): string {
  return `the request is ${mib(bytes)} MiB, over the limit of ${mib(MAX_MESSAGE_BYTES)} MiB per message`;
}

function hint(): string {
  return "write a big file in parts (a file under 16 MiB per workspace_file_write), or put it in the project and use workspace_sync_push";
}

function mib(bytes: number): string {
  return (bytes / (1024 * 1024)).toFixed(1).replace(/\.0$/, "");
}

/** True when arrays/objects nest deeper than `max` (strings skipped); a scan, no recursion. */
export function exceedsDepth(text: string, max: number): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++;
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x5b || c === 0x7b) {
      if (++depth > max) return true;
    } else if (c === 0x5d || c === 0x7d) depth--;
  }
  return false;
}

const ID = String.raw`(-?\d{1,15}|"(?:[^"\\]|\\.){0,128}")`;
const LEADING_ID = new RegExp(String.raw`^\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*${ID}\s*[,}]`);
const TRAILING_ID = new RegExp(String.raw`,\s*"id"\s*:\s*${ID}\s*\}\s*$`);

function leadingId(head: string): RequestId | undefined {
  const m = LEADING_ID.exec(head);
  return m ? (JSON.parse(m[1]!) as RequestId) : undefined;
}

function trailingId(tail: string): RequestId | undefined {
  const m = TRAILING_ID.exec(tail);
  return m ? (JSON.parse(m[1]!) as RequestId) : undefined;
}

/** The id of a message too deep to parse safely, if it can be read off either end. */
function findId(text: string): RequestId {
  return leadingId(text.slice(0, 4096)) ?? trailingId(text.slice(-4096)) ?? null;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function isId(v: unknown): v is string | number {
  return typeof v === "number" || typeof v === "string";
}

function clip(s: string): string {
  return s.length > 120 ? `${s.slice(0, 120)}…` : s;
}
