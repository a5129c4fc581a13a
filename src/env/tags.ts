/**
 * Versions of an environment whose source moves: an image named by tag. Each digest the
 * tag resolved to is an entry of its own (`<name>@<key>.<digest16>/`), finished once and
 * never rewritten, because workspaces run on its `rootfs/` path. A pointer
 * (`.oci/tags/<name>@<key>.json`, written atomically) names the current version; a pull
 * that finds the tag moved builds the new version and moves only the pointer. `env prune`
 * removes versions the pointer has left behind that no workspace uses.
 */
import { mkdir, readdir, readFile, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import { atomicWriteFile } from "../util/fs.js";
import type { EnvironmentManifest } from "./cache.js";
import { type EnvironmentSpec, entryDirName, recipeKey } from "./catalog.js";
import { parseReference } from "./oci/reference.js";

export interface TagPointer {
  /** Directory name of the current version under the cache root. */
  entry: string;
  /** What the tag resolved to (the index's digest for a multi-arch image). */
  digest: string;
  /** When a pull last resolved the tag to `digest`. */
  resolved_at: string;
}

/** An image reference with a tag and no digest: what it names can change at the registry. */
export function isMovable(spec: EnvironmentSpec): boolean {
  if (spec.source.kind !== "oci") return false;
  try {
    return parseReference(spec.source.reference).digest === null;
  } catch {
    return false;
  }
}

/** The recipe key of the version of `spec` whose tag resolved to `digest`. */
export function versionKey(spec: EnvironmentSpec, digest: string): string {
  return `${recipeKey(spec)}.${digest.slice("sha256:".length, "sha256:".length + 16)}`;
}

/** The directory name all versions of `spec` share before their version suffix (the pointer's name). */
export function tagBase(spec: EnvironmentSpec): string {
  return entryDirName(spec, recipeKey(spec));
}

/** What the tag resolved to when this entry was pulled (the index's digest for a multi-arch image). */
export function tagDigestOf(m: EnvironmentManifest | null): string | null {
  const d = m?.source_detail.index_digest ?? m?.source_detail.digest;
  return typeof d === "string" ? d : null;
}

export async function readPointer(tagsDir: string, spec: EnvironmentSpec): Promise<TagPointer | null> {
  return parsePointer(await readFile(join(tagsDir, `${tagBase(spec)}.json`), "utf8").catch(() => null));
}

export async function writePointer(tagsDir: string, spec: EnvironmentSpec, p: TagPointer): Promise<void> {
  await mkdir(tagsDir, { recursive: true, mode: 0o700 });
  await atomicWriteFile(join(tagsDir, `${tagBase(spec)}.json`), `${JSON.stringify(p, null, 2)}\n`);
}

/** Every pointer, by the base directory name of its versions. */
export async function readPointers(tagsDir: string): Promise<Map<string, TagPointer>> {
  const out = new Map<string, TagPointer>();
  for (const f of await readdir(tagsDir).catch(() => [] as string[])) {
    if (!f.endsWith(".json")) continue;
    const p = parsePointer(await readFile(join(tagsDir, f), "utf8").catch(() => null));
    if (p) out.set(f.slice(0, -".json".length), p);
  }
  return out;
}

/**
 * An older version the tag's pointer has moved away from: pulled before the pointer last
 * moved. A version built after it (a pull still writing its pointer) is never one.
 */
export function isSuperseded(
  dir: string,
  m: EnvironmentManifest | null,
  pointers: Map<string, TagPointer>,
): boolean {
  if (m?.source?.kind !== "oci") return false;
  const spec = { name: m.name, description: m.description, source: m.source };
  if (!isMovable(spec)) return false;
  const p = pointers.get(tagBase(spec));
  return p !== undefined && p.entry !== dir && m.built_at < p.resolved_at;
}

/** Removes pointers whose current version is gone (pruned with `--all`). */
export async function removeDanglingPointers(root: string, tagsDir: string): Promise<void> {
  for (const [base, p] of await readPointers(tagsDir)) {
    if (!(await stat(join(root, p.entry)).catch(() => null)))
      await rm(join(tagsDir, `${base}.json`), { force: true });
  }
}

function parsePointer(text: string | null): TagPointer | null {
  if (text === null) return null;
  try {
    const p = JSON.parse(text) as Partial<TagPointer>;
    if (typeof p.entry !== "string" || typeof p.digest !== "string" || typeof p.resolved_at !== "string")
      return null;
    // A pointer names a directory of the cache root, never a path elsewhere.
    if (p.entry.includes("/") || p.entry.startsWith(".")) return null;
    return { entry: p.entry, digest: p.digest, resolved_at: p.resolved_at };
  } catch {
    return null;
  }
}
