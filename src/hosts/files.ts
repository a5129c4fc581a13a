import { constants } from "node:fs";
import { access, readFile, realpath, stat } from "node:fs/promises";
import { delimiter, dirname, isAbsolute, join } from "node:path";
import { parse as parseToml, stringify as stringifyToml } from "smol-toml";
import { atomicWriteFile, makeDirs } from "../util/fs.js";

/**
 * Config-file plumbing shared by the hosts: read a JSON or TOML config without
 * guessing when it is broken, and write it back atomically (temp + rename) through a
 * symlink if the user keeps the file in a dotfiles repo.
 */

export type JsonObject = Record<string, unknown>;

export interface LoadedFile<T> {
  path: string;
  exists: boolean;
  text: string;
  /** The parsed document; `{}` when the file does not exist. */
  data: T;
  /** Set when the file exists but does not parse, or its top level is not a table/object. */
  error?: string;
}

export function isObject(v: unknown): v is JsonObject {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** The file's text, or null when it does not exist. */
export async function readText(path: string): Promise<string | null> {
  try {
    return await readFile(path, "utf8");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw err;
  }
}

export async function loadJson(path: string): Promise<LoadedFile<JsonObject>> {
  const text = await readText(path);
  if (text === null) return { path, exists: false, text: "", data: {} };
  if (text.trim() === "") return { path, exists: true, text, data: {} };
  try {
    const data: unknown = JSON.parse(text);
    if (!isObject(data))
      return { path, exists: true, text, data: {}, error: "the top level is not a JSON object" };
    return { path, exists: true, text, data };
  } catch (err) {
    return { path, exists: true, text, data: {}, error: (err as Error).message };
  }
}

export async function loadToml(path: string): Promise<LoadedFile<JsonObject>> {
  const text = await readText(path);
  if (text === null) return { path, exists: false, text: "", data: {} };
  try {
    return { path, exists: true, text, data: parseToml(text) as JsonObject };
  } catch (err) {
    return {
      path,
      exists: true,
      text,
      data: {},
      error: (err as Error).message.split("\n")[0] ?? "invalid TOML",
    };
  }
}

/** The indentation a JSON file already uses (two spaces when it cannot tell). */
export function jsonIndent(text: string): string | number {
  const m = /^[{[]\r?\n([ \t]+)\S/.exec(text);
  return m?.[1] ?? 2;
}

/**
 * Writes `text` over `path` atomically. A symlinked config is written at its target so
 * the link survives; the file keeps its mode (new files get `newMode`).
 */
export async function writeConfig(path: string, text: string, newMode: number): Promise<void> {
  let target = path;
  let mode = newMode;
  try {
    target = await realpath(path);
    mode = (await stat(target)).mode & 0o777;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
  }
  await makeDirs(dirname(target));
  await atomicWriteFile(target, text, mode);
}

const TABLE_HEADER = /^\s*\[\[?\s*([^\]]*?)\s*\]\]?\s*(#.*)?$/;

/** Splits a TOML header's dotted key into its parts (bare, "basic" or 'literal' keys). */
export function tomlKeyParts(key: string): string[] | null {
  const parts: string[] = [];
  const re = /\s*(?:"((?:[^"\\]|\\.)*)"|'([^']*)'|([A-Za-z0-9_-]+))\s*(\.|$)/y;
  let at = 0;
  while (at < key.length) {
    re.lastIndex = at;
    const m = re.exec(key);
    if (!m) return null;
    parts.push(m[1] !== undefined ? JSON.parse(`"${m[1]}"`) : (m[2] ?? m[3] ?? ""));
    at = re.lastIndex;
    if (m[4] === "") break;
  }
  return parts;
}

/**
 * Replaces the TOML table at `tablePath` (its header and every sub-table under it) with
 * `section`, or appends `section` when there is no such table. Every other line of the
 * file is kept byte for byte: comments, order and other servers included.
 *
 * This is deliberately a line editor, not a parse + re-serialise: it owns one section
 * and leaves the rest alone. The caller verifies the outcome by parsing it.
 */
export function replaceTomlTable(text: string, tablePath: readonly string[], section: string): string {
  const spliced = spliceTomlTable(text, tablePath, section.replace(/\n+$/, "").split("\n"));
  if (spliced !== null) return spliced;
  let head = text;
  if (head.trim().length === 0) head = "";
  else if (!head.endsWith("\n")) head += "\n\n";
  else if (!head.endsWith("\n\n")) head += "\n";
  return `${head}${section.replace(/\n+$/, "")}\n`;
}

/**
 * Removes the TOML table at `tablePath` and its sub-tables, the same line editor as
 * `replaceTomlTable`: comments and blank lines that introduce what follows stay, and so
 * does every other line. The text comes back unchanged when there is no such table.
 */
export function removeTomlTable(text: string, tablePath: readonly string[]): string {
  return spliceTomlTable(text, tablePath, []) ?? text;
}

/** Puts `body` where the table at `tablePath` was; null when there is no such table. */
function spliceTomlTable(text: string, tablePath: readonly string[], body: string[]): string | null {
  const lines = text.split("\n");
  const ownedAt = (i: number): boolean | null => {
    const m = TABLE_HEADER.exec(lines[i] ?? "");
    if (!m) return null;
    const parts = tomlKeyParts(m[1] ?? "");
    return parts !== null && parts.length >= tablePath.length && tablePath.every((p, k) => parts[k] === p);
  };
  const out: string[] = [];
  let inserted = false;
  let i = 0;
  while (i < lines.length) {
    if (ownedAt(i) !== true) {
      out.push(lines[i] ?? "");
      i++;
      continue;
    }
    // The owned region runs to the next header that is not ours.
    let j = i + 1;
    while (j < lines.length && ownedAt(j) !== false) j++;
    // Blank and comment lines at its end introduce whatever follows: give them back.
    let k = j;
    while (k > i + 1 && /^\s*(#.*)?$/.test(lines[k - 1] ?? "")) k--;
    const trailing = lines.slice(k, j);
    const blankAfter = trailing.length > 0 && (trailing[0] ?? "").trim() === "";
    if (!inserted && body.length > 0) {
      out.push(...body);
      if (j < lines.length && !blankAfter) out.push("");
    } else if (body.length === 0 && (blankAfter || j === lines.length) && out.length > 0) {
      // Removed: the blank line that separated the table goes with it.
      if ((out[out.length - 1] ?? "").trim() === "") out.pop();
    }
    inserted = true;
    out.push(...trailing);
    i = j;
  }
  if (!inserted) return null;
  const joined = out.join("\n");
  if (joined.trim() === "") return "";
  return joined.endsWith("\n") ? joined : `${joined}\n`;
}

/** Renders `value` as the TOML table at `tablePath` (with sub-tables for nested objects). */
export function tomlTable(tablePath: readonly string[], value: JsonObject): string {
  let doc: JsonObject = value;
  for (const key of [...tablePath].reverse()) doc = { [key]: doc };
  return stringifyToml(doc).replace(/^\s+/, "");
}

/** True when `p` is an executable regular file. */
export async function isExecutable(p: string): Promise<boolean> {
  try {
    await access(p, constants.X_OK);
    return (await stat(p)).isFile();
  } catch {
    return false;
  }
}

/** Resolves a command like a shell would: absolute paths as they are, bare names on PATH. */
export async function resolveCommand(
  command: string,
  env: NodeJS.ProcessEnv,
  cwd: string,
): Promise<string | null> {
  if (command.includes("/")) {
    const p = isAbsolute(command) ? command : join(cwd, command);
    return (await isExecutable(p)) ? p : null;
  }
  for (const dir of (env.PATH ?? "").split(delimiter)) {
    if (!dir) continue;
    const p = join(dir, command);
    if (await isExecutable(p)) return p;
  }
  return null;
}

export async function fileExists(p: string): Promise<boolean> {
  try {
    await stat(p);
    return true;
  } catch {
    return false;
  }
}
