/**
 * The host side of the guest agent protocol: one AgentClient per byte stream to an
 * agent. Every call has a timeout and an AbortSignal. The client fails closed: EOF, a
 * transport error, or anything from the agent that breaks the protocol (bad frame,
 * bad JSON, a message or result that fails its schema) fails every pending request
 * and closes the stream; nothing is retried here (core decides whether to reconnect).
 */
import type { Duplex, Readable } from "node:stream";
import { type CloseReason, FramedConnection } from "./connection.js";
import { AgentError } from "./errors.js";
import { ProtocolViolation } from "./frames.js";
import {
  type AgentHello,
  agentMessage,
  OPS,
  type OpArgs,
  type OpName,
  type OpResult,
  PROTOCOL_VERSION,
  sendsData,
  takesUpload,
} from "./messages.js";
import { EXEC_SLACK_MS } from "./slack.js";

export { AgentError } from "./errors.js";
export type { OpArgs, OpName, OpResult } from "./messages.js";

/** Options of {@link AgentClient.connect}. */
export interface ConnectOptions {
  /** Handshake deadline (default 10 s). */
  timeoutMs?: number;
  /** Aborts the handshake. */
  signal?: AbortSignal;
  /** Default deadline of requests that do not set one (default 60 s; exec adds its own timeout). */
  requestTimeoutMs?: number;
  /** Identifies the host in the hello (default "pyro-mcp"). */
  client?: string;
}

/** Options of {@link AgentClient.request}. */
export interface RequestOptions {
  /** Deadline for the response; on expiry the request is cancelled on the agent too. */
  timeoutMs?: number;
  /** Cancels the request (locally at once, and on the agent). */
  signal?: AbortSignal;
  /** Bytes to stream to the op (required by tar_in). */
  upload?: AsyncIterable<Uint8Array> | Readable;
  /**
   * Receives the op's download stream (tar_out, file_read with stream: true), in order.
   * Returning a promise says "slow down": the connection stops reading until it settles
   * (chunks already read still arrive, in order), so a slow consumer bounds the memory.
   */
  onData?: (chunk: Buffer) => unknown;
}

/** What the agent said about itself in the handshake. */
export type AgentInfo = Omit<AgentHello, "type">;

const DEFAULT_HANDSHAKE_MS = 10_000;
const DEFAULT_REQUEST_MS = 60_000;

export { EXEC_SLACK_MS, WAIT_SLACK_MS } from "./slack.js";

const MAX_ID = 0xffff_ffff;

interface Pending {
  op: OpName;
  resolve(result: unknown): void;
  reject(error: AgentError): void;
  onData?: (chunk: Buffer) => unknown;
  /** Releases of the connection pauses this request's slow onData promises took. */
  holds: Set<() => void>;
}

function closeError(reason: CloseReason): AgentError {
  switch (reason.kind) {
    case "eof":
      return new AgentError(
        "agent_disconnected",
        reason.midFrame
          ? "the agent closed the connection in the middle of a message"
          : "the agent closed the connection",
      );
    case "violation":
      return new AgentError(
        "protocol_violation",
        `the agent broke the protocol: ${reason.error.message}`,
        undefined,
        {
          cause: reason.error,
        },
      );
    case "transport":
      return new AgentError(
        "agent_disconnected",
        `the channel to the agent failed: ${reason.error.message}`,
        undefined,
        {
          cause: reason.error,
        },
      );
    case "local":
      return new AgentError("agent_disconnected", "the connection to the agent was closed");
  }
}

/** A connected, handshaken agent. Create with {@link AgentClient.connect}. */
export class AgentClient {
  private readonly conn: FramedConnection;
  private readonly pending = new Map<number, Pending>();
  private readonly closeListeners: ((error: AgentError) => void)[] = [];
  private lastId = 0;
  private failure: AgentError | null = null;
  /** Set before a deliberate close so pending requests get the specific reason. */
  private pendingCloseError: AgentError | null = null;
  private handshake: { resolve(hello: AgentInfo): void; reject(error: AgentError): void } | null = null;
  private info: AgentInfo | null = null;

  private constructor(
    stream: Duplex,
    private readonly requestTimeoutMs: number,
  ) {
    this.conn = new FramedConnection(stream, {
      message: (value) => this.onMessage(value),
      data: (channel, chunk) => this.onData(channel, chunk),
      end: () => {},
      // An aborted download is followed by the op's error response, which carries the reason.
      abort: () => {},
      close: (reason) => this.handleClose(reason),
    });
  }

