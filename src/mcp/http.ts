import { randomUUID } from "node:crypto";
import {
  createServer as createHttpServer,
  type Server as HttpServer,
  type IncomingMessage,
  type ServerResponse,
} from "node:http";
import type { AddressInfo } from "node:net";
import type { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import { PyroError } from "../errors.js";
import { exceedsDepth, MAX_JSON_DEPTH, MAX_MESSAGE_BYTES } from "./wire.js";

/** Loopback only: the server runs commands and writes host files for whoever reaches it. */
const LOOPBACK_HOSTS: Record<string, string> = {
  "127.0.0.1": "127.0.0.1",
  localhost: "127.0.0.1",
  "::1": "::1",
  "[::1]": "::1",
};

/** Largest request body accepted (a patch or a file's text travels in one request). */
const MAX_BODY_BYTES = MAX_MESSAGE_BYTES;

export interface HttpAddress {
  host: string;
  port: number;
}

/** Parses `--http HOST:PORT` (HOST one of 127.0.0.1, localhost, [::1]; PORT 0 picks a free one). */
export function parseHttpAddress(spec: string): HttpAddress {
  const m = /^(\[::1\]|[^:]+):(\d{1,5})$/.exec(spec.trim());
  const host = m ? LOOPBACK_HOSTS[m[1]!] : undefined;
  const port = m ? Number(m[2]) : Number.NaN;
  if (!m || !(port >= 0 && port <= 65535)) {
    throw new PyroError(
      "invalid_argument",
      `--http wants HOST:PORT, got '${spec}'`,
      "e.g. --http 127.0.0.1:8765 (port 0 picks a free one)",
    );
  }
  if (!host) {
    throw new PyroError(
      "invalid_argument",
      `--http binds to loopback only, not '${m[1]}'`,
      "use 127.0.0.1, localhost or [::1]",
    );
  }
  return { host, port };
}

export interface HttpEndpoint {
  /** The MCP endpoint, e.g. http://127.0.0.1:8765/mcp. */
  url: string;
  /** Sessions open now. */
  sessionCount(): number;
  close(): Promise<void>;
}

interface Session {
  transport: StreamableHTTPServerTransport;
  server: McpServer;
  /** When a request of this session last ended (or began). */
  lastSeen: number;
  /** Requests (and SSE streams) of this session still open. */
  open: number;
}

export interface HttpOptions {
  /** A session with nothing open for this long is closed (its client went away without DELETE). */
  sessionIdleMs?: number;
  /** At most this many sessions; a new one evicts the longest idle, or is refused when all are busy. */
  maxSessions?: number;
}

/** Defaults: an idle session lives 30 minutes; 64 sessions at once. */
export const SESSION_IDLE_MS = 30 * 60 * 1000;
export const MAX_SESSIONS = 64;

/**
 * The sessions of one HTTP endpoint. Clients that vanish without DELETE leave sessions (a
 * server and its listeners each): swept once they have had nothing open for `idleMs`; at
 * `maxSessions`, a new session evicts the one idle longest.
 */
class SessionTable {
  private readonly sessions = new Map<string, Session>();
  private readonly sweeper: NodeJS.Timeout;

  constructor(
    private readonly idleMs: number,
    readonly maxSessions: number,
  ) {
    this.sweeper = setInterval(
      () => {
        const now = Date.now();
        for (const [id, session] of [...this.sessions])
          if (this.idle(session, now)) void this.end(id, session);
      },
      Math.max(10, Math.min(60_000, Math.floor(idleMs / 2))),
    );
    this.sweeper.unref();
  }

  get size(): number {
    return this.sessions.size;
  }

  get(id: string): Session | undefined {
    return this.sessions.get(id);
  }

  /** A session initialized by the request answered on `res`. */
  add(id: string, session: Session, res: ServerResponse): void {
    this.sessions.set(id, session);
    this.track(session, res);
  }

  delete(id: string): void {
    this.sessions.delete(id);
  }

  /** Counts a request as open on its session until its response closes. */
  track(session: Session, res: ServerResponse): void {
    session.open++;
    session.lastSeen = Date.now();
    res.once("close", () => {
      session.open--;
      session.lastSeen = Date.now();
    });
  }

  /**
   * Makes room for a new session: at the cap, the session idle longest goes. False when
   * every session is busy (the new one has to wait).
   */
  async makeRoom(): Promise<boolean> {
    if (this.sessions.size < this.maxSessions) return true;
    const oldest = [...this.sessions]
      .filter(([, s]) => s.open === 0)
      .sort(([, a], [, b]) => a.lastSeen - b.lastSeen)[0];
    if (!oldest) return false;
    await this.end(oldest[0], oldest[1]);
    return true;
  }

  /** Stops sweeping and ends every session. */
  async close(): Promise<void> {
    clearInterval(this.sweeper);
    for (const [id, session] of [...this.sessions]) await this.end(id, session);
  }

  private idle(session: Session, now: number): boolean {
    return session.open === 0 && now - session.lastSeen >= this.idleMs;
  }

  private async end(id: string, session: Session): Promise<void> {
    this.sessions.delete(id);
    await session.server.close().catch(() => {});
    await session.transport.close().catch(() => {});
  }
}

/**
 * Serves MCP over Streamable HTTP at `/mcp` on a loopback address. Every session
 * (initialize request) gets its own McpServer from `newServer`, all sharing one SDK
 * client; sessions are stateful, so a client's cancel notification reaches the request
 * it cancels. Requests whose Host or Origin is not loopback are refused (DNS rebinding).
 */
export async function serveHttp(
  newServer: () => McpServer,
  address: HttpAddress,
  options: HttpOptions = {},
): Promise<HttpEndpoint> {
  const sessions = new SessionTable(
    options.sessionIdleMs ?? SESSION_IDLE_MS,
    options.maxSessions ?? MAX_SESSIONS,
  );
  let allowedHosts: string[] = [];

  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const url = new URL(req.url ?? "/", "http://loopback");
    if (url.pathname !== "/mcp") return reply(res, 404, "not found: the MCP endpoint is /mcp");
    if (!allowedHosts.includes(req.headers.host ?? ""))
      return reply(res, 403, `forbidden Host header '${req.headers.host ?? ""}'`);
    const origin = req.headers.origin;
    if (origin !== undefined && !isLoopbackOrigin(origin))
      return reply(res, 403, `forbidden Origin '${origin}'`);

    const sessionId = req.headers["mcp-session-id"];
    const body = req.method === "POST" ? await readJson(req) : undefined;
    if (typeof sessionId === "string") {
      const session = sessions.get(sessionId);
      if (!session) return reply(res, 404, "unknown or expired session; initialize again");
      sessions.track(session, res);
      return session.transport.handleRequest(req, res, body);
    }
    if (req.method !== "POST" || !isInitializeRequest(body)) {
      return reply(res, 400, "no mcp-session-id header: the first request of a session must be initialize");
    }
    if (!(await sessions.makeRoom()))
      return reply(res, 503, `all ${sessions.maxSessions} sessions are busy; retry shortly`);
    const server = newServer();
    const transport: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      onsessioninitialized: (id) => {
        sessions.add(id, { transport, server, lastSeen: Date.now(), open: 0 }, res);
      },
    });
    transport.onclose = () => {
      if (transport.sessionId) sessions.delete(transport.sessionId);
    };
    await server.connect(transport);
    await transport.handleRequest(req, res, body);
  };

  const http = createHttpServer((req, res) => {
    handle(req, res).catch((err: unknown) => {
      if (err instanceof BodyError) return reply(res, err.status, err.message);
      if (!res.headersSent) reply(res, 500, "internal error");
      else res.end();
    });
  });
  await listen(http, address);
  const port = (http.address() as AddressInfo).port;
  const hostPart = address.host === "::1" ? "[::1]" : address.host;
  allowedHosts = [`${hostPart}:${port}`, `localhost:${port}`];
  return {
    url: `http://${hostPart}:${port}/mcp`,
    sessionCount: () => sessions.size,
    close: async () => {
      await sessions.close();
      const closed = new Promise<void>((resolve) => http.close(() => resolve()));
      http.closeAllConnections();
      await closed;
    },
  };
}

