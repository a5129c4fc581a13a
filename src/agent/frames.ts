/**
 * The frame codec of the guest agent protocol, independent of any transport.
 *
 * A frame on the wire is:
 *
 *   u32 BE length of the rest | u8 kind | u32 BE channel | payload
 *
 * so `length = 5 + payload.length`. The decoder never trusts the peer: a length that
 * is too small or too large, an unknown kind, or a kind/channel combination the
 * protocol does not allow is a {@link ProtocolViolation}, thrown before any payload is
 * buffered (an oversize length is rejected from its header alone).
 */

/** Largest payload of a single frame (1 MiB). Larger messages are fragmented. */
export const MAX_FRAME_PAYLOAD = 1024 * 1024;

/** Bytes before the payload: u32 length + u8 kind + u32 channel. */
export const FRAME_HEADER_BYTES = 9;

/** Frame kinds. */
export const FrameKind = {
  /** A complete JSON message (UTF-8); always on channel 0. */
  Message: 1,
  /** A chunk of the stream on `channel` (channel 0: a fragment of a large JSON message). */
  Data: 2,
  /** End of the stream on `channel` (channel 0: the fragmented message is complete). Empty payload. */
  End: 3,
  /** The stream on `channel` was aborted; payload is an optional UTF-8 reason. Never channel 0. */
  Abort: 4,
} as const;

export type FrameKind = (typeof FrameKind)[keyof typeof FrameKind];

/** One decoded frame. */
export interface Frame {
  kind: FrameKind;
  channel: number;
  payload: Buffer;
}

/** The peer broke the framing or message rules; the connection must be closed. */
export class ProtocolViolation extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ProtocolViolation";
  }
}

const MAX_U32 = 0xffff_ffff;

function isKind(value: number): value is FrameKind {
  return value >= FrameKind.Message && value <= FrameKind.Abort;
}

/**
 * The rules a single frame must follow regardless of session state. Shared by the
 * encoder (so we never send what we would reject) and the decoder.
 */
function checkFrame(kind: number, channel: number, payloadLength: number): void {
  if (payloadLength > MAX_FRAME_PAYLOAD) {
    throw new ProtocolViolation(`frame payload of ${payloadLength} bytes exceeds ${MAX_FRAME_PAYLOAD}`);
  }
  if (!isKind(kind)) throw new ProtocolViolation(`unknown frame kind ${kind}`);
  if (kind === FrameKind.Message && channel !== 0) {
    throw new ProtocolViolation(`message frame on channel ${channel} (must be 0)`);
  }
  if (kind === FrameKind.End && payloadLength !== 0) {
    throw new ProtocolViolation("end-of-stream frame with a non-empty payload");
  }
  if (kind === FrameKind.Abort && channel === 0) {
    throw new ProtocolViolation("abort frame on channel 0");
  }
}

/**
 * Encodes one frame. Throws a {@link ProtocolViolation} for a frame the protocol does
 * not allow (the caller is buggy), so a bad frame never reaches the wire.
 */
export function encodeFrame(kind: FrameKind, channel: number, payload: Uint8Array = Buffer.alloc(0)): Buffer {
  if (!Number.isInteger(channel) || channel < 0 || channel > MAX_U32) {
    throw new ProtocolViolation(`invalid channel ${channel}`);
  }
  checkFrame(kind, channel, payload.length);
  const frame = Buffer.allocUnsafe(FRAME_HEADER_BYTES + payload.length);
  frame.writeUInt32BE(5 + payload.length, 0);
  frame.writeUInt8(kind, 4);
  frame.writeUInt32BE(channel, 5);
  frame.set(payload, FRAME_HEADER_BYTES);
  return frame;
}

/**
 * Incremental decoder: feed it bytes as they arrive, split anywhere, and it returns
 * the frames completed so far. Once it has thrown it stays broken (every later call
 * throws again), because the byte stream can no longer be trusted.
 */
export class FrameDecoder {
  // Chunks are kept in a list and only concatenated per frame, so a large frame
  // arriving in many small chunks costs O(n), not O(n^2).
  private chunks: Buffer[] = [];
  private buffered = 0;
  private failure: ProtocolViolation | null = null;

  /** Bytes received that do not yet form a complete frame. */
  get pendingBytes(): number {
    return this.buffered;
  }

  /** Adds bytes and returns every frame they complete (possibly none). */
  push(chunk: Uint8Array): Frame[] {
    if (this.failure) throw this.failure;
    if (chunk.length > 0) {
      this.chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk));
      this.buffered += chunk.length;
    }
    const frames: Frame[] = [];
    try {
      for (;;) {
        const frame = this.next();
        if (!frame) break;
        frames.push(frame);
      }
    } catch (err) {
      this.failure = err instanceof ProtocolViolation ? err : new ProtocolViolation(String(err));
      this.chunks = [];
      this.buffered = 0;
      throw this.failure;
    }
    return frames;
  }

  /**
   * Declares the end of the byte stream. Throws if it ended inside a frame: a peer
   * that closes mid-frame has not sent what it meant to send.
   */
  end(): void {
    if (this.failure) throw this.failure;
    if (this.buffered > 0) {
      throw new ProtocolViolation(`stream ended inside a frame (${this.buffered} bytes pending)`);
    }
  }

  private next(): Frame | null {
    if (this.buffered < FRAME_HEADER_BYTES) return null;
    const header = this.peek(FRAME_HEADER_BYTES);
    const length = header.readUInt32BE(0);
    if (length < 5) throw new ProtocolViolation(`frame length ${length} is shorter than its header`);
    const kind = header.readUInt8(4);
    const channel = header.readUInt32BE(5);
    // Validate from the header alone: an oversize or unknown frame is refused before
    // we buffer up to 4 GiB waiting for its payload.
    checkFrame(kind, channel, length - 5);
    const total = 4 + length;
    if (this.buffered < total) return null;
    const bytes = this.take(total);
    return { kind: kind as FrameKind, channel, payload: bytes.subarray(FRAME_HEADER_BYTES) };
  }

  private peek(n: number): Buffer {
    const first = this.chunks[0]!;
    if (first.length >= n) return first.subarray(0, n);
    return Buffer.concat(this.chunks, this.buffered).subarray(0, n);
  }

  private take(n: number): Buffer {
    const parts: Buffer[] = [];
    let need = n;
    while (need > 0) {
      const head = this.chunks[0]!;
      if (head.length <= need) {
        parts.push(head);
        this.chunks.shift();
        need -= head.length;
      } else {
        parts.push(head.subarray(0, need));
        this.chunks[0] = head.subarray(need);
        need = 0;
      }
    }
    this.buffered -= n;
    // Copy so the frame does not pin a larger shared chunk in memory.
    return parts.length === 1 ? Buffer.from(parts[0]!) : Buffer.concat(parts, n);
  }
}
