import type { Stats } from "node:fs";
import { lstat, mkdir, mkdtemp, readdir, rename, rm, stat } from "node:fs/promises";
import { basename, dirname, join, resolve } from "node:path";
import type { Readable } from "node:stream";
import type { AgentClient } from "../agent/client.js";
import { packTree } from "../agent/tarsafe.js";
import { PyroError, toPyroError } from "../errors.js";
import { makeDirs } from "../util/fs.js";
import { run } from "../util/run.js";
import { type Extracted, type UntrustedUnpacker, untrustedUnpacker } from "./untrusted-tar.js";

/**
 * Host-side halves of the tar streams: packing a host path for `sync push`, and
 * extracting an agent's export or snapshot. The agent is not trusted: its archive is
 * checked and extracted entry by entry, as it arrives, by one parser into a private temp
 * directory (untrusted-tar.ts has the rules), and moved into place only when complete.
 * Extracting while the agent still packs is what lets an export run at `tar | tar` speed:
 * spooling first made it pack, then transfer, then extract, one after the other.
 */

/** Refuses (`not_found`) a host path that does not exist; its stat otherwise. */
export async function requireHostPath(src: string): Promise<Stats> {
  const abs = resolve(src);
  const st = await stat(abs).catch(() => null);
  if (!st) throw new PyroError("not_found", `no such file or directory: ${abs}`);
  return st;
}

/**
 * A tar stream of a host directory's contents (or one file), without following symlinks;
 * `finished` is the packer's exit code (not 0: it could not read all of the source).
 */
export async function packHostPath(
  src: string,
): Promise<{ stream: Readable; finished: Promise<number | null> }> {
  const abs = resolve(src);
  const st = await requireHostPath(abs);
  const [cwd, names] = st.isDirectory() ? [abs, await readdir(abs)] : [dirname(abs), [basename(abs)]];
  return packTree(cwd, names.sort());
}

/**
 * `sync push` through the agent's `tar_in` (the fast push's fallback, push-direct.ts): the
 * host's tar packs `source` as the agent receives it. A source that changed while it was
 * read fails the push after the fact, as on the fast path ({@link sourceUnread}).
 */
export async function pushThrough(
  agent: Pick<AgentClient, "request">,
  source: string,
  dest: string,
  signal?: AbortSignal,
): Promise<{ dest: string; files: number; bytes: number }> {
  const packed = await packHostPath(source);
  let r: { dest: string; files: number; bytes: number };
  try {
    r = await agent.request(
      "tar_in",
      { dest },
      { upload: packed.stream, timeoutMs: 30 * 60_000, ...(signal ? { signal } : {}) },
    );
  } catch (err) {
    // tar's failure ends the upload with an error before the agent has all of it (a slow
    // reader): the upload failed because the source changed, and nothing was pushed.
    // (`finished` settled with that error; anything else leaves the agent's error.)
    const read = await Promise.race([
      packed.finished,
      new Promise<"later">((r) => setImmediate(() => r("later"))),
    ]);
    if (typeof read === "number" && read !== 0) throw sourceUnread(resolve(source), read, false);
    throw err;
  }
  const read = await packed.finished;
  if (read !== 0) throw sourceUnread(resolve(source), read, true);
  return r;
}

/** A push whose host tar could not read all of `abs` (exit `code`). */
export function sourceUnread(abs: string, code: number | null, pushed: boolean): PyroError {
  return new PyroError(
    "conflict",
    `the host's tar could not read all of ${abs} (exit ${code ?? "none"}): a file changed or vanished while it was read; ${pushed ? "what it read was pushed" : "nothing was pushed"}`,
    "push again once the source is not changing",
  );
}

/**
 * Where an export lands before it is complete: a private directory beside `output` (on
 * its filesystem, so the result moves into place with one rename). All-or-nothing: a
 * file export becomes the file at `output` (replacing a file there), a directory export
 * becomes the directory `output` (which must not exist or be empty).
 */
export class ExportStaging {
  private tmp = "";

  constructor(readonly output: string) {}

  /** The directory the archive is extracted into. */
  get tree(): string {
    return join(this.tmp, "tree");
  }

  async begin(): Promise<void> {
    const existing = await lstat(this.output).catch(() => null);
    if (existing?.isDirectory() && (await readdir(this.output)).length > 0) {
      throw new PyroError(
        "conflict",
        `output directory ${this.output} exists and is not empty`,
        "choose a new output path",
      );
    }
    const parent = dirname(resolve(this.output));
    await makeDirs(parent);
    this.tmp = await mkdtemp(join(parent, ".pyro-export-"));
    await mkdir(this.tree);
  }

  /** Moves the extracted result into place (`top`: the tree's top-level entries). */
  async place(artifactType: "file" | "directory", top: Extracted["top"]): Promise<void> {
    const out = resolve(this.output);
    if (artifactType === "file") {
      const only = top[0];
      if (top.length !== 1 || !only || only.type !== "file")
        throw new PyroError("internal", "a file export did not contain exactly one regular file");
      await rename(join(this.tree, only.name), out);
    } else {
      await rm(out, { recursive: true, force: true }); // only an empty directory can be here
      await rename(this.tree, out);
    }
  }

