/**
 * Extraction of archives that come out of a sandbox: exports and snapshots. Whatever a
 * sandbox sends is hostile (its code can replace or hijack the agent), so the rule for
 * every host-side write of sandbox data is here, in one place:
 *
 * - One parser both checks and writes. node-tar's parser reads each entry once; the same
 *   entry object is checked and then written (by tree-writer.ts). (Checking with one parser and extracting with
 *   another let a PAX `linkpath` before a GNU long-link header look harmless to the
 *   checker and become a symlink to /etc/shadow for the extractor.)
 * - Only regular files, directories and symlinks whose target stays inside the tree.
 *   No hard links, devices, FIFOs or sockets; no absolute or `..` names.
 * - Exports land owned by the invoking user with plain permission bits: setuid, setgid
 *   and sticky bits are dropped. Snapshots (kept only as a sandbox's lower layer, in a
 *   0700 directory) keep owners, modes and absolute symlinks, which mean something
 *   inside the sandbox only.
 * - Extraction happens into a fresh private directory, and the result is walked again
 *   with lstat before it is moved into place: any entry that is not what was accepted
 *   refuses the whole archive.
 */
import { chmodSync, lstatSync, readdirSync, readlinkSync, type Stats, unlinkSync } from "node:fs";
import path from "node:path";
import { Writable } from "node:stream";
import * as tar from "tar";
import { linkStaysInside } from "../agent/tarsafe.js";
import { PyroError } from "../errors.js";
import { compressionOf, MAGIC_BYTES } from "../util/compression.js";
import { TreeOps } from "./tree-ops.js";
import { SwitchingSteps, workerScript } from "./tree-worker.js";
import { TreeWriter } from "./tree-writer.js";

const posix = path.posix;
const FILE_TYPES = new Set(["File", "OldFile", "ContiguousFile"]);

export type UntrustedMode = "export" | "snapshot";

export interface Extracted {
  files: number;
  bytes: number;
  entries: number;
  /** Type of the single top-level entry (a file export has exactly one). */
  top: { name: string; type: "file" | "directory" | "symlink" }[];
}

/**
 * An archive with more file data than `maxBytes`: what /workspace could hold under its
 * disk limit. A sparse file counts its full size (tar has no holes here, and the host
 * would write the zeros): a file of 16 TiB that held no block under a 128 MiB limit
 * would otherwise fill the host's disk in a snapshot or an export.
 */
function tooLarge(label: string, maxBytes: number): PyroError {
  return new PyroError(
    "conflict",
    `refused to extract into '${label}': the archive holds more than ${maxBytes} bytes of file data, more than the workspace's disk limit lets /workspace hold`,
    "a sparse file counts its full size: delete or truncate large sparse files, or copy a smaller path",
  );
}

function refusal(label: string, problems: readonly string[]): PyroError {
  return new PyroError(
    "path_outside_workspace",
    `refused to extract into '${label}': the archive has ${problems.slice(0, 5).join("; ")}`,
    "archives may hold only files, directories and symlinks that stay inside",
  );
}

/**
 * Bounds on what one archive may make the host do (a hijacked agent chooses every byte):
 * a name no longer than PATH_MAX, at most 256 directory levels, at most 4 million entries
 * (as for image layers), and at most 256 Mi characters of names kept in memory. A
 * directory an entry implies without its own entry counts as an entry, and there may be
 * at most 1024 more of those than explicit entries: pyro's own archives name every
 * directory, and without the bound a few kilobytes of deep names made the host create
 * thousands of directories synchronously.
 */
export const UNTRUSTED_LIMITS = {
  nameBytes: 4096,
  depth: 256,
  entries: 4_000_000,
  nameChars: 256 * 1024 * 1024,
  impliedDirsOverEntries: 1024,
} as const;

