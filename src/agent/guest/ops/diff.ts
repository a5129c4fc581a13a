/**
 * `diff`: compares the workspace with a read-only baseline tree (an absolute path the
 * agent can see, outside the root) and renders a git-style unified diff. Both trees
 * are walked without following symlinks; symlinks compare by target; mode changes
 * are ignored; directories appear only through their contents (as in git).
 */
import { isUtf8 } from "node:buffer";
import type { Stats } from "node:fs";
import { readFile, readlink, realpath, stat } from "node:fs/promises";
import path from "node:path";
import { createTwoFilesPatch, FILE_HEADERS_ONLY } from "diff";
import { AgentError } from "../../errors.js";
import { artifactType, type WalkEntry, walk } from "../fsutil.js";
import type { OpHandler } from "./context.js";

/** Largest patch text returned; beyond it the result says `truncated` (entries stay complete). */
export const MAX_DIFF_PATCH_BYTES = 16 * 1024 * 1024;

type Status = "added" | "modified" | "deleted";

/** What a tree node contributes to a diff: its bytes (file content or link target). */
async function contentOf(e: WalkEntry): Promise<Buffer | null> {
  if (e.stat.isFile()) return readFile(e.abs);
  if (e.stat.isSymbolicLink()) return Buffer.from(await readlink(e.abs));
  return null;
}

function gitMode(st: Stats): string {
  if (st.isSymbolicLink()) return "120000";
  return st.mode & 0o111 ? "100755" : "100644";
}

async function same(a: WalkEntry, b: WalkEntry): Promise<boolean> {
  const ta = artifactType(a.stat);
  if (ta !== artifactType(b.stat)) return false;
  if (ta === "other") return (a.stat.mode & 0o170000) === (b.stat.mode & 0o170000);
  if (ta === "file" && a.stat.size !== b.stat.size) return false;
  const [ca, cb] = await Promise.all([contentOf(a), contentOf(b)]);
  return ca !== null && cb !== null && ca.equals(cb);
}

async function renderOne(
  rel: string,
  old: WalkEntry | undefined,
  cur: WalkEntry | undefined,
): Promise<string> {
  const oldLabel = old ? `a/${rel}` : "/dev/null";
  const newLabel = cur ? `b/${rel}` : "/dev/null";
  let head = `diff --git a/${rel} b/${rel}\n`;
  if (!old && cur) head += `new file mode ${gitMode(cur.stat)}\n`;
  if (old && !cur) head += `deleted file mode ${gitMode(old.stat)}\n`;
  const [before, after] = await Promise.all([
    old ? contentOf(old) : Buffer.alloc(0),
    cur ? contentOf(cur) : Buffer.alloc(0),
  ]);
  if (before === null || after === null || !isUtf8(before) || !isUtf8(after)) {
    return `${head}Binary files ${oldLabel} and ${newLabel} differ\n`;
  }
  const body = createTwoFilesPatch(
    oldLabel,
    newLabel,
    before.toString("utf8"),
    after.toString("utf8"),
    undefined,
    undefined,
    {
      headerOptions: FILE_HEADERS_ONLY,
    },
  );
  return head + body;
}

/** Non-directory nodes of a tree, keyed by relative path. */
async function nodes(dir: string): Promise<Map<string, WalkEntry>> {
  const all: WalkEntry[] = [];
  await walk(dir, all);
  return new Map(all.filter((e) => !e.stat.isDirectory()).map((e) => [e.rel, e]));
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

  const [before, after] = await Promise.all([nodes(base), nodes(root)]);
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
    if (truncated) continue;
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
