/**
 * A framed, message-oriented connection over any byte-stream Duplex (unix socket,
 * container stdio, virtio-serial, vsock). Shared by the host-side client and the
 * agent's server: it owns the frame decoder, JSON message (re)assembly, write
 * backpressure and the "close once, say why" rule. It knows nothing about sessions.
 */
import type { Duplex } from "node:stream";
import {
  encodeFrame,
  type Frame,
  FrameDecoder,
  FrameKind,
  MAX_FRAME_PAYLOAD,
  ProtocolViolation,
} from "./frames.js";
import { MAX_MESSAGE_BYTES } from "./messages.js";
import { drained } from "./pipe.js";

/** Why a connection closed. */
export type CloseReason =
  /** The peer ended the stream; `midFrame` when it stopped inside a frame. */
  | { kind: "eof"; midFrame: boolean }
  /** The peer broke the protocol; we closed. */
  | { kind: "violation"; error: ProtocolViolation }
  /** The transport failed (reset, EPIPE...). */
  | { kind: "transport"; error: Error }
  /** We closed it ourselves. */
  | { kind: "local" };

/** Callbacks for what arrives. Called synchronously from the stream's data events. */
export interface ConnectionHandlers {
  /** A complete JSON message (parsed, not yet schema-validated). */
  message(value: unknown): void;
  data(channel: number, chunk: Buffer): void;
  end(channel: number): void;
  abort(channel: number, reason: string): void;
  /** Called exactly once. */
  close(reason: CloseReason): void;
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

/** See the module comment. One instance per transport stream. */
export class FramedConnection {
  private readonly decoder = new FrameDecoder();
  private fragments: Buffer[] | null = null;
  private fragmentBytes = 0;
  private pauses = 0;
  private closedReason: CloseReason | null = null;

  /**
   * @param farewell builds a last message sent to the peer before closing on a
   *   protocol violation (the agent uses it to say why it hangs up).
   */
  constructor(
    private readonly stream: Duplex,
    private readonly handlers: ConnectionHandlers,
    private readonly farewell?: (error: ProtocolViolation) => unknown,
  ) {
    stream.on("data", (chunk: Buffer) => this.onBytes(chunk));
    stream.on("end", () => this.onEof());
    stream.on("error", (error: Error) => this.finish({ kind: "transport", error }));
    stream.on("close", () => this.onEof());
  }

  /** True once the connection is closed for any reason; nothing more is sent or delivered. */
  get closed(): boolean {
    return this.closedReason !== null;
  }

  /**
   * Sends one JSON message, fragmenting it over channel 0 when it is larger than a
   * frame. All fragments are written synchronously, so no other frame can be
   * interleaved between them. Throws if the message exceeds MAX_MESSAGE_BYTES.
   */
  sendMessage(value: unknown): void {
    const bytes = Buffer.from(JSON.stringify(value), "utf8");
    if (bytes.length > MAX_MESSAGE_BYTES) {
      throw new RangeError(`message of ${bytes.length} bytes exceeds ${MAX_MESSAGE_BYTES}`);
    }
    if (this.closed) return;
    if (bytes.length <= MAX_FRAME_PAYLOAD) {
      this.stream.write(encodeFrame(FrameKind.Message, 0, bytes));
      return;
    }
    for (let at = 0; at < bytes.length; at += MAX_FRAME_PAYLOAD) {
      this.stream.write(encodeFrame(FrameKind.Data, 0, bytes.subarray(at, at + MAX_FRAME_PAYLOAD)));
    }
    this.stream.write(encodeFrame(FrameKind.End, 0));
  }

  /**
   * Sends stream bytes on `channel` (split into frames), resolving once the transport
   * can take more, so a producer that awaits it cannot outrun a slow peer.
   */
  async sendData(channel: number, chunk: Uint8Array): Promise<void> {
    for (let at = 0; at < chunk.length; at += MAX_FRAME_PAYLOAD) {
      if (this.closed) throw new Error("connection closed");
      const ok = this.stream.write(
        encodeFrame(FrameKind.Data, channel, chunk.subarray(at, at + MAX_FRAME_PAYLOAD)),
      );
      if (!ok) await this.drained();
    }
  }

