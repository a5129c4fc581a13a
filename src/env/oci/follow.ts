/**
 * Reads a layer while it downloads, so unpacking overlaps the transfer instead of
 * waiting for it (skopeo and containerd pipeline the same way). The reader follows the
 * download's `.partial` file (or the stored blob once it is renamed) from byte 0 to the
 * layer's size, and hashes every byte it hands on: what was unpacked is exactly the
 * bytes whose sha256 is checked against the layer's digest, whatever the download did
 * meanwhile (resumed, restarted). A mismatch fails the pull; the build directory the
 * bytes went into is discarded by the cache, never committed.
 */
import { createHash } from "node:crypto";
import { type FileHandle, open } from "node:fs/promises";
import { Readable } from "node:stream";
import { PyroError } from "../../errors.js";

const CHUNK = 1 << 20;
/** How long to wait for more bytes when the reader has caught up with the download. */
const POLL_MS = 5;

export class LayerFollower {
  private fh: FileHandle | null = null;
  private pos = 0;
  private readonly hash = createHash("sha256");
  private settled = false;
  private failure: unknown = null;
  private verified = false;
  private got: string | null = null;
  /** Reads happen one at a time, in order: the unpacker's stream and finish() share `pos`. */
  private queue: Promise<unknown> = Promise.resolve();
  /** Set by finish(): the stream handed out asks for nothing more. */
  private finishing = false;

  constructor(
    private readonly partial: string,
    private readonly blob: string,
    private readonly digest: string,
    private readonly size: number,
    download: Promise<void>,
  ) {
    download.then(
      () => {
        this.settled = true;
      },
      (err: unknown) => {
        this.settled = true;
        this.failure = err;
      },
    );
  }

  /** The layer's bytes as a stream; the first ones (at least `head`, for magic bytes) are returned apart too. */
  async stream(head: number): Promise<{ head: Buffer; stream: Readable }> {
    const first: Buffer[] = [];
    let got = 0;
    while (got < Math.min(head, this.size)) {
      const b = await this.next();
      if (!b) break;
      first.push(b);
      got += b.length;
    }
    const start = Buffer.concat(first);
    const self = this;
    async function* chunks() {
      if (start.length > 0) yield start;
      while (!self.finishing) {
        const b = await self.next();
        if (!b) return;
        yield b;
      }
    }
    return { head: start, stream: Readable.from(chunks(), { objectMode: false }) };
  }

  /**
   * Reads what the unpacker left (bytes after the archive's end) and checks the digest
   * of everything read. Called after the layer is applied, before it counts.
   */
  async finish(): Promise<void> {
    // The unpacker may stop reading before the end (gunzip ends with its member while
    // bytes follow) with its stream still pulling: stop that stream, then read the rest
    // in turn after whatever it asked for.
    this.finishing = true;
    while (!this.verified && (await this.next())) {}
    await this.close();
  }

  async close(): Promise<void> {
    const fh = this.fh;
    this.fh = null;
    await fh?.close().catch(() => {});
  }

  /** The next chunk, waiting for the download when the reader has caught up; null at the end (verified). */
  private next(): Promise<Buffer | null> {
    const read = this.queue.then(() => this.readNext());
    this.queue = read.catch(() => {});
    return read;
  }

  private async readNext(): Promise<Buffer | null> {
    if (this.pos >= this.size) {
      this.verify();
      return null;
    }
    const fh = this.fh ?? (await this.openFile());
    for (;;) {
      const wasSettled = this.settled;
      const want = Math.min(CHUNK, this.size - this.pos);
      const buf = Buffer.allocUnsafe(want);
      const { bytesRead } = await fh.read(buf, 0, want, this.pos);
      if (bytesRead > 0) {
        const b = buf.subarray(0, bytesRead);
        this.hash.update(b);
        this.pos += bytesRead;
        return b;
      }
      if (this.failure) throw this.failure;
      if (wasSettled) throw mismatch(this.digest, `the download ended at ${this.pos} of ${this.size} bytes`);
      await sleep(POLL_MS);
    }
  }

  /** The partial file (still downloading) or the blob (already renamed); waits until either exists. */
  private async openFile(): Promise<FileHandle> {
    for (;;) {
      for (const p of [this.partial, this.blob]) {
        try {
          this.fh = await open(p, "r");
          return this.fh;
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
        }
      }
      if (this.failure) throw this.failure;
      // Downloaded, yet neither file is there (swept meanwhile): nothing more will come.
      if (this.settled) throw mismatch(this.digest, "the downloaded blob disappeared");
      await sleep(POLL_MS);
    }
  }

  private verify(): void {
    this.got ??= `sha256:${this.hash.digest("hex")}`;
    if (this.got !== this.digest) throw mismatch(this.digest, `got ${this.got}`);
    this.verified = true;
  }
}

function mismatch(digest: string, detail: string): PyroError {
  return new PyroError(
    "build_failed",
    `layer ${digest} failed verification while unpacking: ${detail}`,
    "the registry served corrupt or tampered content; nothing was kept",
  );
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
