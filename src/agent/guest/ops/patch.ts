/**
 * `patch_apply`: applies a multi-file patch (a unified diff, with or without hunk line
 * numbers, or the `*** Begin Patch` envelope; see ../patch/) all-or-nothing. Every new
 * content is computed in memory and every path checked for containment before the
 * first write; writes are then staged next to their targets and only renamed into
 * place once all of them are staged. Files whose bytes (and mode) end up as they were
 * are neither written nor reported.
 */
import { isUtf8 } from "node:buffer";
import { mkdir, readFile, rm } from "node:fs/promises";
import path from "node:path";
import { AgentError } from "../../errors.js";
import { type StagedWrite, stageWrite } from "../fsutil.js";
import { applyHunks, HunkFailure } from "../patch/apply.js";
import { type FilePatch, parsePatchText } from "../patch/parse.js";
import { type ResolvedPath, Workspace } from "../paths.js";
import type { OpHandler } from "./context.js";

type Status = "added" | "modified" | "deleted";

/** What the patch does to one path, accumulated over every file patch that names it. */
interface Plan {
  target: ResolvedPath;
  /** Content before the patch; null when the file did not exist. */
  original: string | null;
  originalMode: number;
  /** Content after the patch; null means the file is deleted (or still absent). */
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

function statusOf(plan: Plan): Status | null {
  if (plan.original === null) return plan.content === null ? null : "added";
  if (plan.content === null) return "deleted";
  return plan.content !== plan.original || plan.mode !== plan.originalMode ? "modified" : null;
}

/** A file patch that changes nothing by construction is a malformed patch, not a success. */
function checkShape(fp: FilePatch, shown: string): void {
  for (const [k, h] of fp.hunks.entries())
    if (h.lines.length === 0)
      throw new AgentError("invalid_argument", `hunk ${k + 1} of ${shown} (${h.header}) has no lines`);
  const plainEdit = fp.oldName !== null && fp.oldName === fp.newName && fp.newMode === null;
  if (plainEdit && fp.hunks.length === 0)
    throw new AgentError(
      "invalid_argument",
      `the patch for ${shown} has no hunks`,
      "each change is a hunk: a line starting with @@, then lines starting with ' ', '-' or '+'",
    );
}

export const patchApply: OpHandler<"patch_apply"> = async (args, ctx) => {
  if (args.patch.trim() === "") throw new AgentError("invalid_argument", "the patch is empty");
  const filePatches = parsePatchText(args.patch);
  if (filePatches.length === 0)
    throw new AgentError(
      "invalid_argument",
      "the patch contains no file changes",
      "pass a unified diff (--- a/PATH, +++ b/PATH, @@ hunks) or a *** Begin Patch envelope",
    );
  // Every file patch is planned in memory first; nothing is written unless all apply.
  const plans = new Plans(ctx.workspace);
  for (const fp of filePatches) await plans.apply(fp);
  const files = plans.changes();
  await plans.write();
  return { changed: files.length > 0, files };
};

/** The planned content of every path the patch touches, in the order first touched. */
class Plans {
  private readonly plans = new Map<string, Plan>();
  private readonly order: string[] = [];

  constructor(private readonly workspace: Workspace) {}

  /**
   * Current state of a path: the plan's content if an earlier file patch touched it,
   * otherwise what is on disk (after containment checks).
   */
  private async load(name: string): Promise<Plan> {
    const rel = this.workspace.relative(name);
    const known = this.plans.get(rel);
    if (known) return known;
    const target = await this.workspace.resolve(name);
    let content: string | null = null;
    let mode = 0o644;
    if (target.stat) {
      if (!target.stat.isFile()) throw rejected(`${Workspace.show(rel)} is not a regular file`);
      const bytes = await readFile(target.real);
      if (!isUtf8(bytes)) throw rejected(`${Workspace.show(rel)} is not a UTF-8 text file`);
      content = bytes.toString("utf8");
      mode = target.stat.mode & 0o7777;
    }
    const plan: Plan = { target, original: content, originalMode: mode, content, mode };
    this.plans.set(rel, plan);
    this.order.push(rel);
    return plan;
  }

  /** Plans one file patch (create, update, delete, rename or copy); rejects it exactly. */
  async apply(fp: FilePatch): Promise<void> {
    const { oldName, newName } = fp;
    const name = (newName ?? oldName)!;
    const shown = Workspace.show(this.workspace.relative(name));
    if (fp.binary) throw rejected(`binary patches are not supported (${shown})`);
    const source = oldName === null ? null : await this.load(oldName);
    const dest = newName === null ? null : await this.load(newName);
    // Hunks are written against the old file: name it in their errors.
    const hunkFile = Workspace.show(this.workspace.relative(oldName ?? name));
    checkShape(fp, hunkFile);
    if (oldName === null && dest!.content !== null) throw rejected(`${shown} already exists`);
    if (source && source.content === null) throw rejected(`${hunkFile} does not exist`);
    let after: string;
    try {
      after = applyHunks(source?.content ?? "", fp.hunks);
    } catch (err) {
      if (!(err instanceof HunkFailure)) throw err;
      throw rejected(`hunk ${err.index} of ${hunkFile} (${err.hunk.header}) does not apply: ${err.why}`);
    }
    if (newName === null) {
      if (fp.hunks.length > 0 && after !== "")
        throw rejected(`the deletion of ${shown} does not remove all of its content`);
      source!.content = null;
      return;
    }
    // A rename (different old and new names) deletes the old path; a copy keeps it.
    if (source && source !== dest) {
      if (dest!.content !== null) throw rejected(`${shown} already exists`);
      if (!fp.copy) source.content = null;
      dest!.mode = source.mode;
    }
    dest!.content = after;
    if (fp.newMode !== null) dest!.mode = fp.newMode;
  }

  /** What changed, by bytes and mode (an unchanged plan is not a change). */
  changes(): { path: string; status: Status }[] {
    const files: { path: string; status: Status }[] = [];
    for (const rel of this.order) {
      const status = statusOf(this.plans.get(rel)!);
      if (status) files.push({ path: Workspace.show(rel), status });
    }
    return files;
  }

  /** Stages every write; on any failure removes what was staged and the directories made. */
  async write(): Promise<void> {
    const staged: StagedWrite[] = [];
    const madeDirs: string[] = [];
    try {
      for (const rel of this.order) {
        const plan = this.plans.get(rel)!;
        const status = statusOf(plan);
        if (plan.content === null || (status !== "added" && status !== "modified")) continue;
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
    for (const rel of this.order) {
      const plan = this.plans.get(rel)!;
      if (statusOf(plan) === "deleted") await rm(plan.target.real, { force: true });
    }
  }
}
