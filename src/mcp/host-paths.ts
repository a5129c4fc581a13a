import { lstat, readdir, realpath } from "node:fs/promises";
import { homedir } from "node:os";
import { basename, dirname, isAbsolute, join, relative, resolve, sep } from "node:path";
import { PyroError, toPyroError } from "../errors.js";

/**
 * The host directories an MCP server lets tool arguments name (seed_path, source_path,
 * output_path). Over MCP a host path comes from a model, or from whatever reached it by
 * prompt injection, so it is confined; the CLI and SDK act for the user and are not.
 *
 * Rule: a path resolves (relative ones against `base`) to the real path of its deepest
 * existing ancestor, with the not-yet-existing rest appended, and that must lie inside
 * the real path of a root. Symlinks are allowed only while they stay inside a root: a
 * symlink (or symlinked parent) that leads out, or leads nowhere, is refused. What a tool
 * then uses is that real path, so the check and the use name the same file. Writes are
 * also refused inside any `.git` directory (hooks and config there run code on the host
 * the next time the user runs git).
 *
 * Nothing an MCP call can create on the host weakens this afterwards: exports may hold
 * only symlinks that stay inside their own tree (core/untrusted-tar.ts).
 */
export interface HostPathRoots {
  /** Directory that relative paths resolve against (the project directory). */
  base: string;
  /**
   * The project's directories: the base and the default seed's directory. Dropped when
   * one is the filesystem root or the home directory (hosts that start servers in / or
   * ~ would otherwise hand the model everything); --allow-host-path can still name them.
   */
  project: readonly (string | null | undefined)[];
  /** Directories allowed explicitly (`pyro mcp serve --allow-host-path DIR`). */
  allowed: readonly string[];
}

interface Root {
  /** As configured (for messages). */
  path: string;
  /** realpath of it: what containment is checked against. */
  real: string;
  origin: "project" | "--allow-host-path";
}

export type HostPathUse = "read" | "write";

export class HostPaths {
  private roots: Promise<Root[]> | undefined;

  constructor(private readonly config: HostPathRoots) {}

  /** The allowed roots, realpath'd once; a root that does not exist (any more) allows nothing. */
  private allowedRoots(): Promise<Root[]> {
    this.roots ??= (async () => {
      const home = await realpath(homedir()).catch(() => null);
      const wanted: { path: string; origin: Root["origin"] }[] = [
        ...this.config.project
          .filter((p): p is string => typeof p === "string" && p !== "")
          .map((p) => ({ path: resolve(p), origin: "project" as const })),
        ...this.config.allowed.map((p) => ({
          path: resolve(this.config.base, p),
          origin: "--allow-host-path" as const,
        })),
      ];
      const out: Root[] = [];
      for (const w of wanted) {
        const real = await realpath(w.path).catch(() => null);
        if (real === null) continue;
        if (w.origin === "project" && (real === "/" || real === home)) continue;
        if (!out.some((r) => r.real === real)) out.push({ ...w, real });
      }
      return out;
    })();
    return this.roots;
  }

  /** One line naming the allowed roots, for hints and logs. */
  async describe(): Promise<string> {
    const roots = await this.allowedRoots();
    if (roots.length === 0) return "none";
    return roots.map((r) => `${r.real} (${r.origin})`).join(", ");
  }

  /**
   * The real host path that `path` names, or a `path_outside_workspace` refusal (an
   * `invalid_argument` one for a NUL byte). Touches nothing but lstat/realpath/readdir.
   */
  async resolve(path: string, use: HostPathUse): Promise<string> {
    if (path.includes("\0"))
      throw new PyroError("invalid_argument", "a host path cannot contain a NUL byte", await this.hint());
    const abs = resolve(this.config.base, path);
    // The deepest ancestor that exists (lstat: a dangling symlink exists, and is refused below).
    let existing = abs;
    const rest: string[] = [];
    for (;;) {
      const st = await lstat(existing).catch((err: NodeJS.ErrnoException) => {
        if (err.code === "ENOENT" || err.code === "ENOTDIR") return null;
        throw toPyroError(err);
      });
      if (st) break;
      const parent = dirname(existing);
      if (parent === existing) break;
      rest.unshift(basename(existing));
      existing = parent;
    }
    const realExisting = await realpath(existing).catch(() => null);
    if (realExisting === null) {
      throw new PyroError(
        "path_outside_workspace",
        `host path '${path}' goes through a symlink that leads nowhere (${existing})`,
        await this.hint(),
      );
    }
    const real = join(realExisting, ...rest);
    const roots = await this.allowedRoots();
    const root = roots.find((r) => inside(r.real, real));
    if (!root) {
      const lexical = roots.some((r) => inside(r.path, abs) || inside(r.real, abs));
      throw new PyroError(
        "path_outside_workspace",
        lexical
          ? `host path '${path}' goes through a symlink that leads outside the directories this MCP server may use (it resolves to ${real})`
          : `host path '${path}' (${abs}) is outside the directories this MCP server may use`,
        await this.hint(),
      );
    }
    if (
      use === "write" &&
      relative(root.real, real)
        .split(sep)
        .some((c) => c.toLowerCase() === ".git")
    ) {
      throw new PyroError(
        "path_outside_workspace",
        `host path '${path}' is inside a .git directory, which MCP tools may not write`,
        await this.hint(),
      );
    }
    return real;
  }

  private async hint(): Promise<string> {
    const roots = await this.allowedRoots();
    const where =
      roots.length === 0
        ? "this MCP server allows no host paths"
        : `host paths must be inside ${roots.map((r) => r.real).join(" or ")}; relative paths resolve against ${this.config.base}`;
    return `${where}; the user can allow another directory by starting the server with --allow-host-path DIR`;
  }
}

/** `child` is `parent` or below it (both absolute, normalised). */
function inside(parent: string, child: string): boolean {
  const rel = relative(parent, child);
  return rel === "" || (!isAbsolute(rel) && rel !== ".." && !rel.startsWith(`..${sep}`));
}

/**
 * Refuses an export over an existing file or non-empty directory unless the call said
 * `overwrite: true`. (The core refuses a non-empty directory in any case, and replaces
 * a file; over MCP replacing must be asked for.)
 */
export async function refuseOverwrite(output: string, requested: string): Promise<void> {
  const st = await lstat(output).catch(() => null);
  if (!st) return;
  if (st.isDirectory() && (await readdir(output)).length === 0) return;
  throw new PyroError(
    "conflict",
    `output_path '${requested}' already exists on the host (${output})`,
    st.isDirectory()
      ? "a directory export needs a new or empty output_path"
      : "choose a new output_path, or pass overwrite: true to replace the file",
  );
}
