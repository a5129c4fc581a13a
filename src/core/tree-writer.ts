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
import path from "node:path";
import type { ReadEntry } from "tar";
import type { DirMeta, Owner, TreeSteps } from "./tree-ops.js";

/** Seconds since the epoch, as the fs calls take them. */
const seconds = (d: Date | undefined): number | undefined => (d ? d.getTime() / 1000 : undefined);

export class TreeWriter {
  /** What this writer made, by normalized name ("." is the tree itself). */
  private readonly made = new Map<string, "dir" | "file" | "symlink">([[".", "dir"]]);
  private readonly dirs: DirMeta[] = [];
  /** Directories made because an entry implied them (they had no entry of their own). */
  implied = 0;

  /**
   * `keepOwners`: chown to the archive's owners (snapshots); otherwise everything stays
   * owned by this process. `report` receives a problem that refuses the archive; the
   * steps' own failures reach it through whoever made `steps` (tree-ops.ts).
   */
  constructor(
    private readonly tree: string,
    private readonly keepOwners: boolean,
    private readonly report: (problem: string) => void,
    /** How many implied directories may have been made so far (untrusted-tar.ts's bound). */
    private readonly limits: { impliedDirs: () => number },
    private readonly steps: TreeSteps,
  ) {}

  /** Writes `entry` (already checked) at `name`; its body is consumed here. */
  write(name: string, entry: ReadEntry): void {
    if (!this.parentsAreDirs(name)) {
      entry.resume();
      return;
    }
    const at = path.join(this.tree, name);
    if (entry.type === "Directory") this.directory(name, at, entry);
    else if (entry.type === "SymbolicLink") this.symlink(name, at, entry);
    else this.file(name, at, entry);
  }

  /** Applies the directories' modes, owners and times, deepest first; closes a file left open. */
  finish(): void {
    this.dirs.sort((a, b) => b.at.length - a.at.length);
    this.steps.finishDirs(this.dirs);
  }

  private owner(entry: ReadEntry): Owner | undefined {
    return this.keepOwners && entry.uid !== undefined && entry.gid !== undefined
      ? [entry.uid, entry.gid]
      : undefined;
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
      this.steps.mkdir(path.join(this.tree, dir), dir);
      this.made.set(dir, "dir");
      this.implied++;
    }
    return true;
  }

  private directory(name: string, at: string, entry: ReadEntry): void {
    if (this.made.get(name) !== "dir") {
      this.steps.mkdir(at, name);
      this.made.set(name, "dir");
    }
    const mtime = seconds(entry.mtime);
    const owner = this.owner(entry);
    this.dirs.push({
      at,
      name,
      mode: (entry.mode ?? 0o755) & 0o7777,
      ...(mtime !== undefined ? { mtime } : {}),
      ...(owner ? { owner } : {}),
    });
    entry.resume();
  }

  private symlink(name: string, at: string, entry: ReadEntry): void {
    this.steps.symlink(entry.linkpath ?? "", at, name, this.owner(entry));
    this.made.set(name, "symlink");
    entry.resume();
  }

  private file(name: string, at: string, entry: ReadEntry): void {
    this.steps.open(at, name);
    this.made.set(name, "file");
    entry.on("data", (chunk: Buffer) => this.steps.write(chunk));
    entry.on("end", () => {
      const mtime = seconds(entry.mtime);
      const owner = this.owner(entry);
      this.steps.close({
        mode: (entry.mode ?? 0o644) & 0o7777,
        ...(owner ? { owner } : {}),
        ...(mtime !== undefined ? { times: [seconds(entry.atime) ?? mtime, mtime] } : {}),
      });
    });
  }
}
