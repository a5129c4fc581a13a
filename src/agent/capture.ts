/**
 * Head-and-tail capture of a command's output: the one implementation of pyro's output
 * cap, used by the guest agent's `exec` and by the host's one-shot runners (bwrap,
 * gVisor, docker). It lives under src/agent/ because the agent imports nothing from the
 * host side; host code importing it is the allowed direction.
 *
 * A stream of at most `cap` bytes is kept whole. Past the cap it keeps its first
 * `floor(cap / 2)` bytes and its last `cap - floor(cap / 2)` bytes (the tail is where test
 * runners print their summary), with one marker line between them that says how many
 * bytes were left out. The kept bytes never exceed `cap`; the marker line comes on top
 * (at most `MARKER_MAX_BYTES`). Cuts fall on UTF-8 character boundaries, so a multi-byte
 * character is left out whole rather than turned into U+FFFD; the omitted count covers
 * those bytes too, so head + omitted + tail is always the stream's full size.
 */

/**
 * Cap on `exec.max_output_bytes`: two streams this size must fit in one message. Here,
 * not beside the op schemas that check it: the host's output rules (core/output.ts)
 * need the number without loading zod.
 */
export const MAX_EXEC_OUTPUT_BYTES = 4 * 1024 * 1024;

/** Longest marker line (with its newlines) that `omittedMarker` can produce. */
export const MARKER_MAX_BYTES = 64;

/**
 * The line put between the head and the tail of a stream past its cap. It starts on a
 * line of its own (a newline is added when the head ends mid-line) and ends the line.
 */
export function omittedMarker(omittedBytes: number, headEndsLine: boolean): string {
  return `${headEndsLine ? "" : "\n"}[... ${omittedBytes} bytes omitted ...]\n`;
}

/** A stream as captured: its text (head, marker, tail when over the cap) and its size. */
export interface CapturedText {
  text: string;
  /** The stream's full size in bytes, whatever was kept. */
  bytes: number;
  /** True when bytes were left out (`bytes` > the cap). */
  truncated: boolean;
}

/**
 * Collects one stream with bounded memory: the first `floor(cap / 2)` bytes, and a
 * sliding window over the last `cap - floor(cap / 2)` bytes of the rest. Because both
 * parts are raw bytes, `render(smaller)` cuts the same stream exactly at any smaller cap.
 */
export class HeadTailCapture {
  private readonly headCap: number;
  private readonly tailCap: number;
  private readonly head: Buffer[] = [];
  private headSize = 0;
  private tail: Buffer[] = [];
  private tailSize = 0;
  /** Bytes seen so far. */
  bytes = 0;

  constructor(readonly cap: number) {
    if (!(Number.isSafeInteger(cap) && cap >= 0)) throw new RangeError(`bad output cap: ${cap}`);
    this.headCap = Math.floor(cap / 2);
    this.tailCap = cap - this.headCap;
  }

  /** True once more than `cap` bytes were seen. */
  get truncated(): boolean {
    return this.bytes > this.cap;
  }

  /** Takes a chunk. The caller must not reuse the chunk's memory afterwards. */
  push(chunk: Buffer): void {
    this.bytes += chunk.length;
    let rest = chunk;
    if (this.headSize < this.headCap) {
      const take = Math.min(this.headCap - this.headSize, rest.length);
      this.head.push(rest.subarray(0, take));
      this.headSize += take;
      rest = rest.subarray(take);
    }
    if (rest.length === 0 || this.tailCap === 0) return;
    if (rest.length >= this.tailCap) {
      this.tail = [rest.subarray(rest.length - this.tailCap)];
      this.tailSize = this.tailCap;
      return;
    }
    this.tail.push(rest);
    this.tailSize += rest.length;
    // Drop whole chunks that lie entirely before the window; the first kept chunk may
    // start before it (render() trims it).
    while (this.tail.length > 1 && this.tailSize - this.tail[0]!.length >= this.tailCap) {
      this.tailSize -= this.tail.shift()!.length;
    }
  }

