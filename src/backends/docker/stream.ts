/**
 * Docker's attach/exec stream format and the agent channel built on it.
 *
 * Without a TTY the engine multiplexes a process's stdout and stderr onto one byte stream:
 * each frame is an 8-byte header (stream id: 0 stdin, 1 stdout, 2 stderr, 3 the engine's
 * own error text; three zero bytes; the payload length as a big-endian uint32) followed
 * by the payload. Input (our writes) is raw, unframed. Podman's compatible API speaks the
 * same format.
 */
import { Duplex } from "node:stream";

export type StreamId = 0 | 1 | 2 | 3;

export interface Frame {
  stream: StreamId;
  /** Payload bytes; a frame's payload may arrive in several pieces. */
  data: Buffer;
}

export class FramingError extends Error {
  override readonly name = "FramingError";
}

const HEADER = 8;

/**
 * Incremental demultiplexer: feed it chunks as they arrive, it returns payload pieces
 * tagged with their stream. Payloads are passed through as they come (never buffered up
 * to the frame size), so a huge frame costs no memory. Anything that is not a valid
 * header is a FramingError: the caller must close the stream (fail closed).
 */
export class StreamDemuxer {
  private readonly header = Buffer.alloc(HEADER);
  private headerFill = 0;
  private stream: StreamId = 1;
  private remaining = 0;

  /** Splits `chunk` into payload pieces. Throws FramingError on a malformed header. */
  push(chunk: Buffer): Frame[] {
    const out: Frame[] = [];
    let off = 0;
    while (off < chunk.length) {
      if (this.remaining > 0) {
        const n = Math.min(this.remaining, chunk.length - off);
        out.push({ stream: this.stream, data: chunk.subarray(off, off + n) });
        this.remaining -= n;
        off += n;
        continue;
      }
      const n = Math.min(HEADER - this.headerFill, chunk.length - off);
      chunk.copy(this.header, this.headerFill, off, off + n);
      this.headerFill += n;
      off += n;
      if (this.headerFill < HEADER) break;
      this.headerFill = 0;
      const id = this.header[0]!;
      if (id > 3 || this.header[1] !== 0 || this.header[2] !== 0 || this.header[3] !== 0) {
        throw new FramingError(`malformed stream frame header ${this.header.toString("hex")}`);
      }
      this.stream = id as StreamId;
      this.remaining = this.header.readUInt32BE(4);
    }
    return out;
  }

  /** True when the stream stopped in the middle of a header or a payload. */
  get midFrame(): boolean {
    return this.headerFill > 0 || this.remaining > 0;
  }
}

/** Builds one frame (tests, and anything that needs to speak the format). */
export function encodeFrame(stream: StreamId, payload: Buffer | string): Buffer {
  const data = typeof payload === "string" ? Buffer.from(payload) : payload;
  const header = Buffer.alloc(HEADER);
  header[0] = stream;
  header.writeUInt32BE(data.length, 4);
  return Buffer.concat([header, data]);
}

/** How much of a process's stderr a channel keeps for error messages. */
const STDERR_KEEP = 8 * 1024;

/**
 * A Duplex over a hijacked exec connection: writes go to the process's stdin (ending
 * the Duplex half-closes the connection, so the process sees EOF), reads are the
 * process's stdout only. Stderr (and the engine's stream 3) is never mixed into the
 * channel: its tail is kept for error messages. A framing error destroys the channel.
 */
export class ExecChannel extends Duplex {
  private readonly demux = new StreamDemuxer();
  private stderrTail = Buffer.alloc(0);
  private sawStdout = false;

  constructor(private readonly conn: Duplex) {
    super({ allowHalfOpen: true });
    conn.on("data", (chunk: Buffer) => this.onData(chunk));
    conn.on("end", () => {
      if (this.demux.midFrame) {
        this.destroy(new FramingError("the engine closed the stream in the middle of a frame"));
        return;
      }
      // A process that died before saying anything: its stderr is the only explanation.
      const stderr = this.stderrText().trim();
      if (!this.sawStdout && stderr) {
        this.destroy(
          new Error(`the process exited before answering: ${stderr.split("\n").slice(-5).join(" | ")}`),
        );
        return;
      }
      this.push(null);
    });
    conn.on("error", (err) => this.destroy(err));
    conn.on("close", () => {
      // A connection closed without an end (reset) still ends the channel.
      if (!this.readableEnded && !this.destroyed) this.push(null);
    });
  }

  /** The last few KiB the process wrote to stderr (for error messages). */
  stderrText(): string {
    return this.stderrTail.toString("utf8");
  }

  /** True once the process wrote anything to stdout. */
  get answered(): boolean {
    return this.sawStdout;
  }

  private onData(chunk: Buffer): void {
    let frames: Frame[];
    try {
      frames = this.demux.push(chunk);
    } catch (err) {
      this.destroy(err as Error);
      return;
    }
    for (const f of frames) {
      if (f.stream === 1) {
        this.sawStdout = true;
        if (!this.push(f.data)) this.conn.pause();
      } else if (f.stream === 2 || f.stream === 3) {
        const joined = Buffer.concat([this.stderrTail, f.data]);
        this.stderrTail = joined.length > STDERR_KEEP ? joined.subarray(joined.length - STDERR_KEEP) : joined;
      }
      // Stream 0 (stdin echo) never carries anything for us.
    }
  }

  override _read(): void {
    this.conn.resume();
  }

  override _write(chunk: Buffer, _enc: BufferEncoding, cb: (err?: Error | null) => void): void {
    this.conn.write(chunk, cb);
  }

  override _final(cb: (err?: Error | null) => void): void {
    this.conn.end();
    cb();
  }

  override _destroy(err: Error | null, cb: (err?: Error | null) => void): void {
    this.conn.destroy();
    cb(err);
  }
}
