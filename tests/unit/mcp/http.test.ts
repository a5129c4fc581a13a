import { request } from "node:http";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PyroError } from "../../../src/errors.js";
import { type HttpEndpoint, parseHttpAddress, serveHttp } from "../../../src/mcp/http.js";
import { createServer } from "../../../src/mcp/server.js";
import { fakePyro } from "../../helpers/engine.js";
import { PINNED } from "./pinned.js";

describe("--http address", () => {
  it("accepts loopback addresses only", () => {
    expect(parseHttpAddress("127.0.0.1:8765")).toEqual({ host: "127.0.0.1", port: 8765 });
    expect(parseHttpAddress("localhost:0")).toEqual({ host: "127.0.0.1", port: 0 });
    expect(parseHttpAddress("[::1]:9000")).toEqual({ host: "::1", port: 9000 });
    for (const bad of [
      "0.0.0.0:8765",
      "192.168.1.2:80",
      "example.com:80",
      "127.0.0.1",
      "127.0.0.1:70000",
      ":80",
    ]) {
      expect(() => parseHttpAddress(bad), bad).toThrow(PyroError);
    }
  });
});

describe("Streamable HTTP transport", () => {
  let t: Awaited<ReturnType<typeof fakePyro>>;
  let endpoint: HttpEndpoint;
  beforeAll(async () => {
    t = await fakePyro();
    endpoint = await serveHttp(() => createServer(t.pyro, {}), { host: "127.0.0.1", port: 0 });
  });
  afterAll(async () => {
    await endpoint.close();
    await t.cleanup();
  });

  const connect = async () => {
    const client = new Client({ name: "http-test", version: "0" });
    await client.connect(new StreamableHTTPClientTransport(new URL(endpoint.url)));
    return client;
  };

  it("serves one session per client on an ephemeral loopback port", async () => {
    expect(endpoint.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/mcp$/);
    const [a, b] = await Promise.all([connect(), connect()]);
    try {
      expect((await a.listTools()).tools.map((x) => x.name)).toEqual(PINNED["workspace-core"]);
      const created = await a.callTool({ name: "workspace_create", arguments: { name: "over-http" } });
      expect(created.isError).toBeFalsy();
      const listed = await b.callTool({ name: "workspace_list", arguments: {} });
      expect(
        (listed.structuredContent as { workspaces: { name: string }[] }).workspaces.map((w) => w.name),
      ).toContain("over-http");
      const failed = await b.callTool({ name: "workspace_status", arguments: { workspace_id: "nope" } });
      expect(failed).toMatchObject({
        isError: true,
        structuredContent: { error: { code: "workspace_not_found" } },
      });
    } finally {
      await a.close();
      await b.close();
    }
  });

  it("refuses a foreign Host or Origin header (DNS rebinding) and unknown paths", async () => {
    const { port } = new URL(endpoint.url);
    const send = (path: string, headers: Record<string, string>, body?: string) =>
      new Promise<number>((resolve, reject) => {
        const req = request(
          {
            host: "127.0.0.1",
            port,
            path,
            method: "POST",
            headers: { "content-type": "application/json", ...headers },
          },
          (res) => {
            res.resume();
            resolve(res.statusCode ?? 0);
          },
        );
        req.on("error", reject);
        req.end(body ?? JSON.stringify({ jsonrpc: "2.0", id: 1, method: "ping" }));
      });
    expect(await send("/mcp", { host: `evil.example:${port}` })).toBe(403);
    expect(await send("/mcp", { host: `127.0.0.1:${port}`, origin: "https://evil.example" })).toBe(403);
    expect(await send("/elsewhere", { host: `127.0.0.1:${port}` })).toBe(404);
    // Not an initialize request, no session: refused rather than served statelessly.
    expect(
      await send("/mcp", { host: `127.0.0.1:${port}`, accept: "application/json, text/event-stream" }),
    ).toBe(400);
    // Nested past the limit: refused before parsing (JSON.stringify of it would overflow the stack).
    const deep = `{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":${"[".repeat(100_000)}${"]".repeat(100_000)}}}`;
    expect(await send("/mcp", { host: `127.0.0.1:${port}` }, deep)).toBe(400);
  });
});

describe("Streamable HTTP sessions whose clients vanish", () => {
  let t: Awaited<ReturnType<typeof fakePyro>>;
  beforeAll(async () => {
    t = await fakePyro();
  });
  afterAll(async () => {
    await t.cleanup();
  });

  /** A raw POST to the endpoint: status and the session id the server gave. */
  const post = (url: string, body: unknown, session?: string) =>
    fetch(url, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        accept: "application/json, text/event-stream",
        ...(session ? { "mcp-session-id": session, "mcp-protocol-version": "2025-06-18" } : {}),
      },
      body: JSON.stringify(body),
    }).then(async (r) => {
      await r.text();
      return { status: r.status, session: r.headers.get("mcp-session-id") ?? "" };
    });
  const initialize = (url: string) =>
    post(url, {
      jsonrpc: "2.0",
      id: 1,
      method: "initialize",
      params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "gone", version: "0" } },
    });
  const ping = (url: string, session: string) =>
    post(url, { jsonrpc: "2.0", id: 2, method: "ping" }, session);

  it("closes a session that has had nothing open for the idle time, and keeps one in use", async () => {
    const endpoint = await serveHttp(
      () => createServer(t.pyro, {}),
      { host: "127.0.0.1", port: 0 },
      {
        sessionIdleMs: 300,
      },
    );
    try {
      const gone = await initialize(endpoint.url);
      expect(gone.status).toBe(200);
      expect((await ping(endpoint.url, gone.session)).status).toBe(200);
      // A client that stays: a ping every 100 ms keeps its session while the other one goes.
      const kept = await initialize(endpoint.url);
      expect(endpoint.sessionCount()).toBe(2);
      for (let i = 0; i < 200 && endpoint.sessionCount() > 1; i++) {
        await new Promise((r) => setTimeout(r, 100));
        expect((await ping(endpoint.url, kept.session)).status).toBe(200);
      }
      expect(endpoint.sessionCount()).toBe(1);
      expect((await ping(endpoint.url, gone.session)).status).toBe(404);
      expect((await ping(endpoint.url, kept.session)).status).toBe(200);
    } finally {
      await endpoint.close();
    }
  });

  it("at the session cap, a new session evicts the longest idle one", async () => {
    const endpoint = await serveHttp(
      () => createServer(t.pyro, {}),
      { host: "127.0.0.1", port: 0 },
      {
        maxSessions: 2,
      },
    );
    try {
      const a = await initialize(endpoint.url);
      const b = await initialize(endpoint.url);
      expect((await ping(endpoint.url, b.session)).status).toBe(200);
      const c = await initialize(endpoint.url);
      expect(c.status).toBe(200);
      expect((await ping(endpoint.url, a.session)).status).toBe(404);
      expect((await ping(endpoint.url, b.session)).status).toBe(200);
      expect((await ping(endpoint.url, c.session)).status).toBe(200);
    } finally {
      await endpoint.close();
    }
  });
});
