/**
 * Containment: every path an op receives goes through {@link Workspace.resolve}, which
 * refuses (with `path_outside_workspace`, before anything is touched) whatever leads out
 * of the workspace root: `..` escapes, absolute paths elsewhere, symlinks whose
 * resolution leaves the root, and regular files with more than one hard link.
 *
 * Symlinks are resolved here component by component rather than with realpath(),
 * because writes need the resolution of paths whose tail does not exist yet (a new
 * file under a symlinked directory must land where the kernel would put it).
 */

import type { Stats } from "node:fs";
import { lstat, readlink, realpath, stat } from "node:fs/promises";
import path from "node:path";
import { AgentError, toAgentError } from "../errors.js";

const posix = path.posix;
// Linux gives up after 40 symlinks in one resolution; so do we.
const MAX_SYMLINK_HOPS = 40;

/** A path argument after containment checks. */
export interface ResolvedPath {
  /** Normalised path relative to the root ("" is the root itself); what results report. */
  rel: string;
  /** Where the path leads once every symlink is followed; always inside the root. */
  real: string;
  /** lstat of `real`, or null when it does not exist yet. */
  stat: Stats | null;
}

/** Error for anything that leaves the root. */
export function outsideError(arg: string, why: string): AgentError {
  return new AgentError(
    "path_outside_workspace",
    `path '${arg}' is outside the workspace: ${why}`,
    "use a path relative to the workspace, or an absolute path under it; symlinks and hard links that lead outside are refused",
  );
}

/** The workspace root as seen by the agent, and the containment rules around it. */
export class Workspace {
  private constructor(
    /** The root as given (e.g. /workspace); absolute arguments are relative to it. */
    readonly givenRoot: string,
    /** The root with symlinks resolved; every resolved path lies under it. */
    readonly root: string,
    /**
     * Another absolute name for the root (host-compat runs the agent on a host directory
     * while users keep saying `/workspace/...`).
     */
    readonly alias: string | null = null,
  ) {}

  /** Opens a root directory (it must exist). */
  static async open(root: string, alias?: string): Promise<Workspace> {
    if (!path.isAbsolute(root)) throw new AgentError("invalid_argument", `root must be absolute: ${root}`);
    const real = await realpath(root);
    if (!(await stat(real)).isDirectory())
      throw new AgentError("invalid_argument", `root is not a directory: ${root}`);
    const clean = (p: string) => posix.normalize(p).replace(/(.)\/+$/, "$1");
    return new Workspace(clean(root), real, alias ? clean(alias) : null);
  }

  /**
   * The lexical part of containment: maps an argument to a normalised relative path
   * without touching the file system. `..` is folded lexically, so `a/../b` is `b`
   * even if `a` is a symlink: we then operate on `<root>/b`, never on what the
   * kernel would make of the raw string.
   */
  relative(arg: string): string {
    if (arg.includes("\0")) throw new AgentError("invalid_argument", "path contains a NUL byte");
    let rel: string;
    if (posix.isAbsolute(arg)) {
      const normal = posix.normalize(arg);
      const base = [this.givenRoot, this.root, ...(this.alias ? [this.alias] : [])].find(
        (r) => normal === r || normal.startsWith(r === "/" ? r : `${r}/`),
      );
      if (base === undefined) throw outsideError(arg, "absolute path outside the root");
      rel = normal.slice(base.length);
    } else {
      rel = arg;
    }
    rel = posix.normalize(rel.replace(/^\/+/, "") || ".").replace(/\/+$/, "");
    if (rel === "." || rel === "") return "";
    if (rel === ".." || rel.startsWith("../")) throw outsideError(arg, "it climbs above the root with '..'");
    return rel;
  }

  /** Absolute path under the root for a relative path, without resolving symlinks. */
  lexical(rel: string): string {
    return rel === "" ? this.root : posix.join(this.root, rel);
  }

  /** True when an absolute, resolved path is the root or under it. */
  contains(real: string): boolean {
    return real === this.root || real.startsWith(this.root === "/" ? "/" : `${this.root}/`);
  }

  /**
   * Full containment check of an argument. Follows symlinks (a link that stays inside
   * is fine), allows a missing tail (for writes), and refuses hard-linked files.
   */
  async resolve(arg: string): Promise<ResolvedPath> {
    const rel = this.relative(arg);
    const { real, exists } = await this.follow(arg, rel);
    if (!this.contains(real)) throw outsideError(arg, "a symlink on the way leads outside the root");
    let st: Stats | null = null;
    if (exists) {
      st = await lstat(real).catch((err: NodeJS.ErrnoException) => {
        if (err.code === "ENOENT") return null;
        throw toAgentError(err, this.root);
      });
    }
    if (st?.isFile() && st.nlink > 1)
      throw outsideError(arg, "it is a hard link (it may be shared with a file outside)");
    return { rel, real, stat: st };
  }

  /** Display form of a relative path. */
  static show(rel: string): string {
    return rel === "" ? "." : rel;
  }

  private async follow(arg: string, rel: string): Promise<{ real: string; exists: boolean }> {
    let current = this.root;
    const pending = rel === "" ? [] : rel.split("/");
    let hops = 0;
    while (pending.length > 0) {
      const name = pending.shift()!;
      if (name === "" || name === ".") continue;
      if (name === "..") {
        // Only symlink targets bring `..` here, and `current` is already resolved, so
        // its lexical parent is its real parent.
        current = posix.dirname(current);
        continue;
      }
      const next = posix.join(current, name);
      let st: Stats;
      try {
        st = await lstat(next);
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        if (code === "ENOENT") {
          // Nothing below a missing entry can be a symlink, so the rest is lexical.
          return { real: posix.resolve(next, ...pending), exists: false };
        }
        if (code === "ENOTDIR")
          throw new AgentError("invalid_argument", `not a directory on the way to '${arg}'`);
        throw toAgentError(err, this.root);
      }
      if (st.isSymbolicLink()) {
        if (++hops > MAX_SYMLINK_HOPS)
          throw new AgentError("invalid_argument", `too many symlinks in '${arg}'`);
        const target = await readlink(next);
        if (posix.isAbsolute(target)) current = "/";
        pending.unshift(...target.split("/"));
        continue;
      }
      if (pending.length > 0 && !st.isDirectory()) {
        throw new AgentError("invalid_argument", `not a directory on the way to '${arg}'`);
      }
      current = next;
    }
    return { real: current, exists: true };
  }
}
