/**
 * `diff`: compares the workspace with a read-only baseline tree (an absolute path the
 * agent can see, outside the root) and renders a git-style unified diff that `git apply`
 * takes: binary files as Git binary patches, executable-bit changes as mode changes, a
 * file turned into a symlink (or back) as a deletion and an addition. Both trees are
 * walked without following symlinks; symlinks compare by target; directories appear
 * only through their contents (as in git).
 *
 * Like `git status`, the diff leaves out `.git` directories and the workspace's ignored
 * files: a path that only the workspace has is left out when the workspace's own
 * `.gitignore` rules (gitignore.ts) ignore it. A path the baseline has is always
 * compared (it was seeded, so it was tracked or not ignored then), as Git keeps
 * showing changes to tracked files that match an ignore pattern.
 */
import { isUtf8 } from "node:buffer";
import type { Stats } from "node:fs";
import { lstat, open, readdir, readFile, readlink, realpath, stat } from "node:fs/promises";
import path from "node:path";
import { createTwoFilesPatch, FILE_HEADERS_ONLY } from "diff";
import { AgentError } from "../../errors.js";
import { artifactType, type WalkEntry } from "../fsutil.js";
import { binaryBody } from "../gitbinary.js";
import { IgnoreScope } from "../gitignore.js";
import type { OpHandler } from "./context.js";

/** Largest patch text returned; beyond it the result says `truncated` (entries stay complete). */
export const MAX_DIFF_PATCH_BYTES = 16 * 1024 * 1024;

/**
 * Largest file whose content a diff reads whole (to render it): a bigger one could never
 * fit the patch, and reading it whole took the agent past the workspace's memory limit
 * (a 1.9 GiB sparse file killed the sandbox; past 2 GiB Node refuses to read it at all).
 * Bigger files are compared in chunks and rendered as "Binary files ... differ".
 */
export const MAX_DIFF_FILE_BYTES = MAX_DIFF_PATCH_BYTES;
const CHUNK = 1024 * 1024;

const tooBig = (e: WalkEntry | undefined) =>
  e !== undefined && e.stat.isFile() && e.stat.size > MAX_DIFF_FILE_BYTES;

/** Whether two files of the same size hold the same bytes, read a chunk at a time. */
async function sameBytes(a: string, b: string): Promise<boolean> {
  const [fa, fb] = await Promise.all([open(a, "r"), open(b, "r")]);
  try {
    const ba = Buffer.alloc(CHUNK);
    const bb = Buffer.alloc(CHUNK);
    for (let pos = 0; ; pos += CHUNK) {
      const [ra, rb] = await Promise.all([fa.read(ba, 0, CHUNK, pos), fb.read(bb, 0, CHUNK, pos)]);
      if (ra.bytesRead !== rb.bytesRead || !ba.subarray(0, ra.bytesRead).equals(bb.subarray(0, rb.bytesRead)))
        return false;
      if (ra.bytesRead === 0) return true;
    }
  } finally {
    await Promise.all([fa.close(), fb.close()]);
  }
}

type Status = "added" | "modified" | "deleted";

/** What a tree node contributes to a diff: its bytes (file content or link target). */
async function contentOf(e: WalkEntry): Promise<Buffer | null> {
  if (e.stat.isFile()) return readFile(e.abs);
  if (e.stat.isSymbolicLink()) return Buffer.from(await readlink(e.abs));
  return null;
}

function gitMode(st: Stats): string {
  if (st.isSymbolicLink()) return "120000";
  return st.mode & 0o100 ? "100755" : "100644";
}

async function same(a: WalkEntry, b: WalkEntry): Promise<boolean> {
  const ta = artifactType(a.stat);
  if (ta !== artifactType(b.stat)) return false;
  if (ta === "other") return (a.stat.mode & 0o170000) === (b.stat.mode & 0o170000);
  if (ta === "file" && (a.stat.size !== b.stat.size || gitMode(a.stat) !== gitMode(b.stat))) return false;
  if (ta === "file" && tooBig(a)) return sameBytes(a.abs, b.abs);
  const [ca, cb] = await Promise.all([contentOf(a), contentOf(b)]);
  return ca !== null && cb !== null && ca.equals(cb);
}

/** One `diff --git` block: `old` → `cur` of the same kind (or one side absent). */
async function renderSide(
  rel: string,
  old: WalkEntry | undefined,
  cur: WalkEntry | undefined,
): Promise<string> {
  const oldLabel = old ? `a/${rel}` : "/dev/null";
  const newLabel = cur ? `b/${rel}` : "/dev/null";
  let head = `diff --git a/${rel} b/${rel}\n`;
  if (!old && cur) head += `new file mode ${gitMode(cur.stat)}\n`;
  if (old && !cur) head += `deleted file mode ${gitMode(old.stat)}\n`;
  const modeChanged = old && cur && gitMode(old.stat) !== gitMode(cur.stat);
  if (modeChanged) head += `old mode ${gitMode(old.stat)}\nnew mode ${gitMode(cur.stat)}\n`;
  if (tooBig(old) || tooBig(cur)) {
    const sameContent = old && cur && old.stat.size === cur.stat.size && (await sameBytes(old.abs, cur.abs));
    return sameContent ? head : `${head}Binary files ${oldLabel} and ${newLabel} differ\n`;
  }
  const [before, after] = await Promise.all([old ? contentOf(old) : null, cur ? contentOf(cur) : null]);
  if ((old && before === null) || (cur && after === null)) {
    return `${head}Binary files ${oldLabel} and ${newLabel} differ\n`;
  }
  if (before?.equals(after ?? Buffer.alloc(0)) && old && cur) return head; // mode only
  if ((before && !isUtf8(before)) || (after && !isUtf8(after))) {
    return head + binaryBody(before, after, old && cur && !modeChanged ? gitMode(cur.stat) : null);
  }
  const body = createTwoFilesPatch(
    oldLabel,
    newLabel,
    (before ?? Buffer.alloc(0)).toString("utf8"),
    (after ?? Buffer.alloc(0)).toString("utf8"),
    undefined,
    undefined,
    { headerOptions: FILE_HEADERS_ONLY },
  );
  // An empty file added or removed has no hunk: Git writes the header lines alone.
  return body.includes("\n@@ ") ? head + body : head;
}

