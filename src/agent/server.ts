/**
 * The agent's side of one connection: handshake, request dispatch to op handlers,
 * request streams, cancellation. Transport-agnostic (any Duplex), so tests run it
 * in-process and guest/main.ts runs it over a unix socket or stdio.
 *
 * Violation policy (see docs/protocol.md): a request that fails its schema but has a
 * readable id gets an error response for that id; anything else that breaks the
 * protocol gets a final `{type:"error"}` message and the connection is closed.
 */
import os from "node:os";
import type { Duplex } from "node:stream";
import { Readable } from "node:stream";
import { type CloseReason, FramedConnection } from "./connection.js";
import { AgentError, toAgentError } from "./errors.js";
import { ProtocolViolation } from "./frames.js";
import type { OpContext, OpHandler, OpHandlers } from "./guest/ops/context.js";
import type { Workspace } from "./guest/paths.js";
import {
  AGENT_VERSION,
  hostHello,
  hostMessage,
  isOpName,
  MAX_CONCURRENT_REQUESTS,
  OP_NAMES,
  OPS,
  PROTOCOL_VERSION,
  requestId,
  takesUpload,
} from "./messages.js";

/** How to serve a connection. */
export interface ServeOptions {
  workspace: Workspace;
  /** Op implementations (tests may substitute some). */
  handlers: OpHandlers;
  /** Scratch space outside the workspace; defaults to the OS temp dir. */
  tmpDir?: string;
  /** Debug log sink (stderr behind PYRO_AGENT_DEBUG in the guest). */
  log?: (line: string) => void;
  /** Set inside a microVM: the agent disk's mount point (enables the vm_* ops). */
  vmDir?: string;
  /** Run commands at nice 19 (see GuestOptions.idleCommands). */
  idleCommands?: boolean;
}

interface InFlight {
  controller: AbortController;
  upload: UploadStream | null;
  done: Promise<void>;
}

/**
 * The upload of one request: a byte Readable fed by data frames. When the consumer
 * falls behind it pauses the whole connection (see FramedConnection.pause).
 */
class UploadStream extends Readable {
  private pausedConn = false;
  finished = false;

  constructor(private readonly conn: FramedConnection) {
    super({ highWaterMark: 4 * 1024 * 1024 });
    // The op sees an abort through its own consumer (pipeline, iteration); an op that
    // already stopped reading must not turn it into an unhandled 'error' event.
    this.on("error", () => {});
  }

  feed(chunk: Buffer): void {
    if (this.finished || this.destroyed) return;
    if (!this.push(chunk) && !this.pausedConn) {
      this.pausedConn = true;
      this.conn.pause();
    }
  }

  override _read(): void {
    this.release();
  }

  /** Stops pausing the connection on this stream's behalf. */
  release(): void {
    if (this.pausedConn) {
      this.pausedConn = false;
      this.conn.resume();
    }
  }
}

function summarizeZod(error: { issues: { path: PropertyKey[]; message: string }[] }): string {
  return error.issues
    .slice(0, 5)
    .map((i) => (i.path.length ? `${i.path.map(String).join(".")}: ${i.message}` : i.message))
    .join("; ");
}

/**
 * Serves one connection until it closes. Resolves (never rejects) with the close
 * reason once every in-flight op has finished; ops are cancelled when it closes.
 */
export function serveConnection(stream: Duplex, options: ServeOptions): Promise<CloseReason> {
  return new Session(stream, options).closed;
}

/** One connection: the hello, then requests dispatched to handlers, cancels and uploads. */
class Session {
  readonly closed: Promise<CloseReason>;
  private readonly conn: FramedConnection;
  private readonly inflight = new Map<number, InFlight>();
  private readonly log: (line: string) => void;
  private readonly tmpDir: string;
  private greeted = false;

  constructor(
    stream: Duplex,
    private readonly options: ServeOptions,
  ) {
    this.log = options.log ?? (() => {});
    this.tmpDir = options.tmpDir ?? os.tmpdir();
    let resolveClosed!: (reason: CloseReason) => void;
    this.closed = new Promise<CloseReason>((r) => {
      resolveClosed = r;
    });
    const inflight = this.inflight;
    this.conn = new FramedConnection(
      stream,
      {
        message: (value) => this.onMessage(value),
        data: (channel, chunk) => inflight.get(channel)?.upload?.feed(chunk),
        end: (channel) => {
          const upload = inflight.get(channel)?.upload;
          if (upload && !upload.finished) {
            upload.finished = true;
            upload.push(null);
          }
        },
        abort: (channel, reason) => {
          inflight
            .get(channel)
            ?.upload?.destroy(
              new AgentError("cancelled", `the host aborted the upload: ${reason || "no reason given"}`),
            );
        },
        close: (reason) => {
          this.log(
            `connection closed: ${reason.kind}${"error" in reason ? ` (${reason.error.message})` : ""}`,
          );
          for (const op of inflight.values()) op.controller.abort();
          void Promise.allSettled([...inflight.values()].map((op) => op.done)).then(() =>
            resolveClosed(reason),
          );
        },
      },
      (error) => ({ type: "error", code: "protocol_violation", message: error.message }),
    );
  }

