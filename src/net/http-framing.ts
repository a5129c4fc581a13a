/**
 * The parts of HTTP/1.1 message framing (RFC 9112) the forwarding proxy reads in an
 * upstream's response, so that it can relay the body's bytes as they come instead of
 * through a second HTTP parser and stream: the head (status line and header fields) and
 * the `chunked` transfer coding. Both are strict: anything they do not understand is an
 * `HttpFramingError`, which the proxy answers with 502 and a closed upstream.
 *
 * Requests are parsed by Node's own server (http-proxy.ts); only responses come here.
 */

export class HttpFramingError extends Error {}

export interface ResponseHead {
  status: number;
  reason: string;
  /** Header fields in order, names as sent. */
  fields: [string, string][];
  /** Bytes of the head, its blank line included. */
  length: number;
}

/** How the response's body ends (RFC 9112 §6.3). */
export type BodyFraming =
  | { kind: "none" }
  | { kind: "length"; bytes: number }
  | { kind: "chunked" }
  | { kind: "close" };

const STATUS_LINE = /^HTTP\/1\.[01] ([1-9][0-9]{2})(?: ([^\x00-\x08\x0a-\x1f\x7f]*))?$/;
const FIELD = /^([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([^\x00-\x08\x0a-\x1f\x7f]*?)[ \t]*$/;

/**
 * The response head at the start of `buf`, or null while its blank line has not come
 * yet. Throws past `maxBytes` or on a malformed line (obsolete line folding included).
 */
export function parseResponseHead(buf: Buffer, maxBytes: number): ResponseHead | null {
  const end = buf.indexOf("\r\n\r\n");
  // A bare LF ends no line here: refuse it at once rather than wait for a CRLF CRLF
  // that an upstream keeping its connection open would never send.
  for (let nl = buf.indexOf(0x0a); nl >= 0 && (end < 0 || nl < end + 4); nl = buf.indexOf(0x0a, nl + 1))
    if (nl === 0 || buf[nl - 1] !== 0x0d) throw new HttpFramingError("bare LF in the response head");
  if (end < 0) {
    if (buf.length > maxBytes) throw new HttpFramingError(`response head over ${maxBytes} bytes`);
    return null;
  }
  if (end + 4 > maxBytes) throw new HttpFramingError(`response head over ${maxBytes} bytes`);
  const lines = buf.subarray(0, end).toString("latin1").split("\r\n");
  const status = STATUS_LINE.exec(lines[0]!);
  if (!status) throw new HttpFramingError("malformed status line");
  const fields: [string, string][] = [];
  for (const line of lines.slice(1)) {
    const m = FIELD.exec(line);
    if (!m) throw new HttpFramingError("malformed header field");
    fields.push([m[1]!, m[2]!]);
  }
  return { status: Number(status[1]), reason: status[2] ?? "", fields, length: end + 4 };
}

/** The values of one field, all its lines, comma lists split. */
export function fieldValues(fields: [string, string][], name: string): string[] {
  return fields
    .filter(([n]) => n.toLowerCase() === name)
    .flatMap(([, v]) => v.split(","))
    .map((v) => v.trim())
    .filter((v) => v !== "");
}

/** How a response to `method` with this head ends its body. */
export function bodyFraming(method: string, head: ResponseHead): BodyFraming {
  if (method === "HEAD" || head.status === 204 || head.status === 304) return { kind: "none" };
  const codings = fieldValues(head.fields, "transfer-encoding").map((c) => c.toLowerCase());
  if (codings.length > 0) return codings.at(-1) === "chunked" ? { kind: "chunked" } : { kind: "close" };
  const length = contentLength(head.fields);
  if (length === "invalid") throw new HttpFramingError("invalid or conflicting Content-Length");
  return length === null ? { kind: "close" } : { kind: "length", bytes: length };
}

/** The length the Content-Length fields state: null without one, "invalid" unless one decimal value. */
export function contentLength(fields: [string, string][]): number | null | "invalid" {
  const lengths = fieldValues(fields, "content-length");
  if (lengths.length === 0) return null;
  return lengths.every((v) => /^[0-9]{1,15}$/.test(v) && v === lengths[0]) ? Number(lengths[0]) : "invalid";
}

/** Longest chunk-size line (size and extensions) and trailer section accepted. */
const MAX_SIZE_LINE = 4096;
const MAX_TRAILERS = 16 * 1024;

/**
 * Decodes the `chunked` transfer coding as bytes arrive: `push` returns the data the
 * bytes held (views into them, not copies) and whether the last chunk and its trailer
 * section are complete, with the bytes after them (which are not the body's).
 */
export class ChunkedDecoder {
  private state: "size" | "data" | "data-end" | "trailers" = "size";
  private line = "";
  private left = 0;

  push(buf: Buffer): { data: Buffer[]; done: boolean; rest: Buffer } {
    const data: Buffer[] = [];
    let at = 0;
    while (at < buf.length) {
      if (this.state === "data") {
        const n = Math.min(this.left, buf.length - at);
        data.push(buf.subarray(at, at + n));
        at += n;
        this.left -= n;
        if (this.left === 0) this.state = "data-end";
        continue;
      }
      const nl = buf.indexOf(0x0a, at);
      const upTo = nl < 0 ? buf.length : nl + 1;
      this.line += buf.toString("latin1", at, upTo);
      at = upTo;
      const limit = this.state === "trailers" ? MAX_TRAILERS : MAX_SIZE_LINE;
      if (this.line.length > limit) throw new HttpFramingError("chunk size line or trailers too long");
      if (nl < 0) break;
      if (this.lineDone()) return { data, done: true, rest: buf.subarray(at) };
    }
    return { data, done: false, rest: Buffer.alloc(0) };
  }

  /** Takes the complete line in `line`; true when the message has ended. */
  private lineDone(): boolean {
    const line = this.line;
    if (this.state === "data-end" && line !== "\r\n")
      throw new HttpFramingError("chunk data longer than its size");
    if (!line.endsWith("\r\n")) throw new HttpFramingError("bare LF in chunked framing");
    if (this.state === "trailers") return line === "\r\n" || line.endsWith("\r\n\r\n");
    this.line = "";
    if (this.state === "data-end") {
      this.state = "size";
      return false;
    }
    const m = /^([0-9a-fA-F]{1,12})(?:[ \t]*;[^\r\n]*)?\r\n$/.exec(line);
    if (!m) throw new HttpFramingError("malformed chunk size");
    this.left = Number.parseInt(m[1]!, 16);
    if (this.left === 0) {
      this.state = "trailers";
      return false;
    }
    this.state = "data";
    return false;
  }
}