  /**
   * Performs the handshake on `stream` and returns a ready client. Rejects with
   * `version_mismatch`, `timeout`, `cancelled`, `agent_disconnected` or
   * `protocol_violation`; the stream is destroyed on any failure.
   */
  static async connect(stream: Duplex, options: ConnectOptions = {}): Promise<AgentClient> {
    const client = new AgentClient(stream, options.requestTimeoutMs ?? DEFAULT_REQUEST_MS);
    const timeoutMs = options.timeoutMs ?? DEFAULT_HANDSHAKE_MS;
    const hello = new Promise<AgentInfo>((resolve, reject) => {
      client.handshake = { resolve, reject };
    });
    const guard = client.guard(hello, timeoutMs, options.signal, "the agent handshake");
    client.conn.sendMessage({
      type: "hello",
      version: PROTOCOL_VERSION,
      client: options.client ?? "pyro-mcp",
    });
    try {
      client.info = await guard;
      return client;
    } catch (err) {
      client.shutdown(err as AgentError);
      throw err;
    }
  }

  /** The agent's hello: protocol version, agent version, pid and ops. */
  get agent(): AgentInfo {
    return this.info!;
  }

  /** True once the connection is closed; every later request fails with the reason it closed. */
  get closed(): boolean {
    return this.conn.closed;
  }

  /** Calls `listener` once when the connection closes, with the reason. */
  onClose(listener: (error: AgentError) => void): void {
    if (this.failure) listener(this.failure);
    else this.closeListeners.push(listener);
  }

  /**
   * Runs one op on the agent and returns its validated result. Errors returned by the
   * agent keep their code (e.g. `path_outside_workspace`); channel failures use
   * `timeout`, `cancelled`, `agent_disconnected`, `protocol_violation`; bad arguments
   * are refused locally with `invalid_argument`. Requests may run concurrently.
   */
  async request<O extends OpName>(
    op: O,
    args: OpArgs<O>,
    options: RequestOptions = {},
  ): Promise<OpResult<O>> {
    if (this.failure || this.conn.closed)
      throw this.failure ?? new AgentError("agent_disconnected", "the connection to the agent is closed");
    const spec = OPS[op];
    if (!spec) throw new AgentError("invalid_argument", `unknown op '${String(op)}'`);
    const parsed = spec.args.safeParse(args);
    if (!parsed.success) {
      throw new AgentError(
        "invalid_argument",
        `invalid arguments for ${op}: ${parsed.error.issues.map((i) => i.message).join("; ")}`,
      );
    }
    const uploads = takesUpload(op, parsed.data);
    if (uploads && !options.upload) throw new AgentError("invalid_argument", `${op} needs an upload stream`);
    if (!uploads && options.upload) throw new AgentError("invalid_argument", `${op} does not take an upload`);
    const streams = sendsData(op, parsed.data);
    if (streams && !options.onData)
      throw new AgentError("invalid_argument", `${op} streams its data; pass onData`);
    if (this.lastId >= MAX_ID) throw new AgentError("agent_disconnected", "request ids exhausted; reconnect");

    const id = ++this.lastId;
    const timeoutMs =
      options.timeoutMs ??
      (op === "exec"
        ? Math.max(this.requestTimeoutMs, (parsed.data as { timeout_ms: number }).timeout_ms + EXEC_SLACK_MS)
        : this.requestTimeoutMs);
    const response = new Promise<unknown>((resolve, reject) => {
      const entry: Pending = { op, resolve, reject, holds: new Set() };
      if (options.onData) entry.onData = options.onData;
      this.pending.set(id, entry);
    });
    try {
      this.conn.sendMessage({ type: "request", id, op, args: parsed.data });
    } catch (err) {
      this.forget(id);
      throw new AgentError(
        "invalid_argument",
        `the ${op} request is too large to send: ${(err as Error).message}`,
      );
    }
    if (options.upload) void this.pump(id, options.upload);
    try {
      return (await this.guard(response, timeoutMs, options.signal, `${op} (request ${id})`)) as OpResult<O>;
    } catch (err) {
      // Our side gave up (timeout, abort): tell the agent so it stops working on it.
      if (this.forget(id) && !this.conn.closed) this.conn.sendMessage({ type: "cancel", id });
      throw err;
    }
  }

  /** Closes the connection; pending requests fail with `agent_disconnected`. */
  close(): void {
    this.shutdown(new AgentError("agent_disconnected", "the client closed the connection to the agent"));
  }

  private shutdown(error: AgentError): void {
    if (this.conn.closed) return;
    this.pendingCloseError = error;
    this.conn.close();
  }