  /** Ends the stream on `channel`. */
  sendEnd(channel: number): void {
    if (!this.closed) this.stream.write(encodeFrame(FrameKind.End, channel));
  }

  /** Aborts the stream on `channel` with a short reason. */
  sendAbort(channel: number, reason: string): void {
    if (!this.closed)
      this.stream.write(encodeFrame(FrameKind.Abort, channel, Buffer.from(reason.slice(0, 1024))));
  }

  /**
   * Stops reading from the transport until a matching resume(). Used when an upload
   * consumer falls behind: the whole connection waits, which is the only flow control
   * a single byte stream without credits can offer.
   */
  pause(): void {
    if (this.pauses++ === 0) this.stream.pause();
  }

  resume(): void {
    if (this.pauses > 0 && --this.pauses === 0 && !this.closed) this.stream.resume();
  }

  /**
   * Closes the connection. `graceful` lets queued writes (e.g. a final error message)
   * reach the peer before the transport is destroyed.
   */
  close(reason: CloseReason = { kind: "local" }, graceful = false): void {
    if (this.closed) return;
    this.finish(reason);
    if (graceful) {
      this.stream.end();
      const timer = setTimeout(() => this.stream.destroy(), 1000);
      timer.unref();
      this.stream.once("close", () => clearTimeout(timer));
    } else {
      this.stream.destroy();
    }
  }

  private async drained(): Promise<void> {
    await drained(this.stream);
    if (this.closed) throw new Error("connection closed");
  }

  private finish(reason: CloseReason): void {
    if (this.closedReason) return;
    this.closedReason = reason;
    this.fragments = null;
    this.handlers.close(reason);
  }

  private onEof(): void {
    if (this.closed) return;
    const midFrame = this.decoder.pendingBytes > 0 || this.fragments !== null;
    this.close({ kind: "eof", midFrame });
  }

  private onBytes(chunk: Buffer): void {
    if (this.closed) return;
    let frames: Frame[];
    try {
      frames = this.decoder.push(chunk);
    } catch (err) {
      this.violation(err);
      return;
    }
    for (const frame of frames) {
      // A handler may close the connection (e.g. on a bad message); stop delivering then.
      if (this.closed) return;
      try {
        this.dispatch(frame);
      } catch (err) {
        this.violation(err);
        return;
      }
    }
  }

  private violation(err: unknown): void {
    const error = err instanceof ProtocolViolation ? err : new ProtocolViolation(String(err));
    if (this.farewell && !this.closed) {
      try {
        this.sendMessage(this.farewell(error));
      } catch {
        // The farewell is a courtesy; closing is what matters.
      }
    }
    this.close({ kind: "violation", error }, this.farewell !== undefined);
  }

  private dispatch(frame: Frame): void {
    const { kind, channel, payload } = frame;
    if (channel === 0) {
      if (kind === FrameKind.Message) {
        if (this.fragments) throw new ProtocolViolation("message frame inside a fragmented message");
        this.handlers.message(parseJson(payload));
      } else if (kind === FrameKind.Data) {
        this.fragments ??= [];
        this.fragmentBytes += payload.length;
        if (this.fragmentBytes > MAX_MESSAGE_BYTES) {
          throw new ProtocolViolation(`fragmented message exceeds ${MAX_MESSAGE_BYTES} bytes`);
        }
        this.fragments.push(payload);
      } else if (kind === FrameKind.End) {
        if (!this.fragments) throw new ProtocolViolation("end of message without fragments");
        const whole = Buffer.concat(this.fragments, this.fragmentBytes);
        this.fragments = null;
        this.fragmentBytes = 0;
        this.handlers.message(parseJson(whole));
      }
      return;
    }
    if (kind === FrameKind.Data) this.handlers.data(channel, payload);
    else if (kind === FrameKind.End) this.handlers.end(channel);
    else if (kind === FrameKind.Abort) this.handlers.abort(channel, payload.toString("utf8"));
    else throw new ProtocolViolation(`frame kind ${kind} on channel ${channel}`);
  }
}

function parseJson(bytes: Buffer): unknown {
  try {
    return JSON.parse(utf8.decode(bytes));
  } catch {
    throw new ProtocolViolation("message is not valid UTF-8 JSON");
  }
}
