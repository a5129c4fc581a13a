import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage } from "node:http";
import type { AddressInfo } from "node:net";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest, type JSONRPCMessage } from "@modelcontextprotocol/sdk/types.js";

/**
 * Puts a stdio MCP server behind a loopback Streamable HTTP endpoint, message for
 * message, so a URL-only client (the conformance runner) can drive the stdio transport:
 * each HTTP session launches its own server process, as a host launches one per
 * connection. Nothing is interpreted: requests go to the child's stdin as they came,
 * and the child's responses and notifications come back on the session's streams.
 */
export async function stdioBridge(launch: {
  command: string;
  args: string[];
  cwd: string;
  env: Record<string, string>;
}): Promise<{ url: string; stderr(): string; close(): Promise<void> }> {
  const sessions = new Map<string, { http: StreamableHTTPServerTransport; stdio: StdioClientTransport }>();
  let stderr = "";
  const readJson = async (req: IncomingMessage): Promise<unknown> => {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const text = Buffer.concat(chunks).toString("utf8");
    return text ? JSON.parse(text) : undefined;
  };
  const server = createServer((req, res) => {
    (async () => {
      const body = req.method === "POST" ? await readJson(req) : undefined;
      const id = req.headers["mcp-session-id"];
      if (typeof id === "string") {
        const s = sessions.get(id);
        if (!s) {
          res.writeHead(404).end("unknown session");
          return;
        }
        await s.http.handleRequest(req, res, body);
        return;
      }
      if (!isInitializeRequest(body)) {
        res.writeHead(400).end("initialize first");
        return;
      }
      const stdio = new StdioClientTransport({ ...launch, stderr: "pipe" });
      const http: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (sid) => {
          sessions.set(sid, { http, stdio });
        },
      });
      http.onmessage = (m: JSONRPCMessage) => {
        stdio.send(m).catch(() => {});
      };
      stdio.onmessage = (m: JSONRPCMessage) => {
        http.send(m).catch(() => {});
      };
      http.onclose = () => {
        if (http.sessionId) sessions.delete(http.sessionId);
        stdio.close().catch(() => {});
      };
      await stdio.start();
      stdio.stderr?.on("data", (c: Buffer) => {
        stderr += c.toString("utf8");
      });
      await http.start();
      await http.handleRequest(req, res, body);
    })().catch((err: unknown) => {
      if (!res.headersSent) res.writeHead(500).end(String(err));
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}/mcp`,
    stderr: () => stderr,
    close: async () => {
      for (const s of sessions.values()) {
        await s.http.close().catch(() => {});
        await s.stdio.close().catch(() => {});
      }
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}