async function renderOne(
  rel: string,
  old: WalkEntry | undefined,
  cur: WalkEntry | undefined,
): Promise<string> {
  // A kind change (file <-> symlink) is, for Git, a deletion and an addition.
  if (old && cur && artifactType(old.stat) !== artifactType(cur.stat)) {
    return (await renderSide(rel, old, undefined)) + (await renderSide(rel, undefined, cur));
  }
  return renderSide(rel, old, cur);
}

/**
 * Non-directory nodes under `dir`, keyed by relative path, without `.git` directories.
 * With `scope`, a path is left out when ignored, unless `keep` (the baseline) has it;
 * an ignored directory is entered only when the baseline has something under it.
 */
async function nodes(
  dir: string,
  out: Map<string, WalkEntry>,
  scope?: IgnoreScope,
  keep?: { files: Map<string, WalkEntry>; dirs: Set<string> },
  prefix = "",
  ignoredAbove = false,
): Promise<Map<string, WalkEntry>> {
  const names = (await readdir(path.join(dir, prefix))).sort();
  for (const name of names) {
    if (name === ".git") continue;
    const rel = prefix ? `${prefix}/${name}` : name;
    const abs = path.join(dir, rel);
    const st = await lstat(abs).catch((err: NodeJS.ErrnoException) => {
      // Removed between readdir and lstat by something running in the workspace.
      if (err.code === "ENOENT") return null;
      throw err;
    });
    if (!st) continue;
    const isDir = st.isDirectory();
    const ignored = ignoredAbove || (scope?.ignored(rel, isDir) ?? false);
    if (isDir) {
      if (ignored && keep && !keep.dirs.has(rel)) continue;
      const inner = scope && !ignored ? await scope.enter(rel) : scope;
      await nodes(dir, out, inner, keep, rel, ignored);
    } else if (!ignored || keep?.files.has(rel)) {
      out.set(rel, { rel, abs, stat: st });
    }
  }
  return out;
}

/** The directories that hold `files`' paths. */
function dirsOf(files: Map<string, WalkEntry>): Set<string> {
  const dirs = new Set<string>();
  for (const rel of files.keys()) {
    for (let d = path.posix.dirname(rel); d !== "."; d = path.posix.dirname(d)) {
      if (dirs.has(d)) break;
      dirs.add(d);
    }
  }
  return dirs;
}

export const diff: OpHandler<"diff"> = async (args, ctx) => {
  const { workspace } = ctx;
  if (!path.isAbsolute(args.base)) throw new AgentError("invalid_argument", "base must be an absolute path");
  let base: string;
  try {
    base = await realpath(args.base);
  } catch {
    throw new AgentError("not_found", `baseline not found: ${args.base}`);
  }
  if (!(await stat(base)).isDirectory())
    throw new AgentError("invalid_argument", `baseline is not a directory: ${args.base}`);
  const root = workspace.root;
  if (workspace.contains(base) || root.startsWith(`${base}/`) || base === "/") {
    throw new AgentError("invalid_argument", "the baseline and the workspace must not contain each other");
  }

  const before = await nodes(base, new Map());
  const after = await nodes(root, new Map(), await IgnoreScope.forRoot(root), {
    files: before,
    dirs: dirsOf(before),
  });
  const paths = [...new Set([...before.keys(), ...after.keys()])].sort((a, b) =>
    a < b ? -1 : a > b ? 1 : 0,
  );
  const entries: { path: string; status: Status }[] = [];
  const parts: string[] = [];
  let size = 0;
  let truncated = false;
  for (const rel of paths) {
    if (ctx.signal.aborted) throw new AgentError("cancelled", "the diff was cancelled");
    const old = before.get(rel);
    const cur = after.get(rel);
    let status: Status;
    if (!old) status = "added";
    else if (!cur) status = "deleted";
    else if (await same(old, cur)) continue;
    else status = "modified";
    entries.push({ path: rel, status });
    if (truncated || !args.patch) continue;
    const text = await renderOne(rel, old, cur);
    if (size + text.length > MAX_DIFF_PATCH_BYTES) {
      truncated = true;
      continue;
    }
    parts.push(text);
    size += text.length;
  }
  const count = (s: Status) => entries.filter((e) => e.status === s).length;
  return {
    changed: entries.length > 0,
    patch: parts.join(""),
    summary: {
      total: entries.length,
      added: count("added"),
      modified: count("modified"),
      deleted: count("deleted"),
    },
    entries,
    truncated,
  };
};