/** Listens on the address; a port in use is a `conflict`. */
function listen(http: HttpServer, address: HttpAddress): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    http.once("error", (err: NodeJS.ErrnoException) =>
      reject(
        err.code === "EADDRINUSE"
          ? new PyroError(
              "conflict",
              `${address.host}:${address.port} is already in use`,
              "pick another port, or 0 for a free one",
            )
          : err,
      ),
    );
    http.listen(address.port, address.host, () => resolve());
  });
}

function isLoopbackOrigin(origin: string): boolean {
  try {
    const u = new URL(origin);
    return ["127.0.0.1", "localhost", "[::1]"].includes(u.hostname);
  } catch {
    return false;
  }
}

class BodyError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

async function readJson(req: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > MAX_BODY_BYTES) throw new BodyError(413, `request body over ${MAX_BODY_BYTES} bytes`);
    chunks.push(chunk as Buffer);
  }
  const text = Buffer.concat(chunks).toString("utf8");
  if (exceedsDepth(text, MAX_JSON_DEPTH))
    throw new BodyError(400, `the request body nests deeper than ${MAX_JSON_DEPTH} levels`);
  try {
    return JSON.parse(text);
  } catch {
    throw new BodyError(400, "the request body is not JSON");
  }
}

function reply(res: ServerResponse, status: number, message: string): void {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32000, message }, id: null }));
}