  private onMessage(value: unknown): void {
    if (!this.greeted) {
      this.greet(value);
      return;
    }
    const parsed = hostMessage.safeParse(value);
    if (!parsed.success) {
      // An id we can read gets an error response; otherwise the message is garbage.
      const raw = value as { type?: unknown; id?: unknown } | null;
      const id =
        raw && typeof raw === "object" && raw.type === "request" ? requestId.safeParse(raw.id) : null;
      if (id?.success && !this.inflight.has(id.data)) {
        this.respondError(
          id.data,
          new AgentError("invalid_argument", `malformed request: ${summarizeZod(parsed.error)}`),
        );
        return;
      }
      throw new ProtocolViolation(`malformed message: ${summarizeZod(parsed.error)}`);
    }
    const msg = parsed.data;
    if (msg.type === "hello") throw new ProtocolViolation("hello sent twice");
    if (msg.type === "cancel") {
      this.inflight.get(msg.id)?.controller.abort();
      return;
    }
    this.request(msg.id, msg.op, msg.args);
  }

  /** The first message must be the host's hello, in this agent's protocol version. */
  private greet(value: unknown): void {
    const hello = hostHello.safeParse(value);
    if (!hello.success) throw new ProtocolViolation("the first message must be a hello");
    if (hello.data.version !== PROTOCOL_VERSION) {
      this.conn.sendMessage({
        type: "error",
        code: "version_mismatch",
        message: `the host speaks protocol version ${hello.data.version}, this agent speaks ${PROTOCOL_VERSION}`,
        hint: "use a guest agent built from the same pyro-mcp release as the host",
      });
      this.conn.close({ kind: "local" }, true);
      return;
    }
    this.greeted = true;
    this.log(`hello from ${hello.data.client}`);
    this.conn.sendMessage({
      type: "hello",
      version: PROTOCOL_VERSION,
      agent_version: AGENT_VERSION,
      pid: process.pid,
      ops: OP_NAMES,
    });
  }

  /** A request: refused with an error response, or started. */
  private request(id: number, op: string, rawArgs: unknown): void {
    if (this.inflight.has(id)) throw new ProtocolViolation(`request id ${id} is already in flight`);
    if (!isOpName(op)) {
      this.respondError(
        id,
        new AgentError("invalid_argument", `unknown op '${op}'`, `known ops: ${OP_NAMES.join(", ")}`),
      );
      return;
    }
    if (this.inflight.size >= MAX_CONCURRENT_REQUESTS) {
      this.respondError(
        id,
        new AgentError("conflict", `more than ${MAX_CONCURRENT_REQUESTS} requests in flight`),
      );
      return;
    }
    const args = OPS[op].args.safeParse(rawArgs);
    if (!args.success) {
      this.respondError(
        id,
        new AgentError("invalid_argument", `invalid arguments for ${op}: ${summarizeZod(args.error)}`),
      );
      return;
    }
    this.start(id, op, args.data, takesUpload(op, args.data));
  }

  private respondError(id: number, err: AgentError): void {
    this.conn.sendMessage({ type: "response", id, ok: false, error: err.toJSON() });
  }

  private start(id: number, op: keyof OpHandlers, args: unknown, takesUpload: boolean): void {
    const controller = new AbortController();
    const upload = takesUpload ? new UploadStream(this.conn) : null;
    const entry: InFlight = { controller, upload, done: Promise.resolve() };
    this.inflight.set(id, entry);
    entry.done = this.run(id, op, args, entry);
  }

  /** Runs one op to its response (or error response); streams its data if it sends any. */
  private async run(id: number, op: keyof OpHandlers, args: unknown, entry: InFlight): Promise<void> {
    const { controller, upload } = entry;
    const conn = this.conn;
    let streamed = false;
    const ctx: OpContext = {
      workspace: this.options.workspace,
      signal: controller.signal,
      upload,
      tmpDir: this.tmpDir,
      vmDir: this.options.vmDir ?? null,
      idleCommands: this.options.idleCommands === true,
      send: async (chunk) => {
        streamed = true;
        if (controller.signal.aborted) throw new AgentError("cancelled", "the request was cancelled");
        await conn.sendData(id, chunk);
      },
    };
    const started = performance.now();
    const handler = this.options.handlers[op] as OpHandler<typeof op>;
    try {
      const result = OPS[op].result.safeParse(await handler(args as never, ctx));
      if (!result.success)
        throw new AgentError(
          "internal",
          `op ${op} produced an invalid result: ${summarizeZod(result.error)}`,
        );
      if (streamed) conn.sendEnd(id);
      try {
        conn.sendMessage({ type: "response", id, ok: true, result: result.data });
      } catch (err) {
        // Too large for one message: report it rather than leave the request hanging.
        this.respondError(
          id,
          new AgentError("internal", `the result of ${op} is too large: ${(err as Error).message}`),
        );
      }
      this.log(`#${id} ${op} ok in ${Math.round(performance.now() - started)} ms`);
    } catch (err) {
      let error = toAgentError(err, this.options.workspace.root);
      if (controller.signal.aborted && error.code !== "cancelled") {
        error = new AgentError("cancelled", `${op} was cancelled`, undefined, { cause: err });
      }
      if (streamed) conn.sendAbort(id, error.message);
      this.respondError(id, error);
      this.log(`#${id} ${op} failed: ${error.code}: ${error.message}`);
    } finally {
      this.inflight.delete(id);
      if (upload) {
        upload.release();
        upload.finished = true;
        upload.destroy();
      }
    }
  }
}
