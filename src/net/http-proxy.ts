import http, { type IncomingMessage, type ServerResponse } from "node:http";
import type { Socket } from "node:net";
import type { Destination, Opened } from "./gate.js";
import { forwardRequest } from "./http-forward.js";

/**
 * The HTTP side of the proxy: `CONNECT host:port` tunnels and absolute-URI forwarding.
 *
 * Node's own parser reads the requests (with size and time limits); this file only
 * turns a request into a destination, asks `open` for a checked upstream socket, and
 * copies bytes (a forwarded request's at the byte level: http-forward.ts). Each
 * forwarded request gets its own upstream connection.
 */

export interface HttpSideOptions {
  open(dest: Destination): Promise<Opened>;
  refusalBody(dest: Destination, opened: Extract<Opened, { ok: false }>): string;
  splice(client: Socket, upstream: Socket): void;
}

/** Limits of the header phase; bodies and tunnels are not timed (they may be long). */
export const MAX_HEADER_BYTES = 16 * 1024;
export const HEADERS_TIMEOUT_MS = 30_000;

export function createHttpSide(options: HttpSideOptions): http.Server {
  const server = http.createServer({
    maxHeaderSize: MAX_HEADER_BYTES,
    headersTimeout: HEADERS_TIMEOUT_MS,
    // requestTimeout covers the body too; a long upload must not be cut, so only headers are timed.
    requestTimeout: 0,
    requireHostHeader: false,
  });
  // Every field counts (MAX_HEADER_BYTES bounds them): past Node's default of 2000,
  // `req.headers` would silently miss fields, framing ones included.
  server.maxHeadersCount = 0;
  server.on("request", (req, res) => void forward(req, res, options));
  server.on(
    "connect",
    (req: IncomingMessage, socket: Socket, head: Buffer) => void tunnel(req, socket, head, options),
  );
  server.on("clientError", (err: NodeJS.ErrnoException, socket: Socket) => {
    const status =
      err.code === "HPE_HEADER_OVERFLOW" ? "431 Request Header Fields Too Large" : "400 Bad Request";
    if (socket.writable) socket.end(`HTTP/1.1 ${status}\r\nConnection: close\r\n\r\n`);
    socket.destroy();
  });
  return server;
}

async function tunnel(req: IncomingMessage, client: Socket, head: Buffer, options: HttpSideOptions) {
  const dest = parseAuthority(req.url ?? "");
  if (!dest) return void client.end(plainResponse(400, "Bad Request", "CONNECT needs host:port\n"));
  const opened = await options.open(dest);
  if (!opened.ok) return void client.end(refusalResponse(dest, opened, options));
  if (client.destroyed) return void opened.socket.destroy();
  client.write("HTTP/1.1 200 Connection Established\r\n\r\n");
  if (head.length > 0) opened.socket.write(head);
  options.splice(client, opened.socket);
}

async function forward(req: IncomingMessage, res: ServerResponse, options: HttpSideOptions) {
  const target = requestTarget(req);
  if (!target) return sendText(res, 400, "an absolute http:// URI or a Host header is required\n");
  const opened = await options.open(target.dest);
  if (!opened.ok) {
    const status = opened.refusal === "blocked" ? 403 : opened.refusal === "bad_target" ? 400 : 502;
    return sendText(res, status, options.refusalBody(target.dest, opened));
  }
  if (res.destroyed) return void opened.socket.destroy();
  forwardRequest(req, res, opened.socket, target);
}

/** Where a plain request goes: its absolute URI, or failing that its Host header (port 80). */
function requestTarget(req: IncomingMessage): { dest: Destination; path: string; hostHeader: string } | null {
  const raw = req.url ?? "";
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(raw)) {
    let url: URL;
    try {
      url = new URL(raw);
    } catch {
      return null;
    }
    if (url.protocol !== "http:" || url.hostname === "" || url.username || url.password) return null;
    const dest = { host: url.hostname, port: url.port === "" ? 80 : Number(url.port) };
    return { dest, path: `${url.pathname}${url.search}`, hostHeader: url.host };
  }
  const host = req.headers.host;
  if (!host || !raw.startsWith("/")) return null;
  const dest = parseAuthority(host, 80);
  return dest ? { dest, path: raw, hostHeader: host } : null;
}

/** `host:port` or `[v6]:port`; the port may default. Host validity is the gate's job. */
export function parseAuthority(text: string, defaultPort?: number): Destination | null {
  const m = /^(\[[0-9a-fA-F:.]+\]|[^:[\]]+)(?::([0-9]{1,5}))?$/.exec(text);
  if (!m) return null;
  const port = m[2] === undefined ? defaultPort : Number(m[2]);
  if (port === undefined || port < 1 || port > 65535) return null;
  return { host: m[1]!, port };
}

function refusalResponse(
  dest: Destination,
  opened: Extract<Opened, { ok: false }>,
  options: HttpSideOptions,
) {
  const body = options.refusalBody(dest, opened);
  if (opened.refusal === "blocked") return plainResponse(403, "Forbidden", body);
  if (opened.refusal === "bad_target") return plainResponse(400, "Bad Request", body);
  return plainResponse(502, "Bad Gateway", body);
}

function plainResponse(status: number, text: string, body: string): string {
  return (
    `HTTP/1.1 ${status} ${text}\r\nContent-Type: text/plain; charset=utf-8\r\n` +
    `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`
  );
}

function sendText(res: ServerResponse, status: number, body: string): void {
  if (res.headersSent || res.destroyed) return void res.destroy();
  res.writeHead(status, {
    "content-type": "text/plain; charset=utf-8",
    "content-length": Buffer.byteLength(body),
    connection: "close",
  });
  res.end(body);
}
