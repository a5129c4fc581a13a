/**
 * Counts and bounds a tar archive as it streams past, from its headers alone: entries,
 * bytes of file data, each entry's name (length and depth), and the attributes of a
 * leading `./` entry. For archives GNU tar writes (`--format=gnu`: ustar headers, sizes
 * in octal or base-256, `L`/`K` records for long names); any other record type, or a
 * header it cannot read, makes it throw. Nothing is copied but the 512-byte headers and
 * long names.
 */

/** Types whose data is a regular file's contents (`0`, the old NUL form, contiguous `7`). */
const FILE_TYPES = new Set([0x30, 0x00, 0x37]);
/** Every type GNU tar's own format writes for what a filesystem holds. */
const KNOWN_TYPES = new Set([...FILE_TYPES, 0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x4c, 0x4b]);
const LONG_NAME = 0x4c;
const LONG_LINK = 0x4b;
const DIRECTORY = 0x35;
const FIFO = 0x36;

export interface TarBounds {
  /** The longest entry name, in bytes. */
  nameBytes: number;
  /** The most components an entry name may have. */
  depth: number;
  /** The most entries. */
  entries: number;
}

export class TarCounter {
  /** Entries seen (long-name records are part of the entry they name). */
  entries = 0;
  /** Bytes of regular files' data. */
  bytes = 0;
  /** FIFOs among the entries. */
  fifos = 0;
  /** Mode and mtime (seconds) of a first entry that is the archive's own directory (`./`). */
  root: { mode: number; mtime: number } | null = null;
  private readonly header = Buffer.alloc(512);
  private have = 0;
  /** Bytes of the current entry's data (with its padding) still to pass. */
  private skip = 0;
  /** A long name's data being collected, and how many of its bytes are still to come. */
  private longName: Buffer[] | null = null;
  private longLeft = 0;
  private nextName: string | null = null;

  constructor(private readonly bounds?: TarBounds) {}

  /** Takes the next bytes of the archive. */
  push(chunk: Buffer): void {
    let i = 0;
    while (i < chunk.length) {
      if (this.skip > 0) {
        const n = Math.min(this.skip, chunk.length - i);
        if (this.longName && this.longLeft > 0) {
          const take = Math.min(n, this.longLeft);
          this.longName.push(chunk.subarray(i, i + take));
          this.longLeft -= take;
        }
        this.skip -= n;
        i += n;
        if (this.skip === 0 && this.longName) {
          this.nextName = Buffer.concat(this.longName).toString("latin1").replace(/\0.*$/s, "");
          this.longName = null;
        }
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
    const size = numberField(h.subarray(124, 136), "size");
    const type = h[156]!;
    if (!KNOWN_TYPES.has(type))
      throw new Error(`a tar entry has type ${JSON.stringify(String.fromCharCode(type))}`);
    this.skip = Math.ceil(size / 512) * 512;
    if (type === LONG_NAME) {
      if (this.bounds && size > this.bounds.nameBytes + 1) throw new Error("a tar entry's name is too long");
      this.longName = [];
      this.longLeft = size;
      return;
    }
    if (type === LONG_LINK) return;
    const name = this.nextName ?? cString(h.subarray(0, 100));
    this.nextName = null;
    this.entries++;
    if (FILE_TYPES.has(type)) this.bytes += size;
    if (type === FIFO) this.fifos++;
    this.check(name);
    const normal = name.replace(/^(\.\/)+/, "").replace(/\/+$/, "");
    if (this.entries === 1 && type === DIRECTORY && (normal === "" || normal === "."))
      this.root = {
        mode: numberField(h.subarray(100, 108), "mode"),
        mtime: numberField(h.subarray(136, 148), "mtime"),
      };
  }

  private check(name: string): void {
    const b = this.bounds;
    if (!b) return;
    if (Buffer.byteLength(name, "latin1") > b.nameBytes) throw new Error("a tar entry's name is too long");
    if (name.split("/").filter((p) => p !== "" && p !== ".").length > b.depth)
      throw new Error("a tar entry is too deep");
    if (this.entries > b.entries) throw new Error("a tar archive has too many entries");
  }
}

/** A NUL-ended field as text. */
function cString(field: Buffer): string {
  const end = field.indexOf(0);
  return field.toString("latin1", 0, end < 0 ? field.length : end);
}

/** A numeric field: octal digits (NUL or space ended), or GNU's base-256 (high bit set). */
function numberField(field: Buffer, what: string): number {
  if ((field[0]! & 0x80) !== 0) {
    let n = field[0]! & 0x7f;
    for (let i = 1; i < field.length; i++) n = n * 256 + field[i]!;
    if (!Number.isSafeInteger(n)) throw new Error(`a tar header's ${what} is out of range`);
    return n;
  }
  const text = field
    .toString("latin1")
    .replace(/[\0 ]+$/, "")
    .replace(/^ +/, "");
  if (!/^[0-7]*$/.test(text)) throw new Error(`a tar header's ${what} is not octal`);
  return text === "" ? 0 : Number.parseInt(text, 8);
}
