/**
 * `tar_out` streams a file or directory of the workspace as a tar; `tar_in` extracts
 * an uploaded tar into the workspace. Neither follows symlinks, and both refuse
 * hard-linked files (a hard link may share its inode with a file outside the root).
 *
 * tar_in spools the upload to a scratch file outside the workspace, validates every
 * entry, and only then extracts: an archive with one bad entry changes nothing.
 */
import { createWriteStream, Stats } from "node:fs";
import { lstat, mkdir, mkdtemp, rm, stat } from "node:fs/promises";
import path from "node:path";
import { pipeline } from "node:stream/promises";
import * as tar from "tar";
import { AgentError } from "../../errors.js";
import { outsideError, Workspace } from "../paths.js";
import type { OpContext, OpHandler } from "./context.js";

const posix = path.posix;
const FILE_TYPES = new Set(["File", "OldFile", "ContiguousFile"]);

export const tarOut: OpHandler<"tar_out"> = async (args, ctx) => {
  const target = await ctx.workspace.resolve(args.path);
  if (!target.stat) throw new AgentError("not_found", `no such file or directory: ${args.path}`);
  const isDir = target.stat.isDirectory();
  if (!isDir && !target.stat.isFile())
    throw new AgentError("invalid_argument", `'${args.path}' is neither a file nor a directory`);
  const cwd = isDir ? target.real : path.dirname(target.real);
  const files = isDir ? ["."] : [path.basename(target.real)];

  let refused: string | null = null;
  let entries = 0;
  const pack = tar.c(
    {
      cwd,
      portable: true,
      follow: false,
      // Decides per node, with its lstat: skip devices, FIFOs and sockets (nothing a
      // host should recreate); a hard-linked file fails the whole export.
      filter: (p, st) => {
        if (!(st instanceof Stats)) return true;
        if (st.isFile() && st.nlink > 1) {
          refused ??= p;
          return false;
        }
        if (!st.isFile() && !st.isDirectory() && !st.isSymbolicLink()) return false;
        entries++;
        return true;
      },
    },
    files,
  );
  let bytes = 0;
  await ctx.send(Buffer.alloc(0));
  for await (const chunk of pack as AsyncIterable<Buffer>) {
    if (ctx.signal.aborted) throw new AgentError("cancelled", "the export was cancelled");
    if (refused !== null) break;
    await ctx.send(chunk);
    bytes += chunk.length;
  }
  if (refused !== null) {
    throw outsideError(
      posix.join(Workspace.show(target.rel), refused),
      "it is a hard link (it may be shared with a file outside)",
    );
  }
  return { artifact_type: isDir ? "directory" : "file", bytes, entries };
};

interface Checked {
  files: number;
  bytes: number;
}

/**
 * Whether a symlink entry at `name` (relative to the extraction directory) with
 * target `target` stays inside the extraction directory. This is stricter than
 * "inside the root" on purpose: tar's own guard (kept on as a second line of defence)
 * refuses links that leave its cwd, and a check that disagreed with it would let an
 * archive fail half-way through extraction. Absolute targets are refused (tar would
 * rewrite them). `..` is only accepted as a leading run: after a normal component it
 * could climb out of a directory that is itself a symlink, which lexical checking
 * cannot see.
 */
function linkStaysInside(name: string, target: string): boolean {
  if (target === "" || posix.isAbsolute(target)) return false;
  const parts = target.split("/").filter((p) => p !== "" && p !== ".");
  const firstNormal = parts.findIndex((p) => p !== "..");
  if (firstNormal >= 0 && parts.slice(firstNormal).includes("..")) return false;
  const joined = posix.normalize(posix.join(posix.dirname(name), ...parts));
  return joined !== ".." && !joined.startsWith("../");
}

/** Reads the spooled archive and refuses it unless every entry is safe to extract into `destRel`. */
async function validate(file: string, destRel: string, destReal: string): Promise<Checked> {
  const problems: string[] = [];
  const links = new Set<string>();
  const names: { name: string; type: string }[] = [];
  const checked: Checked = { files: 0, bytes: 0 };
  await tar.t({
    file,
    strict: true,
    onReadEntry: (entry) => {
      const raw = entry.path;
      const name = posix.normalize(raw.replace(/^(\.\/)+/, "")).replace(/\/+$/, "");
      if (posix.isAbsolute(raw) || /^[a-zA-Z]:/.test(raw)) problems.push(`absolute entry name '${raw}'`);
      else if (name.split("/").includes("..")) problems.push(`entry '${raw}' climbs out with '..'`);
      else if (entry.type === "Link") problems.push(`hard link '${raw}'`);
      else if (entry.type === "SymbolicLink") {
        if (!linkStaysInside(name, entry.linkpath ?? "")) {
          problems.push(`symlink '${raw}' -> '${entry.linkpath}' leads outside the extraction directory`);
        }
        links.add(name);
      } else if (FILE_TYPES.has(entry.type)) {
        checked.files++;
        checked.bytes += entry.size;
      } else if (entry.type !== "Directory")
        problems.push(`entry '${raw}' has unsupported type ${entry.type}`);
      names.push({ name, type: entry.type });
    },
  });
  if (problems.length > 0)
    throw outsideError(Workspace.show(destRel), `the archive has ${problems.slice(0, 5).join("; ")}`);

  // Nothing may be extracted through a symlink, whether the archive makes it or it
  // already exists under the destination.
  const existing = new Map<string, boolean>();
  const isLink = async (rel: string): Promise<boolean> => {
    if (links.has(rel)) return true;
    if (!existing.has(rel)) {
      const st = await lstat(posix.join(destReal, rel)).catch(() => null);
      existing.set(rel, st?.isSymbolicLink() ?? false);
    }
    return existing.get(rel)!;
  };
  for (const { name, type } of names) {
    if (name === "." || name === "") continue;
    const parts = name.split("/");
    for (let i = 1; i < parts.length; i++) {
      const prefix = parts.slice(0, i).join("/");
      if (await isLink(prefix))
        throw outsideError(
          Workspace.show(destRel),
          `entry '${name}' would be extracted through the symlink '${prefix}'`,
        );
    }
    if (type === "Directory" && !links.has(name) && (await isLink(name))) {
      throw new AgentError("conflict", `'${name}' exists as a symlink where the archive has a directory`);
    }
  }
  return checked;
}

async function spool(ctx: OpContext, file: string): Promise<number> {
  await pipeline(ctx.upload!, createWriteStream(file, { mode: 0o600 }), { signal: ctx.signal });
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
    const size = await spool(ctx, file).catch((err: unknown) => {
      if (ctx.signal.aborted) throw new AgentError("cancelled", "the upload was cancelled");
      throw err instanceof AgentError
        ? err
        : new AgentError("invalid_argument", `the upload failed: ${(err as Error).message}`);
    });
    if (size === 0) throw new AgentError("invalid_argument", "the uploaded archive is empty");
    let checked: Checked;
    try {
      checked = await validate(file, dest.rel, dest.real);
    } catch (err) {
      if (err instanceof AgentError) throw err;
      throw new AgentError(
        "invalid_argument",
        `the upload is not a valid tar archive: ${(err as Error).message}`,
      );
    }
    await mkdir(dest.real, { recursive: true });
    await tar.x({
      file,
      cwd: dest.real,
      strict: true,
      // unlink: replace existing files instead of writing into them, so a hard link
      // in the workspace cannot carry the write to another inode.
      unlink: true,
      preserveOwner: false,
    });
    return { dest: Workspace.show(dest.rel), files: checked.files, bytes: checked.bytes };
  } finally {
    await rm(scratch, { recursive: true, force: true });
  }
};
