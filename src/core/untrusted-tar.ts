/**
 * Extraction of archives that come out of a sandbox: exports and snapshots. Whatever a
 * sandbox sends is hostile (its code can replace or hijack the agent), so the rule for
 * every host-side write of sandbox data is here, in one place:
 *
 * - One parser both checks and writes. node-tar reads each entry once; the same entry
 *   object is checked and then written. (Checking with one parser and extracting with
 *   another let a PAX `linkpath` before a GNU long-link header look harmless to the
 *   checker and become a symlink to /etc/shadow for the extractor.)
 * - Only regular files, directories and symlinks whose target stays inside the tree.
 *   No hard links, devices, FIFOs or sockets; no absolute or `..` names.
 * - Exports land owned by the invoking user with plain permission bits: setuid, setgid
 *   and sticky bits are dropped. Snapshots (kept only as a sandbox's lower layer, in a
 *   0700 directory) keep owners, modes and absolute symlinks, which mean something
 *   inside the sandbox only.
 * - Extraction happens into a fresh private directory, and the result is walked again
 *   with lstat before it is moved into place: any entry that is not what was accepted
 *   refuses the whole archive.
 */
import { lchownSync, lstatSync, readdirSync, readlinkSync, symlinkSync, unlinkSync } from "node:fs";
import path from "node:path";
import * as tar from "tar";
import { linkStaysInside } from "../agent/tarsafe.js";
import { PyroError } from "../errors.js";

const posix = path.posix;
const FILE_TYPES = new Set(["File", "OldFile", "ContiguousFile"]);

export type UntrustedMode = "export" | "snapshot";

export interface Extracted {
  files: number;
  bytes: number;
  entries: number;
  /** Type of the single top-level entry (a file export has exactly one). */
  top: { name: string; type: "file" | "directory" | "symlink" }[];
}

function refusal(label: string, problems: readonly string[]): PyroError {
  return new PyroError(
    "path_outside_workspace",
    `refused to extract into '${label}': the archive has ${problems.slice(0, 5).join("; ")}`,
    "archives may hold only files, directories and symlinks that stay inside",
  );
}

/** The entry's name as node-tar will write it, or a reason to refuse it. */
function checkName(raw: string): { name: string } | { problem: string } {
  if (raw.includes("\0")) return { problem: "an entry name with a NUL byte" };
  if (posix.isAbsolute(raw) || /^[a-zA-Z]:/.test(raw)) return { problem: `absolute entry name '${raw}'` };
  const name = posix.normalize(raw.replace(/^(\.\/)+/, "")).replace(/\/+$/, "");
  if (name.split("/").includes("..")) return { problem: `entry '${raw}' climbs out with '..'` };
  return { name };
}

/**
 * Extracts `archive` into `tree` (an empty directory only this process uses) under the
 * rules above; refuses with `path_outside_workspace` and leaves `tree` to the caller to
 * discard when anything is off.
 */
