import type { Readable, Writable } from "node:stream";
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js";
import type { JSONRPCMessage } from "@modelcontextprotocol/sdk/types.js";
import { decodeMessage, MAX_MESSAGE_BYTES, oversizeReply } from "./wire.js";

/** How much of an oversize line is kept to find its id: its first and last bytes. */
const EDGE_BYTES = 4096;

/**
 * The stdio transport: newline-delimited JSON-RPC on stdin/stdout, as the MCP spec
 * defines it. It replaces the SDK's StdioServerTransport, which closes the connection
 * (the server then exits) on any line over 10 MiB and answers nothing to a line that is
 * not JSON. Here every line gets what JSON-RPC prescribes (wire.ts): a line over the
 * limit is skipped to its newline without being kept (bounded memory) and refused with
 * an answer; the connection stays up for the next message.
 */
export class LineTransport implements Transport {
  onclose?: () => void;
  onerror?: (error: Error) => void;
  onmessage?: (message: JSONRPCMessage) => void;

  private chunks: Buffer[] = [];
  private size = 0;
  /** Set while skipping a line over the limit: its head, a rolling tail and its size. */
  private skipping: { head: string; tail: Buffer; bytes: number } | undefined;
  private closed = false;

  constructor(
    private readonly input: Readable,
    private readonly output: Writable,
    private readonly maxBytes = MAX_MESSAGE_BYTES,
  ) {}

  async start(): Promise<void> {
    this.input.on("data", this.onData);
    this.input.on("error", this.onError);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.input.off("data", this.onData);
    this.input.off("error", this.onError);
    if (this.input.listenerCount("data") === 0) this.input.pause();
    this.chunks = [];
    this.size = 0;
    this.skipping = undefined;
    this.onclose?.();
  }

  send(message: JSONRPCMessage): Promise<void> {
    return new Promise((resolve) => {
      if (this.output.write(`${JSON.stringify(message)}\n`)) resolve();
      else this.output.once("drain", resolve);
    });
  }

  private readonly onError = (error: Error) => this.onerror?.(error);

  private readonly onData = (chunk: Buffer | string) => {
    let data = typeof chunk === "string" ? Buffer.from(chunk) : chunk;
    while (data.length > 0 && !this.closed) {
      const nl = data.indexOf(0x0a);
      const piece = nl === -1 ? data : data.subarray(0, nl);
      this.take(piece);
      if (nl === -1) break;
      this.endLine();
      data = data.subarray(nl + 1);
    }
  };

  /** Adds part of the current line: kept while under the limit, else only its edges. */
  private take(piece: Buffer): void {
    if (piece.length === 0) return;
    if (this.skipping) {
      const s = this.skipping;
      s.bytes += piece.length;
      s.tail = Buffer.concat([s.tail, piece]).subarray(-EDGE_BYTES);
      return;
    }
    if (this.size + piece.length <= this.maxBytes) {
      this.chunks.push(piece);
      this.size += piece.length;
      return;
    }
    const kept = Buffer.concat([...this.chunks, piece]);
    this.skipping = {
      head: kept.subarray(0, EDGE_BYTES).toString("utf8"),
      tail: Buffer.from(kept.subarray(-EDGE_BYTES)),
      bytes: kept.length,
    };
    this.chunks = [];
    this.size = 0;
  }

  private endLine(): void {
    if (this.skipping) {
      const { head, tail, bytes } = this.skipping;
      this.skipping = undefined;
      const reply = oversizeReply(head, tail.toString("utf8").replace(/\r$/, ""), bytes);
      this.onerror?.(new Error(`refused a message of ${bytes} bytes (over ${this.maxBytes})`));
      if (reply) void this.send(reply);
      return;
    }
    const line = Buffer.concat(this.chunks).toString("utf8").replace(/\r$/, "");
    this.chunks = [];
    this.size = 0;
    if (line.trim() === "") return;
    const decoded = decodeMessage(line);
    if (decoded.ok) {
      try {
        this.onmessage?.(decoded.message);
      } catch (err) {
        this.onerror?.(err as Error);
      }
      return;
    }
    if (decoded.reply) void this.send(decoded.reply);
  }
}
