/**
 * The system calls of tree-writer.ts, apart from its decisions: each method is one step
 * of writing a checked entry into the private extraction directory. The writer calls them
 * either here, on its own thread, or in a worker thread (tree-worker.ts), in the same
 * order either way.
 *
 * The first failure ends the writing: it is reported once (`onFailure`, which refuses the
 * archive) and every later step does nothing, as the writer skips every later entry.
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

const FILE_FLAGS = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW;

/** An owner to set: [uid, gid]. */
export type Owner = [number, number];

/** A directory's metadata, applied after everything else (deepest first). */
export interface DirMeta {
  at: string;
  /** Its name in the archive, for a failure's message. */
  name: string;
  mode: number;
  /** Seconds since the epoch. */
  mtime?: number;
  owner?: Owner;
}

/** What a file gets once its data is written. */
export interface FileMeta {
  owner?: Owner;
  mode: number;
  /** [atime, mtime], seconds since the epoch. */
  times?: [number, number];
}

/** The steps, as tree-writer.ts calls them (here, or through a worker). */
export interface TreeSteps {
  mkdir(at: string, name: string): void;
  symlink(target: string, at: string, name: string, owner?: Owner): void;
  open(at: string, name: string): void;
  write(data: Uint8Array): void;
  close(meta: FileMeta): void;
  /** The directories' modes, owners and times, in the order given; closes a file left open. */
  finishDirs(dirs: DirMeta[]): void;
}

export class TreeOps implements TreeSteps {
  private fd: number | null = null;
  private fileName = "";
  private failed = false;

  constructor(private readonly onFailure: (problem: string) => void) {}

  mkdir(at: string, name: string): void {
    this.step(name, () => mkdirSync(at, 0o700));
  }

  symlink(target: string, at: string, name: string, owner?: Owner): void {
    this.step(name, () => {
      symlinkSync(target, at);
      if (owner) lchownSync(at, owner[0], owner[1]);
    });
  }

  open(at: string, name: string): void {
    this.step(name, () => {
      this.closeOpen();
      this.fd = openSync(at, FILE_FLAGS, 0o600);
      this.fileName = name;
    });
  }

  write(data: Uint8Array): void {
    const fd = this.fd;
    if (fd === null) return;
    this.step(this.fileName, () => {
      for (let off = 0; off < data.length; ) off += writeSync(fd, data, off);
    });
  }

  close(meta: FileMeta): void {
    const fd = this.fd;
    if (fd === null) return;
    this.step(this.fileName, () => {
      if (meta.owner) fchownSync(fd, meta.owner[0], meta.owner[1]);
      // After the chown, which clears setuid bits; the checks already reduced an export's mode.
      fchmodSync(fd, meta.mode);
      if (meta.times) futimesSync(fd, meta.times[0], meta.times[1]);
    });
    this.closeOpen();
  }

  finishDirs(dirs: DirMeta[]): void {
    this.closeOpen();
    for (const d of dirs)
      this.step(d.name, () => {
        if (d.owner) lchownSync(d.at, d.owner[0], d.owner[1]);
        mkdirModeSync(d.at, d.mode);
        if (d.mtime !== undefined) utimesSync(d.at, d.mtime, d.mtime);
      });
  }

  private step(name: string, f: () => void): void {
    if (this.failed) return;
    try {
      f();
    } catch (err) {
      this.failed = true;
      this.closeOpen();
      this.onFailure(`'${name}' could not be written (${(err as Error).message})`);
    }
  }

  private closeOpen(): void {
    if (this.fd === null) return;
    const fd = this.fd;
    this.fd = null;
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
