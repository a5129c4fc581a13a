/**
 * The checks of an archive before anything of it is extracted (tarsafe.ts): names, types,
 * link targets, and no entry through a symlink or onto a directory of the destination.
 * Fed as the bytes arrive, so an upload is checked while it is spooled.
 */

import { createReadStream, type Stats } from "node:fs";
import { lstat } from "node:fs/promises";
import path from "node:path";
import * as tar from "tar";
import { AgentError } from "./errors.js";

const posix = path.posix;
const FILE_TYPES = new Set(["File", "OldFile", "ContiguousFile"]);

export interface ValidateOptions {
  /** Keep absolute symlink targets (snapshots: they mean something inside the sandbox). */
  allowAbsoluteSymlinks?: boolean;
  /** Existing directory the archive will be extracted into (for the symlink-prefix check). */
  destReal?: string;
  /** How to name the destination in errors. */
  destLabel: string;
}

export interface Checked {
  files: number;
  bytes: number;
  entries: number;
}

/**
 * Whether a symlink at `name` with relative `target` stays inside the extraction
 * directory. `..` is only accepted as a leading run: after a normal component it could
 * climb out of a directory that is itself a symlink, which a lexical check cannot see.
 */
export function linkStaysInside(name: string, target: string): boolean {
  if (target === "" || posix.isAbsolute(target)) return false;
  const parts = target.split("/").filter((p) => p !== "" && p !== ".");
  const firstNormal = parts.findIndex((p) => p !== "..");
  if (firstNormal >= 0 && parts.slice(firstNormal).includes("..")) return false;
  const joined = posix.normalize(posix.join(posix.dirname(name), ...parts));
  return joined !== ".." && !joined.startsWith("../");
}

function refusal(label: string, why: string): AgentError {
  return new AgentError(
    "path_outside_workspace",
    `refused to extract into '${label}': ${why}`,
    "archives may hold only files, directories and symlinks that stay inside",
  );
}

/** Reads a spooled archive and refuses it unless every entry is safe to extract. */
export async function validateArchive(file: string, options: ValidateOptions): Promise<Checked> {
  const v = archiveValidator(options);
  for await (const chunk of createReadStream(file, { highWaterMark: 1024 * 1024 }))
    await v.write(chunk as Buffer);
  return v.finish();
}

/**
 * validateArchive fed as the bytes arrive (tar_in checks an upload while spooling it, so
 * the archive is not read a second time before extraction). Nothing is extracted here:
 * the caller extracts only after finish() accepted the whole archive.
 */
export function archiveValidator(options: ValidateOptions): {
  /** Resolves when the parser can take more. */
  write(chunk: Buffer): Promise<void>;
  /** Ends the archive; resolves with the counts, or rejects with the refusal. */
  finish(): Promise<Checked>;
} {
  const problems: string[] = [];
  const links = new Set<string>();
  const names: { name: string; type: string }[] = [];
  const checked: Checked = { files: 0, bytes: 0, entries: 0 };
  const parser = new tar.Parser({ strict: true });
  let failure: Error | null = null;
  let zeros = true;
  const ended = new Promise<void>((resolve, reject) => {
    parser.on("error", (e: Error) => {
      failure ??= e;
      reject(e);
    });
    parser.on("end", () => resolve());
  });
  ended.catch(() => {});
  parser.on("entry", (entry: tar.ReadEntry) => {
    checkListed(entry, options, { problems, links, names, checked });
    entry.resume();
  });
  // Entries node-tar does not know (an unrecognised type flag) it skips without an
  // "entry" event, but GNU tar, which extracts afterwards, writes them as regular files:
  // one under a symlink the sandbox planted would be written through it. Refused.
  parser.on("ignoredEntry", (entry: tar.ReadEntry) => {
    problems.push(`entry '${entry.path}' has an unknown type`);
  });
  return {
    write: async (chunk) => {
      if (zeros && !chunk.equals(Buffer.alloc(chunk.length))) zeros = false;
      if (failure) throw failure;
      // A failed parse never drains: `ended` settles then instead.
      if (!parser.write(chunk))
        await Promise.race([new Promise((r) => parser.once("drain", r)), ended.catch(() => {})]);
    },
    finish: async () => {
      parser.end();
      // Only zero blocks: the archive of no entries (GNU tar's of an empty directory),
      // which the parser calls unrecognised.
      await ended.catch((err) => {
        if (!zeros || checked.entries > 0) throw err;
      });
      if (problems.length > 0)
        throw refusal(options.destLabel, `the archive has ${problems.slice(0, 5).join("; ")}`);
      await checkPrefixes(names, links, options);
      return checked;
    },
  };
}

