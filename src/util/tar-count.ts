/**
 * Counts a tar archive as it streams past, from its headers alone: the entries and the
 * bytes of file data. For archives GNU tar writes (`--format=gnu`: ustar headers, sizes
 * in octal or base-256, `L`/`K` records for long names); nothing else is parsed, and
 * nothing is copied but the 512-byte headers. A header it cannot read makes it throw.
 */

/** Types whose data is a regular file's contents (`0`, the old NUL form, contiguous `7`). */
const FILE_TYPES = new Set([0x30, 0x00, 0x37]);
/** GNU's records that carry the next entry's long name or link target: not entries. */
const NAME_RECORDS = new Set([0x4c, 0x4b]);

export class TarCounter {
  /** Entries seen (long-name records are part of the entry they name). */
  entries = 0;
  /** Bytes of regular files' data. */
  bytes = 0;
  private readonly header = Buffer.alloc(512);
  private have = 0;
  /** Bytes of the current entry's data (with its padding) still to pass. */
  private skip = 0;

  /** Takes the next bytes of the archive. */
  push(chunk: Buffer): void {
    let i = 0;
    while (i < chunk.length) {
      if (this.skip > 0) {
        const n = Math.min(this.skip, chunk.length - i);
        this.skip -= n;
        i += n;
        continue;
      }
      const n = Math.min(512 - this.have, chunk.length - i);
      chunk.copy(this.header, this.have, i, i + n);
      this.have += n;
      i += n;
      if (this.have === 512) {
        this.have = 0;
        this.onHeader();
      }
    }
  }

  private onHeader(): void {
    const h = this.header;
    if (h.every((b) => b === 0)) return; // the end-of-archive blocks
    const size = headerSize(h.subarray(124, 136));
    const type = h[156]!;
    if (FILE_TYPES.has(type)) this.bytes += size;
    if (!NAME_RECORDS.has(type)) this.entries++;
    this.skip = Math.ceil(size / 512) * 512;
  }
}

/** The size field: octal digits (NUL or space ended), or GNU's base-256 (high bit set). */
function headerSize(field: Buffer): number {
  if ((field[0]! & 0x80) !== 0) {
    let n = field[0]! & 0x7f;
    for (let i = 1; i < field.length; i++) n = n * 256 + field[i]!;
    if (!Number.isSafeInteger(n)) throw new Error("a tar header's size is out of range");
    return n;
  }
  const text = field
    .toString("latin1")
    .replace(/[\0 ]+$/, "")
    .replace(/^ +/, "");
  if (!/^[0-7]*$/.test(text)) throw new Error("a tar header's size is not octal");
  return text === "" ? 0 : Number.parseInt(text, 8);
}