/** The entry's name as it is written, or a reason to refuse it. */
function checkName(raw: string): { name: string } | { problem: string } {
  if (raw.includes("\0")) return { problem: "an entry name with a NUL byte" };
  if (Buffer.byteLength(raw) > UNTRUSTED_LIMITS.nameBytes)
    return { problem: `an entry name longer than ${UNTRUSTED_LIMITS.nameBytes} bytes` };
  if (posix.isAbsolute(raw) || /^[a-zA-Z]:/.test(raw)) return { problem: `absolute entry name '${raw}'` };
  const name = normalName(raw);
  const parts = name.split("/");
  if (parts.includes("..")) return { problem: `entry '${raw}' climbs out with '..'` };
  if (parts.length > UNTRUSTED_LIMITS.depth)
    return { problem: `entry '${raw.slice(0, 200)}…' is deeper than ${UNTRUSTED_LIMITS.depth} levels` };
  return { name };
}

/** Where the archive's bytes go: write (false: wait for `drain`), end. */
export type ArchiveInput = Pick<Writable, "write" | "end" | "once" | "off" | "on">;

/** A streaming extraction: write the archive's bytes to `input`; `done` settles with the result. */
export interface UntrustedUnpacker {
  input: ArchiveInput;
  /** Settles once `input` has ended and everything is written and verified (or refused). */
  done: Promise<Extracted>;
  /** Aborted at the first problem: the archive will be refused, the rest need not come. */
  refused: AbortSignal;
}

/**
 * Extracts an archive into `tree` (an empty directory only this process uses) under the
 * rules above, fed as the bytes arrive (an export is extracted while the agent is still
 * packing it, as `tar | tar` would). The rules do not depend on the archive being
 * complete first: the one parser checks each entry before it is written, into a private
 * directory the caller moves into place only after `done`; a refusal is
 * `path_outside_workspace`, and the caller discards `tree`.
 */
export function untrustedUnpacker(
  tree: string,
  mode: UntrustedMode,
  label: string,
  /** The most bytes of file data the archive may hold (tooLarge); default: no bound. */
  maxBytes = Number.POSITIVE_INFINITY,
): UntrustedUnpacker {
  // The first few problems are kept for the refusal; after the first, entries are only skipped.
  const problems: string[] = [];
  const refused = new AbortController();
  const report = (p: string) => {
    if (problems.length < 5) problems.push(p);
    refused.abort();
  };
  const seen = new Map<string, string>();
  let nameChars = 0;
  let oversize = false;
  const result: Extracted = { files: 0, bytes: 0, entries: 0, top: [] };
  // Exports land as files the invoking user made: its umask applies (snapshots keep modes).
  const umask = mode === "export" ? process.umask() : 0;
  const { writer, worker } = writerFor(tree, mode, report, () => result.entries);
  const parser = new tar.Parser({
    strict: false,
    onwarn: (code, message) => {
      report(`${message} (${code})`);
    },
  });
  // An entry of a type node-tar does not know is skipped by it, so never written; an
  // archive with one is still not what pyro's agents make: refused.
  parser.on("ignoredEntry", (entry: Entry) => report(`entry '${entry.path}' has an unknown type`));
  parser.on("entry", (entry: Entry) => {
    result.entries++;
    if (problems.length > 0) {
      entry.resume();
      return;
    }
    const raw = entry.path;
    nameChars += raw.length;
    // Checked at the entry's header, before any of its data is written.
    oversize ||= FILE_TYPES.has(entry.type) && result.bytes + (entry.size ?? 0) > maxBytes;
    const problem = oversize
      ? `more than ${maxBytes} bytes of file data`
      : result.entries + writer.implied > UNTRUSTED_LIMITS.entries
        ? `more than ${UNTRUSTED_LIMITS.entries} entries`
        : nameChars > UNTRUSTED_LIMITS.nameChars
          ? `more than ${UNTRUSTED_LIMITS.nameChars} characters of entry names`
          : checkEntry(raw, entry, mode, seen, umask);
    if (problem) report(problem);
    else if (FILE_TYPES.has(entry.type)) {
      result.files++;
      result.bytes += entry.size ?? 0;
    }
    // After the first problem nothing more is written: the archive is refused anyway.
    if (problems.length > 0) entry.resume();
    else writer.write(normalName(raw), entry);
  });
  const done = settled(
    parser,
    async () => {
      writer.finish();
      await worker?.done();
    },
    async () => worker?.stop(),
    () => checked(),
  );
  const checked = (): Extracted => {
    if (oversize) throw tooLarge(label, maxBytes);
    if (problems.length > 0) throw refusal(label, problems);
    verifyTree(tree, mode, label, result);
    return result;
  };
  // A caller that stops feeding (a failed export) must not leave an unhandled rejection.
  done.catch(() => {});
  return { input: feeding(parser, worker, report), done, refused: refused.signal };
}