/** The per-entry checks of validateArchive: names, types and link targets. */
function checkListed(
  entry: tar.ReadEntry,
  options: ValidateOptions,
  acc: {
    problems: string[];
    links: Set<string>;
    names: { name: string; type: string }[];
    checked: Checked;
  },
): void {
  const { problems, links, checked } = acc;
  const raw = entry.path;
  const name = posix.normalize(raw.replace(/^(\.\/)+/, "")).replace(/\/+$/, "");
  checked.entries++;
  if (posix.isAbsolute(raw) || /^[a-zA-Z]:/.test(raw)) problems.push(`absolute entry name '${raw}'`);
  else if (name.split("/").includes("..")) problems.push(`entry '${raw}' climbs out with '..'`);
  else if (entry.type === "Link") problems.push(`hard link '${raw}'`);
  else if (entry.type === "SymbolicLink") {
    const target = entry.linkpath ?? "";
    const ok = (options.allowAbsoluteSymlinks && posix.isAbsolute(target)) || linkStaysInside(name, target);
    if (!ok) problems.push(`symlink '${raw}' -> '${target}' leads outside the extraction directory`);
    links.add(name);
  } else if (FILE_TYPES.has(entry.type)) {
    checked.files++;
    checked.bytes += entry.size;
  } else if (entry.type !== "Directory") problems.push(`entry '${raw}' has unsupported type ${entry.type}`);
  acc.names.push({ name, type: entry.type });
}

/**
 * Nothing may be extracted through a symlink, whether the archive makes it or it already
 * exists under the destination, and no file or symlink onto an existing directory (GNU
 * tar would fail halfway; refused before anything is written).
 */
async function checkPrefixes(
  names: { name: string; type: string }[],
  links: Set<string>,
  options: ValidateOptions,
): Promise<void> {
  const existing = new Map<string, Stats | null>();
  const stOf = async (rel: string): Promise<Stats | null> => {
    if (!options.destReal) return null;
    if (!existing.has(rel))
      existing.set(rel, await lstat(posix.join(options.destReal, rel)).catch(() => null));
    return existing.get(rel)!;
  };
  const isLink = async (rel: string): Promise<boolean> =>
    links.has(rel) || ((await stOf(rel))?.isSymbolicLink() ?? false);
  for (const { name, type } of names) {
    if (name === "." || name === "") continue;
    const parts = name.split("/");
    for (let i = 1; i < parts.length; i++) {
      const prefix = parts.slice(0, i).join("/");
      if (await isLink(prefix))
        throw refusal(
          options.destLabel,
          `entry '${name}' would be extracted through the symlink '${prefix}'`,
        );
    }
    if (type === "Directory" && !links.has(name) && (await isLink(name))) {
      throw new AgentError("conflict", `'${name}' exists as a symlink where the archive has a directory`);
    }
    if (type !== "Directory" && (await stOf(name))?.isDirectory()) {
      const what = type === "SymbolicLink" ? "symlink" : "file";
      const hint = "remove the directory first, or push to another destination";
      throw new AgentError(
        "conflict",
        `'${name}' exists as a directory where the archive has a ${what}`,
        hint,
      );
    }
  }
}
