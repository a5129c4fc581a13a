/**
 * The fast push into a running workspace (docs/architecture.md, "Export and push"): the host's
 * GNU tar packs the source and the backend's GNU tar extracts it into /workspace
 * (backend.workspaceWriter; bwrap/unpack.ts), one pipe between them, as `tar | tar`.
 *
 * The agent's `tar_in` checks the whole archive before it extracts anything (an upload
 * with one bad entry changes nothing). The same checks run here, on what the archive is
 * made from, before a byte moves: the source's walk (the one that lists the archive)
 * accepts only files with one link, directories and symlinks whose target stays inside
 * (tarsafe.ts linkStaysInside; devices, FIFOs and sockets are left out of the archive,
 * as on the agent's path), and the destination, read through the backend's view,
 * must have a real directory wherever the archive has one and the same type wherever
 * both have an entry, with no symlink on the way to it. Anything else (or a source that
 * is empty, or a path the reader does not take) goes to the agent, whose answer counts:
 * its refusal, with its exact reason, or its push.
 *
 * What the checks cannot hold is the workspace itself changing the destination while
 * the archive flows (a directory swapped for a symlink): GNU tar then follows it inside a
 * sandbox that sees the workspace's tree and nothing of the host, so the write lands in
 * the workspace or nowhere, as the workspace's own code could have written it.
 */
import { lstatSync, readdirSync, readlinkSync, type Stats } from "node:fs";
import { stat } from "node:fs/promises";
import { basename, dirname, join, resolve } from "node:path";
import { linkStaysInside, listTree, packList } from "../agent/tarsafe.js";
import type { SandboxSpec, SandboxState, WorkspaceBackend } from "../backends/backend.js";
import { PyroError } from "../errors.js";
import { plainWorkspacePath } from "./export-direct.js";
import { sourceUnread } from "./transfer.js";

type Kind = "file" | "directory" | "symlink";

function kindOf(st: Stats): Kind | null {
  return st.isFile() ? "file" : st.isDirectory() ? "directory" : st.isSymbolicLink() ? "symlink" : null;
}

/**
 * Pushes host path `source` into /workspace/`dest` of the running workspace without its
 * agent, or returns null when the agent must do it (see the top of the file). Throws
 * what the agent's push would: GNU tar's failure once it has begun (a full disk).
 */
export async function pushDirect(
  backend: WorkspaceBackend,
  sandbox: { spec: SandboxSpec; state: SandboxState },
  source: string,
  dest: string,
  signal?: AbortSignal,
): Promise<{ dest: string; files: number; bytes: number } | null> {
  const rel = plainWorkspacePath(dest);
  if (rel === null || !backend.workspaceWriter) return null;
  const abs = resolve(source);
  const st = await stat(abs).catch(() => null);
  if (!st) return null;
  const [cwd, names] = st.isDirectory() ? [abs, readdirSync(abs).sort()] : [dirname(abs), [basename(abs)]];
  if (names.length === 0) return null;
  const writer = await backend.workspaceWriter(sandbox.spec, sandbox.state);
  if (!writer) return null;
  const listed: { name: string; kind: Kind }[] = [];
  let plain = true;
  let files = 0;
  let bytes = 0;
  const list = listTree(cwd, names, (name, entry) => {
    const kind = kindOf(entry);
    // Devices, FIFOs and sockets are left out, as packHostPath leaves them out.
    if (!kind) return false;
    if (kind === "file") {
      files++;
      bytes += entry.size;
    }
    if (
      (kind === "file" && entry.nlink !== 1) ||
      (kind === "symlink" && !linkStaysInside(name, readlinkSync(join(cwd, name))))
    )
      plain = false;
    listed.push({ name, kind });
    return plain;
  });
  // An archive of nothing: the agent says what it says of it.
  if (list.length === 0) plain = false;
  const missing = plain ? missingDirectories(writer.view, rel) : null;
  // Below a directory the destination lacks, everything is new. The writer makes the
  // missing ones from an archive of plain ustar names (up to 99 bytes each).
  if (
    !missing ||
    missing.some((d) => Buffer.byteLength(d) > 99) ||
    (missing.length === 0 && !fits(writer.view, rel, listed))
  )
    return null;
  // The host's tar starts only once its sandboxed peer has (nothing is left waiting).
  let finished: Promise<number | null> = Promise.resolve(0);
  const r = await writer.unpack(
    rel,
    async () => {
      const packed = await packList(cwd, list);
      finished = packed.finished;
      return packed.stream;
    },
    missing,
    signal,
  );
  if (!r.started) return null;
  if (signal?.aborted) throw new PyroError("cancelled", "the upload was cancelled");
  if (r.code !== 0) throw new PyroError("internal", `tar failed (exit ${r.code ?? "none"}): ${r.said}`);
  const read = await finished;
  if (read !== 0) throw sourceUnread(abs, read, true);
  return { dest: rel === "" ? "." : rel, files, bytes };
}

/**
 * The components of /workspace/`rel` that do not exist yet (relative to /workspace,
 * parents first), or null when one that exists is not a real directory.
 */
function missingDirectories(view: string, rel: string): string[] | null {
  const parts = rel === "" ? [] : rel.split("/");
  for (let i = 0; i < parts.length; i++) {
    const at = parts.slice(0, i + 1).join("/");
    const st = lstatOrNull(join(view, at));
    if (st === undefined) return null;
    if (st === null) return parts.slice(i).map((_p, j) => parts.slice(0, i + j + 1).join("/"));
    if (!st.isDirectory()) return null;
  }
  return [];
}

/**
 * Whether the archive's entries fit the existing destination /workspace/`rel`: where
 * both have an entry, the same kind (a directory where the archive has one, never a
 * symlink GNU tar would follow). Entries under a directory the destination lacks are new.
 */
function fits(view: string, rel: string, listed: { name: string; kind: Kind }[]): boolean {
  const fresh = new Set<string>();
  for (const { name, kind } of listed) {
    if (name === ".") continue;
    const parent = dirname(name);
    if (parent !== "." && fresh.has(parent)) {
      if (kind === "directory") fresh.add(name);
      continue;
    }
    const st = lstatOrNull(join(view, rel, name));
    if (st === undefined) return false;
    if (st === null) {
      if (kind === "directory") fresh.add(name);
      continue;
    }
    if (kindOf(st) !== kind) return false;
  }
  return true;
}

/** lstat, null when missing, undefined on any other failure. */
function lstatOrNull(path: string): Stats | null | undefined {
  try {
    return lstatSync(path);
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "ENOENT" ? null : undefined;
  }
}
