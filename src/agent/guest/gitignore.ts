/**
 * `.gitignore` rules of a workspace, evaluated the way Git does for untracked files: each
 * directory's `.gitignore` applies to the paths below it, a deeper file's last matching
 * pattern wins over a shallower one (`!pattern` re-includes), `.git/info/exclude` sits
 * under the root file, and nothing inside an ignored directory can be re-included.
 * Matching is the `ignore` package (the matcher eslint and prettier use); the rules are
 * read from the workspace itself, so an agent that edits a `.gitignore` sees the effect
 * at the next diff.
 */
import { lstat, readFile } from "node:fs/promises";
import path from "node:path";
import ignore, { type Ignore } from "ignore";

/** A `.gitignore` larger than this is not read (Git itself has no limit; a guard). */
const MAX_IGNORE_FILE_BYTES = 1024 * 1024;

interface Level {
  /** Directory of the rules, relative to the root ("" for the root). */
  dir: string;
  rules: Ignore;
}

async function readRules(file: string): Promise<Ignore | null> {
  const st = await lstat(file).catch(() => null);
  // Git does not follow a symlinked .gitignore in the work tree either.
  if (!st?.isFile() || st.size > MAX_IGNORE_FILE_BYTES) return null;
  const text = await readFile(file, "utf8").catch(() => null);
  return text === null ? null : ignore({ allowRelativePaths: true }).add(text);
}

/** The rules in force in one directory: its own `.gitignore` on top of its parents'. */
export class IgnoreScope {
  private constructor(
    private readonly root: string,
    private readonly levels: readonly Level[],
  ) {}

  /** The rules at the root: `.git/info/exclude`, then the root `.gitignore`. */
  static async forRoot(root: string): Promise<IgnoreScope> {
    const levels: Level[] = [];
    const exclude = await readRules(path.join(root, ".git", "info", "exclude"));
    if (exclude) levels.push({ dir: "", rules: exclude });
    const top = await readRules(path.join(root, ".gitignore"));
    if (top) levels.push({ dir: "", rules: top });
    return new IgnoreScope(root, levels);
  }

  /** The scope of the subdirectory `rel` (relative to the root) of this scope's directory. */
  async enter(rel: string): Promise<IgnoreScope> {
    const rules = await readRules(path.join(this.root, rel, ".gitignore"));
    return rules ? new IgnoreScope(this.root, [...this.levels, { dir: rel, rules }]) : this;
  }

  /** Whether `rel` (a path relative to the root, in this scope's directory) is ignored. */
  ignored(rel: string, isDir: boolean): boolean {
    for (let i = this.levels.length - 1; i >= 0; i--) {
      const level = this.levels[i]!;
      const sub = level.dir === "" ? rel : rel.slice(level.dir.length + 1);
      const r = level.rules.test(isDir ? `${sub}/` : sub);
      if (r.ignored) return true;
      if (r.unignored) return false;
    }
    return false;
  }
}