/**
 * The parser's input. When the files are made on a worker, each write's steps go to it
 * once the parser has taken the bytes, and the write completes (the caller's
 * backpressure) only when the worker has room again; else when the parser has.
 */
function feeding(
  parser: tar.Parser,
  worker: SwitchingSteps | null,
  report: (problem: string) => void,
): Writable {
  // node-tar would inflate gzip and zstd by itself, a thousandfold per write: pyro's
  // agents send plain tar, so a compressed archive is refused before it is parsed. The
  // first MAGIC_BYTES are held until they are all in.
  let head: Buffer | null = Buffer.alloc(0);
  let compressed = false;
  const sniff = (chunk: Buffer, last: boolean): Buffer | null => {
    if (head === null) return compressed ? null : chunk;
    head = Buffer.concat([head, chunk]);
    if (head.length < MAGIC_BYTES && !last) return null;
    const all = head;
    head = null;
    compressed = compressionOf(all) !== null;
    if (compressed) report("the archive is compressed (pyro's agents send plain tar)");
    return compressed ? null : all;
  };
  return new Writable({
    highWaterMark: 256 * 1024,
    write(received: Buffer, _encoding, callback) {
      const chunk = sniff(received, false);
      if (!chunk) return callback();
      const taken = parser.write(chunk);
      if (!worker) return taken ? callback() : void parser.once("drain", () => callback());
      worker.flush();
      const room = worker.room();
      if (room) void room.then(() => callback());
      else callback();
    },
    final(callback) {
      const rest = sniff(Buffer.alloc(0), true);
      if (rest && rest.length > 0) parser.write(rest);
      worker?.flush();
      parser.end();
      callback();
    },
  });
}

/**
 * The unpacker's writer. A large export's files are made on a worker thread while this
 * one parses and checks (as `tar | tar` overlaps; tree-worker.ts); a snapshot's, here
 * (its latency counts more).
 */
function writerFor(
  tree: string,
  mode: UntrustedMode,
  report: (problem: string) => void,
  entries: () => number,
): { writer: TreeWriter; worker: SwitchingSteps | null } {
  const script = mode === "export" ? workerScript() : null;
  const worker = script ? new SwitchingSteps(script, report) : null;
  const writer = new TreeWriter(
    tree,
    mode === "snapshot",
    report,
    { impliedDirs: () => entries() + UNTRUSTED_LIMITS.impliedDirsOverEntries },
    worker ?? new TreeOps(report),
  );
  return { writer, worker };
}

/**
 * An unpacker's `done`: once the parser has ended, the writer's last steps, then the
 * checks; after a parse error, the writer stopped first. Either way nothing is written
 * after it settles (the caller removes the tree then).
 */
function settled(
  parser: tar.Parser,
  finish: () => Promise<void>,
  stop: () => Promise<void>,
  checked: () => Extracted,
): Promise<Extracted> {
  const parsed = new Promise<void>((resolve, reject) => {
    parser.on("error", reject);
    parser.on("end", () => resolve());
  });
  return parsed.then(
    async () => {
      await finish();
      return checked();
    },
    async (err: unknown) => {
      await stop();
      throw err;
    },
  );
}

type Entry = tar.ReadEntry;

/** `./a//b/` → `a/b`; the tree itself is ".". */
function normalName(raw: string): string {
  return posix.normalize(raw.replace(/^(\.\/)+/, "")).replace(/\/+$/, "") || ".";
}