export async function extractUntrusted(
  archive: string,
  tree: string,
  mode: UntrustedMode,
  label: string,
): Promise<Extracted> {
  const problems: string[] = [];
  const seen = new Map<string, string>();
  // Snapshots keep absolute symlinks, which node-tar (kept from writing through symlinks
  // by preservePaths: false) writes with the leading '/' stripped: put them back after.
  const absolute: { name: string; target: string; uid?: number; gid?: number }[] = [];
  const result: Extracted = { files: 0, bytes: 0, entries: 0, top: [] };
  await tar.x({
    file: archive,
    cwd: tree,
    strict: false,
    preserveOwner: mode === "snapshot",
    // Names are checked below; node-tar's own stripping would only hide a problem.
    preservePaths: false,
    // The tree is fresh: nothing there to unlink, and a repeated name is refused below.
    unlink: false,
    onwarn: (code, message) => {
      if (mode === "snapshot" && code === "TAR_ENTRY_INFO" && message.includes("absolute linkpath")) return;
      problems.push(`${message} (${code})`);
    },
    filter: (raw, entry) => {
      if (!("type" in entry)) return false;
      result.entries++;
      const checked = checkName(raw);
      if ("problem" in checked) {
        problems.push(checked.problem);
        return false;
      }
      const { name } = checked;
      const earlier = seen.get(name);
      if (earlier !== undefined && !(earlier === "Directory" && entry.type === "Directory")) {
        problems.push(`entry '${raw}' appears twice`);
        return false;
      }
      seen.set(name, entry.type);
      if (entry.type === "Link") {
        problems.push(`hard link '${raw}'`);
        return false;
      }
      if (entry.type === "SymbolicLink") {
        const target = entry.linkpath ?? "";
        const ok = (mode === "snapshot" && posix.isAbsolute(target)) || linkStaysInside(name, target);
        if (!ok) {
          problems.push(`symlink '${raw}' -> '${target}' leads outside the extraction directory`);
          return false;
        }
        if (posix.isAbsolute(target))
          absolute.push({
            name,
            target,
            ...(typeof entry.uid === "number" ? { uid: entry.uid } : {}),
            ...(typeof entry.gid === "number" ? { gid: entry.gid } : {}),
          });
      } else if (FILE_TYPES.has(entry.type)) {
        result.files++;
        result.bytes += entry.size ?? 0;
      } else if (entry.type !== "Directory") {
        problems.push(`entry '${raw}' has unsupported type ${entry.type}`);
        return false;
      }
      if (mode === "export" && entry.type !== "SymbolicLink") {
        // Plain permission bits only, and the owner may always read and write what it got.
        const base = typeof entry.mode === "number" ? entry.mode : 0o644;
        entry.mode = (base & 0o777) | (entry.type === "Directory" ? 0o700 : 0o600);
      }
      return problems.length === 0;
    },
  });
  if (problems.length > 0) throw refusal(label, problems);
  for (const a of absolute) {
    // node-tar made every parent a real directory (it refuses to write through a symlink).
    const at = path.join(tree, a.name);
    unlinkSync(at);
    symlinkSync(a.target, at);
    if (a.uid !== undefined && a.gid !== undefined && process.getuid?.() === 0) lchownSync(at, a.uid, a.gid);
  }
  verifyTree(tree, mode, label, result);
  return result;
}

/**
 * Walks what was extracted (never following a symlink) and refuses anything the filter
 * did not mean to write. Synchronous: the tree is private and the walk is a few lstats.
 */
function verifyTree(tree: string, mode: UntrustedMode, label: string, result: Extracted): void {
  const uid = process.getuid?.() ?? 0;
  const problems: string[] = [];
  const visit = (rel: string, depth: number): void => {
    for (const name of readdirSync(path.join(tree, rel))) {
      const r = rel === "" ? name : `${rel}/${name}`;
      const st = lstatSync(path.join(tree, r));
      if (depth === 0)
        result.top.push({
          name,
          type: st.isDirectory() ? "directory" : st.isSymbolicLink() ? "symlink" : "file",
        });
      if (st.isSymbolicLink()) {
        const target = readlinkSync(path.join(tree, r));
        if (!((mode === "snapshot" && posix.isAbsolute(target)) || linkStaysInside(r, target)))
          problems.push(`symlink '${r}' -> '${target}' leads outside the extraction directory`);
      } else if (st.isFile()) {
        if (st.nlink !== 1) problems.push(`'${r}' is a hard link`);
        if (mode === "export" && (st.mode & 0o7000) !== 0)
          problems.push(`'${r}' has setuid/setgid/sticky bits`);
      } else if (!st.isDirectory()) {
        problems.push(`'${r}' is not a file, directory or symlink`);
      }
      if (mode === "export" && st.uid !== uid) problems.push(`'${r}' is owned by uid ${st.uid}`);
      if (st.isDirectory()) visit(r, depth + 1);
    }
  };
  visit("", 0);
  if (problems.length > 0) throw refusal(label, problems);
}
