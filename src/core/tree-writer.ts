/**
 * The writing half of untrusted-tar.ts: puts entries that its checks accepted into a
 * fresh private directory, with plain synchronous calls. node-tar's Unpack did this
 * through the libuv thread pool, with an lstat and a mkdir per file on top: about five
 * thread hand-offs per file made an export of 10k small files several times slower
 * than `tar | tar`. Each entry here is a handful of direct system calls.
 *
 * Safety does not rest on this file alone: untrusted-tar.ts checks every entry first, and
 * walks the result again afterwards. What this writer adds:
 * - nothing is ever written through a symlink: every parent of an entry must be a
 *   directory this writer made (the directory is fresh and private, so what it made is
 *   what is there), and files are opened O_EXCL | O_NOFOLLOW;
 * - modes and times are applied after the contents (a read-only directory is still
 *   written into), directories deepest first.
 */
import {
  closeSync,
  constants,
  fchmodSync,
  fchownSync,
  futimesSync,
  lchownSync,
  mkdirSync,
  openSync,
  symlinkSync,
  utimesSync,
  writeSync,
} from "node:fs";
import path from "node:path";
import type { ReadEntry } from "tar";

const FILE_FLAGS = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW;

interface DirMeta {
  at: string;
  mode: number;
  mtime: Date | undefined;
  uid: number | undefined;
  gid: number | undefined;
}

export class TreeWriter {
  /** What this writer made, by normalized name ("." is the tree itself). */
  private readonly made = new Map<string, "dir" | "file" | "symlink">([[".", "dir"]]);
  private readonly dirs: DirMeta[] = [];
  private openFd: number | null = null;
  /** Directories made because an entry implied them (they had no entry of their own). */
  implied = 0;

  /**
   * `keepOwners`: chown to the archive's owners (snapshots); otherwise everything stays
   * owned by this process. `report` receives a problem that refuses the archive.
   */
  constructor(
    private readonly tree: string,
    private readonly keepOwners: boolean,
    private readonly report: (problem: string) => void,
    /** How many implied directories may have been made so far (untrusted-tar.ts's bound). */
    private readonly limits: { impliedDirs: () => number },
  ) {}

  /** Writes `entry` (already checked) at `name`; its body is consumed here. */
  write(name: string, entry: ReadEntry): void {
    try {
      if (!this.parentsAreDirs(name)) {
        entry.resume();
        return;
      }
      const at = path.join(this.tree, name);
      if (entry.type === "Directory") this.directory(name, at, entry);
      else if (entry.type === "SymbolicLink") this.symlink(name, at, entry);
      else this.file(name, at, entry);
    } catch (err) {
      this.fail(name, err);
      entry.resume();
    }
  }

  /** Applies the directories' modes, owners and times, deepest first; closes a file left open. */
  finish(): void {
    this.closeOpen();
    this.dirs.sort((a, b) => b.at.length - a.at.length);
    for (const d of this.dirs) {
      try {
        if (this.keepOwners && d.uid !== undefined && d.gid !== undefined) lchownSync(d.at, d.uid, d.gid);
        mkdirModeSync(d.at, d.mode);
        if (d.mtime) utimesSync(d.at, d.mtime, d.mtime);
      } catch (err) {
        this.fail(path.relative(this.tree, d.at) || ".", err);
      }
    }
  }

  /** Makes missing parents (as plain directories); false, reported, if one is not a directory made here. */
  private parentsAreDirs(name: string): boolean {
    // Up from the entry's parent to the nearest one made here (a directory made here had
    // its own parents checked), then down again making the missing ones.
    const missing: string[] = [];
    let prefix = path.posix.dirname(name);
    let kind = this.made.get(prefix);
    while (kind === undefined) {
      missing.push(prefix);
      prefix = path.posix.dirname(prefix);
      kind = this.made.get(prefix);
    }
    if (kind !== "dir") {
      this.report(`entry '${name}' would be written through '${prefix}', which is not a directory`);
      return false;
    }
    if (this.implied + missing.length > this.limits.impliedDirs()) {
      this.report(`entry '${name}' implies more directories than the archive names`);
      return false;
    }
    for (const dir of missing.reverse()) {
      mkdirSync(path.join(this.tree, dir), 0o700);
      this.made.set(dir, "dir");
      this.implied++;
    }
    return true;
  }

  private directory(name: string, at: string, entry: ReadEntry): void {
    if (this.made.get(name) !== "dir") {
      mkdirSync(at, 0o700);
      this.made.set(name, "dir");
    }
    this.dirs.push({
      at,
      mode: (entry.mode ?? 0o755) & 0o7777,
      mtime: entry.mtime,
      uid: entry.uid,
      gid: entry.gid,
    });
    entry.resume();
  }

  private symlink(name: string, at: string, entry: ReadEntry): void {
    symlinkSync(entry.linkpath ?? "", at);
    this.made.set(name, "symlink");
    if (this.keepOwners && entry.uid !== undefined && entry.gid !== undefined)
      lchownSync(at, entry.uid, entry.gid);
    entry.resume();
  }

  private file(name: string, at: string, entry: ReadEntry): void {
    const fd = openSync(at, FILE_FLAGS, 0o600);
    this.openFd = fd;
    this.made.set(name, "file");
    entry.on("data", (chunk: Buffer) => {
      if (this.openFd !== fd) return;
      try {
        for (let off = 0; off < chunk.length; ) off += writeSync(fd, chunk, off);
      } catch (err) {
        this.fail(name, err);
      }
    });
    entry.on("end", () => {
      if (this.openFd !== fd) return;
      try {
        if (this.keepOwners && entry.uid !== undefined && entry.gid !== undefined)
          fchownSync(fd, entry.uid, entry.gid);
        // After the chown, which clears setuid bits; the checks already reduced an export's mode.
        fchmodSync(fd, (entry.mode ?? 0o644) & 0o7777);
        if (entry.mtime) futimesSync(fd, entry.atime ?? entry.mtime, entry.mtime);
      } catch (err) {
        this.fail(name, err);
      }
      this.closeOpen();
    });
  }

  private fail(name: string, err: unknown): void {
    this.closeOpen();
    this.report(`'${name}' could not be written (${(err as Error).message})`);
  }

  private closeOpen(): void {
    if (this.openFd === null) return;
    const fd = this.openFd;
    this.openFd = null;
    closeSync(fd);
  }
}

/** chmod of a directory this writer made (never a symlink: the walk afterwards checks). */
function mkdirModeSync(at: string, mode: number): void {
  const fd = openSync(at, constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW);
  try {
    fchmodSync(fd, mode);
  } finally {
    closeSync(fd);
  }
}