  /** Races `promise` against a deadline and a signal, converting both to AgentErrors. */
  private guard<T>(
    promise: Promise<T>,
    timeoutMs: number,
    signal: AbortSignal | undefined,
    what: string,
  ): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        cleanup();
        reject(
          new AgentError(
            "timeout",
            `${what} did not complete within ${timeoutMs} ms`,
            "the agent may be hung; the workspace can be restarted",
          ),
        );
      }, timeoutMs);
      const onAbort = () => {
        cleanup();
        reject(new AgentError("cancelled", `${what} was cancelled`, undefined, { cause: signal?.reason }));
      };
      const cleanup = () => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
      };
      if (signal?.aborted) return onAbort();
      signal?.addEventListener("abort", onAbort, { once: true });
      promise.then(
        (value) => {
          cleanup();
          resolve(value);
        },
        (err: unknown) => {
          cleanup();
          reject(err);
        },
      );
    });
  }

  private async pump(id: number, upload: AsyncIterable<Uint8Array> | Readable): Promise<void> {
    try {
      for await (const chunk of upload as AsyncIterable<Uint8Array | string>) {
        if (!this.pending.has(id) || this.conn.closed) return;
        await this.conn.sendData(id, typeof chunk === "string" ? Buffer.from(chunk) : chunk);
      }
      if (this.pending.has(id)) this.conn.sendEnd(id);
    } catch (err) {
      // The agent answers an aborted upload with an error response for the request.
      if (this.pending.has(id)) this.conn.sendAbort(id, `upload failed: ${(err as Error).message}`);
    }
  }

  private onData(channel: number, chunk: Buffer): void {
    const entry = this.pending.get(channel);
    // Frames for a request we gave up on can still be in flight; drop them.
    if (!entry?.onData) return;
    const fail = (err: unknown) => {
      if (this.pending.get(channel) !== entry) return;
      this.forget(channel);
      this.conn.sendMessage({ type: "cancel", id: channel });
      entry.reject(
        new AgentError("cancelled", `the onData callback failed: ${(err as Error).message}`, undefined, {
          cause: err,
        }),
      );
    };
    try {
      const slow: unknown = entry.onData(chunk);
      if (slow instanceof Promise) {
        // Paused until the consumer catches up or the request is over (forget).
        this.conn.pause();
        const release = () => entry.holds.delete(release) && this.conn.resume();
        entry.holds.add(release);
        slow.then(release, (err: unknown) => {
          release();
          fail(err);
        });
      }
    } catch (err) {
      fail(err);
    }
  }

  private onMessage(value: unknown): void {
    const parsed = agentMessage.safeParse(value);
    if (!parsed.success)
      throw new ProtocolViolation(
        `unexpected message from the agent: ${parsed.error.issues[0]?.message ?? "invalid"}`,
      );
    const msg = parsed.data;
    if (msg.type === "error") {
      // The agent hangs up after this; report its reason rather than a bare EOF.
      this.shutdown(new AgentError(msg.code, msg.message, msg.hint));
      return;
    }
    if (msg.type === "hello") {
      if (!this.handshake || this.info) throw new ProtocolViolation("unexpected hello");
      const { type: _type, ...info } = msg;
      if (info.version !== PROTOCOL_VERSION) {
        this.shutdown(
          new AgentError(
            "version_mismatch",
            `the agent speaks protocol version ${info.version}, the host speaks ${PROTOCOL_VERSION}`,
            "update the guest agent",
          ),
        );
        return;
      }
      this.handshake.resolve(info);
      this.handshake = null;
      return;
    }
    if (!this.info) throw new ProtocolViolation("response before the handshake completed");
    if (msg.id > this.lastId)
      throw new ProtocolViolation(`response to request ${msg.id}, which was never sent`);
    const entry = this.pending.get(msg.id);
    // A response to a request we timed out or cancelled: expected, ignored.
    if (!entry) return;
    if (!msg.ok) {
      this.forget(msg.id);
      entry.reject(new AgentError(msg.error.code, msg.error.message, msg.error.hint));
      return;
    }
    const result = OPS[entry.op].result.safeParse(msg.result);
    // Still pending here, so the violation's close fails this request too.
    if (!result.success) {
      throw new ProtocolViolation(
        `invalid ${entry.op} result: ${result.error.issues[0]?.message ?? "invalid"}`,
      );
    }
    this.forget(msg.id);
    entry.resolve(result.data);
  }

  /** Removes a request from the pending ones and releases the pauses its onData holds. */
  private forget(id: number): boolean {
    const entry = this.pending.get(id);
    for (const release of [...(entry?.holds ?? [])]) release();
    return this.pending.delete(id);
  }

  private handleClose(reason: CloseReason): void {
    const error = this.pendingCloseError ?? closeError(reason);
    // A violation is more specific than our own decision to close.
    this.failure = reason.kind === "violation" ? closeError(reason) : error;
    this.handshake?.reject(this.failure);
    this.handshake = null;
    for (const entry of this.pending.values()) entry.reject(this.failure);
    this.pending.clear();
    for (const listener of this.closeListeners.splice(0)) listener(this.failure);
  }
}