  /**
   * The stream as text, cut at `cap` (default: the capture's own; a larger one is the
   * capture's own). Invalid UTF-8 in the kept bytes becomes U+FFFD (lossy by design).
   */
  render(cap = this.cap): CapturedText {
    const limit = Math.min(cap, this.cap);
    const head = Buffer.concat(this.head, this.headSize);
    let tail = Buffer.concat(this.tail, this.tailSize);
    if (tail.length > this.tailCap) tail = tail.subarray(tail.length - this.tailCap);
    if (this.bytes <= this.cap) {
      // Nothing was dropped: the head and the window are the whole stream, one piece.
      const whole = Buffer.concat([head, tail]);
      // Decoded as one, so a character split across the two parts stays whole.
      if (whole.length <= limit) return { text: whole.toString("utf8"), bytes: this.bytes, truncated: false };
      return { text: cut(whole, whole, limit, this.bytes), bytes: this.bytes, truncated: true };
    }
    return { text: cut(head, tail, limit, this.bytes), bytes: this.bytes, truncated: true };
  }
}

/** The first floor(cap / 2) bytes of `head` and the last cap - floor(cap / 2) of `tail`, joined. */
function cut(head: Buffer, tail: Buffer, cap: number, totalBytes: number): string {
  const headCap = Math.floor(cap / 2);
  const tailCap = cap - headCap;
  return joinHeadTail(
    head.subarray(0, Math.min(headCap, head.length)),
    tail.subarray(Math.max(0, tail.length - tailCap)),
    totalBytes,
  );
}

/**
 * Cuts text (already decoded, perhaps already cut once) to `cap` bytes of head and tail.
 * `totalBytes` is the size of the stream the text stands for (default: the text's own);
 * the marker says `totalBytes` minus what is kept. A text that was already cut (it stands
 * for more bytes than it holds) and is within `cap + MARKER_MAX_BYTES` is returned as it
 * is: cutting a captured text again at the cap it was captured with changes nothing, and
 * cutting it at a smaller cap keeps parts of its head and tail (its old marker falls in
 * the part left out).
 */
export function clipText(text: string, cap: number, totalBytes?: number): string {
  const buf = Buffer.from(text, "utf8");
  const total = totalBytes ?? buf.length;
  if (buf.length <= cap || (total > buf.length && buf.length <= cap + MARKER_MAX_BYTES)) return text;
  // A text that was lossily decoded may be longer than the stream it came from.
  return cut(buf, buf, cap, Math.max(total, buf.length));
}

/** Head + marker + tail, each part cut back to whole UTF-8 characters. */
function joinHeadTail(head: Buffer, tail: Buffer, totalBytes: number): string {
  const h = head.subarray(0, completePrefix(head));
  const t = tail.subarray(characterStart(tail));
  const omitted = totalBytes - h.length - t.length;
  const headEndsLine = h.length === 0 || h[h.length - 1] === 0x0a;
  return h.toString("utf8") + omittedMarker(omitted, headEndsLine) + t.toString("utf8");
}

/**
 * Length of `b` without a trailing incomplete UTF-8 sequence (a character the cut split).
 * Bytes that are invalid anyway are left for the decoder.
 */
export function completePrefix(b: Uint8Array): number {
  const end = b.length;
  let i = end - 1;
  // At most 3 continuation bytes (10xxxxxx) can belong to one character.
  while (i >= 0 && end - i <= 3 && ((b[i] ?? 0) & 0xc0) === 0x80) i--;
  if (i < 0) return end;
  const lead = b[i] ?? 0;
  const need = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
  return need > 1 && end - i < need ? i : end;
}

/** Offset of the first byte of `b` that is not a continuation byte (at most 3 skipped). */
export function characterStart(b: Uint8Array): number {
  let i = 0;
  while (i < b.length && i < 3 && ((b[i] ?? 0) & 0xc0) === 0x80) i++;
  return i;
}
