/**
 * `patch_apply`: applies a multi-file unified diff all-or-nothing. Every new content
 * is computed in memory and every path checked for containment before the first
 * write; writes are then staged next to their targets and only renamed into place
 * once all of them are staged.
 */
import { isUtf8 } from "node:buffer";
import { mkdir, readFile, rm } from "node:fs/promises";
import path from "node:path";
import { applyPatch, parsePatch, type StructuredPatch } from "diff";
import { AgentError } from "../../errors.js";
import { type StagedWrite, stageWrite } from "../fsutil.js";
import { type ResolvedPath, Workspace } from "../paths.js";
import type { OpHandler } from "./context.js";

type Status = "added" | "modified" | "deleted";

/** What the patch does to one path, accumulated over every file patch that names it. */
interface Plan {
  target: ResolvedPath;
  /** Existed before the patch. */
  existed: boolean;
  /** Content after the patch; null means the file is deleted. */
  content: string | null;
  mode: number;
}

function rejected(message: string): AgentError {
  return new AgentError(
    "patch_rejected",
    message,
    "nothing was changed; re-read the files and regenerate the patch",
  );
}

/**
 * Strips git's `a/` and `b/` prefixes when the patch uses them (git header, or every
 * name carrying its prefix); plain `--- x` / `+++ x` names are kept. `/dev/null` → null.
 */
function fileNames(fp: StructuredPatch): { oldName: string | null; newName: string | null } {
  const raw = (n: string | undefined) => (n === undefined || n === "/dev/null" ? null : n);
  const oldRaw = raw(fp.oldFileName);
  const newRaw = raw(fp.newFileName);
  const prefixed =
    (oldRaw === null || oldRaw.startsWith("a/")) && (newRaw === null || newRaw.startsWith("b/"));
  const strip = fp.isGit || prefixed;
  return {
    oldName: oldRaw !== null && strip && oldRaw.startsWith("a/") ? oldRaw.slice(2) : oldRaw,
    newName: newRaw !== null && strip && newRaw.startsWith("b/") ? newRaw.slice(2) : newRaw,
  };
}

/** Applies hunk prefixes until one fails, to name the first hunk that does not apply. */
function failingHunk(source: string, fp: StructuredPatch): number {
  for (let k = 1; k <= fp.hunks.length; k++) {
    if (applyPatch(source, { ...fp, hunks: fp.hunks.slice(0, k) }) === false) return k;
  }
  return fp.hunks.length;
}

function hunkHeader(fp: StructuredPatch, index: number): string {
  const h = fp.hunks[index - 1];
  return h ? `@@ -${h.oldStart},${h.oldLines} +${h.newStart},${h.newLines} @@` : "@@ ? @@";
}

export const patchApply: OpHandler<"patch_apply"> = async (args, ctx) => {
  const { workspace } = ctx;
  if (args.patch.trim() === "") throw new AgentError("invalid_argument", "the patch is empty");
  let parsed: StructuredPatch[];
  try {
    parsed = parsePatch(args.patch);
  } catch (err) {
    throw new AgentError("invalid_argument", `the patch could not be parsed: ${(err as Error).message}`);
  }
  const filePatches = parsed.filter((fp) => fp.hunks.length > 0 || fp.oldFileName || fp.newFileName);
  if (filePatches.length === 0)
    throw new AgentError("invalid_argument", "the patch contains no file changes");

  const plans = new Map<string, Plan>();
  const order: string[] = [];

  // Current state of a path: the plan's content if an earlier file patch touched it,
  // otherwise what is on disk (after containment checks).
  async function load(name: string): Promise<Plan> {
    const rel = workspace.relative(name);
    const known = plans.get(rel);
    if (known) return known;
    const target = await workspace.resolve(name);
    let content: string | null = null;
    let mode = 0o644;
    if (target.stat) {
      if (!target.stat.isFile()) throw rejected(`${Workspace.show(rel)} is not a regular file`);
      const bytes = await readFile(target.real);
      if (!isUtf8(bytes)) throw rejected(`${Workspace.show(rel)} is not a UTF-8 text file`);
      content = bytes.toString("utf8");
      mode = target.stat.mode & 0o7777;
    }
    const plan: Plan = { target, existed: target.stat !== null, content, mode };
    plans.set(rel, plan);
    order.push(rel);
    return plan;
  }

  for (const fp of filePatches) {
    if (fp.isBinary) throw rejected(`binary patches are not supported (${fp.newFileName ?? fp.oldFileName})`);
    const { oldName, newName } = fileNames(fp);
    const name = newName ?? oldName;
    if (name === null)
      throw new AgentError("invalid_argument", "a file patch names neither an old nor a new file");
    const source = oldName === null ? null : await load(oldName);
    const dest = newName === null ? null : await load(newName);
    const shown = Workspace.show(workspace.relative(name));
    if (oldName === null && dest!.content !== null) throw rejected(`${shown} already exists`);
    if (oldName !== null && source!.content === null) throw rejected(`${shown} does not exist`);
    const before = source?.content ?? "";
    const after = applyPatch(before, fp);
    if (after === false) {
      const k = failingHunk(before, fp);
      throw rejected(`hunk ${k} of ${shown} (${hunkHeader(fp, k)}) does not apply`);
    }
    if (newName === null) {
      if (after !== "") throw rejected(`the deletion of ${shown} does not remove all of its content`);
      source!.content = null;
      continue;
    }
    // A rename (different old and new names) deletes the old path.
    if (source && source !== dest) {
      if (dest!.content !== null) throw rejected(`${shown} already exists`);
      source.content = null;
    }
    dest!.content = after;
    if (fp.newMode && /^[0-7]+$/.test(fp.newMode)) dest!.mode = Number.parseInt(fp.newMode, 8) & 0o777;
  }

  const files: { path: string; status: Status }[] = [];
  for (const rel of order) {
    const plan = plans.get(rel)!;
    if (!plan.existed && plan.content === null) continue;
    files.push({
      path: Workspace.show(rel),
      status: !plan.existed ? "added" : plan.content === null ? "deleted" : "modified",
    });
  }

  // Stage every write; on any failure remove what was staged and the directories made.
  const staged: StagedWrite[] = [];
  const madeDirs: string[] = [];
  try {
    for (const rel of order) {
      const plan = plans.get(rel)!;
      if (plan.content === null) continue;
      const made = await mkdir(path.dirname(plan.target.real), { recursive: true });
      if (made) madeDirs.push(made);
      staged.push(await stageWrite(plan.target.real, Buffer.from(plan.content, "utf8"), plan.mode));
    }
  } catch (err) {
    await Promise.all(staged.map((s) => s.discard()));
    for (const dir of madeDirs.reverse()) await rm(dir, { recursive: true, force: true });
    throw err;
  }
  for (const s of staged) await s.commit();
  for (const rel of order) {
    const plan = plans.get(rel)!;
    if (plan.existed && plan.content === null) await rm(plan.target.real, { force: true });
  }
  return { changed: files.length > 0, files };
};
