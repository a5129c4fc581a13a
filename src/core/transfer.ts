import { lstat, mkdir, mkdtemp, readdir, rename, rm, stat } from "node:fs/promises";
import { basename, dirname, isAbsolute, join, normalize, resolve, sep } from "node:path";
import { Readable } from "node:stream";
import * as tar from "tar";
import { PyroError } from "./errors.js";

/**
 * Host-side halves of the tar streams: packing a host directory for `sync push`, and
 * extracting an agent's export safely. The agent is not trusted: every entry is checked
 * (no absolute names, no `..`, no hard links, no symlinks pointing out of the export) and
 * extraction happens in a private temp directory moved into place only when complete.
 */

/** A tar stream of a host directory's contents (or one file), without following symlinks. */
export async function packHostPath(src: string): Promise<Readable> {
  const abs = resolve(src);
  const st = await stat(abs).catch(() => null);
  if (!st) throw new PyroError("not_found", `no such file or directory: ${abs}`);
  const [cwd, entries] = st.isDirectory() ? [abs, await readdir(abs)] : [dirname(abs), [basename(abs)]];
  return Readable.from(tar.c({ cwd, portable: true, follow: false, noDirRecurse: false }, entries.length ? entries : []) as AsyncIterable<Buffer>);
}

/** Whether a tar entry may be written under the extraction root. */
export function safeEntry(path: string, type: string, linkpath: string | undefined, allowAbsoluteSymlinks = false): string | null {
  const clean = normalize(path).replace(/^(\.\/)+/, "");
  if (isAbsolute(path) || clean === ".." || clean.startsWith(`..${sep}`)) return `entry '${path}' leaves the export`;
  if (type === "Link") return `entry '${path}' is a hard link`;
  if (type === "SymbolicLink") {
    if (!linkpath) return `symlink '${path}' has no target`;
    if (isAbsolute(linkpath)) return allowAbsoluteSymlinks ? null : `symlink '${path}' points to an absolute path`;
    const target = normalize(join(dirname(clean), linkpath));
    if (target === ".." || target.startsWith(`..${sep}`)) return `symlink '${path}' points out of the export`;
  }
  if (!["File", "OldFile", "ContiguousFile", "Directory", "SymbolicLink"].includes(type)) return `entry '${path}' has unsupported type ${type}`;
  return null;
}

/**
 * Extracts an export's tar chunks to `output`: a file export becomes the file at
 * `output` (replacing a file there), a directory export becomes the directory `output`
 * (which must not exist or be empty). All-or-nothing.
 */
export class ExportWriter {
  private readonly tmpParent: string;
  private tmp = "";
  private extractor: tar.Unpack | null = null;
  private refused: string | null = null;
  private done: Promise<void> = Promise.resolve();

  /**
   * `snapshot` mode keeps absolute symlinks (they mean something inside the sandbox, and a
   * snapshot tree is only ever used as a sandbox layer); exports to the host refuse them.
   */
  constructor(
    private readonly output: string,
    private readonly mode: "export" | "snapshot" = "export",
  ) {
    this.tmpParent = dirname(resolve(output));
  }

  async begin(): Promise<void> {
    const existing = await lstat(this.output).catch(() => null);
    if (existing?.isDirectory() && (await readdir(this.output)).length > 0) {
      throw new PyroError("conflict", `output directory ${this.output} exists and is not empty`, "choose a new output path");
    }
    await mkdir(this.tmpParent, { recursive: true });
    this.tmp = await mkdtemp(join(this.tmpParent, ".pyro-export-"));
    this.extractor = new tar.Unpack({
      cwd: this.tmp,
      strict: true,
      preserveOwner: false,
      filter: (path, entry) => {
        const e = entry as tar.ReadEntry;
        const why = safeEntry(path, e.type, e.linkpath, this.mode === "snapshot");
        if (why) this.refused ??= why;
        return why === null;
      },
    });
    this.done = new Promise((res, rej) => {
      this.extractor!.on("finish", () => res());
      this.extractor!.on("close", () => res());
      this.extractor!.on("error", rej);
    });
  }

  write(chunk: Buffer): void {
    this.extractor?.write(chunk);
  }

  /** Finishes extraction and moves the result into place. */
  async commit(artifactType: "file" | "directory"): Promise<void> {
    this.extractor?.end();
    try {
      await this.done;
      if (this.refused) throw new PyroError("path_outside_workspace", `export refused: ${this.refused}`);
      const out = resolve(this.output);
      if (artifactType === "file") {
        const names = await readdir(this.tmp);
        if (names.length !== 1 || !names[0]) throw new PyroError("internal", "a file export did not contain exactly one file");
        await rename(join(this.tmp, names[0]), out);
      } else {
        await rm(out, { recursive: true, force: true }); // only an empty directory can be here
        await rename(this.tmp, out);
        this.tmp = "";
      }
    } finally {
      await this.abort();
    }
  }

  async abort(): Promise<void> {
    (this.extractor as unknown as { destroy?: () => void } | null)?.destroy?.();
    if (this.tmp) await rm(this.tmp, { recursive: true, force: true });
    this.tmp = "";
  }
}
