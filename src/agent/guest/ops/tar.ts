/**
 * `tar_out` streams a file or directory of the workspace as a tar; `tar_in` extracts
 * an uploaded tar into the workspace. Neither follows symlinks, and both refuse
 * hard-linked files (a hard link may share its inode with a file outside the root).
 *
 * tar_in spools the upload to a scratch file outside the workspace, validates every
 * entry, and only then extracts: an archive with one bad entry changes nothing.
 */

import type { Stats } from "node:fs";
import { createWriteStream } from "node:fs";
import { lstat, mkdir, mkdtemp, rm, stat } from "node:fs/promises";
import path from "node:path";
import { Transform } from "node:stream";
import { pipeline } from "node:stream/promises";
import { AgentError } from "../../errors.js";
import { archiveValidator, type Checked, extractArchive, packTree } from "../../tarsafe.js";
import { outsideError, Workspace } from "../paths.js";
import type { OpContext, OpHandler } from "./context.js";

const posix = path.posix;

/**
 * The lstat of `rel` under `dir` when every directory on the way is a real directory
 * (no symlink followed), else null.
 */
async function plainNode(dir: string, rel: string): Promise<Stats | null> {
  const parts = rel.split("/");
  if (parts.some((p) => p === "" || p === "." || p === ".."))
    throw new AgentError("invalid_argument", `'${rel}' is not a plain relative path`);
  let current = dir;
  for (const [i, part] of parts.entries()) {
    current = path.join(current, part);
    const st = await lstat(current).catch(() => null);
    if (!st) return null;
    if (i === parts.length - 1) return st;
    if (!st.isDirectory()) return null;
  }
  return null;
}

export const tarOut: OpHandler<"tar_out"> = async (args, ctx) => {
  const target = await ctx.workspace.resolve(args.path);
  if (!target.stat) throw new AgentError("not_found", `no such file or directory: ${args.path}`);
  const isDir = target.stat.isDirectory();
  if (!isDir && !target.stat.isFile())
    throw new AgentError("invalid_argument", `'${args.path}' is neither a file nor a directory`);
  if (args.paths && !isDir) throw new AgentError("invalid_argument", `'${args.path}' is not a directory`);
  const cwd = isDir ? target.real : path.dirname(target.real);
  let names = isDir ? ["."] : [path.basename(target.real)];
  if (args.paths) {
    names = [];
    for (const rel of args.paths) {
      const st = await plainNode(cwd, rel);
      if (st && (st.isFile() || st.isSymbolicLink())) names.push(rel);
    }
  }
  // Skip devices, FIFOs and sockets (nothing a host should recreate); a hard-linked file
  // fails the whole export (it may share its inode with a file outside).
  const { stream, entries } = await packTree(cwd, names, {
    accept: (rel, st) => {
      if (st.isFile() && st.nlink > 1) {
        throw outsideError(
          posix.join(Workspace.show(target.rel), rel),
          "it is a hard link (it may be shared with a file outside)",
        );
      }
      return st.isFile() || st.isDirectory() || st.isSymbolicLink();
    },
  });
  let bytes = 0;
  await ctx.send(Buffer.alloc(0));
  for await (const chunk of stream as AsyncIterable<Buffer>) {
    if (ctx.signal.aborted) {
      stream.destroy();
      throw new AgentError("cancelled", "the export was cancelled");
    }
    await ctx.send(chunk);
    bytes += chunk.length;
  }
  return { artifact_type: isDir ? "directory" : "file", bytes, entries };
};

/**
 * Writes the upload to `file` and feeds the same bytes to `validator` as they arrive (the
 * archive is checked while it is received, not read again after). Returns the size.
 */
async function spool(
  ctx: OpContext,
  file: string,
  validator: ReturnType<typeof archiveValidator>,
): Promise<number> {
  const out = createWriteStream(file, { mode: 0o600 });
  const check = new Transform({
    transform(chunk: Buffer, _enc, done) {
      // A chunk the parser refuses still goes to the file: the whole upload is read (the
      // request's stream must be drained) and finish() reports the parser's error.
      validator.write(chunk).then(
        () => done(null, chunk),
        () => done(null, chunk),
      );
    },
  });
  await pipeline(ctx.upload!, check, out, { signal: ctx.signal });
  return (await stat(file)).size;
}

export const tarIn: OpHandler<"tar_in"> = async (args, ctx) => {
  if (!ctx.upload) throw new AgentError("invalid_argument", "tar_in needs an uploaded tar stream");
  const dest = await ctx.workspace.resolve(args.dest);
  if (dest.stat && !dest.stat.isDirectory())
    throw new AgentError("conflict", `'${args.dest}' exists and is not a directory`);
  const scratch = await mkdtemp(path.join(ctx.tmpDir, "pyro-upload-"));
  try {
    const file = path.join(scratch, "upload.tar");
    const validator = archiveValidator({ destReal: dest.real, destLabel: Workspace.show(dest.rel) });
    const size = await spool(ctx, file, validator).catch((err: unknown) => {
      if (ctx.signal.aborted) throw new AgentError("cancelled", "the upload was cancelled");
      throw err instanceof AgentError
        ? err
        : new AgentError("invalid_argument", `the upload failed: ${(err as Error).message}`);
    });
    if (size === 0) throw new AgentError("invalid_argument", "the uploaded archive is empty");
    let checked: Checked;
    try {
      checked = await validator.finish();
    } catch (err) {
      if (err instanceof AgentError) throw err;
      throw new AgentError(
        "invalid_argument",
        `the upload is not a valid tar archive: ${(err as Error).message}`,
      );
    }
    await mkdir(dest.real, { recursive: true });
    if (checked.entries > 0) await extractArchive(file, dest.real);
    return { dest: Workspace.show(dest.rel), files: checked.files, bytes: checked.bytes };
  } finally {
    await rm(scratch, { recursive: true, force: true });
  }
};
