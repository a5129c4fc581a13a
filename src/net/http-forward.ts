import type { IncomingMessage, ServerResponse } from "node:http";
import type { Socket } from "node:net";
import { drained } from "../agent/pipe.js";
import {
  type BodyFraming,
  bodyFraming,
  ChunkedDecoder,
  contentLength,
  HttpFramingError,
  parseResponseHead,
  type ResponseHead,
} from "./http-framing.js";

/**
 * One plain-HTTP request forwarded on its own upstream connection, written and read at
 * the byte level: the request's head is written from the parsed request, its body
 * copied as it comes; the response's head is read here (http-framing.ts) and its body's
 * bytes go to the client's response as they arrive, without a second parser and stream
 * on the way (docs/network.md, "Costs": this halved the forwarding path's own CPU).
 *
 * The client's connection stays Node's (`res`), so keep-alive and pipelining towards
 * the client work as with any Node server; upstream, every request says
 * `Connection: close`.
 */

/** Headers that describe one hop, never forwarded (RFC 9110 §7.6.1, plus the proxy ones). */
export const HOP_BY_HOP = new Set([
  "connection",
  "proxy-connection",
  "keep-alive",
  "proxy-authorization",
  "proxy-authenticate",
  "te",
  "trailer",
  "transfer-encoding",
  "upgrade",
]);

export interface ForwardTarget {
  path: string;
  hostHeader: string;
}

/** Fields of `fields` that go to the next hop: no hop-by-hop ones, none the Connection field names. */
export function endToEndFields(fields: [string, string][]): [string, string][] {
  const listed = new Set(
    fields
      .filter(([n]) => n.toLowerCase() === "connection")
      .flatMap(([, v]) => v.split(","))
      .map((t) => t.trim().toLowerCase())
      .filter(Boolean),
  );
  return fields.filter(([n]) => {
    const name = n.toLowerCase();
    return !HOP_BY_HOP.has(name) && !listed.has(name);
  });
}

function pairs(raw: string[]): [string, string][] {
  const out: [string, string][] = [];
  for (let i = 0; i + 1 < raw.length; i += 2) out.push([raw[i]!, raw[i + 1]!]);
  return out;
}

/** Fields whose meaning is this message's framing: the proxy writes its own. */
const FRAMING = new Set(["content-length", "transfer-encoding", "host"]);

/**
 * How the request's body is framed, as Node's parser framed it (which reads the whole
 * header list, whatever the Connection field names): chunked, a length, or no body.
 */
function requestFraming(req: IncomingMessage): { chunked: boolean; length: string | null } {
  const chunked = /chunked/i.test(String(req.headers["transfer-encoding"] ?? ""));
  const length = req.headers["content-length"];
  return { chunked, length: !chunked && length !== undefined ? length : null };
}

/** Sends `req` upstream and relays the response into `res`; settles when both are done. */
export function forwardRequest(
  req: IncomingMessage,
  res: ServerResponse,
  up: Socket,
  target: ForwardTarget,
): void {
  const { chunked, length } = requestFraming(req);
  const fields = endToEndFields(pairs(req.rawHeaders)).filter(([n]) => !FRAMING.has(n.toLowerCase()));
  const head = [
    `${req.method} ${target.path} HTTP/1.1`,
    `Host: ${target.hostHeader}`,
    ...fields.map(([n, v]) => `${n}: ${v}`),
    ...(chunked ? ["Transfer-Encoding: chunked"] : length !== null ? [`Content-Length: ${length}`] : []),
    "Connection: close",
    "",
    "",
  ].join("\r\n");
  up.write(head, "latin1");
  void copyBody(req, up, chunked).catch(() => up.destroy());
  relayResponse(up, res, req.method ?? "GET");
  res.on("close", () => up.destroy());
}

/** The request's body (already de-chunked by Node), chunked again when it came so. */
async function copyBody(req: IncomingMessage, up: Socket, chunked: boolean): Promise<void> {
  for await (const chunk of req as AsyncIterable<Buffer>) {
    if (up.destroyed) return;
    let ok: boolean;
    if (chunked) {
      // All three pieces go, whatever the buffer says after the first: a chunk's size,
      // data and CRLF are one unit of the framing.
      up.cork();
      up.write(`${chunk.length.toString(16)}\r\n`);
      up.write(chunk);
      ok = up.write("\r\n");
      up.uncork();
    } else ok = up.write(chunk);
    if (!ok) await drained(up);
  }
  if (chunked && !up.destroyed) up.write("0\r\n\r\n");
}

/** Limit of the response head, as for requests. */
const MAX_RESPONSE_HEAD = 16 * 1024;