/** Why `entry` (named `raw` in the archive) may not be extracted, or null; adjusts its mode for exports. */
function checkEntry(
  raw: string,
  entry: Entry,
  mode: UntrustedMode,
  seen: Map<string, string>,
  umask: number,
): string | null {
  const checked = checkName(raw);
  if ("problem" in checked) return checked.problem;
  const { name } = checked;
  const earlier = seen.get(name);
  if (earlier !== undefined && !(earlier === "Directory" && entry.type === "Directory"))
    return `entry '${raw}' appears twice`;
  seen.set(name, entry.type);
  if (entry.type === "Link") return `hard link '${raw}'`;
  if (entry.type === "SymbolicLink") {
    const target = entry.linkpath ?? "";
    const ok = (mode === "snapshot" && posix.isAbsolute(target)) || linkStaysInside(name, target);
    if (!ok) return `symlink '${raw}' -> '${target}' leads outside the extraction directory`;
  } else if (!FILE_TYPES.has(entry.type) && entry.type !== "Directory") {
    return `entry '${raw}' has unsupported type ${entry.type}`;
  }
  if (mode === "export" && entry.type !== "SymbolicLink") {
    // Plain permission bits under the user's umask, and the owner may always read and
    // write what it got.
    const base = typeof entry.mode === "number" ? entry.mode : 0o644;
    entry.mode = (base & 0o777 & ~umask) | (entry.type === "Directory" ? 0o700 : 0o600);
  }
  return null;
}

/**
 * Walks what was extracted (never following a symlink) and refuses anything the filter
 * did not mean to write. Synchronous: the tree is private and the walk is a few lstats.
 * `gnu_tar`: the tree is GNU tar's extraction (export-direct.ts), so first do what this
 * file's own extraction does as it writes: give the owner read and write (and search, on
 * a directory) where the entry lacks them (checkEntry), and remove FIFOs (the agent
 * skips them when it packs; GNU tar, reading the tree itself, packs them).
 */
export function verifyTree(
  tree: string,
  mode: UntrustedMode,
  label: string,
  result: Extracted,
  options: { gnu_tar?: boolean } = {},
): void {
  const uid = process.getuid?.() ?? 0;
  const problems: string[] = [];
  const visit = (rel: string, depth: number): void => {
    for (const name of readdirSync(path.join(tree, rel))) {
      const r = rel === "" ? name : `${rel}/${name}`;
      const st = lstatSync(path.join(tree, r));
      if (options.gnu_tar && st.isFIFO()) {
        unlinkSync(path.join(tree, r));
        continue;
      }
      if (options.gnu_tar) giveOwnerBits(path.join(tree, r), st);
      if (depth === 0)
        result.top.push({
          name,
          type: st.isDirectory() ? "directory" : st.isSymbolicLink() ? "symlink" : "file",
        });
      if (st.isSymbolicLink()) {
        const target = readlinkSync(path.join(tree, r));
        if (!((mode === "snapshot" && posix.isAbsolute(target)) || linkStaysInside(r, target)))
          problems.push(`symlink '${r}' -> '${target}' leads outside the extraction directory`);
      } else if (st.isFile()) {
        if (st.nlink !== 1) problems.push(`'${r}' is a hard link`);
        if (mode === "export" && (st.mode & 0o7000) !== 0)
          problems.push(`'${r}' has setuid/setgid/sticky bits`);
      } else if (!st.isDirectory()) {
        problems.push(`'${r}' is not a file, directory or symlink`);
      }
      if (mode === "export" && st.uid !== uid) problems.push(`'${r}' is owned by uid ${st.uid}`);
      if (st.isDirectory()) visit(r, depth + 1);
    }
  };
  visit("", 0);
  if (problems.length > 0) throw refusal(label, problems);
}

/** chmod u+rw (u+rwx on a directory) of an entry that lacks it; never of a symlink. */
function giveOwnerBits(at: string, st: Stats): void {
  const want = st.isDirectory() ? 0o700 : st.isFile() ? 0o600 : 0;
  if ((st.mode & want) !== want) {
    chmodSync(at, (st.mode & 0o7777) | want);
    st.mode |= want;
  }
}