  /**
   * Removes whatever is still staged; safe to call at any point, more than once, and
   * never throws: a tree deeper than a path can name (which Node's rm cannot remove) is
   * removed by `rm -rf`, which walks with descriptors.
   */
  async discard(): Promise<void> {
    const tmp = this.tmp;
    this.tmp = "";
    if (!tmp) return;
    await rm(tmp, { recursive: true, force: true }).catch(() =>
      run(["rm", "-rf", "--", tmp], { timeoutMs: 10 * 60_000 }).catch(() => {}),
    );
  }
}

/**
 * Receives an export's tar chunks and puts the result at `output` through an
 * {@link ExportStaging}.
 */
export class ExportWriter {
  private readonly staging: ExportStaging;
  private unpacker: UntrustedUnpacker | null = null;
  private ended = false;
  private readonly stop = new AbortController();
  /**
   * Aborted when the extraction has refused the archive: the caller cancels the agent's
   * request (the rest is not read) and throws {@link refusalOr}'s error.
   */
  readonly refused: AbortSignal = this.stop.signal;

  /**
   * `snapshot` mode keeps absolute symlinks and owners (a snapshot tree is only ever
   * used as a sandbox layer); exports to the host refuse absolute symlinks.
   */
  constructor(
    private readonly output: string,
    private readonly mode: "export" | "snapshot" = "export",
    /** The most bytes of file data the archive may hold (untrusted-tar.ts); default: no bound. */
    private readonly maxBytes?: number,
  ) {
    this.staging = new ExportStaging(output);
  }

  async begin(): Promise<void> {
    await this.staging.begin();
    this.unpacker = untrustedUnpacker(this.staging.tree, this.mode, this.output, this.maxBytes);
    this.unpacker.refused.addEventListener("abort", () => this.stop.abort(), { once: true });
  }

  /**
   * Feeds the next bytes of the archive. Returns a promise when the extraction is behind
   * (the caller should stop reading until it settles: AgentClient pauses the connection),
   * so a fast agent cannot pile its archive up in the host's memory.
   */
  write(chunk: Buffer): Promise<void> | undefined {
    const u = this.unpacker;
    if (!u || this.ended || u.input.write(chunk)) return undefined;
    return new Promise((res) => {
      const settle = () => {
        u.input.off("drain", settle);
        res();
      };
      u.input.on("drain", settle);
      // A failed extraction stops draining; do not wait for it then.
      void u.done.then(settle, settle);
    });
  }

  /**
   * Ends the archive, waits for the extraction under the rules of untrusted-tar.ts into a
   * private directory and moves the result into place. The counts returned are what the
   * host wrote, not what the agent claimed.
   */
  async commit(artifactType: "file" | "directory"): Promise<Extracted> {
    try {
      const u = this.unpacker;
      if (!u) throw new PyroError("internal", "the export was not begun");
      this.end(u);
      const got = await u.done.catch((err: unknown) => {
        throw toPyroError(err);
      });
      await this.staging.place(artifactType, got.top);
      return got;
    } finally {
      await this.abort();
    }
  }

  private end(u: UntrustedUnpacker): void {
    if (this.ended) return;
    this.ended = true;
    u.input.end();
  }

  /** The extraction's refusal when it refused the archive (the request was cancelled for it), else `err`. */
  async refusalOr(err: unknown): Promise<unknown> {
    const u = this.unpacker;
    if (!u || !this.refused.aborted) return err;
    this.end(u);
    return u.done.then(
      () => err,
      (refusal: unknown) => toPyroError(refusal),
    );
  }

  /** Discards everything received; safe to call at any point, more than once. */
  async abort(): Promise<void> {
    const u = this.unpacker;
    this.unpacker = null;
    if (u) {
      // Let the extraction stop before its directory goes, so nothing is written after.
      this.end(u);
      await u.done.catch(() => {});
    }
    await this.staging.discard();
  }
}

/**
 * Copies `path` out of the agent's tree to `output` through an ExportWriter (all or
 * nothing; the sizes are what the host wrote, never what the agent claimed).
 */
export async function exportThrough(
  agent: AgentClient,
  path: string,
  output: string,
  signal?: AbortSignal,
  /** The most bytes of file data to accept (workspaceArchiveBudget); default: no bound. */
  maxBytes?: number,
): Promise<{ artifact_type: "file" | "directory"; bytes: number; entries: number }> {
  const writer = new ExportWriter(output, "export", maxBytes);
  await writer.begin();
  try {
    const r = await agent.request(
      "tar_out",
      { path },
      {
        onData: (c: Buffer) => writer.write(c),
        timeoutMs: 30 * 60_000,
        signal: signal ? AbortSignal.any([signal, writer.refused]) : writer.refused,
      },
    );
    const got = await writer.commit(r.artifact_type);
    return { artifact_type: r.artifact_type, bytes: got.bytes, entries: got.entries };
  } catch (err) {
    const why = await writer.refusalOr(err);
    await writer.abort();
    throw why;
  }
}