/**
 * Reads the response off `up` and writes it to `res`: 1xx interim responses are dropped
 * (the client's 100-continue was answered by Node's server), the body is copied by its
 * framing, and `res` ends when the body does. An upstream that breaks the framing or
 * closes early gets 502 before the head, a destroyed response after it.
 */
function relayResponse(up: Socket, res: ServerResponse, method: string): void {
  let pending: Buffer = Buffer.alloc(0);
  let body: BodyReader | null = null;
  const fail = (why: string) => {
    up.destroy();
    if (res.headersSent || res.destroyed) return void res.destroy();
    const text = `upstream ${why}\n`;
    res.writeHead(502, {
      "content-type": "text/plain; charset=utf-8",
      "content-length": Buffer.byteLength(text),
      connection: "close",
    });
    res.end(text);
  };
  const onData = (chunk: Buffer) => {
    try {
      if (body) return body.push(chunk);
      pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk]);
      const found = finalHead(pending);
      if (!found.head) {
        pending = found.rest;
        return;
      }
      const framing = bodyFraming(method, found.head);
      res.writeHead(
        found.head.status,
        found.head.reason || undefined,
        responseFields(found.head, framing).flat(),
      );
      body = new BodyReader(framing, res, up);
      body.push(found.rest);
    } catch (err) {
      fail(
        err instanceof HttpFramingError
          ? `sent a malformed response: ${err.message}`
          : "response was not relayable",
      );
    }
  };
  up.on("data", onData);
  up.on("end", () => (body ? body.end() : fail("closed the connection before a response")));
  up.on("error", () => (body ? res.destroy() : fail("connection failed")));
}

/**
 * The final response's head in `buf` and the bytes after it, past any 1xx interim
 * ones; without a complete final head, null and the bytes still to be read.
 */
function finalHead(buf: Buffer): { head: ResponseHead; rest: Buffer } | { head: null; rest: Buffer } {
  for (;;) {
    const head = parseResponseHead(buf, MAX_RESPONSE_HEAD);
    if (!head) return { head: null, rest: buf };
    const rest = buf.subarray(head.length);
    if (head.status >= 200) return { head, rest };
    if (head.status === 101) throw new HttpFramingError("switched protocols, which is not relayed");
    buf = rest;
  }
}

/**
 * The response's fields for the client: end-to-end ones, with its length written by the
 * proxy as one field (when the body has a length, or a HEAD, 204 or 304 response states a
 * valid one), never as the upstream spelled it (`5, 5`, or twice).
 */
function responseFields(head: ResponseHead, framing: BodyFraming): [string, string][] {
  const fields = endToEndFields(head.fields).filter(([n]) => n.toLowerCase() !== "content-length");
  const stated = framing.kind === "none" ? contentLength(head.fields) : null;
  const length = framing.kind === "length" ? framing.bytes : typeof stated === "number" ? stated : null;
  return length === null ? fields : [...fields, ["Content-Length", String(length)]];
}

/** Copies the body's bytes into `res` by its framing, holding `up` while `res` is full. */
class BodyReader {
  private left: number;
  private readonly chunks: ChunkedDecoder | null;
  private finished = false;

  constructor(
    private readonly framing: BodyFraming,
    private readonly res: ServerResponse,
    private readonly up: Socket,
  ) {
    this.left = framing.kind === "length" ? framing.bytes : 0;
    this.chunks = framing.kind === "chunked" ? new ChunkedDecoder() : null;
    if (framing.kind === "none" || (framing.kind === "length" && framing.bytes === 0)) this.finish();
  }

  push(buf: Buffer): void {
    if (this.finished || buf.length === 0) return;
    if (this.framing.kind === "length") {
      const part = buf.length > this.left ? buf.subarray(0, this.left) : buf;
      this.left -= part.length;
      this.write(part);
      if (this.left === 0) this.finish();
    } else if (this.chunks) {
      const { data, done } = this.chunks.push(buf);
      // One write to the client per read from the upstream, however many chunks it held.
      this.res.cork();
      for (const d of data) this.write(d);
      this.res.uncork();
      if (done) this.finish();
    } else this.write(buf);
  }

  /** The upstream's end: the body's end when it is close-delimited, else a truncation. */
  end(): void {
    if (this.finished) return;
    if (this.framing.kind === "close") this.finish();
    else this.res.destroy();
  }

  private write(buf: Buffer): void {
    if (buf.length === 0) return;
    if (!this.res.write(buf)) {
      this.up.pause();
      this.res.once("drain", () => this.up.resume());
    }
  }

  private finish(): void {
    this.finished = true;
    this.res.end();
    this.up.destroy();
  }
}
