import { PassThrough } from "node:stream";
import type { JSONRPCMessage } from "@modelcontextprotocol/sdk/types.js";
import { describe, expect, it } from "vitest";
import { bounded, PyroError, quote } from "../../../src/errors.js";
import { LineTransport } from "../../../src/mcp/stdio.js";
import { decodeMessage, exceedsDepth, oversizeReply } from "../../../src/mcp/wire.js";

/** A transport on in-memory streams: what it delivers and what it answers. */
function open(maxBytes = 1024) {
  const input = new PassThrough();
  const output = new PassThrough();
  const t = new LineTransport(input, output, maxBytes);
  const delivered: JSONRPCMessage[] = [];
  const answered: any[] = [];
  let closed = false;
  t.onmessage = (m) => delivered.push(m);
  t.onclose = () => {
    closed = true;
  };
  output.setEncoding("utf8");
  let buf = "";
  output.on("data", (d: string) => {
    buf += d;
    for (let i = buf.indexOf("\n"); i !== -1; i = buf.indexOf("\n")) {
      answered.push(JSON.parse(buf.slice(0, i)));
      buf = buf.slice(i + 1);
    }
  });
  return { input, t, delivered, answered, closed: () => closed };
}

const tick = () => new Promise((r) => setImmediate(r));
const ping = (id: number) => `${JSON.stringify({ jsonrpc: "2.0", id, method: "ping" })}\n`;

describe("LineTransport (stdio)", () => {
  it("delivers messages split across chunks and several in one chunk, CRLF included", async () => {
    const s = open();
    await s.t.start();
    const two = ping(1) + ping(2).replace("\n", "\r\n");
    s.input.write(two.slice(0, 7));
    s.input.write(two.slice(7, 40));
    s.input.write(two.slice(40));
    await tick();
    expect(s.delivered.map((m) => (m as { id: number }).id)).toEqual([1, 2]);
  });

  it("refuses a line over the limit with an answer, keeps only its edges, and keeps serving", async () => {
    const s = open(1024);
    await s.t.start();
    // The id at the end, as the official SDK's clients write it.
    const big = `{"method":"tools/call","params":{"name":"workspace_file_write","arguments":{"text":"${"x".repeat(5000)}"}},"jsonrpc":"2.0","id":41}\n`;
    for (let i = 0; i < big.length; i += 100) s.input.write(big.slice(i, i + 100));
    s.input.write(ping(42));
    await tick();
    expect(s.closed()).toBe(false);
    expect(s.answered).toHaveLength(1);
    expect(s.answered[0]).toMatchObject({
      id: 41,
      result: { isError: true, structuredContent: { error: { code: "invalid_argument" } } },
    });
    expect(s.delivered).toEqual([{ jsonrpc: "2.0", id: 42, method: "ping" }]);
  });

  it("answers a line that is not JSON with -32700 and id null, and an invalid message with -32600", async () => {
    const s = open();
    await s.t.start();
    s.input.write("{nope\n");
    s.input.write(`${JSON.stringify({ jsonrpc: "2.0", id: 7, method: 5 })}\n`);
    s.input.write(`${JSON.stringify([1, 2])}\n`);
    s.input.write("\n   \n");
    await tick();
    expect(s.answered.map((a) => [a.id, a.error.code])).toEqual([
      [null, -32700],
      [7, -32600],
      [null, -32600],
    ]);
    expect(s.delivered).toEqual([]);
  });

  it("stops reading on close and says so", async () => {
    const s = open();
    await s.t.start();
    await s.t.close();
    s.input.write(ping(1));
    await tick();
    expect(s.closed()).toBe(true);
    expect(s.delivered).toEqual([]);
  });
});

describe("wire rules", () => {
  it("measures nesting without recursion, ignoring brackets in strings", () => {
    expect(exceedsDepth(`${"[".repeat(1_000_000)}${"]".repeat(1_000_000)}`, 64)).toBe(true);
    expect(exceedsDepth(`{"a":"${"[".repeat(100)}\\"["}`, 64)).toBe(false);
    expect(exceedsDepth(`${"[".repeat(64)}${"]".repeat(64)}`, 64)).toBe(false);
    expect(exceedsDepth(`${"[".repeat(65)}${"]".repeat(65)}`, 64)).toBe(true);
  });

  it("refuses too-deep messages with their id before parsing", () => {
    const d = decodeMessage(
      `{"jsonrpc":"2.0","id":"q","method":"x","params":${"[".repeat(70)}${"]".repeat(70)}}`,
    );
    expect(d).toEqual({
      ok: false,
      reply: { jsonrpc: "2.0", id: "q", error: expect.objectContaining({ code: -32600 }) },
    });
  });

  it("finds an oversize request's id at either end; a notification gets no answer", () => {
    expect(
      oversizeReply('{"jsonrpc":"2.0","id":3,"method":"x","params":{"a":"', 'aaa"}}', 9e7),
    ).toMatchObject({
      id: 3,
      error: { code: -32600 },
    });
    expect(
      oversizeReply('{"method":"x","params":{"a":"', 'aaa"}},"jsonrpc":"2.0","id":"s"}', 9e7),
    ).toMatchObject({
      id: "s",
    });
    expect(oversizeReply('{"method":"notifications/x","params":{"a":"', 'aaa"}},"jsonrpc":"2.0"}', 9e7)).toBe(
      undefined,
    );
    // A nested "id" is not the request's.
    expect(oversizeReply('{"method":"x","params":{"a":"', '","id":5}}', 9e7)).toMatchObject({ id: null });
  });
});

describe("error text is bounded", () => {
  it("quotes a long value by its prefix and length, and caps the whole message", () => {
    const e = new PyroError(
      "workspace_not_found",
      `no workspace '${"w".repeat(1_400_000)}'`,
      "h".repeat(5000),
    );
    expect(e.message.length).toBeLessThan(200);
    expect(e.message).toMatch(/^no workspace 'w+…' \(1400000 characters\)$/);
    expect(e.hint!.length).toBeLessThan(2100);
    expect(quote("short")).toBe("'short'");
    expect(bounded("plain")).toBe("plain");
  });
});
