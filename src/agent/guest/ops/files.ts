/** `file_list`, `file_read` and `file_write`: structured file access inside the root. */
import { constants, isUtf8 } from "node:buffer";
import { constants as fsConstants } from "node:fs";
import type { FileHandle } from "node:fs/promises";
import { open, readlink } from "node:fs/promises";
import { AgentError } from "../../errors.js";
import { DEFAULT_INLINE_READ_BYTES, MAX_INLINE_READ_BYTES } from "../../op-schemas.js";
import { artifactType, atomicWrite, ensureParent, type WalkEntry, walk } from "../fsutil.js";
import { outsideError, type ResolvedPath, Workspace } from "../paths.js";
import type { OpHandler } from "./context.js";

/** Most entries one `file_list` returns; beyond it the result says `truncated`. */
export const MAX_LIST_ENTRIES = 50_000;

const STREAM_CHUNK = 256 * 1024;
const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/** Sorted by code unit, so the order does not depend on the agent's locale. */
function byPath(a: { path: string }, b: { path: string }): number {
  return a.path < b.path ? -1 : a.path > b.path ? 1 : 0;
}

export const fileList: OpHandler<"file_list"> = async (args, ctx) => {
  const target = await ctx.workspace.resolve(args.path);
  if (!target.stat) throw new AgentError("not_found", `no such file or directory: ${args.path}`);
  const found: WalkEntry[] = [];
  let truncated = false;
  if (target.stat.isDirectory()) {
    truncated = await walk(target.real, found, args.recursive, MAX_LIST_ENTRIES);
  } else {
    found.push({ rel: "", abs: target.real, stat: target.stat });
  }
  const base = target.rel;
  const entries = await Promise.all(
    found.map(async (e) => {
      const rel = e.rel === "" ? base : base === "" ? e.rel : `${base}/${e.rel}`;
      const type = artifactType(e.stat);
      return {
        path: Workspace.show(rel),
        artifact_type: type,
        size_bytes: type === "file" || type === "symlink" ? e.stat.size : 0,
        link_target: type === "symlink" ? await readlink(e.abs) : null,
      };
    }),
  );
  entries.sort(byPath);
  return { path: Workspace.show(base), entries, truncated };
};

/**
 * Opens a contained regular file for reading without following a symlink swapped in
 * after the check, and re-checks the hard-link rule on the open descriptor.
 */
async function openContained(target: ResolvedPath, arg: string): Promise<FileHandle> {
  if (!target.stat) throw new AgentError("not_found", `no such file: ${arg}`);
  if (target.stat.isDirectory())
    throw new AgentError("invalid_argument", `'${arg}' is a directory; use file_list`);
  if (!target.stat.isFile()) throw new AgentError("invalid_argument", `'${arg}' is not a regular file`);
  const handle = await open(target.real, fsConstants.O_RDONLY | fsConstants.O_NOFOLLOW);
  const st = await handle.stat();
  if (!st.isFile() || st.nlink > 1) {
    await handle.close();
    throw outsideError(arg, "it changed into a hard link or special file while being opened");
  }
  return handle;
}

/** Reads up to `limit` bytes; `more` tells whether the file had more. */
async function readPrefix(handle: FileHandle, limit: number): Promise<{ bytes: Buffer; more: boolean }> {
  // One byte past the limit tells truncation apart from a file that is exactly `limit` long.
  const buf = Buffer.alloc(Math.min(limit + 1, constants.MAX_LENGTH));
  let filled = 0;
  while (filled < buf.length) {
    const { bytesRead } = await handle.read(buf, filled, buf.length - filled, null);
    if (bytesRead === 0) break;
    filled += bytesRead;
  }
  return { bytes: buf.subarray(0, Math.min(filled, limit)), more: filled > limit };
}

/**
 * Whether `bytes` is UTF-8 text; a prefix cut inside a multi-byte character still
 * counts (the cut bytes are dropped, the result says truncated anyway).
 */
function asUtf8(bytes: Buffer, cut: boolean): string | null {
  if (isUtf8(bytes)) return bytes.toString("utf8");
  if (!cut) return null;
  for (let drop = 1; drop <= 3 && drop < bytes.length; drop++) {
    const head = bytes.subarray(0, bytes.length - drop);
    if (isUtf8(head)) return head.toString("utf8");
  }
  return null;
}

export const fileRead: OpHandler<"file_read"> = async (args, ctx) => {
  const target = await ctx.workspace.resolve(args.path);
  const handle = await openContained(target, args.path);
  try {
    const size = (await handle.stat()).size;
    const shown = Workspace.show(target.rel);
    if (args.stream) {
      const limit = args.max_bytes ?? Number.POSITIVE_INFINITY;
      let sent = 0;
      await ctx.send(Buffer.alloc(0));
      const buf = Buffer.alloc(STREAM_CHUNK);
      while (sent < limit) {
        if (ctx.signal.aborted) throw new AgentError("cancelled", "the read was cancelled");
        const want = Math.min(buf.length, limit - sent);
        const { bytesRead } = await handle.read(buf, 0, want, null);
        if (bytesRead === 0) break;
        // Copy: the buffer is reused for the next read while this chunk may still be queued.
        await ctx.send(Buffer.from(buf.subarray(0, bytesRead)));
        sent += bytesRead;
      }
      return { path: shown, content: "", encoding: "stream", size_bytes: size, truncated: sent < size };
    }
    const limit = args.max_bytes ?? DEFAULT_INLINE_READ_BYTES;
    if (limit > MAX_INLINE_READ_BYTES) {
      throw new AgentError(
        "invalid_argument",
        `max_bytes ${limit} exceeds ${MAX_INLINE_READ_BYTES} for an inline read`,
        "pass stream: true to read large files as a stream",
      );
    }
    const { bytes, more } = await readPrefix(handle, limit);
    const text = asUtf8(bytes, more);
    return {
      path: shown,
      content: text ?? bytes.toString("base64"),
      encoding: text === null ? "base64" : "utf8",
      size_bytes: size,
      truncated: more,
    };
  } finally {
    await handle.close();
  }
};

export const fileWrite: OpHandler<"file_write"> = async (args, ctx) => {
  let data: Buffer;
  if (args.encoding === "base64") {
    if (!BASE64.test(args.content)) throw new AgentError("invalid_argument", "content is not valid base64");
    data = Buffer.from(args.content, "base64");
  } else {
    data = Buffer.from(args.content, "utf8");
  }
  const target = await ctx.workspace.resolve(args.path);
  let mode: number | undefined;
  if (target.stat) {
    if (target.stat.isDirectory()) throw new AgentError("invalid_argument", `'${args.path}' is a directory`);
    if (!target.stat.isFile())
      throw new AgentError("invalid_argument", `'${args.path}' is not a regular file`);
    mode = target.stat.mode & 0o7777;
  } else {
    await ensureParent(target.real);
  }
  await atomicWrite(target.real, data, mode);
  return { path: Workspace.show(target.rel), size_bytes: data.length, created: target.stat === null };
};
